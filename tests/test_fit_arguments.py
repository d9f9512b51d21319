"""Keras' fit arguments with Keras' meaning on an elastic model (issue 23.2).

One worker on an embedded cluster with the synchronous exchange applies
exactly Keras' updates, so each argument is checked against plain Keras on
the same data: the weights after training and the logs must be equal.
"""

import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import launch

import keras_elastic as ke


def model(elastic: bool, seed: int = 0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,))
    h = keras.layers.Dense(12, activation="relu")(inputs)
    outputs = keras.layers.Dense(3, activation="softmax")(h)
    m = keras.Model(inputs, outputs)
    if elastic:
        m = ke.wrap(m)
    m.compile(optimizer=keras.optimizers.SGD(0.05),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return m


def arrays(n=256, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype("float32")
    y = ((x[:, 0] > 0).astype("int64") + (x[:, 1] > 0.5)).astype("int64")
    return x, y


def assert_same(plain, elastic, history_plain=None, history_elastic=None):
    for a, b in zip(plain.get_weights(), elastic.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    if history_plain is not None:
        assert sorted(history_plain.history) == sorted(history_elastic.history)
        for key, values in history_plain.history.items():
            np.testing.assert_allclose(history_elastic.history[key], values, rtol=1e-4,
                                       atol=1e-5, err_msg=key)


def fit_both(**kwargs):
    plain, elastic = model(False), model(True)
    hp = plain.fit(**kwargs, verbose=0)
    he = elastic.fit(**kwargs, verbose=0)
    assert_same(plain, elastic, hp, he)
    return hp, he


def test_validation_split_takes_the_last_fraction_as_keras(embedded_cluster):
    x, y = arrays()
    hp, _ = fit_both(x=x, y=y, batch_size=32, epochs=2, shuffle=False,
                     validation_split=0.25)
    assert len(hp.history["val_accuracy"]) == 2
    status = embedded_cluster.master.status()["datasets"]
    # The training phase has the first 75 %, validation the last 25 %.
    assert status["fit_arrays"]["records_per_epoch"] == 192
    assert status["fit_validation"]["records_per_epoch"] == 64


def test_validation_data_arrays_and_sample_weight(embedded_cluster):
    x, y = arrays()
    vx, vy = arrays(64, seed=1)
    weights = np.linspace(0.5, 2.0, len(x)).astype("float32")
    fit_both(x=x, y=y, sample_weight=weights, batch_size=32, epochs=2, shuffle=False,
             validation_data=(vx, vy))


def test_class_weight_weighs_samples_as_keras(embedded_cluster):
    x, y = arrays()
    fit_both(x=x, y=y, batch_size=32, epochs=2, shuffle=False,
             class_weight={0: 0.5, 1: 2.0, 2: 4.0})


def test_class_weight_on_an_elastic_dataset(embedded_cluster):
    x, y = arrays()
    class_weight = {0: 0.5, 1: 2.0, 2: 4.0}
    plain, elastic = model(False), model(True)
    plain.fit(x, y, batch_size=32, epochs=1, shuffle=False, class_weight=class_weight,
              verbose=0)
    elastic.fit(ke.ElasticDataset((x, y), batch_size=32), epochs=1,
                class_weight=class_weight, verbose=0)
    assert_same(plain, elastic)


def test_class_weight_with_sample_weight_is_refused_as_in_keras(embedded_cluster):
    x, y = arrays()
    with pytest.raises(ValueError, match="class_weight` and `sample_weight"):
        model(True).fit(x, y, sample_weight=np.ones(len(x)), class_weight={0: 2.0},
                        verbose=0)


def test_steps_per_epoch_continues_through_the_data_as_keras(embedded_cluster):
    # 8 batches of data, 4 per epoch: epochs 0, 1, 2 take batches 0-3, 4-7,
    # 0-3 (Keras continues where the last epoch stopped, then starts over).
    x, y = arrays()
    fit_both(x=x, y=y, batch_size=32, epochs=3, shuffle=False, steps_per_epoch=4)
    status = embedded_cluster.master.status()["datasets"]["fit_arrays"]
    assert status["records_per_epoch"] == 128


def test_validation_steps_evaluates_that_many_batches_as_keras(embedded_cluster):
    # 4 validation batches of 16, 2 per evaluation: Keras evaluates the first
    # two batches each epoch (its evaluate resets the data's iterator).
    x, y = arrays()
    vx, vy = arrays(64, seed=1)
    hp, he = fit_both(x=x, y=y, batch_size=32, epochs=3, shuffle=False,
                      validation_data=(vx, vy), validation_batch_size=16,
                      validation_steps=2)
    status = embedded_cluster.master.status()["datasets"]["fit_validation"]
    assert status["records_per_epoch"] == 32


def test_evaluate_steps_takes_the_first_batches_as_keras(embedded_cluster):
    x, y = arrays()
    plain, elastic = model(False), model(True)
    plain.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    elastic.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    for steps in (2, 3, 2):
        want = plain.evaluate(x, y, batch_size=16, steps=steps, verbose=0,
                              return_dict=True)
        got = elastic.evaluate(x, y, batch_size=16, steps=steps, verbose=0,
                               return_dict=True)
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    dataset = ke.ElasticDataset((x, y), batch_size=16, mode="evaluation", name="held")
    got = elastic.evaluate(dataset, steps=3, return_dict=True, verbose=0)
    want = plain.evaluate(x[:48], y[:48], batch_size=16, verbose=0, return_dict=True)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)


def test_shuffle_on_arrays_trains_every_record_once_per_epoch_in_a_new_order(
        embedded_cluster):
    # Keras' permutation is its own; an elastic model's is the master's
    # (seeded, the same on every worker). Each epoch still trains every
    # record once (the ledger), in an order other than the arrays'.
    x, y = arrays()
    ordered = model(True)
    ordered.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    shuffled = model(True)
    history = shuffled.fit(x, y, batch_size=32, epochs=2, shuffle=True, verbose=0)
    assert any(not np.allclose(a, b) for a, b in zip(ordered.get_weights(),
                                                      shuffled.get_weights()))
    plain = model(False)
    keras_history = plain.fit(x, y, batch_size=32, epochs=2, shuffle=True, verbose=0)
    np.testing.assert_allclose(history.history["loss"], keras_history.history["loss"],
                               atol=0.05)
    status = embedded_cluster.master.status()["datasets"]["fit_arrays@2"]
    assert status["records_per_epoch"] == len(x)
    assert status["tasks_done_total"] == 2 * status["tasks_per_epoch"]


def test_initial_epoch_trains_the_remaining_epochs(embedded_cluster):
    x, y = arrays()
    hp, he = fit_both(x=x, y=y, batch_size=32, epochs=4, initial_epoch=2, shuffle=False)
    assert len(he.history["loss"]) == 2


def test_a_second_fit_trains_on_as_keras(embedded_cluster):
    # Each fit is a new phase of the job ("fit_arrays", "fit_arrays@2", ...).
    x, y = arrays()
    plain, elastic = model(False), model(True)
    for epochs in (2, 3):
        hp = plain.fit(x, y, batch_size=32, epochs=epochs, shuffle=False, verbose=0)
        he = elastic.fit(x, y, batch_size=32, epochs=epochs, shuffle=False, verbose=0)
        assert_same(plain, elastic, hp, he)
    assert {"fit_arrays", "fit_arrays@2"} <= set(
        embedded_cluster.master.status()["datasets"])


def test_evaluate_on_arrays_is_exact_for_each_call(embedded_cluster):
    x, y = arrays()
    vx, vy = arrays(100, seed=1)
    plain, elastic = model(False), model(True)
    plain.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    elastic.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    for data in ((x, y), (vx, vy), (x, y)):
        want = plain.evaluate(*data, batch_size=16, verbose=0, return_dict=True)
        got = elastic.evaluate(*data, batch_size=16, verbose=0, return_dict=True)
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_a_tf_data_dataset_trains_with_keras_own_loop_when_embedded(embedded_cluster):
    # What keras.io's GAN does; the servers then hold the model it trained.
    x, y = arrays()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    plain, elastic = model(False), model(True)
    plain.fit(dataset, epochs=2, verbose=0)
    elastic.fit(dataset, epochs=2, verbose=0)
    assert_same(plain, elastic)
    # An elastic call after it starts from what Keras' loop trained.
    want = plain.evaluate(x, y, verbose=0, return_dict=True)
    got = elastic.evaluate(x, y, verbose=0, return_dict=True)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)


JOB_SCRIPT = textwrap.dedent("""
    import keras, numpy as np, tensorflow as tf
    import keras_elastic as ke
    x = np.zeros((64, 6), "float32"); y = np.zeros(64, "int64")
    inputs = keras.Input((6,))
    model = ke.wrap(keras.Model(inputs, keras.layers.Dense(3)(inputs)))
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=1)
""")


@pytest.mark.multiprocess
def test_a_tf_data_dataset_in_a_job_is_a_clear_error(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(JOB_SCRIPT)
    result = launch(str(tmp_path / "job"), str(script), "--num_workers=1",
                    "--max_worker_restarts=0")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    logs = "".join(p.read_text() for p in (tmp_path / "job").glob("worker-*.log"))
    assert "fit() in a multi-worker job: x is a tf.data.Dataset" in logs + output, (
        output[-3000:])
    assert "ke.ElasticDataset" in logs + output


def test_several_models_in_one_script_each_train_as_keras(embedded_cluster):
    # keras.io's guides build a model per section: each model gets its own
    # variables and optimizer on the servers (a namespace), so each trains from
    # its own initial weights, as in Keras; another architecture too.
    x, y = arrays()
    for seed in (1, 2):
        fit_both_seeded = model(False, seed), model(True, seed)
        plain, elastic = fit_both_seeded
        plain.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
        elastic.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
        assert_same(plain, elastic)
    keras.utils.set_random_seed(3)
    inputs = keras.Input((6,))
    other = ke.wrap(keras.Model(inputs, keras.layers.Dense(2)(
        keras.layers.Dense(5)(inputs))))
    other.compile(optimizer="adam", loss="mse")
    other.fit(x, np.zeros((len(x), 2)), verbose=0)
    variables = embedded_cluster.ps.status(0).variables
    assert {"0000/kernel", "m1/0000/kernel", "m2/0003/bias"} <= set(variables)

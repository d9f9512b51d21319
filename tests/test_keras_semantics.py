"""Keras' meaning of compile, weights and callbacks, kept by elastic models
(issue 40), on an embedded cluster: each test compares with plain Keras.

- a second `compile` (other loss, metrics or optimizer; a layer's `trainable`
  changed, as keras.io's fine-tuning does) takes effect in `evaluate`, in
  `fit`'s validation and on the servers;
- weights the script assigns (`set_weights`, `load_weights`, a callback
  restoring the best epoch) stay the model's and reach the servers;
- `fit`'s validation calls the callbacks' test hooks as Keras does, and
  `on_train_end` gets the last epoch's logs with their `val_` keys.

Both exchanges run: "sync" on an embedded cluster shares the model's own
variables with the in-process store; "pipelined" holds copies and talks to
the store as a remote server would, which is where weights can drift.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import keras_elastic as ke

EXCHANGES = ["sync", "pipelined"]


def data(n: int = 256, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.random((n, 6)).astype("float32")
    y = (x[:, :3].sum(1) > x[:, 3:].sum(1)).astype("float32")
    return x, y


def make_model(seed: int = 1) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(1, activation="sigmoid")])


def plain_evaluate(model: keras.Model, x, y, **compile_args) -> dict:
    """Plain Keras' evaluate of a model with `model`'s weights."""
    plain = make_model()
    plain.set_weights(model.get_weights())
    plain.compile(**compile_args)
    return plain.evaluate(x, y, verbose=0, return_dict=True)


def assert_logs_close(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want), (got, want)
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-6), (k, got, want)


@pytest.mark.parametrize("exchange", EXCHANGES)
def test_evaluate_after_a_second_compile_uses_the_new_loss_and_metrics(
        embedded_cluster, exchange):
    x, y = data()
    model = ke.wrap(make_model())
    first = dict(optimizer="adam", loss="binary_crossentropy",
                 metrics=["binary_accuracy"])
    model.compile(**first, exchange=exchange)
    assert_logs_close(model.evaluate(x, y, verbose=0, return_dict=True),
                      plain_evaluate(model, x, y, **first))
    second = dict(optimizer="adam", loss="mse", metrics=["mae", "binary_accuracy"])
    model.compile(**second, exchange=exchange)
    assert_logs_close(model.evaluate(x, y, verbose=0, return_dict=True),
                      plain_evaluate(model, x, y, **second))
    # fit's validation too, after the compile: the same numbers as evaluate.
    history = model.fit(x, y, epochs=1, batch_size=32, verbose=0, validation_data=(x, y))
    want = plain_evaluate(model, x, y, **second)
    assert history.history["val_mae"][0] == pytest.approx(want["mae"], rel=1e-5)
    assert history.history["val_loss"][0] == pytest.approx(want["loss"], rel=1e-5)


def fine_tune(exchange: str):
    """keras.io's transfer-learning flow: a frozen base, its head trained, then
    the base unfrozen and compiled again with a small learning rate."""
    x, y = data(512)
    keras.utils.set_random_seed(3)
    base = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.BatchNormalization()])
    inputs = keras.Input((6,))
    outputs = keras.layers.Dense(1, activation="sigmoid")(base(inputs, training=False))
    model = ke.wrap(keras.Model(inputs, outputs))
    base.trainable = False
    model.compile(keras.optimizers.Adam(1e-2), "binary_crossentropy", exchange=exchange)
    model.fit(x, y, epochs=2, batch_size=32, verbose=0)
    frozen = [w.copy() for w in base.get_weights()]
    base.trainable = True
    model.compile(keras.optimizers.Adam(1e-3), "binary_crossentropy",
                  metrics=["binary_accuracy"], exchange=exchange)
    model.fit(x, y, epochs=2, batch_size=32, verbose=0)
    return model, base, frozen


@pytest.mark.parametrize("exchange", EXCHANGES)
def test_fine_tuning_trains_the_unfrozen_base_with_the_new_optimizer(
        embedded_cluster, exchange):
    model, base, frozen = fine_tune(exchange)
    kernel_before, kernel_after = frozen[0], base.get_weights()[0]
    assert np.abs(kernel_after - kernel_before).max() > 1e-3  # the base trained
    assert float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)) == (
        pytest.approx(1e-3))
    # What the servers hold is the model: a pull changes nothing.
    session = ke.model.session_of(model)
    weights = [w.copy() for w in model.get_weights()]
    session.pull()
    for before, after in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(before, after)


class RestoreAtTrainEnd(keras.callbacks.Callback):
    """keras.io's EarlyStoppingAtMinLoss' restore: `set_weights` at train end."""

    def on_train_end(self, logs=None):
        self.restored = [np.full_like(w, 0.125) for w in self.model.get_weights()]
        self.model.set_weights(self.restored)


@pytest.mark.parametrize("exchange", EXCHANGES)
def test_weights_a_callback_restores_stay_after_fit(embedded_cluster, exchange):
    x, y = data()
    model = ke.wrap(make_model())
    model.compile("adam", "binary_crossentropy", exchange=exchange)
    restore = RestoreAtTrainEnd()
    model.fit(x, y, epochs=2, batch_size=32, verbose=0, callbacks=[restore])
    for want, got in zip(restore.restored, model.get_weights()):
        np.testing.assert_array_equal(got, want)
    # ... and are the servers': evaluate (which takes the servers' values) agrees.
    assert model.evaluate(x, y, verbose=0) == pytest.approx(
        plain_evaluate(model, x, y, loss="binary_crossentropy")["loss"], rel=1e-5)


@pytest.mark.parametrize("exchange", EXCHANGES)
def test_early_stopping_restores_the_best_epoch(embedded_cluster, exchange):
    """`EarlyStopping(restore_best_weights=True)`: the weights after fit are the
    best epoch's (saved by the callback), not the last epoch's."""
    x, y = data()
    model = ke.wrap(make_model())
    model.compile(keras.optimizers.SGD(0.5), "binary_crossentropy", exchange=exchange)
    snapshots = []
    keep = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: snapshots.append(model.get_weights()))
    # patience 0 and a min_delta no epoch can reach: the first epoch is the best.
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=1, min_delta=10.0,
                                         restore_best_weights=True)
    history = model.fit(x, y, epochs=5, batch_size=16, verbose=0, callbacks=[keep, stop])
    assert len(history.history["loss"]) == 2
    assert not all(np.array_equal(a, b) for a, b in zip(snapshots[0], snapshots[1]))
    for want, got in zip(snapshots[0], model.get_weights()):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("exchange", EXCHANGES)
def test_set_weights_between_calls_reach_evaluate_and_the_next_fit(
        embedded_cluster, exchange):
    x, y = data()
    model = ke.wrap(make_model())
    model.compile("sgd", "binary_crossentropy", exchange=exchange)
    model.fit(x, y, epochs=1, batch_size=32, verbose=0)
    chosen = [np.full_like(w, 0.25) for w in model.get_weights()]
    model.set_weights(chosen)
    assert model.evaluate(x, y, verbose=0) == pytest.approx(
        plain_evaluate(model, x, y, loss="binary_crossentropy")["loss"], rel=1e-5)
    for want, got in zip(chosen, model.get_weights()):
        np.testing.assert_array_equal(got, want)
    # A fit of zero-rate SGD leaves the assigned weights as they are.
    model.compile(keras.optimizers.SGD(0.0), "binary_crossentropy", exchange=exchange)
    model.fit(x, y, epochs=1, batch_size=32, verbose=0)
    for want, got in zip(chosen, model.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-7)


HOOKS = ["on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
         "on_test_begin", "on_test_end", "on_test_batch_begin", "on_test_batch_end"]


class Recorder(keras.callbacks.Callback):
    """Every epoch and test hook, with the log keys it got."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __getattribute__(self, name):
        if name in HOOKS:
            def record(*args, logs=None):
                if args and isinstance(args[-1], dict):
                    logs = args[-1]
                self.calls.append((name, tuple(sorted(logs or ()))))
            return record
        return super().__getattribute__(name)


def hook_calls(model: keras.Model, **fit_args) -> list:
    x, y = data(128)
    model.compile("adam", "binary_crossentropy", metrics=["binary_accuracy"])
    recorder = Recorder()
    model.fit(x, y, epochs=3, batch_size=32, verbose=0, callbacks=[recorder], **fit_args)
    return recorder.calls


@pytest.mark.parametrize("fit_args", [
    dict(validation_split=0.25),
    dict(validation_data=data(64, seed=5), validation_freq=2),
    dict(validation_data=data(64, seed=5), validation_steps=1)],
    ids=["split", "freq", "steps"])
def test_fit_validation_calls_the_test_hooks_as_keras_does(embedded_cluster, fit_args):
    want = hook_calls(make_model(), **fit_args)
    got = hook_calls(ke.wrap(make_model()), **fit_args)
    assert got == want
    assert any(name == "on_test_batch_end" for name, _ in got)
    assert got[-1][0] == "on_train_end"
    if "validation_freq" not in fit_args:  # (else the last epoch validates not)
        assert "val_loss" in got[-1][1]


class OwnTestStep(keras.Sequential):
    """keras.io's "providing your own evaluation step": its logs are
    `{"loss": ..., "compile_metrics": {"mae": ...}}`, nested."""

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        loss = self.compute_loss(y=y, y_pred=y_pred)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def test_an_own_test_step_with_nested_logs_reports_the_job_metrics(embedded_cluster):
    """Keras returns such a step's last logs, flattened; each is the metric's
    result over all the data, not the last task's (the MAE was)."""
    x, y = data(1000)

    def build():
        keras.utils.set_random_seed(3)
        model = OwnTestStep([keras.Input((6,)), keras.layers.Dense(1)])
        model.compile(loss="mse", metrics=["mae"])
        return model

    want = build().evaluate(x, y, verbose=0, return_dict=True)
    model = ke.wrap(build())
    assert_logs_close(model.evaluate(x, y, verbose=0, return_dict=True), want)
    registered = embedded_cluster.master.job_status().datasets
    assert max(d.tasks_per_epoch for d in registered.values()) > 1  # several tasks


def two_in_two_out(seed: int = 7) -> keras.Model:
    """The built-in-training guide's model: image and time-series inputs, a
    score and a class output."""
    keras.utils.set_random_seed(seed)
    image = keras.Input((8, 8, 3), name="img_input")
    series = keras.Input((5, 4), name="ts_input")
    a = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(3, 3)(image))
    b = keras.layers.GlobalAveragePooling1D()(keras.layers.Conv1D(3, 3)(series))
    merged = keras.layers.concatenate([a, b])
    score = keras.layers.Dense(1, name="score_output")(merged)
    classes = keras.layers.Dense(5, name="class_output")(merged)
    model = keras.Model([image, series], [score, classes])
    model.compile(optimizer="rmsprop",
                  loss=[keras.losses.MeanSquaredError(),
                        keras.losses.CategoricalCrossentropy(from_logits=True)])
    return model


def guide_arrays(n: int = 96):
    rng = np.random.default_rng(11)
    img = rng.random((n, 8, 8, 3)).astype("float32")
    ts = rng.random((n, 5, 4)).astype("float32")
    score = rng.random((n, 1)).astype("float32")
    classes = rng.integers(0, 2, (n, 5)).astype("float32")
    return img, ts, score, classes


def test_python_lists_are_nests_as_in_keras(embedded_cluster):
    """`fit([img, ts], [score, classes])` as keras.io's guide writes it (lists
    were stacked into one tensor: `Shapes of all inputs must match`)."""
    img, ts, score, classes = guide_arrays()
    model = ke.wrap(two_in_two_out())
    plain = two_in_two_out()
    assert model.evaluate([img, ts], [score, classes], verbose=0) == pytest.approx(
        plain.evaluate([img, ts], [score, classes], verbose=0), rel=1e-5)
    history = model.fit([img, ts], [score, classes], batch_size=32, epochs=1, verbose=0,
                        validation_split=0.25)
    assert ke.model.session_of(model).connected  # trained on the cluster
    assert {"loss", "val_loss"} <= set(history.history)
    # A dict by input names is the same data.
    by_name = model.evaluate({"img_input": img, "ts_input": ts}, [score, classes],
                             verbose=0)
    assert by_name == pytest.approx(model.evaluate([img, ts], (score, classes),
                                                   verbose=0), rel=1e-6)


def test_tensors_and_dataframes_are_arrays(embedded_cluster):
    """A tf.Tensor label (`keras.ops.one_hot(...)`, the guide's) and pandas
    columns train on the cluster as NumPy arrays would (they fell back to
    Keras' own loop, silently)."""
    import pandas as pd

    x, y = data()
    labels = y.astype("int64")
    model = ke.wrap(keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)]))
    model.compile("sgd", keras.losses.CategoricalCrossentropy(from_logits=True))
    want = model.evaluate(x, keras.utils.to_categorical(labels, 2), verbose=0)
    one_hot = keras.ops.one_hot(labels, 2)
    assert model.evaluate(tf_constant(x), one_hot, verbose=0) == pytest.approx(want)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(6)])
    assert model.evaluate(frame, one_hot, verbose=0) == pytest.approx(want)
    model.fit(frame, one_hot, batch_size=32, epochs=1, verbose=0)
    # Each call ran on the cluster: its data registered as tasks.
    registered = embedded_cluster.master.job_status().datasets
    assert {"evaluate_arrays", "evaluate_arrays@2", "evaluate_arrays@3",
            "fit_arrays"} <= set(registered), sorted(registered)


def tf_constant(x):
    import tensorflow as tf

    return tf.constant(x)


def test_a_sparse_leaf_trains_with_keras_loop_embedded_and_is_named(
        embedded_cluster, caplog):
    import logging

    import tensorflow as tf

    x, y = data(64)
    model = ke.wrap(keras.Sequential([keras.Input((6,), sparse=True),
                                      keras.layers.Dense(1)]))
    model.compile("sgd", "mse")
    with caplog.at_level(logging.WARNING, logger="absl"):
        model.fit(tf.sparse.from_dense(x), y, batch_size=16, epochs=1, verbose=0)
    assert "x is a tensorflow.SparseTensor" in caplog.text, caplog.text
    assert "training with Keras' own loop" in caplog.text


def table_model() -> keras.Model:
    """A model whose only trained weights are a server table's rows."""
    inputs = keras.Input((3,), dtype="int64")
    rows = ke.layers.Embedding(1000, 1)(inputs)
    outputs = keras.layers.Activation("sigmoid")(
        keras.ops.sum(rows, axis=(1, 2))[:, None])
    model = ke.Model(inputs, outputs)
    model.compile(keras.optimizers.Adagrad(0.5), "binary_crossentropy")
    return model


def table_data():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 1000, (512, 3))
    return ids, (ids.sum(axis=1) % 2).astype("float32")


def test_a_model_trains_whose_only_weights_are_server_tables(embedded_cluster):
    """(It failed at trace: the step's exchange returned no value.)"""
    ids, y = table_data()
    model = table_model()
    history = model.fit(ids, y, epochs=3, batch_size=32, verbose=0)
    loss = history.history["loss"]
    assert loss[-1] < loss[0] - 0.05, loss  # the rows learn the ids' parity


def test_a_second_model_with_server_tables_in_one_process(embedded_cluster):
    """A notebook's second model gets tables of its own (they were refused:
    "one model with server tables per job"), starting from the initializer
    as the first model's did, not from the first model's trained rows."""
    ids, y = table_data()
    first = table_model()
    untrained = first.evaluate(ids, y, verbose=0)
    first.fit(ids, y, epochs=3, batch_size=32, verbose=0)
    trained = first.evaluate(ids, y, verbose=0)
    second = table_model()
    assert second.evaluate(ids, y, verbose=0) == pytest.approx(untrained, rel=1e-6)
    second.fit(ids, y, epochs=3, batch_size=32, verbose=0)
    assert second.evaluate(ids, y, verbose=0) < untrained - 0.05
    assert first.evaluate(ids, y, verbose=0) == pytest.approx(trained, rel=1e-6)


class BatchPairs(keras.callbacks.Callback):
    """The train batch hooks in order: ("begin"|"end", batch index)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def on_train_batch_begin(self, batch, logs=None):
        self.calls.append(("begin", batch))

    def on_train_batch_end(self, batch, logs=None):
        self.calls.append(("end", batch))


@pytest.mark.parametrize("exchange", EXCHANGES)
def test_every_train_batch_begin_has_its_end(embedded_cluster, exchange):
    """As Keras on data of known size: a batch's on_train_batch_begin is
    called only for a batch that exists (it was called once more at each
    epoch's end, with no on_train_batch_end)."""
    x, y = data(200)
    model = ke.wrap(make_model())
    model.compile("sgd", "binary_crossentropy", exchange=exchange)
    pairs = BatchPairs()
    model.fit(x, y, epochs=2, batch_size=32, verbose=0, callbacks=[pairs])
    calls = pairs.calls
    assert calls[0::2] == [("begin", b) for _, b in calls[1::2]], calls
    assert [kind for kind, _ in calls[1::2]] == ["end"] * (len(calls) // 2), calls
    assert len(calls) % 2 == 0 and calls.count(("begin", 0)) == 2, calls


def test_a_model_built_in_a_distribution_strategy_is_refused_clearly(embedded_cluster):
    """keras-elastic's workers and servers are the distribution: a model whose
    variables a tf.distribute strategy holds gets an error saying so (its
    step was called on the strategy's per-replica batch: a TensorFlow
    ValueError about positional arguments)."""
    import tensorflow as tf

    x, y = data(64)
    with tf.distribute.MirroredStrategy(["CPU:0"]).scope():
        model = ke.wrap(make_model())
        model.compile("sgd", "binary_crossentropy")
    with pytest.raises(ValueError, match="built in a MirroredStrategy scope.*outside "
                                         "the strategy's scope"):
        model.fit(x, y, batch_size=16, verbose=0)

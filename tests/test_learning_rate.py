"""Learning-rate changes made on a worker reach the parameter servers (issue 13).

The servers apply the optimizer; a worker's `keras.callbacks.
LearningRateScheduler` / `ReduceLROnPlateau` set the rate of its own copy,
which goes to every server with the next push. Real gRPC servers in the test
process (the embedded cluster or `start_cluster`), a real worker process for
the worker that connects later, real TensorFlow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from conftest import subprocess_env
from support.tfrecord_data import make_arrays

import keras_elastic as ke
from keras_elastic.checkpoint.ps_manifest import write_ps_manifest
from keras_elastic.common.variable_keys import model_variables, variable_keys
from keras_elastic.ps import ParameterServer, PSClient
from keras_elastic.ps.checkpoint_part import init_from_checkpoint, restore_shard, save_shard
from keras_elastic.ps.store import ParameterStore
from keras_elastic.ps.update import Update
from keras_elastic.worker.hyperparameters import HyperparameterError

TESTS = os.path.dirname(os.path.abspath(__file__))


def build(cls, optimizer, seed: int = 3, **compile_args):
    keras.utils.set_random_seed(seed)
    model = cls([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                 keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  **compile_args)
    return model


def server_values(servers) -> dict[str, np.ndarray]:
    values = {}
    for server in servers:
        values.update(server.store.values_since(-1))
    return values


def server_rates(servers) -> list[float]:
    return [server.store.hyperparameters()["learning_rate"] for server in servers]


def f32(x: float) -> float:
    return float(np.float32(x))


@pytest.mark.parametrize("exchange", ["sync", "pipelined"])
def test_a_learning_rate_of_zero_leaves_the_servers_weights_unchanged(
        start_cluster, exchange):
    _, servers = start_cluster(2)
    x, y = make_arrays(256)
    model = build(ke.Sequential, keras.optimizers.SGD(0.1, momentum=0.9),
                  exchange=exchange)
    initial = {k: np.array(v.numpy()) for k, v in zip(variable_keys(model),
                                                       model_variables(model))}
    history = model.fit(ke.ElasticDataset((x, y), batch_size=32, minibatches_per_task=2),
                        epochs=2, verbose=0, callbacks=[
                            keras.callbacks.LearningRateScheduler(lambda e, lr: 0.0)])
    assert history.history["learning_rate"] == [0.0, 0.0]
    assert server_rates(servers) == [0.0, 0.0]
    # Both servers own variables, and every update was one of rate 0.
    assert all(s.store.variables for s in servers)
    assert all(int(s.store.optimizer.iterations.numpy()) == 16 for s in servers)
    on_servers = server_values(servers)
    assert set(on_servers) == set(initial)
    for key, value in initial.items():
        np.testing.assert_array_equal(on_servers[key], value, err_msg=key)
    for key, variable in zip(variable_keys(model), model_variables(model)):
        np.testing.assert_array_equal(variable.numpy(), initial[key], err_msg=key)


def test_a_scheduled_change_at_epoch_2_equals_plain_keras(embedded_cluster):
    x, y = make_arrays(256)

    def schedule(epoch, lr):
        return 0.1 if epoch < 2 else 0.02

    plain, elastic = (build(keras.Sequential, keras.optimizers.SGD(0.1)),
                      build(ke.Sequential, keras.optimizers.SGD(0.1)))
    plain.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0,
              callbacks=[keras.callbacks.LearningRateScheduler(schedule)])
    history = elastic.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0,
                          callbacks=[keras.callbacks.LearningRateScheduler(schedule)])
    assert history.history["learning_rate"] == pytest.approx([0.1, 0.1, 0.02])
    for a, b in zip(plain.get_weights(), elastic.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert server_rates(embedded_cluster._servers[:1]) == [f32(0.02)]
    # The change matters: without it the weights differ.
    unchanged = build(keras.Sequential, keras.optimizers.SGD(0.1))
    unchanged.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0)
    assert not all(np.allclose(a, b, atol=1e-4) for a, b in zip(
        unchanged.get_weights(), elastic.get_weights()))


NEW_WORKER = """
import json
import keras
import keras_elastic as ke
from support.tfrecord_data import make_arrays

keras.utils.set_random_seed(3)
model = ke.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                       keras.layers.Dense(2, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.1),  # the script's own rate
              loss="sparse_categorical_crossentropy")
seen = {}
record = keras.callbacks.LambdaCallback(
    on_train_begin=lambda logs: seen.update(
        begin=float(model.optimizer.learning_rate)))
x, y = make_arrays(64, seed=1)
model.fit(ke.ElasticDataset((x, y), batch_size=32, name="more"), epochs=1, verbose=0,
          callbacks=[record])
seen["end"] = float(model.optimizer.learning_rate)
print("SEEN " + json.dumps(seen))
"""


@pytest.mark.multiprocess
def test_reduce_lr_on_plateau_reaches_the_servers_and_a_new_worker_adopts_it(
        start_cluster):
    cluster, servers = start_cluster(2)
    x, y = make_arrays(256)
    model = build(ke.Sequential, keras.optimizers.SGD(0.1))
    # min_delta larger than any improvement: the rate halves at the end of
    # epochs 1 and 2 (the last change after the last push).
    history = model.fit(
        ke.ElasticDataset((x, y), batch_size=32, minibatches_per_task=2), epochs=3,
        verbose=0, callbacks=[keras.callbacks.ReduceLROnPlateau(
            monitor="loss", factor=0.5, patience=0, min_delta=100.0)])
    lowered = float(model.optimizer.learning_rate)
    assert lowered == f32(f32(0.1 * 0.5) * 0.5)
    # (ReduceLROnPlateau logs the rate of the epoch, then lowers it.)
    assert history.history["learning_rate"] == pytest.approx([0.1, 0.1, 0.05])
    assert server_rates(servers) == [lowered, lowered]
    status = cluster.ps.status_all()
    assert [s.hyperparameters for s in status] == [{"learning_rate": lowered}] * 2

    # A worker process that connects now, with SGD(0.1) in its script, trains
    # with the servers' lowered rate (and its logs say so), and leaves it.
    # This process's worker leaves the job first (its script is done): the new
    # worker is then the chief, instead of waiting 60 s, twice, for this one
    # to start and end a fit of its dataset too (the followers' wait).
    cluster.master.worker_exited()
    env = subprocess_env(KERAS_ELASTIC_MASTER=cluster.master_address,
                         KERAS_ELASTIC_PS=",".join(cluster.ps_addresses),
                         KERAS_ELASTIC_WORKER_ID="1")
    env["PYTHONPATH"] = TESTS + os.pathsep + env["PYTHONPATH"]
    result = subprocess.run([sys.executable, "-c", NEW_WORKER], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    seen = json.loads(result.stdout.split("SEEN ")[-1])
    assert seen == {"begin": lowered, "end": lowered}
    assert server_rates(servers) == [lowered, lowered]


def test_a_learning_rate_schedule_runs_on_the_servers_iteration_count(
        embedded_cluster):
    x, y = make_arrays(256)

    def schedule():
        return keras.optimizers.schedules.ExponentialDecay(0.2, decay_steps=3,
                                                           decay_rate=0.5)

    plain = build(keras.Sequential, keras.optimizers.SGD(schedule()))
    elastic = build(ke.Sequential, keras.optimizers.SGD(schedule()))
    plain.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    elastic.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(plain.get_weights(), elastic.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    store = embedded_cluster._servers[0].store
    assert int(store.optimizer.iterations.numpy()) == 16
    assert store.hyperparameters() == {}  # nothing settable: a schedule
    # Setting the rate of a scheduled optimizer is refused, as in Keras.
    with pytest.raises(TypeError, match="created with a `LearningRateSchedule`.*"
                       "hence its learning rate is not settable"):
        elastic.fit(ke.ElasticDataset((x, y), batch_size=32, name="again"), epochs=1,
                    verbose=0, callbacks=[keras.callbacks.LearningRateScheduler(
                        lambda e, lr: 0.01)])
    assert int(store.optimizer.iterations.numpy()) == 16


def test_servers_with_a_schedule_refuse_a_learning_rate_from_a_worker():
    server = ParameterServer()
    client = PSClient([server.address])
    try:
        config = keras.optimizers.serialize(keras.optimizers.SGD(
            keras.optimizers.schedules.ExponentialDecay(0.2, 3, 0.5)))
        client.init({"w": (np.ones(2, np.float32), True)}, config)
        with pytest.raises(ValueError) as e:  # INVALID_ARGUMENT, named
            client.send(Update(grads={"w": np.ones(2, np.float32)},
                               hyperparameters={"learning_rate": 0.01}))
        assert "`LearningRateSchedule` (ExponentialDecay)" in str(e.value)
        assert "not settable" in str(e.value) and "float `learning_rate`" in str(e.value)
        np.testing.assert_array_equal(server.store.values_since(-1)["w"], [1, 1])
        assert server.store.version == 0
    finally:
        client.close()
        server.stop(0)


def test_other_hyperparameters_changed_on_a_worker_are_refused(embedded_cluster):
    x, y = make_arrays(128)
    model = build(ke.Sequential, keras.optimizers.SGD(0.1, momentum=0.9))

    def change_momentum(epoch, logs):
        if epoch == 1:
            model.optimizer.momentum = 0.5

    with pytest.raises(HyperparameterError, match=r"optimizer\.momentum changed on "
                       r"this worker \(0\.9 -> 0\.5\).*a compiled Keras fit ignores "
                       "such a change too.*Build the optimizer with the momentum you "
                       "want"):
        model.fit(x, y, batch_size=32, epochs=3, verbose=0, callbacks=[
            keras.callbacks.LambdaCallback(on_epoch_begin=change_momentum)])
    # Refused before any update of epoch 1 (4 steps an epoch).
    assert embedded_cluster._servers[0].store.version == 4


def test_embedding_rows_and_buffered_gradients_take_the_pushed_rate():
    sgd = {"class_name": "SGD", "config": {"learning_rate": 0.1}}
    store = ParameterStore()
    store.init({"w": np.zeros(2, np.float32)}, {"w": True}, sgd,
               tables={"t": {"dim": 2, "input_dim": 10, "initializer": "zeros"}})
    ids, rows = np.array([3], np.int64), np.ones((1, 2), np.float32)
    # The row-wise update uses the dense update's rate: the one just pushed.
    store.push(Update(grads={"w": np.ones(2, np.float32)}, rows={"t": (ids, rows)},
                      hyperparameters={"learning_rate": 0.0}), 0)
    assert store.lookup({"t": ids})["t"].tolist() == [[0.0, 0.0]]
    assert store.values_since(-1)["w"].tolist() == [0.0, 0.0]
    store.push(Update(grads={"w": np.ones(2, np.float32)}, rows={"t": (ids, rows)},
                      hyperparameters={"learning_rate": 0.5}), 1)
    assert store.lookup({"t": ids})["t"].tolist() == [[-0.5, -0.5]]
    assert store.values_since(-1)["w"].tolist() == [-0.5, -0.5]
    # grads_to_wait=2: the mean of the buffer, with the rate at its update.
    averaging = ParameterStore(grads_to_wait=2)
    averaging.init({"w": np.zeros(1, np.float32)}, {"w": True}, sgd)
    averaging.push(Update(grads={"w": np.ones(1, np.float32)}), 0)
    averaging.push(Update(grads={"w": np.full(1, 3, np.float32)},
                          hyperparameters={"learning_rate": 0.5}), 0)
    assert averaging.values_since(-1)["w"].tolist() == [-1.0]  # 0 - 0.5 * 2


def _save(store_or_client, directory) -> str:
    """A complete parameter-server checkpoint in `directory`, as the launcher's
    automatic checkpoints write it."""
    if isinstance(store_or_client, ParameterStore):
        parts = [save_shard(store_or_client, 0, 1, directory)]
    else:
        parts = store_or_client.save_all(directory)
    write_ps_manifest(directory, directory, parts, progress=None, sequence=0)
    return directory


def test_the_learning_rate_is_in_checkpoints_and_survives_recovery(tmp_path):
    sgd = {"class_name": "SGD", "config": {"learning_rate": 0.1}}
    store = ParameterStore()
    store.init({"w": np.ones(2, np.float32)}, {"w": True}, sgd)
    store.push(Update(grads={"w": np.ones(2, np.float32)},
                      hyperparameters={"learning_rate": 0.025}), 0)
    np.testing.assert_allclose(store.values_since(-1)["w"], [0.975, 0.975])
    path = _save(store, str(tmp_path / "ckpt"))
    # A server restarted after a crash is built from the checkpoint...
    restarted = ParameterStore()
    init_from_checkpoint(restarted, 0, 1, path)
    assert restarted.hyperparameters() == {"learning_rate": f32(0.025)}
    restarted.push(Update(grads={"w": np.ones(2, np.float32)}), 1)
    np.testing.assert_allclose(restarted.values_since(-1)["w"], [0.95, 0.95])
    # ... and a live one rolled back to it takes the checkpoint's rate.
    store.push(Update(grads={"w": np.ones(2, np.float32)},
                      hyperparameters={"learning_rate": 0.5}), 1)
    restore_shard(store, 0, 1, path)
    assert store.hyperparameters() == {"learning_rate": f32(0.025)}


def _two_servers():
    from keras_elastic.ps import ps_for

    servers = [ParameterServer(partition=i, num_partitions=2) for i in range(2)]
    client = PSClient([s.address for s in servers])
    names = [next(f"w{i}" for i in range(100) if ps_for(f"w{i}", 2) == k)
             for k in range(2)]
    return servers, client, names


def test_a_change_is_sent_once_to_every_server_even_one_the_push_skips():
    servers, client, (w, _) = _two_servers()
    try:
        client.init({w: (np.ones(2, np.float32), True)},
                    {"class_name": "SGD", "config": {"learning_rate": 0.1}})
        assert not servers[1].store.variables  # server 1 owns nothing
        pushes = [s.store.pushes for s in servers]
        # Unchanged: nothing more is sent.
        client.send(Update(grads={w: np.ones(2, np.float32)},
                           hyperparameters={"learning_rate": f32(0.1)}))
        assert [s.store.pushes for s in servers] == [pushes[0] + 1, pushes[1]]
        # Changed: both servers take it, server 1 in an empty push of its own,
        # and server 0 applies the push's gradient with it.
        reply = client.send(Update(grads={w: np.ones(2, np.float32)},
                                   hyperparameters={"learning_rate": 0.5}))
        assert sorted(reply.statuses) == [0, 1] and reply.accepted
        assert server_rates(servers) == [0.5, 0.5]
        np.testing.assert_allclose(servers[0].store.values_since(-1)[w], [0.4, 0.4])
        client.send(Update(grads={w: np.ones(2, np.float32)},
                           hyperparameters={"learning_rate": 0.5}))
        assert [s.store.pushes for s in servers] == [pushes[0] + 3, pushes[1] + 1]
    finally:
        client.close()
        for s in servers:
            s.stop(0)


def test_after_a_restore_the_workers_rate_is_sent_again(tmp_path):
    servers, client, (w, v) = _two_servers()
    try:
        client.init({w: (np.ones(2, np.float32), True),
                     v: (np.ones(2, np.float32), True)},
                    {"class_name": "SGD", "config": {"learning_rate": 0.1}})
        grads = {w: np.ones(2, np.float32), v: np.ones(2, np.float32)}
        client.send(Update(grads=grads, hyperparameters={"learning_rate": 0.5}))
        path = _save(client, str(tmp_path / "ckpt"))
        client.send(Update(grads=grads, hyperparameters={"learning_rate": 0.25}))
        client.restore_all(path)  # a rollback
        assert server_rates(servers) == [0.5, 0.5]
        # The first push after it shows the client the servers' new state (it
        # is applied with the checkpoint's rate); the next one carries the
        # worker's rate again.
        client.send(Update(grads=grads, hyperparameters={"learning_rate": 0.25}))
        assert server_rates(servers) == [0.5, 0.5]
        client.send(Update(grads=grads, hyperparameters={"learning_rate": 0.25}))
        assert server_rates(servers) == [0.25, 0.25]
    finally:
        client.close()
        for s in servers:
            s.stop(0)


ZOO_MODULE = '''
# ElasticDL model-zoo style: the rate comes from ElasticDL's LearningRateScheduler.
import keras
import tensorflow as tf

from elasticdl.python.common.constants import Mode
from elasticdl.python.elasticdl.callbacks import LearningRateScheduler


def custom_model():
    keras.utils.set_random_seed(11)
    inputs = tf.keras.Input(shape=(8, 8), name="image")
    hidden = tf.keras.layers.Dense(16, activation="relu")(
        tf.keras.layers.Flatten()(inputs))
    return tf.keras.Model(inputs=inputs, outputs=tf.keras.layers.Dense(10)(hidden))


def loss(labels, predictions):
    labels = tf.reshape(labels, [-1])
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        logits=predictions, labels=labels))


def optimizer(lr=0.1):
    return tf.optimizers.SGD(lr)


def callbacks():
    return [LearningRateScheduler(lambda model_version: 0.0)]


def dataset_fn(dataset, mode, _):
    def parse(record):
        r = tf.io.parse_single_example(record, {
            "image": tf.io.FixedLenFeature([8, 8], tf.float32),
            "label": tf.io.FixedLenFeature([1], tf.int64)})
        return {"image": r["image"] / 16.0}, tf.cast(r["label"], tf.int32)

    assert mode == Mode.TRAINING
    return dataset.map(parse)
'''


@pytest.mark.multiprocess
def test_elasticdl_learning_rate_scheduler_of_zero_leaves_the_weights(tmp_path):
    """`keras-elastic train` of a model-zoo module whose callbacks() return
    ElasticDL's LearningRateScheduler: a schedule of 0.0 (optimizer() says 0.1)
    leaves every weight as initialized."""
    import tensorflow as tf

    from keras_elastic.checkpoint import ps_layout
    from keras_elastic.jobs.model_def import load_model_def

    zoo = tmp_path / "zoo"
    (zoo / "lrzero").mkdir(parents=True)
    (zoo / "__init__.py").write_text("")
    (zoo / "lrzero" / "__init__.py").write_text("")
    (zoo / "lrzero" / "lr_zero.py").write_text(ZOO_MODULE)
    data = tmp_path / "train"
    data.mkdir()
    rng = np.random.default_rng(0)
    for shard in range(2):
        with tf.io.TFRecordWriter(str(data / f"train-{shard:05d}.tfrecord")) as w:
            for _ in range(80):
                w.write(tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(float_list=tf.train.FloatList(
                        value=rng.integers(0, 17, 64).astype(np.float32))),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(
                        value=[int(rng.integers(0, 10))]))})).SerializeToString())
    result = subprocess.run(
        [sys.executable, "-m", "keras_elastic", "train", f"--model_zoo={zoo}",
         "--model_def=lrzero.lr_zero.custom_model", f"--training_data={data}",
         "--num_epochs=2", "--minibatch_size=16", "--num_minibatches_per_task=4",
         "--num_workers=1", "--num_ps=1", "--log_level=INFO",
         f"--checkpoint_dir={tmp_path / 'ckpt'}", "--checkpoint_steps=0",
         f"--job_dir={tmp_path / 'job'}"],
        env=subprocess_env(), capture_output=True, text=True, timeout=600,
        cwd=os.path.dirname(TESTS))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "learning_rate_scheduler (from callbacks(): LearningRateScheduler)" in out
    saved = ps_layout.read_values(ke.checkpoint.latest(str(tmp_path / "ckpt")))
    iterations = [v for n, v in saved.items() if n.endswith("iteration")]
    assert iterations and int(iterations[0]) >= 20  # 2 epochs of 10 batches (or more)
    _, model_fn, _ = load_model_def("lrzero.lr_zero.custom_model", str(zoo))
    initial = model_fn()
    for key, variable in zip(variable_keys(initial), model_variables(initial)):
        np.testing.assert_array_equal(saved[ps_layout.variable_name(key)],
                                      variable.numpy(), err_msg=key)


def test_servers_keep_their_rate_from_before_a_phases_first_change():
    """Over gRPC: the first push of a phase (the sync points a worker passed)
    that changes the rate keeps the rate from before it, which a pull reports
    to a worker that starts that phase late; later changes of the phase keep
    it, a new phase's first change replaces it, and a restore forgets it."""
    server = ParameterServer()
    chief, late = PSClient([server.address], worker_id=0), PSClient(
        [server.address], worker_id=1)
    try:
        config = keras.optimizers.serialize(keras.optimizers.SGD(0.04))
        chief.init({"w": (np.ones(2, np.float32), True)}, config)
        late.pull()
        chief.phase = late.phase = 1
        assert late.hyperparameters_at_phase_start() == [
            {"learning_rate": pytest.approx(0.04)}]
        for rate in (0.02, 0.01):  # two changes in phase 1
            chief.send(Update(grads={"w": np.ones(2, np.float32)},
                              hyperparameters={"learning_rate": rate}))
        late.pull()
        assert late.server_hyperparameters == [{"learning_rate": pytest.approx(0.01)}]
        assert late.hyperparameters_at_phase_start() == [
            {"learning_rate": pytest.approx(0.04)}]
        # A worker already in phase 2 (none changed it there) takes the rate now.
        late.phase = 2
        assert late.hyperparameters_at_phase_start() == [
            {"learning_rate": pytest.approx(0.01)}]
        chief.phase = 2
        chief.send(Update(hyperparameters={"learning_rate": 0.005}))
        late.pull()
        assert late.hyperparameters_at_phase_start() == [
            {"learning_rate": pytest.approx(0.01)}]
        server.store.mark_restored("elsewhere")
        late.pull()
        assert late.hyperparameters_at_phase_start() == [
            {"learning_rate": pytest.approx(0.005)}]
    finally:
        chief.close()
        late.close()
        server.stop(0)

"""ke.Model / ke.Sequential / ke.wrap training on an embedded cluster.

The embedded cluster is real: a master and a parameter server serving gRPC on
127.0.0.1 inside the test process.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from support.tfrecord_data import dataset_fn, make_arrays, write_shards

import keras_elastic as ke
from keras_elastic.ps.update import Update


def functional(cls=keras.Model, seed=1):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, activation="relu")(inputs)
    h = keras.layers.BatchNormalization()(h)
    outputs = keras.layers.Dense(2, activation="softmax")(h)
    model = cls(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_one_epoch_equals_plain_keras_fit_on_tfrecords(tmp_path, embedded_cluster):
    x, y = make_arrays(512)
    files = write_shards(str(tmp_path), x, y, num_shards=2)  # 256 records each
    plain = functional()
    plain.fit(tf.data.TFRecordDataset(files).map(
        lambda r: dataset_fn(tf.data.Dataset.from_tensors(r), None).get_single_element()
    ).batch(32), epochs=1, verbose=0)
    elastic = functional(ke.Model)
    elastic.fit(ke.ElasticDataset(files, dataset_fn=dataset_fn, batch_size=32,
                                  minibatches_per_task=4), epochs=1, verbose=0)
    for a, b in zip(plain.get_weights(), elastic.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    status = embedded_cluster.master.status()["datasets"]["training"]
    assert status["tasks_done_total"] == 4 and status["finished"]


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.out = keras.layers.Dense(2, activation="softmax")

    def call(self, x, training=False):
        return self.out(self.hidden(x))


@pytest.mark.parametrize("kind", ["sequential", "subclassed", "wrapped_functional"])
def test_every_kind_of_model_trains_and_matches_plain_keras(kind, embedded_cluster):
    x, y = make_arrays(256)

    def build(elastic: bool):
        keras.utils.set_random_seed(3)
        if kind == "sequential":
            cls = ke.Sequential if elastic else keras.Sequential
            model = cls([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                         keras.layers.Dense(2, activation="softmax")])
        elif kind == "subclassed":
            model = Subclassed()
            model = ke.wrap(model) if elastic else model
        else:
            model = functional(seed=3)
            model = ke.wrap(model) if elastic else model
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss="sparse_categorical_crossentropy")
        return model

    plain, elastic = build(False), build(True)
    plain.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    # NumPy arrays become an ElasticDataset (shuffle=False keeps the order).
    history = elastic.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    assert ke.model.is_elastic(elastic)
    assert len(history.history["loss"]) == 2
    for a, b in zip(plain.get_weights(), elastic.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_dataset_fn_that_filters_keeps_task_accounting_exact(embedded_cluster):
    x, y = make_arrays(300)

    def keep_positive(records, mode):  # drops about half of the records
        return records.filter(lambda xi, yi: yi > 0)

    model = functional(ke.Model)
    model.fit(ke.ElasticDataset((x, y), dataset_fn=keep_positive, batch_size=16,
                                minibatches_per_task=3), epochs=2, verbose=0)
    status = embedded_cluster.master.status(include_ledger=True)["datasets"]["training"]
    per_epoch = [[e["task_id"] for e in status["ledger"] if e["epoch"] == ep]
                 for ep in range(2)]
    assert [sorted(p) for p in per_epoch] == [list(range(7))] * 2


def test_keras_callbacks_and_history_work(embedded_cluster):
    x, y = make_arrays(256)
    seen = []
    model = functional(ke.Model)
    history = model.fit(
        ke.ElasticDataset((x, y), batch_size=32, minibatches_per_task=2), epochs=3,
        verbose=0, callbacks=[keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs: seen.append((epoch, sorted(logs))))])
    assert [e for e, _ in seen] == [0, 1, 2]
    assert seen[0][1] == ["accuracy", "loss"]
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_functional_ke_model_leaves_ke_model_subclassable():
    # Keras makes a `keras.Model` subclass called with (inputs, outputs)
    # functional by rewriting class bases; done to ke.Model itself, every
    # later `class M(ke.Model)` would need inputs and outputs.
    bases = ke.Model.__bases__
    functional_model = functional(ke.Model)
    assert isinstance(functional_model, ke.Model)
    assert functional_model.name.startswith("model")

    class UsedFunctionally(ke.Model):
        def __init__(self):
            inputs = keras.Input((8,))
            super().__init__(inputs, keras.layers.Dense(2)(inputs))

    assert UsedFunctionally()(np.ones((1, 8))).shape == (1, 2)
    assert ke.Model.__bases__ == bases

    class Sub(ke.Model):
        def __init__(self):
            super().__init__()
            self.out = keras.layers.Dense(2)

        def call(self, x):
            return self.out(x)

    assert Sub()(np.ones((3, 8))).shape == (3, 2)
    # ke.Model(inputs, outputs) is Keras' own functional model, made elastic:
    # what Keras saves of it loads without keras_elastic.
    assert type(functional_model).__name__ == "Functional"


def test_pipelined_exchange_is_sgd_with_gradients_one_step_late(embedded_cluster):
    # compile(exchange="pipelined"): step k's push travels while step k+1
    # computes on the newest values that arrived, those before step k's update.
    # With one worker that is exactly SGD whose gradient at step k is taken at
    # the weights of step k-1: w[k+1] = w[k] - lr * g_k(w[k-1]); the epoch's
    # end waits for the push in flight, so an epoch's first step is up to date.
    x, y = make_arrays(256)

    def build(cls, **compile_args):
        keras.utils.set_random_seed(5)
        model = cls([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                     keras.layers.Dense(2, activation="softmax")])
        model.compile(optimizer=keras.optimizers.SGD(0.5),
                      loss="sparse_categorical_crossentropy", **compile_args)
        return model

    elastic = build(ke.Sequential, exchange="pipelined")
    elastic.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)

    reference, lagging = build(keras.Sequential), build(keras.Sequential)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    for _ in range(2):
        previous = reference.get_weights()
        for k in range(0, 256, 32):
            lagging.set_weights(previous)
            with tf.GradientTape() as tape:
                loss = loss_fn(y[k:k + 32], lagging(x[k:k + 32], training=True))
            grads = tape.gradient(loss, lagging.trainable_weights)
            previous = reference.get_weights()
            reference.optimizer.apply(grads, reference.trainable_weights)
    for a, b in zip(reference.get_weights(), elastic.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # Not the synchronous result: the exchange really was pipelined.
    synchronous = build(keras.Sequential)
    synchronous.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    assert not all(np.allclose(a, b, atol=1e-4) for a, b in zip(
        synchronous.get_weights(), elastic.get_weights()))
    status = embedded_cluster.master.status(include_ledger=True)["datasets"]
    ledger = next(iter(status.values()))["ledger"]
    assert sorted((e["epoch"], e["task_id"]) for e in ledger) == [
        (e, t) for e in range(2) for t in range(len(ledger) // 2)]


def test_exchange_must_be_sync_or_pipelined():
    model = ke.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="exchange='async'.*'sync', 'pipelined'"):
        model.compile(optimizer="sgd", loss="mse", exchange="async")
    with pytest.raises(ValueError, match="exchange='fast'"):
        ke.wrap(keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)]),
                exchange="fast")


def test_epoch_logs_are_the_jobs_metrics_also_on_a_worker_that_trained_nothing(
        embedded_cluster):
    """The epoch's `loss` and metrics are the job's: the master sums the
    metric states each worker sends with its task reports. Here a second
    worker (a real client of the same master) takes every task of the last
    epoch and reports them with its states; this worker trains no batch of it
    and still logs the job's numbers, not its own 0.0. Its first epoch, which
    it trained alone, logs exactly what plain Keras logs."""
    from keras_elastic.common.tensor_codec import encode_all
    from keras_elastic.master.client import WAIT, MasterClient
    from keras_elastic.worker.evaluation import _leaf_metrics, metric_variables

    x, y = make_arrays(64)
    plain = functional()
    plain_loss = plain.fit(x, y, batch_size=16, epochs=1, shuffle=False,
                           verbose=0).history
    model = functional(ke.Model)
    other = MasterClient(embedded_cluster.master_address)
    other.register_worker()
    taken = []

    class OtherWorkerTakesTheLastEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch != 0:
                return
            while True:
                task = other.get_task("training", 1, return_on_wait=True)
                if task in (None, WAIT):
                    break
                taken.append(task)
            # Its share: loss total 10 over 40 examples, accuracy 30 of 40
            # (the metric states' keys as evaluation and training share them).
            names = [m.name for m in _leaf_metrics(self.model.metrics)]
            states = {}
            for key, variable in metric_variables(self.model):
                metric = names[int(key.split("/")[0])]
                states[key] = np.array(40.0 if variable.name == "count" else
                                       10.0 if metric == "loss" else 30.0)
            other.report_tasks("training", [t.task_id for t in taken],
                               metric_states=list(encode_all(states.items())),
                               leases=[t.lease for t in taken])

    history = model.fit(
        ke.ElasticDataset((x, y), batch_size=16, minibatches_per_task=1,
                          name="training"),
        epochs=2, verbose=0, callbacks=[OtherWorkerTakesTheLastEpoch()]).history
    other.close()
    assert len(taken) == 4  # every task of the last epoch
    status = embedded_cluster.master.status(include_ledger=True)["datasets"][
        "training"]
    assert {e["worker"] for e in status["ledger"] if e["epoch"] == 1} == {
        other.worker_id}
    assert history["loss"][1] == pytest.approx(0.25)
    assert history["accuracy"][1] == pytest.approx(0.75)
    assert history["loss"][0] == pytest.approx(plain_loss["loss"][0], abs=1e-6)
    assert history["accuracy"][0] == pytest.approx(plain_loss["accuracy"][0])


def test_job_metrics_with_keras_own_validation_keep_the_training_states(
        embedded_cluster):
    """Keras' own validation (validation_data that is not an ElasticDataset)
    runs before the epoch's last tasks are reported and resets the metrics:
    the epoch's training numbers stay those of the training batches, and the
    next epoch still trains through the cluster (Keras' evaluate used to
    retrace the train step for untagged batches: epoch 2 failed)."""
    x, y = make_arrays(96)
    plain = functional()
    expected = plain.fit(x[:64], y[:64], batch_size=16, epochs=2, shuffle=False,
                         validation_data=(x[64:], y[64:]), verbose=0).history
    model = functional(ke.Model)
    history = model.fit(
        ke.ElasticDataset((x[:64], y[:64]), batch_size=16, minibatches_per_task=1),
        epochs=2, validation_data=(x[64:], y[64:]), verbose=0).history
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        np.testing.assert_allclose(history[key], expected[key], atol=1e-6, err_msg=key)


def test_an_epochs_first_step_takes_what_another_worker_changed_meanwhile(
        start_cluster, monkeypatch):
    # While a worker ends an epoch (validation, checkpoints, callbacks) or
    # traces its step, the others train on. Its next epoch's first gradient
    # must be of the servers' newest values, not of the model as the last
    # epoch left it (2-worker jobs measured 5-11 updates late there before).
    _, servers = start_cluster(2)  # two servers: over gRPC, not a shared store
    late = []  # per push of this worker's tasks: updates applied since its base

    def observe(store):
        push = store.push

        def observed(update, base_version=0):
            if update.ranges:
                late.append(store.version - base_version)
            return push(update, base_version)

        monkeypatch.setattr(store, "push", observed)

    for server in servers:
        observe(server.store)

    class AnotherWorkerTrains(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            for store in (server.store for server in servers):
                grads = {name: np.full(tuple(v.shape), 0.01, np.float32)
                         for name, v in store.variables.items()
                         if store.trainable[name]}
                if grads:
                    assert store.push(Update(grads=grads),
                                      store.version).status == "applied"

    x, y = make_arrays(256)
    keras.utils.set_random_seed(7)
    model = ke.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="tanh"),
                           keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss="sparse_categorical_crossentropy")
    model.fit(ke.ElasticDataset((x, y), batch_size=32, minibatches_per_task=2),
              epochs=3, verbose=0, callbacks=[AnotherWorkerTrains()])
    assert all(server.store.variables for server in servers)
    assert len(late) >= 3 * 8, late  # every step pushed to a server
    assert max(late) == 0, late  # each epoch's first push included

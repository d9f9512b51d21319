"""ke.layers.Embedding: tables on the parameter servers, trained in the elastic step.

Real servers: an embedded cluster (a master and 1 or 2 parameter servers
serving gRPC on 127.0.0.1 inside the test process).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_elastic as ke
from keras_elastic.ps.row_init import initial_rows
from keras_elastic.ps.update import Update

VOCAB, DIM, FIELDS = 200, 4, 3


@pytest.fixture(params=[1, 2], ids=["1ps", "2ps"])
def cluster(request, start_cluster):
    """The cluster of this process, with `request.param` parameter servers."""
    return start_cluster(request.param)[0]


def data(n=512, seed=0):
    rng = np.random.default_rng(seed)
    # Skewed ids: many repeats within a batch, some ids never seen.
    ids = np.minimum(rng.zipf(1.3, size=(n, FIELDS)), VOCAB - 1).astype("int64")
    y = (ids.sum(axis=1) % 2).astype("float32")
    return ids, y


class DenseGradientEmbedding(keras.layers.Embedding):
    """keras.layers.Embedding whose table gets a dense gradient (summed per id).

    Keras applies a `keras.layers.Embedding`'s IndexedSlices gradient entry by
    entry: Adagrad then adds the square of each occurrence of a repeated id to
    its accumulator (sum of squares), not the square of the id's gradient in
    the batch. The servers apply the batch's gradient of each row, like Keras'
    update of a dense table (and TF's deduplicating sparse updates): this is
    the plain-Keras model with that update.
    """

    def call(self, inputs):
        return keras.ops.take(self.embeddings * 1.0, inputs, axis=0)


def build(embedding_cls, optimizer, seed=5):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((FIELDS,), dtype="int64")
    x = (DenseGradientEmbedding if embedding_cls == "dense" else embedding_cls)(
        VOCAB, DIM, name="table")(inputs)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(8, activation="relu")(x)
    outputs = keras.layers.Dense(1, activation="sigmoid")(x)
    cls = ke.Model if embedding_cls is ke.layers.Embedding else keras.Model
    model = cls(inputs, outputs)
    model.compile(optimizer=optimizer, loss="binary_crossentropy")
    return model


def server_table(cluster, layer, n=VOCAB):
    return cluster.ps.lookup({layer.table_name: np.arange(n, dtype=np.int64)})[
        layer.table_name]


@pytest.mark.parametrize("optimizer, table", [
    ("sgd", keras.layers.Embedding), ("adagrad", "dense"),
    ("adagrad", keras.layers.Embedding)], ids=["sgd", "adagrad", "adagrad-no-repeats"])
def test_one_epoch_equals_plain_keras_embedding(cluster, optimizer, table):
    ids, y = data()
    if table is keras.layers.Embedding and optimizer == "adagrad":
        # No id twice in a batch: Keras' entry-by-entry update is the same.
        ids = np.concatenate([np.random.default_rng(b).permutation(VOCAB - 20)[
            :32 * FIELDS].reshape(32, FIELDS) for b in range(16)]).astype("int64")
    make = {"sgd": lambda: keras.optimizers.SGD(0.5),
            "adagrad": lambda: keras.optimizers.Adagrad(0.5)}[optimizer]
    plain = build(table, make())
    elastic = build(ke.layers.Embedding, make())
    # The plain table starts where the servers' rows start.
    layer = elastic.get_layer("table")
    start = initial_rows(keras.initializers.serialize(layer.embeddings_initializer),
                         np.arange(VOCAB, dtype=np.int64), DIM, "float32")
    plain.get_layer("table").set_weights([start])
    plain.fit(ids, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    elastic.fit(ids, y, batch_size=32, epochs=1, shuffle=False, verbose=0)

    table = server_table(cluster, layer)
    np.testing.assert_allclose(table, plain.get_layer("table").get_weights()[0],
                               atol=1e-5)
    untouched = np.setdiff1d(np.arange(VOCAB), ids)
    assert untouched.size and np.array_equal(table[untouched], start[untouched])
    dense = [w for w in plain.get_weights()[1:]]
    assert len(dense) == len(elastic.get_weights())  # no table on the worker
    for a, b in zip(dense, elastic.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    if cluster.num_ps == 2:  # both servers hold rows
        held = [s.store.tables[layer.table_name] for s in cluster._servers[:2]]
        assert all(len(t) > 0 for t in held)
        assert sum(len(t) for t in held) == VOCAB  # the lookup above made them all


def test_evaluate_and_predict_read_the_servers_rows(cluster):
    ids, y = data(256)
    model = build(ke.layers.Embedding, keras.optimizers.Adam(0.05))
    model.fit(ids, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    layer = model.get_layer("table")
    table = server_table(cluster, layer)
    # The same network computed locally from the servers' table.
    local = keras.Sequential([
        keras.Input((FIELDS,), dtype="int64"),
        keras.layers.Embedding(VOCAB, DIM, weights=[table]),
        keras.layers.Flatten(), keras.layers.Dense(8, activation="relu"),
        keras.layers.Dense(1, activation="sigmoid")])
    for dst, src in zip(local.layers[2:], model.layers[3:]):
        dst.set_weights(src.get_weights())
    expected = local.predict(ids, verbose=0)
    np.testing.assert_allclose(model.predict(ids, batch_size=64, verbose=0), expected,
                               atol=1e-5)
    loss = keras.losses.binary_crossentropy(y[:, None], expected).numpy().mean()
    assert model.evaluate(ids, y, batch_size=64, verbose=0) == pytest.approx(
        loss, abs=1e-5)


def test_wrap_moves_large_embeddings_to_the_servers(embedded_cluster):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((FIELDS,), dtype="int64")
    big = keras.layers.Embedding(VOCAB, DIM, name="big")(inputs)
    small = keras.layers.Embedding(10, DIM, name="small")(inputs % 10)
    x = keras.layers.Flatten()(keras.layers.Concatenate()([big, small]))
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(x))
    model = ke.wrap(model, ps_embeddings_above=100)
    assert isinstance(model.get_layer("big"), ke.layers.Embedding)
    assert type(model.get_layer("small")) is keras.layers.Embedding
    assert all("big" not in w.path for w in model.weights)
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    ids, y = data(128)
    history = model.fit(ids, y, batch_size=32, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    status = embedded_cluster._servers[0].store.tables
    assert len(status[model.get_layer("big").table_name]) == len(np.unique(ids))


@pytest.mark.parametrize("ids, message", [
    (np.array([[1, 2, VOCAB]], "int64"), f"id {VOCAB} is out of range"),
    (np.array([[1, -3, 2]], "int64"), "id -3 is out of range"),
])
def test_bad_ids_name_the_layer_and_the_id(embedded_cluster, ids, message):
    model = build(ke.layers.Embedding, "sgd")
    with pytest.raises(Exception, match=f"'table'.*{message}"):
        model.fit(np.repeat(ids, 32, 0), np.zeros(32, "float32"), batch_size=32,
                  verbose=0)


def test_float_ids_are_refused_naming_the_layer():
    layer = ke.layers.Embedding(10, 2, name="emb")
    with pytest.raises(TypeError, match="'emb': ids must be integers, got a float32"):
        layer(tf.constant([[1.0, 2.0]]))


def _table_rows(servers, table):
    """Every row held by the servers: id -> (row, {slot: row})."""
    rows = {}
    for server in servers:
        ids, values, slots = server.store.tables[table].export()
        for k, i in enumerate(ids.tolist()):
            assert i not in rows  # one owner per id
            rows[i] = (values[k], {s: a[k] for s, a in slots.items()})
    return rows


@pytest.mark.parametrize("restore_ps", [1, 3])
def test_tables_saved_with_two_servers_restore_onto_another_count(tmp_path,
                                                                  start_cluster,
                                                                  restore_ps):
    ids, y = data(512)
    _, servers = start_cluster(2)
    checkpoint = ke.callbacks.ShardedModelCheckpoint(
        f"{tmp_path}/ckpt/", sharding_callback=tf.train.experimental.MaxShardSizePolicy(
            max_shard_size=1024))  # the table's rows span several files
    model = build(ke.layers.Embedding, keras.optimizers.Adam(0.05))
    model.fit(ids, y, batch_size=32, epochs=2, shuffle=False, verbose=0,
              callbacks=[checkpoint])
    table = model.get_layer("table").table_name
    saved = _table_rows(servers, table)
    assert len(saved) == len(np.unique(ids))  # only touched rows exist
    assert all(len(held.store.tables[table]) for held in servers)
    part = ke.checkpoint.latest(f"{tmp_path}/ckpt/").extra["parts"]
    assert part == ["ps-000", "ps-001"]

    _, servers = start_cluster(restore_ps)
    resumed = build(ke.layers.Embedding, keras.optimizers.Adam(0.05), seed=9)
    history = resumed.fit(ids, y, batch_size=32, epochs=2, verbose=0, callbacks=[
        ke.callbacks.ShardedModelCheckpoint(f"{tmp_path}/ckpt/",
                                            restore_on_start=True)])
    assert history.history == {}  # nothing left to train: the tables as saved
    restored = _table_rows(servers, table)
    assert restored.keys() == saved.keys()
    for i, (row, slots) in saved.items():
        np.testing.assert_array_equal(restored[i][0], row, err_msg=f"row {i}")
        assert restored[i][1].keys() == slots.keys() == {"momentum", "velocity"}
        for s in slots:
            np.testing.assert_array_equal(restored[i][1][s], slots[s])
    if restore_ps == 3:
        assert all(len(held.store.tables[table]) for held in servers)


@pytest.mark.multiprocess
def test_export_materializes_the_table_as_a_plain_keras_embedding(tmp_path, cluster):
    ids, y = data(256)
    model = build(ke.layers.Embedding, keras.optimizers.Adagrad(0.1))
    model.fit(ids, y, batch_size=32, epochs=1, verbose=0)
    path = ke.checkpoint.export_keras(model, str(tmp_path / "ctr.keras"))
    expected = model.predict(ids, batch_size=64, verbose=0)
    # Loaded in a process without keras_elastic: only Keras classes inside.
    import json
    import subprocess
    import sys

    script = (
        "import json, sys, numpy as np, keras\n"
        f"m = keras.saving.load_model({path!r})\n"
        "assert not [k for k in sys.modules if k.startswith('keras_elastic')]\n"
        f"x = np.array({ids.tolist()!r}, 'int64')\n"
        "print(json.dumps([type(m.get_layer('table')).__name__,"
        " m.predict(x, verbose=0).ravel().tolist()]))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, check=True).stdout.strip().splitlines()[-1]
    kind, predicted = json.loads(out)
    assert kind == "Embedding"
    np.testing.assert_allclose(np.array(predicted), expected.ravel(), atol=1e-5)
    table = server_table(cluster, model.get_layer("table"))
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(loaded.get_layer("table").get_weights()[0], table)


def test_export_of_an_unbounded_table_is_refused(tmp_path, embedded_cluster):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((FIELDS,), dtype="int64")
    x = keras.layers.Flatten()(ke.layers.Embedding(None, DIM, name="ids")(inputs))
    model = ke.Model(inputs, keras.layers.Dense(1)(x))
    model.compile(optimizer="sgd", loss="mse")
    ids = np.random.default_rng(0).integers(0, 2**62, size=(64, FIELDS))
    model.fit(ids, np.zeros(64, "float32"), batch_size=32, verbose=0)
    assert len(embedded_cluster._servers[0].store.tables[
        model.get_layer("ids").table_name]) == len(np.unique(ids))
    with pytest.raises(ValueError, match="'ids'.*unbounded"):
        ke.checkpoint.export_keras(model, str(tmp_path / "m.keras"))


def test_bad_sparse_requests_are_refused_and_change_nothing():
    import grpc

    from keras_elastic.common.tensor_codec import encode
    from keras_elastic.proto import ps_pb2
    from keras_elastic.ps import ParameterServer, PSClient
    from keras_elastic.ps.partition import row_owner

    servers = [ParameterServer(partition=i, num_partitions=2) for i in range(2)]
    client = PSClient([s.address for s in servers])
    try:
        client.init({"w": (np.zeros(2, np.float32), True)},
                    {"class_name": "Adagrad", "config": {"learning_rate": 0.1}},
                    tables={"t": {"dim": 4, "input_dim": 100}})
        mine = np.array([i for i in range(20) if row_owner(np.array([i]), 2)[0] == 0])
        theirs = np.array([i for i in range(20) if row_owner(np.array([i]), 2)[0] == 1])
        client.lookup({"t": np.arange(20)})
        before = [s.store.tables["t"].export() for s in servers]
        stub = client._stubs[0]

        def lookup(name, ids):
            return stub.Lookup(ps_pb2.LookupRequest(ids=list(encode(name, ids))),
                               timeout=10)

        def push(*named):
            tensors = [c for n, a in named for c in encode(n, a)]
            return stub.PushSmall(ps_pb2.PushBundle(
                header=ps_pb2.PushHeader(worker_id=3, num_tensors=len(named)),
                tensors=tensors), timeout=10)

        cases = [
            (lookup, ("t", mine.astype(np.float32)), "1-D int64"),
            (lookup, ("t", theirs), f"row {theirs[0]} of embedding table 't' belongs "
                                    "to parameter server 1"),
            (lookup, ("nope", mine), "no embedding table 'nope'"),
            (lookup, ("t", np.array([-1, 0])), "-1"),
            (lookup, ("t", np.array([100])), "100"),
            (push, (("@t/ids", mine),), "both its ids and its gradient rows"),
            (push, (("@t/ids", mine),
                    ("@t/grads", np.ones((len(mine), 3), "float32"))), "expected [n, 4]"),
            (push, (("@t/ids", theirs),
                    ("@t/grads", np.ones((len(theirs), 4), "float32"))), "belongs to"),
            (push, (("@t/ids", mine),
                    ("@t/grads", np.ones((len(mine), 4), "float64"))), "float64"),
        ]
        for call, args, message in cases:
            with pytest.raises(grpc.RpcError) as info:
                call(*args)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, args
            assert message in info.value.details(), info.value.details()
        after = [s.store.tables["t"].export() for s in servers]
        for (i0, v0, s0), (i1, v1, s1) in zip(before, after):
            assert np.array_equal(i0, i1) and np.array_equal(v0, v1)
            assert all(np.array_equal(s0[k], s1[k]) for k in s0)
        assert client.lookup({"t": np.arange(20)})["t"].shape == (20, 4)  # serving
    finally:
        client.close()
        for s in servers:
            s.stop(0)


@pytest.mark.multiprocess
def test_a_worker_never_holds_a_table_larger_than_itself(tmp_path):
    """A 2 GiB table (16M x 32 float32): the worker's resident memory stays
    below 1 GiB (TensorFlow itself takes a few hundred MB)."""
    import subprocess
    import sys

    from conftest import subprocess_env

    script = '''
import numpy as np, keras, keras_elastic as ke
ids_in = keras.Input((26,), dtype="int64")
x = keras.layers.Flatten()(ke.layers.Embedding(16_000_000, 32)(ids_in))
model = ke.Model(ids_in, keras.layers.Dense(1, activation="sigmoid")(x))
model.compile(optimizer="adagrad", loss="binary_crossentropy")
rng = np.random.default_rng(0)
ids = rng.integers(0, 16_000_000, size=(4096, 26))
model.fit(ids, rng.integers(0, 2, 4096).astype("float32"), batch_size=512, verbose=0)
rss = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")][0]
print("RSS_KB", rss)
'''
    env = subprocess_env()
    for key in [k for k in env if k.startswith("KERAS_ELASTIC_") and k not in (
            "KERAS_ELASTIC_TOKEN", "KERAS_ELASTIC_INDEX_DIR")]:
        env.pop(key)  # an embedded cluster in that process
    out = subprocess.run([sys.executable, "-c", script], capture_output=True,
                         text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rss = int(out.stdout.split("RSS_KB")[1].split()[0]) * 1024
    table = 16_000_000 * 32 * 4
    assert rss < (1 << 30) < table, (rss, table)


def test_one_lookup_per_step_for_every_table(cluster, monkeypatch):
    """Two tables (one fed through an op on the inputs): the train step looks
    up both in one exchange (one call per server), before the forward pass."""
    keras.utils.set_random_seed(2)
    inputs = keras.Input((FIELDS,), dtype="int64")
    wide = ke.layers.Embedding(VOCAB, 1, name="wide")(inputs)
    deep = ke.layers.Embedding(VOCAB // 10, DIM, name="deep")(inputs // 10)
    x = keras.layers.Concatenate()([keras.layers.Flatten()(wide),
                                    keras.layers.Flatten()(deep)])
    model = ke.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(x))
    model.compile(optimizer=keras.optimizers.Adagrad(0.1), loss="binary_crossentropy")
    calls = []
    lookup = type(cluster.ps).lookup

    def counted(self, ids):
        calls.append(sorted(ids))
        return lookup(self, ids)

    monkeypatch.setattr(type(cluster.ps), "lookup", counted)
    ids, y = data(256)
    model.fit(ids, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    tables = sorted([model.get_layer("wide").table_name,
                     model.get_layer("deep").table_name])
    assert calls == [tables] * (256 // 32)
    # Both tables were trained: their rows moved away from the initial ones.
    for name in ("wide", "deep"):
        layer = model.get_layer(name)
        seen = np.unique(ids if name == "wide" else ids // 10)
        start = initial_rows(keras.initializers.serialize(layer.embeddings_initializer),
                             seen, layer.output_dim, "float32")
        assert not np.allclose(server_table(cluster, layer, layer.input_dim)[seen], start)


def test_store_applies_rows_with_the_dense_step_lazy_adam_and_averaging():
    """Through the store's push: Adam's rows use the dense update's step (bias
    correction) and learning rate, only touched rows and slots change (lazy),
    and with grads_to_wait=2 two pushes are averaged into one update."""
    from keras_elastic.ps.store import ParameterStore

    adam = {"class_name": "Adam", "config": {"learning_rate": 0.1, "beta_1": 0.9,
                                             "beta_2": 0.999, "epsilon": 1e-7}}
    store = ParameterStore()
    store.init({"w": np.zeros(2, np.float32)}, {"w": True}, adam,
               tables={"t": {"dim": 2, "input_dim": 10, "initializer": "zeros"}})
    rng = np.random.default_rng(0)
    m, v, rows = np.zeros((10, 2)), np.zeros((10, 2)), np.zeros((10, 2))
    for step in range(1, 5):
        ids = np.unique(rng.integers(0, 10, size=4))
        g = rng.normal(size=(len(ids), 2)).astype(np.float32)
        store.push(Update(grads={"w": np.ones(2, np.float32)}, rows={"t": (ids, g)}),
                   store.version)
        m[ids] = 0.9 * m[ids] + 0.1 * g
        v[ids] = 0.999 * v[ids] + 0.001 * g * g
        lr = 0.1 * np.sqrt(1 - 0.999 ** step) / (1 - 0.9 ** step)
        rows[ids] -= lr * m[ids] / (np.sqrt(v[ids]) + 1e-7)
        held, values, slots = store.tables["t"].export()
        np.testing.assert_allclose(values, rows[held], atol=1e-5)
        np.testing.assert_allclose(slots["momentum"], m[held], atol=1e-6)
        np.testing.assert_allclose(slots["velocity"], v[held], atol=1e-6)
    assert int(store.optimizer.iterations.numpy()) == 4

    averaged = ParameterStore(grads_to_wait=2)
    averaged.init({"w": np.zeros(2, np.float32)}, {"w": True},
                  {"class_name": "SGD", "config": {"learning_rate": 1.0}},
                  tables={"t": {"dim": 2, "input_dim": 10, "initializer": "zeros"}})
    averaged.push(Update(rows={"t": (np.array([1, 2]), np.ones((2, 2), "f4"))}), 0)
    assert len(averaged.tables["t"]) == 0  # buffered, nothing applied yet
    averaged.push(Update(rows={"t": (np.array([2]), np.full((1, 2), 3, "f4"))}), 0)
    ids, values, _ = averaged.tables["t"].export()
    assert ids.tolist() == [1, 2]
    np.testing.assert_allclose(values, [[-0.5, -0.5], [-2.0, -2.0]])


def test_restore_model_brings_the_servers_tables_back(tmp_path, cluster):
    import glob

    ids, y = data(256)
    model = build(ke.layers.Embedding, keras.optimizers.Adagrad(0.2))
    layer = model.get_layer("table")
    after_first = {}

    class Keep(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                after_first["table"] = server_table(cluster, layer)
                after_first["weights"] = model.get_weights()

    model.fit(ids, y, batch_size=32, epochs=2, verbose=0, callbacks=[
        ke.callbacks.ShardedModelCheckpoint(f"{tmp_path}/ckpt/"), Keep()])
    assert not np.allclose(server_table(cluster, layer), after_first["table"])
    first = sorted(glob.glob(f"{tmp_path}/ckpt/ckpt-*"))[0]
    ke.checkpoint.restore_model(model, first)  # connected: the servers at once
    np.testing.assert_array_equal(server_table(cluster, layer), after_first["table"])
    for a, b in zip(model.get_weights(), after_first["weights"]):
        np.testing.assert_array_equal(a, b)


def test_layer_and_table_errors_name_what_is_wrong():
    from keras_elastic.ps.store import ParameterStore

    with pytest.raises(ValueError, match="does not support \\['embeddings_regularizer'"):
        ke.layers.Embedding(10, 2, embeddings_regularizer="l2")
    with pytest.raises(ValueError, match="'e': input_dim must be positive or None"):
        ke.layers.Embedding(0, 2, name="e")
    model = keras.Sequential([keras.Input((3,), dtype="int64"), keras.layers.Embedding(
        100, 4, embeddings_regularizer="l2", name="reg")])
    with pytest.raises(ValueError, match="cannot move embedding 'reg'"):
        ke.wrap(model, ps_embeddings_above=0)
    store = ParameterStore()
    sgd = {"class_name": "SGD", "config": {}}
    store.init({"w": np.zeros(1, "f4")}, {"w": True}, sgd, tables={"t": {"dim": 4}})
    with pytest.raises(ValueError, match="embedding table 't' is .* there but"):
        store.init({"w": np.zeros(1, "f4")}, {"w": True}, sgd, tables={"t": {"dim": 8}})
    with pytest.raises(ValueError, match="embedding table 'u': dtype int32 is not a float"):
        ParameterStore().init({}, {}, sgd, tables={"u": {"dim": 2, "dtype": "int32"}})


def test_export_of_a_subclassed_model_with_server_tables_is_refused(tmp_path,
                                                                   embedded_cluster):
    class Sub(ke.Model):
        def __init__(self):
            super().__init__()
            self.table = ke.layers.Embedding(VOCAB, DIM, name="sub_table")
            self.out = keras.layers.Dense(1)

        def call(self, x):
            return self.out(keras.ops.sum(self.table(x), axis=1))

    model = Sub()
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="'sub_table'.*not connected"):
        ke.checkpoint.export_keras(model, str(tmp_path / "a.keras"))
    ids, y = data(64)
    model.fit(ids, y, batch_size=32, verbose=0)
    with pytest.raises(ValueError, match="cannot export Sub with ke.layers.Embedding"):
        ke.checkpoint.export_keras(model, str(tmp_path / "b.keras"))


# -- a model with server tables answers before any fit (issue 27) ----------------
def _expected(model, ids):
    """The model's output computed by hand from the servers' initial rows."""
    layer = model.get_layer("table")
    rows = initial_rows(keras.initializers.serialize(layer.embeddings_initializer),
                        ids.reshape(-1), DIM, "float32").reshape(len(ids), -1)
    hidden = model.layers[-2]
    h = np.maximum(rows @ hidden.kernel.numpy() + hidden.bias.numpy(), 0)
    out = model.layers[-1]
    return 1 / (1 + np.exp(-(h @ out.kernel.numpy() + out.bias.numpy())))


def test_a_fresh_model_predicts_and_evaluates_on_arrays_before_any_fit(cluster):
    model = build(ke.layers.Embedding, keras.optimizers.Adam(0.01))
    ids, y = data(64)
    predicted = model.predict(ids, verbose=0)  # connects the model, as fit would
    np.testing.assert_allclose(predicted, _expected(model, ids), rtol=1e-5, atol=1e-6)
    loss = model.evaluate(ids, y, verbose=0)
    expected = keras.losses.binary_crossentropy(y[:, None], predicted).numpy().mean()
    np.testing.assert_allclose(loss, expected, rtol=1e-4)
    np.testing.assert_allclose(model(ids[:8]).numpy(), predicted[:8], rtol=1e-5)


class SubclassedTableModel(ke.Model):
    def __init__(self):
        super().__init__()
        self.table = ke.layers.Embedding(VOCAB, DIM, name="table")
        self.flatten = keras.layers.Flatten()
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.out = keras.layers.Dense(1, activation="sigmoid")

    def call(self, x):
        return self.out(self.hidden(self.flatten(self.table(x))))


def test_a_fresh_subclassed_model_answers_its_first_call_on_data(cluster):
    model = SubclassedTableModel()
    model.compile(optimizer="adam", loss="binary_crossentropy")
    ids, _ = data(16)
    first = model(tf.constant(ids)).numpy()  # built from the data, then connected
    np.testing.assert_allclose(first, _expected(model, ids), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.predict(ids, verbose=0), first, rtol=1e-5)


def test_an_uncompiled_model_with_server_tables_says_to_compile_it(cluster):
    model = SubclassedTableModel()
    with pytest.raises(ValueError, match=r"need the model compiled .* call "
                                         r"model.compile\(...\) before predict"):
        model.predict(data(8)[0], verbose=0)


# -- admission and eviction in training (issue 27) --------------------------------
@pytest.mark.parametrize("num_ps", [1, 2])
def test_admission_and_a_row_bound_in_a_fit(start_cluster, num_ps):
    cluster, servers = start_cluster(num_ps)
    keras.utils.set_random_seed(3)
    inputs = keras.Input((FIELDS,), dtype="int64")
    x = ke.layers.Embedding(VOCAB, DIM, name="table", admit_after=2, max_rows=40)(inputs)
    x = keras.layers.Dense(8, activation="relu")(keras.layers.Flatten()(x))
    model = ke.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(x))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")
    ids, y = data(512)
    model.fit(ids, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    layer = model.get_layer("table")
    tables = [s.store.tables[layer.table_name] for s in servers]
    held = np.concatenate([t.export()[0] for t in tables])
    # Ids seen in one batch only never got a row; no server went past its share.
    batches_seen = {}
    for k in range(0, 512, 32):
        for i in np.unique(ids[k:k + 32]).tolist():
            batches_seen[i] = batches_seen.get(i, 0) + 1
    once = {i for i, n in batches_seen.items() if n == 1}
    assert once and not once & set(held.tolist())
    # Ids seen in two batches or more were admitted: those of the last batch
    # (the most recently used, which the bound keeps) are held, and every row
    # held was trained away from the initializer's row it was made with.
    twice = {i for i, n in batches_seen.items() if n >= 2}
    recent = twice & set(np.unique(ids[-32:]).tolist())
    assert recent and recent <= set(held.tolist()) <= twice
    values = np.concatenate([t.export()[1] for t in tables])
    start = initial_rows(keras.initializers.serialize(layer.embeddings_initializer),
                         held, DIM, "float32")
    assert (np.abs(values - start).max(axis=1) > 0).all()
    assert all(len(t) <= -(-40 // num_ps) for t in tables)
    stats = [s.table_stats[layer.table_name] for s in cluster.ps.status_all()]
    assert sum(s["rows"] for s in stats) == len(held)
    assert sum(s["dropped"] for s in stats) > 0
    assert sum(s["admitted"] for s in stats) - sum(s["evicted"] for s in stats) == len(held)
    # Prediction and evaluation make no rows, whatever ids they see.
    unseen = np.setdiff1d(np.arange(VOCAB), list(batches_seen))[:FIELDS * 4]
    model.predict(unseen.reshape(-1, FIELDS), verbose=0)
    model.evaluate(ids[:64], y[:64], verbose=0)
    assert sum(len(t) for t in tables) == len(held)


def test_admission_and_eviction_options_are_checked():
    with pytest.raises(ValueError, match="'t': admit_after must be an integer >= 0 or "
                                         "None, got -2"):
        ke.layers.Embedding(10, 2, name="t", admit_after=-2)
    model = keras.Sequential([keras.Input((3,), dtype="int64"),
                              keras.layers.Embedding(100, 4, name="ids")])
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['admit'\]; the "
                                         "options are"):
        ke.wrap(model, ps_embeddings_above=0, ps_embedding_options={"ids": {"admit": 2}})
    with pytest.raises(ValueError, match="ps_embedding_options needs "
                                         "ps_embeddings_above"):
        ke.wrap(model, ps_embedding_options={"admit_after": 2})
    ke.wrap(model, ps_embeddings_above=0, ps_embedding_options={"ids": {"max_rows": 50}})
    assert model.get_layer("ids").table_spec()["max_rows"] == 50


def test_a_table_model_called_unbuilt_says_to_build_it(cluster):
    from keras_elastic.worker.session import session_of

    model = SubclassedTableModel()
    model.compile(optimizer="adam", loss="binary_crossentropy")
    with pytest.raises(ValueError, match="are not built: build it"):
        session_of(model).connect_for_tables()


def test_an_incremental_save_against_forgotten_removals_is_refused(monkeypatch):
    from keras_elastic.ps import embedding_table
    from keras_elastic.ps.embedding_table import EmbeddingTable

    monkeypatch.setattr(embedding_table, "_MAX_REMOVALS_KEPT", 2)
    table = EmbeddingTable("t", 2, max_rows=3)
    table.lookup(np.arange(10))  # 7 rows removed: more than the log keeps
    with pytest.raises(ValueError, match="the rows removed since the base checkpoint "
                                         "are no longer known: a full checkpoint"):
        table.export_since(0)


def test_pipelined_rows_are_looked_up_ahead_one_step_late_like_the_weights(
        start_cluster, monkeypatch):
    """exchange="pipelined": each batch's rows are looked up while the step
    before it computes (on the pipeline's thread, behind the push in flight),
    so the lookup leaves the step's path; and the rows a step gets hold the
    same updates as its dense weights (those before the previous step's).
    With one worker and SGD the whole model, table included, is SGD whose
    gradient at step k is taken at the weights of step k-1."""
    import threading

    cluster, _ = start_cluster(2)
    ids, y = data(256, seed=3)
    batch, epochs = 32, 2
    threads = []
    lookup = type(cluster.ps).lookup

    def recorded(self, asked, create=True):
        threads.append(threading.current_thread().name)
        return lookup(self, asked, create)

    monkeypatch.setattr(type(cluster.ps), "lookup", recorded)
    elastic = build(ke.layers.Embedding, keras.optimizers.SGD(0.5))
    elastic.compile(optimizer=keras.optimizers.SGD(0.5), loss="binary_crossentropy",
                    exchange="pipelined")
    layer = elastic.get_layer("table")
    start = initial_rows(keras.initializers.serialize(layer.embeddings_initializer),
                         np.arange(VOCAB, dtype=np.int64), DIM, "float32")
    elastic.fit(ids, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0)
    steps = len(ids) // batch
    # Each epoch's first batch is looked up by its step; every other one ahead,
    # on the pipeline's thread.
    assert len(threads) == epochs * steps, threads
    ahead = sum(name.startswith("keras_elastic_push") for name in threads)
    assert ahead == epochs * (steps - 1), threads

    reference = build(keras.layers.Embedding, keras.optimizers.SGD(0.5))
    lagging = build(keras.layers.Embedding, keras.optimizers.SGD(0.5))
    reference.get_layer("table").set_weights([start])
    loss_fn = keras.losses.BinaryCrossentropy()
    for _ in range(epochs):
        previous = reference.get_weights()
        for k in range(0, len(ids), batch):
            lagging.set_weights(previous)
            with tf.GradientTape() as tape:
                loss = loss_fn(y[k:k + batch], lagging(ids[k:k + batch], training=True))
            grads = tape.gradient(loss, lagging.trainable_weights)
            previous = reference.get_weights()
            reference.optimizer.apply(grads, reference.trainable_weights)
    monkeypatch.setattr(type(cluster.ps), "lookup", lookup)
    np.testing.assert_allclose(server_table(cluster, layer),
                               reference.get_layer("table").get_weights()[0], atol=1e-5)
    for a, b in zip(reference.get_weights()[1:], elastic.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_bad_id_of_a_batch_looked_up_ahead_names_the_layer_and_the_id(start_cluster):
    """exchange="pipelined": the lookup ahead of a batch with an id out of
    range is not started; that batch's step looks its rows up itself and
    fails naming the layer and the id, after the good batches before it
    trained."""
    _, servers = start_cluster(1)
    ids, y = data(96, seed=4)
    ids[70, 1] = VOCAB  # in the third batch of 32
    model = build(ke.layers.Embedding, "sgd")
    model.compile(optimizer="sgd", loss="binary_crossentropy", exchange="pipelined")
    with pytest.raises(Exception, match=f"'table'.*id {VOCAB} is out of range"):
        model.fit(ids, y, batch_size=32, shuffle=False, verbose=0)
    assert servers[0].store.pushes == 2  # the two good batches' steps


def test_a_lookup_bigger_than_a_message_is_cut_into_calls():
    """A lookup whose rows exceed what one gRPC message may hold (64 MiB: a
    prediction batch of many ids, a wide table) is cut into calls of at most
    LOOKUP_REPLY_BYTES of rows each, and answers every id in its place."""
    from keras_elastic.common.tensor_codec import MAX_MESSAGE_BYTES
    from keras_elastic.ps import ParameterServer, PSClient
    from keras_elastic.ps.client import LOOKUP_REPLY_BYTES

    servers = [ParameterServer(partition=i, num_partitions=2) for i in range(2)]
    client = PSClient([s.address for s in servers])
    calls = []
    for i, stub in enumerate(client._streams):
        def counted(request, *args, _lookup=stub.Lookup, _i=i, **kwargs):
            reply = _lookup(request, *args, **kwargs)
            calls.append((_i, reply.byte_size))
            return reply
        stub.Lookup = counted
    try:
        client.init({"w": (np.zeros(2, np.float32), True)},
                    {"class_name": "SGD", "config": {"learning_rate": 0.1}},
                    tables={"t": {"dim": 64}})
        ids = np.arange(300_000, dtype=np.int64) * 7 + 3
        rows = client.lookup({"t": ids})["t"]  # 76.8 MB of rows
        assert rows.shape == (300_000, 64) and rows.nbytes > MAX_MESSAGE_BYTES
        assert sum(s.store.tables["t"].export()[0].size for s in servers) == 300_000
        # Several calls to each server, none of them over the bound.
        assert sorted({i for i, _ in calls}) == [0, 1] and len(calls) >= 6
        assert max(size for _, size in calls) <= LOOKUP_REPLY_BYTES + 4096
        # Every id's row in its place: the same rows asked in another order.
        order = np.random.default_rng(0).permutation(len(ids))
        np.testing.assert_array_equal(
            client.lookup({"t": ids[order]}, create=False)["t"], rows[order])
    finally:
        client.close()
        for s in servers:
            s.stop()

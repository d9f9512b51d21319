"""Dataset registration (issue 23, items 2 and 7).

- Every worker must hold the same in-memory arrays: registration carries a
  content fingerprint per array, and a worker whose arrays differ is refused
  with an error naming the array.
- Errors about a registration that differs from the job's quote both calls
  (the job's, kept in the journal, and this worker's).
- `records_per_epoch` (steps_per_epoch, validation_steps): epoch e covers a
  window of the records that continues across epochs and wraps around.
"""

import hashlib
import random
import tracemalloc
import types

import numpy as np
import pytest

import keras_elastic as ke
from keras_elastic.data import arrays as arrays_module
from keras_elastic.data.arrays import ArraySource, array_fingerprint
from keras_elastic.data.describe import describe_call, summarize
from keras_elastic.data.factory import as_source
from keras_elastic.master.client import MasterClient
from keras_elastic.master.server import MasterServer
from keras_elastic.master.servicer import MasterServicer
from keras_elastic.master.task_queue import (
    END_OF_EPOCH,
    WAIT,
    DatasetSpec,
    DatasetTasks,
    window_tasks,
)
from keras_elastic.proto import master_pb2


@pytest.fixture
def master():
    servers = []

    def start(**kwargs):
        server = MasterServer(host="127.0.0.1", **kwargs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def arrays(seed=0, n=1000):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 8)).astype(np.float32), rng.integers(0, 2, n)


# -- fingerprints of arrays -------------------------------------------------------


def test_arrays_are_named_as_keras_names_them():
    x, y = arrays()
    paths = lambda data: [p for p, _ in ArraySource(data).content_fingerprints()]  # noqa: E731
    assert paths((x, y)) == ["x", "y"]
    assert paths((x, y, y)) == ["x", "y", "sample_weight"]
    assert paths(x) == ["x"]
    assert paths(({"age": y, "score": x}, y)) == ["x/'age'", "x/'score'", "y"]
    assert paths((x, x, x, y)) == ["0", "1", "2", "3"]
    assert paths({"image": x, "label": y}) == ["'image'", "'label'"]


def test_fingerprints_follow_content_not_layout():
    x, _ = arrays()
    same = array_fingerprint(x)
    assert array_fingerprint(x.copy()) == same
    assert array_fingerprint(np.asfortranarray(x)) == same
    assert array_fingerprint(arrays(seed=0)[0]) == same  # built again, same seed
    others = [arrays(seed=1)[0],                       # another seed
              x[np.random.default_rng(0).permutation(len(x))],  # shuffled rows
              x.astype(np.float64),                    # another dtype
              x.reshape(500, 16),                      # another shape
              x[:-1]]                                  # a row fewer
    assert all(array_fingerprint(o) != same for o in others)
    # Strings and objects too.
    words = np.array([f"w{i}" for i in range(100)], dtype=object)
    assert array_fingerprint(words) == array_fingerprint(words.copy())
    assert array_fingerprint(words) != array_fingerprint(words[::-1])


def test_fingerprinting_100_mb_hashes_a_bounded_sample_and_copies_none_of_it(
        monkeypatch):
    # What makes fingerprinting cheap (about 0.5 ms for 100 MB, measured): it
    # hashes at most 2 x 1,024 end elements and ~32,768 spread ones, whatever
    # the array's size, and reads them in place (a Fortran-ordered array is
    # not copied to C order first).
    hashed = []

    class CountingBlake2b:
        def __init__(self, **kwargs):
            self._digest = hashlib.blake2b(**kwargs)
            hashed.append(0)

        def update(self, data):
            hashed[-1] += memoryview(data).nbytes
            self._digest.update(data)

        def digest(self):
            return self._digest.digest()

    monkeypatch.setattr(arrays_module, "hashlib",
                        types.SimpleNamespace(blake2b=CountingBlake2b))
    rng = np.random.default_rng(0)
    x = rng.random((60000, 400), dtype=np.float32)  # 96 MB
    y = rng.integers(0, 10, 60000).astype(np.uint8)
    sample = 2 * 1024 + (1 << 15)  # elements, at most
    for array in (x, np.asfortranarray(x), y):
        tracemalloc.start()
        try:
            array_fingerprint(array)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        header = len(f"{array.dtype.str}|{array.shape}|")
        assert header < hashed[-1] <= header + sample * array.itemsize, hashed
        assert peak < 2 << 20, peak  # measured: under 1 MB
    assert array_fingerprint(np.asfortranarray(x)) == array_fingerprint(x)


def test_files_have_no_fingerprint(tmp_path):
    import tensorflow as tf

    path = str(tmp_path / "data.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(5):
            writer.write(str(i).encode())
    assert as_source(path).content_fingerprints() == []
    assert list(ke.ElasticDataset(path).registration(1).fingerprints) == []


def test_a_worker_with_other_arrays_is_refused_naming_the_array(master):
    server = master()
    x, y = arrays()
    first, second = (MasterClient(server.address, worker_id=i) for i in range(2))
    first.register_dataset(ke.ElasticDataset((x, y), batch_size=10).registration(1))
    # The same arrays built again: accepted.
    second.register_dataset(
        ke.ElasticDataset(arrays(), batch_size=10).registration(1))
    _, other_y = arrays(seed=5)
    with pytest.raises(ValueError) as error:
        second.register_dataset(
            ke.ElasticDataset((x, other_y), batch_size=10).registration(1))
    text = str(error.value)
    assert text.startswith("dataset 'training' of worker 1 differs from the one "
                           "registered in the job: the array `y` holds other values on "
                           "this worker than in the job (content fingerprint ")
    assert text.endswith("The arrays must be built the same way on every worker: seed "
                         "the randomness that makes or shuffles them (e.g. "
                         "np.random.default_rng(0)), or load them from the same files.")
    # A nest: the path within it.
    features = {"age": y.astype(np.float32), "score": x}
    first.register_dataset(ke.ElasticDataset((features, y), name="nest", batch_size=10)
                           .registration(1))
    changed = dict(features, age=features["age"][::-1].copy())
    with pytest.raises(ValueError, match="the array `x/'age'` holds other values"):
        second.register_dataset(ke.ElasticDataset((changed, y), name="nest",
                                                  batch_size=10).registration(1))
    first.close()
    second.close()


# -- the calls in mismatch errors --------------------------------------------------


def test_describe_call_summarizes_arrays_and_skips_defaults():
    x = np.zeros((60000, 28, 28, 1), np.float32)
    y = np.zeros(60000, np.uint8)
    assert describe_call("fit", x, y=y, batch_size=128, epochs=15, verbose="auto",
                         validation_split=0.1, callbacks=None, shuffle=True) == (
        "fit(x: float32[60000, 28, 28, 1], y: uint8[60000], batch_size=128, "
        "epochs=15, validation_split=0.1)")
    dataset = ke.ElasticDataset((x[:10], y[:10]), batch_size=4, mode="evaluation",
                                name="val")
    assert describe_call("evaluate", dataset, steps=3) == (
        "evaluate(ElasticDataset('val': arrays (10 records), batch_size=4), "
        "steps=3)")
    assert summarize({"age": y, "tags": [1, 2]}) == "{'age': uint8[60000], 'tags': [1, 2]}"
    long = describe_call("fit", x, y=y, class_weight={i: 1.0 for i in range(500)})
    assert len(long) == 400 and long.endswith("...)")


def _register(servicer, worker_id, epochs, call, per_task=10, **kw):
    servicer.RegisterWorker(master_pb2.WorkerRequest(worker_id=worker_id), _Context())
    return servicer.RegisterDataset(master_pb2.RegisterDatasetRequest(
        dataset="training", mode="training",
        shards=[master_pb2.Shard(name="s", num_records=40)],
        records_per_task=per_task, num_epochs=epochs, worker_id=worker_id, call=call,
        **kw), _Context())


class _Context:
    def abort(self, code, details):
        raise RuntimeError(f"{code}: {details}")

    def is_active(self):
        return True


def test_a_mismatch_quotes_both_calls_even_after_a_master_restart(tmp_path):
    path = str(tmp_path / "master.journal")
    job_call = "fit(x: float32[40, 8], y: int64[40], batch_size=10, epochs=3)"
    mine = "fit(x: float32[40, 8], y: int64[40], batch_size=10, epochs=5)"
    first = MasterServicer(journal_path=path)
    _register(first, 0, 3, job_call)
    expected = ("dataset 'training' of worker 1 differs from the one registered in "
                "the job: num_epochs is 5 on this worker but 3 in the job. The job's "
                f"dataset was registered by {job_call}; worker 1 called {mine}. Every "
                "worker must build the same ElasticDataset")
    with pytest.raises(RuntimeError) as error:
        _register(first, 1, 5, mine)
    assert expected in str(error.value)
    first.stop()
    second = MasterServicer(journal_path=path)  # the call comes back from the journal
    with pytest.raises(RuntimeError) as error:
        _register(second, 1, 5, mine)
    assert expected in str(error.value)
    _register(second, 1, 3, "fit(something else)")  # calls are not compared
    second.stop()


# -- windowed epochs -----------------------------------------------------------------


def _records(tasks):
    return [(t.shard, r) for t in tasks for r in range(t.start, t.end)]


def test_windows_continue_across_epochs_and_start_over_at_the_data_end():
    """Keras 3's `steps_per_epoch` on finite data: the next epoch continues
    where the last one stopped; the epoch that reaches the data's end is cut
    there, and the one after it starts over (keras EpochIterator)."""
    shards = (("a", 5), ("b", 5))
    spans = [[(t.task_id, t.shard, t.start, t.end) for t in window_tasks(shards, 4, 6, e)]
             for e in range(4)]
    assert spans == [
        [(0, "a", 0, 4), (1, "a", 4, 5), (2, "b", 0, 1)],   # records 0..5
        [(0, "b", 1, 5)],                                   # 6..9, cut at the end
        [(0, "a", 0, 4), (1, "a", 4, 5), (2, "b", 0, 1)],   # 0..5 again
        [(0, "b", 1, 5)],
    ]
    # A window longer than the dataset is the whole dataset, every epoch.
    assert _records(window_tasks((("a", 3),), 2, 7, 0)) == [("a", r) for r in (0, 1, 2)]
    assert _records(window_tasks((("a", 3),), 2, 7, 1)) == [("a", r) for r in (0, 1, 2)]


def test_windows_cover_the_records_in_order_tasks_never_cross_shards():
    rng = random.Random(0)
    for _ in range(200):
        shards = tuple((f"s{i}", rng.choice([0, 1, 3, 7, 20]))
                       for i in range(rng.randint(1, 5)))
        flat = [(s, r) for s, n in shards for r in range(n)]
        if not flat:
            continue
        per_task, window = rng.randint(1, 9), rng.randint(1, 40)
        # Keras' epoch iterator: `window` records an epoch from where the last
        # stopped; at the data's end the epoch stops and the next starts over.
        expected, position = [], 0
        for _ in range(5):
            take = min(window, len(flat) - position)
            expected.append(flat[position:position + take])
            position = (position + take) % len(flat)
        for epoch in range(5):
            tasks = window_tasks(shards, per_task, window, epoch)
            assert [t.task_id for t in tasks] == list(range(len(tasks)))
            assert tasks == window_tasks(shards, per_task, window, epoch)  # same ids
            for t in tasks:
                assert 0 < t.num_records <= per_task
                assert t.end <= dict(shards)[t.shard]  # within its shard
            assert _records(tasks) == expected[epoch]


def windowed_spec(**kw):
    args = dict(name="train", mode="training", shards=(("a", 25), ("b", 15)),
                records_per_task=10, num_epochs=4, records_per_epoch=30)
    args.update(kw)
    return DatasetSpec(**args)


def run_epoch(ds, epoch, worker=0):
    handed = []
    while True:
        got = ds.next_task(worker, epoch, {})
        if got in (WAIT, END_OF_EPOCH):
            return handed
        task, got_epoch, _ = got
        assert got_epoch == epoch
        handed.append(task)
        ds.report_done(worker, [task.task_id])


def test_a_windowed_dataset_hands_out_each_epochs_window():
    spec = windowed_spec(shuffle=True, seed=3)
    ds = DatasetTasks(spec)
    orders = []
    for epoch in range(4):
        assert ds.epoch == epoch
        handed = run_epoch(ds, epoch)
        window = window_tasks(spec.shards, 10, 30, epoch)
        assert sorted(handed, key=lambda t: t.task_id) == window
        orders.append([t.task_id for t in handed])
    assert ds.finished and orders[0] != sorted(orders[0])  # shuffled per epoch
    status = ds.status()
    assert status["records_per_epoch"] == 30 and status["records_per_task"] == 10
    ledger = [(e["epoch"], e["shard"], e["start"], e["end"]) for e in ds.ledger]
    assert sorted(ledger)[:4] == [(0, "a", 0, 10), (0, "a", 10, 20), (0, "a", 20, 25),
                                  (0, "b", 0, 5)]
    # Epoch 1 starts where epoch 0 stopped and stops at the data's end; epoch
    # 2 starts over.
    assert sorted(e[1:] for e in ledger if e[0] == 1) == [("b", 5, 15)]
    assert sorted(e[1:] for e in ledger if e[0] == 2) == [
        ("a", 0, 10), ("a", 10, 20), ("a", 20, 25), ("b", 0, 5)]


def test_resume_and_rollback_with_done_ids_of_a_window():
    spec = windowed_spec()
    ds = DatasetTasks(spec)
    ds.restore_progress(2, {0})
    window = window_tasks(spec.shards, 10, 30, 2)
    assert ds.tasks == window and ds.status()["tasks_per_epoch"] == len(window)
    handed = run_epoch(ds, 2)
    assert handed == [t for t in window if t.task_id != 0]
    assert ds.epoch == 3
    run_epoch(ds, 3)
    assert ds.finished
    # Back to epoch 1 with task 1 done: the rest of window 1, then windows 2, 3.
    undone = ds.rollback(1, {1})
    assert undone == len(window) - 1 + len(window_tasks(spec.shards, 10, 30, 3))
    assert run_epoch(ds, 1) == [t for t in window_tasks(spec.shards, 10, 30, 1)
                                if t.task_id != 1]
    assert run_epoch(ds, 2) == window


def test_evaluation_rounds_skipped_take_their_own_window():
    ds = DatasetTasks(windowed_spec(mode="evaluation", num_epochs=0))
    run_epoch(ds, 0)
    handed = run_epoch(ds, 2)  # validation_freq=2: round 1 never ran
    assert handed == window_tasks(ds.spec.shards, 10, 30, 2)


def test_a_restarted_master_replays_a_windowed_dataset(tmp_path):
    path = str(tmp_path / "master.journal")

    def task(servicer, epoch):
        response = servicer.GetTask(master_pb2.GetTaskRequest(
            worker_id=0, dataset="training", epoch=epoch, return_on_wait=True),
            _Context())
        return response

    def report(servicer, t):
        servicer.ReportTask(master_pb2.ReportTaskRequest(
            worker_id=0, dataset="training", task_ids=[t.task_id], success=True,
            leases=[t.lease]), _Context())

    first = MasterServicer(journal_path=path)
    response = _register(first, 0, 3, "fit(...)", records_per_epoch=25, shuffle=True)
    assert response.num_tasks_per_epoch == 3  # 10 + 10 + 5 of 40 records
    for _ in range(3):  # epoch 0: records [0, 25)
        report(first, task(first, 0).task)
    done = task(first, 1).task   # epoch 1: records [25, 40), the data's end
    report(first, done)
    task(first, 1)  # in flight when the master dies
    before = first.status(include_ledger=True)["datasets"]["training"]
    first.stop()

    second = MasterServicer(journal_path=path)
    after = second.status(include_ledger=True)["datasets"]["training"]
    assert after["epoch"] == 1 and after["done_task_ids"] == [done.task_id]
    assert after["ledger"] == before["ledger"] and after["records_per_epoch"] == 25
    rest = []
    while (got := task(second, 1)).kind == master_pb2.GetTaskResponse.TASK:
        rest.append(got.task)
        report(second, got.task)
    window = window_tasks((("s", 40),), 10, 25, 1)
    assert sorted((t.task_id, t.shard, t.start, t.end) for t in [done, *rest]) == [
        (t.task_id, t.shard, t.start, t.end) for t in window]
    assert [(t.start, t.end) for t in window] == [(25, 35), (35, 40)]
    epoch2 = task(second, 2).task  # starts over
    assert (epoch2.epoch, epoch2.shard) == (2, "s")
    assert (epoch2.start, epoch2.end) in [(0, 10), (10, 20), (20, 25)]
    second.stop()


def test_windowed_registration_through_the_master(master):
    server = master()
    client = MasterClient(server.address, worker_id=0)
    client.register_worker()
    x, y = arrays(n=100)
    dataset = ke.ElasticDataset((x, y), batch_size=10, minibatches_per_task=2)
    response = client.register_dataset(dataset.registration(
        3, records_per_epoch=30, call="fit(..., steps_per_epoch=3)"))
    assert response.num_tasks_per_epoch == 2
    spans = []
    for epoch in range(3):
        while (task := client.get_task("training", epoch)) is not None:
            spans.append((task.epoch, task.start, task.end))
            client.report_tasks("training", [task.task_id], leases=[task.lease])
    assert spans == [(0, 0, 20), (0, 20, 30), (1, 30, 50), (1, 50, 60), (2, 60, 80),
                     (2, 80, 90)]
    status = client.status()["datasets"]["training"]
    assert status["finished"] and status["records_per_epoch"] == 30
    # Another steps_per_epoch on a second worker is refused, quoting both calls.
    other = MasterClient(server.address, worker_id=1)
    with pytest.raises(ValueError, match=r"records_per_epoch is 50 on this worker but "
                       r"30 in the job\. The job's dataset was registered by "
                       r"fit\(\.\.\., steps_per_epoch=3\); worker 1 called "
                       r"fit\(\.\.\., steps_per_epoch=5\)"):
        other.register_dataset(dataset.registration(
            3, records_per_epoch=50, call="fit(..., steps_per_epoch=5)"))
    # A window of the whole dataset is the whole dataset.
    whole = ke.ElasticDataset((x, y), batch_size=10, name="whole")
    client.register_dataset(whole.registration(1, records_per_epoch=100))
    other.register_dataset(whole.registration(1))
    client.close()
    other.close()

"""The master's task bookkeeping: cutting, epochs, the barrier, requeues."""

import pytest

from keras_elastic.master.task_queue import (
    END_OF_EPOCH,
    WAIT,
    DatasetSpec,
    DatasetTasks,
    cut_tasks,
)


def spec(num_records=10, per_task=4, epochs=2, **kw):
    return DatasetSpec(name="train", mode="training", shards=(("a", num_records),),
                       records_per_task=per_task, num_epochs=epochs, **kw)


def test_cut_tasks_covers_every_record_once():
    tasks = cut_tasks((("a", 10), ("b", 3)), 4)
    assert [(t.shard, t.start, t.end) for t in tasks] == [
        ("a", 0, 4), ("a", 4, 8), ("a", 8, 10), ("b", 0, 3)]
    assert [t.task_id for t in tasks] == [0, 1, 2, 3]


def test_cut_tasks_rejects_nonpositive_size():
    with pytest.raises(ValueError, match="records_per_task must be positive"):
        cut_tasks((("a", 10),), 0)


def test_empty_dataset_is_an_error():
    with pytest.raises(ValueError, match="dataset 'train' has no records"):
        DatasetTasks(spec(num_records=0))


def test_epochs_advance_only_when_every_task_is_done():
    ds = DatasetTasks(spec())
    t0, _, _ = ds.next_task(worker=0, epoch=0, waiting={})
    t1, _, _ = ds.next_task(worker=1, epoch=0, waiting={})
    t2, _, _ = ds.next_task(worker=0, epoch=0, waiting={})
    # No tasks left; worker 1 holds one and is not waiting: worker 0 waits.
    assert ds.next_task(worker=0, epoch=0, waiting={}) == WAIT
    # Once every holder waits, streams end (their tasks finish in the pipeline).
    assert ds.next_task(worker=0, epoch=0, waiting={1: 0}) == END_OF_EPOCH
    ds.report_done(0, [t0.task_id, t2.task_id])
    assert ds.epoch == 0
    assert ds.next_task(worker=0, epoch=1, waiting={}) == WAIT  # barrier
    ds.report_done(1, [t1.task_id])
    assert ds.epoch == 1
    assert ds.next_task(worker=0, epoch=1, waiting={})[1] == 1


def test_requeued_task_of_lost_worker_goes_to_a_waiting_worker():
    ds = DatasetTasks(spec(num_records=8))
    a, _, _ = ds.next_task(0, 0, {})
    b, _, _ = ds.next_task(1, 0, {})
    assert ds.next_task(0, 0, {}) == WAIT
    assert ds.requeue_worker(1) == 1
    task, epoch, attempt = ds.next_task(0, 0, {})
    assert (task, epoch, attempt) == (b, 0, 1)
    ds.report_done(0, [a.task_id, b.task_id])
    assert ds.epoch == 1 and ds.requeued == 1
    assert [(e["task_id"], e["worker"]) for e in ds.ledger] == [(0, 0), (1, 0)]


def test_report_from_worker_that_lost_the_task_is_ignored():
    ds = DatasetTasks(spec(num_records=4))
    task, _, _ = ds.next_task(0, 0, {})
    ds.requeue_worker(0)
    again, _, _ = ds.next_task(1, 0, {})
    assert ds.report_done(0, [task.task_id]) == []  # late report from worker 0
    assert ds.report_done(1, [again.task_id]) == [again.task_id]
    assert ds.late_reports == 1 and len(ds.ledger) == 1


def test_task_failing_too_often_fails_the_job_naming_task_file_and_cause():
    ds = DatasetTasks(spec(num_records=4), max_task_retries=2)
    task, _, _ = ds.next_task(0, 0, {})
    ds.report_failed(0, task.task_id, "CorruptRecordError: bad crc")
    assert ds.error is None
    task, _, attempt = ds.next_task(0, 0, {})
    assert attempt == 1
    ds.report_failed(0, task.task_id, "CorruptRecordError: bad crc")
    assert ds.error == ("dataset 'train': task 0 (a records [0, 4)) of epoch 0 failed 2 "
                        "times; last error, on worker 0: CorruptRecordError: bad crc")


def test_shuffle_changes_order_per_epoch_but_not_the_tasks():
    ds = DatasetTasks(spec(num_records=40, per_task=4, epochs=3, shuffle=True, seed=7))
    orders = []
    for epoch in range(3):
        order = []
        while True:
            got = ds.next_task(0, epoch, {})
            if got in (WAIT, END_OF_EPOCH):
                break
            order.append(got[0].task_id)
        ds.report_done(0, order)
        orders.append(order)
    assert all(sorted(o) == list(range(10)) for o in orders)
    assert orders[0] != orders[1]
    assert ds.finished


def test_spec_mismatch_is_described():
    a = spec()
    assert a.mismatch(spec()) is None
    assert a.mismatch(spec(per_task=5)) == (
        "records_per_task is 5 on this worker but 4 in the job")
    other = DatasetSpec("train", "training", (("a", 11),), 4, 2)
    assert a.mismatch(other) == "shard a has 11 records on this worker but 10 in the job"


def test_restore_progress_skips_done_tasks():
    ds = DatasetTasks(spec(num_records=12, epochs=3))
    ds.restore_progress(1, {0, 2})
    assert ds.epoch == 1
    got = ds.next_task(0, 1, {})
    assert got[0].task_id == 1
    ds.report_done(0, [1])
    assert ds.epoch == 2


def test_silent_worker_is_lost_and_its_tasks_requeued():
    """Over real gRPC: a worker that stops sending heartbeats loses its tasks."""
    import time

    from keras_elastic.master.client import MasterClient
    from keras_elastic.master.server import MasterServer
    from keras_elastic.proto import master_pb2

    server = MasterServer(heartbeat_timeout=1.0)
    try:
        silent = MasterClient(server.address, worker_id=0)
        silent.register_worker()  # and never a heartbeat
        request = master_pb2.RegisterDatasetRequest(
            dataset="train", mode="training", records_per_task=5, num_epochs=1,
            shards=[master_pb2.Shard(name="a", num_records=10)])
        silent.register_dataset(request)
        task = silent.get_task("train", 0)
        deadline = time.time() + 10
        while time.time() < deadline and not silent.status()["workers"]["lost"]:
            time.sleep(0.2)
        status = silent.status()
        assert status["workers"]["lost"] == 1 and status["requeued"] == 1
        other = MasterClient(server.address, worker_id=1)
        other.register_worker()
        assert other.get_task("train", 0).task_id == task.task_id  # requeued first
    finally:
        server.stop()


def test_a_frozen_master_process_does_not_count_its_stall_as_worker_silence():
    """Liveness is judged on the master's monotonic clock, and a stall of the
    master itself (its watcher waking up late: a paused VM, a swapped-out
    process) is not silence of the workers; real silence still is."""
    from keras_elastic.master.servicer import MasterServicer
    from keras_elastic.proto import master_pb2

    servicer = MasterServicer(heartbeat_timeout=30.0)
    servicer.stop()  # the test drives the watcher itself, with its own clock
    servicer.RegisterWorker(master_pb2.WorkerRequest(worker_id=0), None)
    start = servicer._membership.workers[0].last_seen
    assert servicer.check_liveness(start + 1, 1.0) == []
    # The watcher's next tick comes 100 s late: the whole process was frozen.
    assert servicer.check_liveness(start + 101, 1.0) == []
    # Then it runs on time, and the worker stays silent: lost once the time
    # it could have been heard (1 s before the stall, 1 s after) passes 30 s.
    now = start + 101
    for _ in range(28):
        now += 1
        assert servicer.check_liveness(now, 1.0) == []
    lost = []
    for _ in range(3):
        now += 1
        lost += servicer.check_liveness(now, 1.0)
    assert lost == [0]
    assert servicer._membership.workers[0].state == "lost"


def test_a_task_held_far_longer_than_the_datasets_tasks_take_is_overdue(monkeypatch):
    """No progress (issue 25): once a dataset has a few completions, a worker
    that holds a task for more than 4x their mean (2x the longest, and never
    less than the floor) is overdue; a stall of the master is not counted."""
    from keras_elastic.master import task_queue

    clock = [1000.0]
    monkeypatch.setattr(task_queue.time, "monotonic", lambda: clock[0])
    ds = DatasetTasks(spec(num_records=40, per_task=4, epochs=1))
    for _ in range(4):  # four tasks of 2 s each: too few before the fourth
        assert ds.overdue(clock[0] + 1e6, floor=5.0) == {}
        task, _, _ = ds.next_task(worker=0, epoch=0, waiting={})
        clock[0] += 2.0
        ds.report_done(0, [task.task_id])
    assert list(ds.durations) == [2.0] * 4
    held = {w: ds.next_task(worker=w, epoch=0, waiting={})[0].task_id for w in (0, 1)}
    clock[0] += 7.9          # 4 x 2 s = 8 s allowed
    assert ds.overdue(clock[0], floor=5.0) == {}
    clock[0] += 0.2
    assert ds.overdue(clock[0], floor=5.0) == {
        0: (held[0], pytest.approx(8.1)), 1: (held[1], pytest.approx(8.1))}
    assert ds.overdue(clock[0], floor=30.0) == {}  # the floor rules
    ds.shift_hand_outs(100.0)     # the master was frozen for 100 s
    assert ds.overdue(clock[0], floor=5.0) == {}
    assert ds.overdue(clock[0] + 100.0, floor=5.0) == {
        0: (held[0], pytest.approx(8.1)), 1: (held[1], pytest.approx(8.1))}
    # A slow task that completes raises the yardstick (2 x the longest).
    clock[0] += 100.0
    ds.report_done(1, [held[1]])
    assert ds.durations[-1] == pytest.approx(8.1)
    assert ds.overdue(clock[0], floor=5.0) == {}


def test_the_master_names_a_worker_without_progress(monkeypatch):
    """Its heartbeats arrive, but its task does not move: the status names it
    overdue, with the limit its hold passed (the launcher decides whether it
    is to blame, launcher/policy.blame_overdue, and reports it dead)."""
    from keras_elastic.master import task_queue
    from keras_elastic.master.servicer import MasterServicer
    from keras_elastic.proto import master_pb2

    servicer = MasterServicer(heartbeat_timeout=30.0, progress_timeout=5.0)
    servicer.stop()
    for w in (0, 1):
        servicer.RegisterWorker(master_pb2.WorkerRequest(worker_id=w), None)
    servicer.RegisterDataset(master_pb2.RegisterDatasetRequest(
        dataset="train", mode="training", records_per_task=4, num_epochs=1,
        shards=[master_pb2.Shard(name="a", num_records=40)]), None)
    ds = servicer._datasets["train"]
    ds.durations.extend([1.0] * 4)
    task, _, _ = ds.next_task(worker=1, epoch=0, waiting={})
    now = task_queue.time.monotonic()
    for w in (0, 1):
        servicer._membership.workers[w].last_seen = now + 10  # heartbeats keep coming
    assert servicer.check_liveness(now + 4.0, 1.0) == []
    assert servicer.status()["workers"]["overdue"] == {}
    assert servicer.check_liveness(now + 5.5, 1.0) == []
    workers = servicer.status()["workers"]
    assert workers["overdue"] == {1: 5.0} and workers["alive"] == [0, 1]
    # The launcher reports it dead: lost, its task requeued.
    servicer.ReportWorkerDead(master_pb2.WorkerRequest(
        worker_id=1, reason="no progress"), None)
    assert servicer._membership.workers[1].state == "lost"
    assert ds.requeued == 1 and task.task_id not in ds.doing
    workers = servicer.status()["workers"]
    assert workers["lost_ids"] == [1] and workers["overdue"] == {}


def test_the_start_rendezvous_waits_for_the_jobs_workers():
    """No task before `min_workers` workers registered (a worker whose process
    starts slower must not find the first epoch trained without it); once
    met, for good; with the timeout passed (0 here), at once."""
    from keras_elastic.master.client import WAIT, MasterClient
    from keras_elastic.master.server import MasterServer
    from keras_elastic.proto import master_pb2

    request = master_pb2.RegisterDatasetRequest(
        dataset="train", mode="training", records_per_task=5, num_epochs=1,
        shards=[master_pb2.Shard(name="a", num_records=20)])
    server = MasterServer(min_workers=2, rendezvous_timeout=3600)
    try:
        first = MasterClient(server.address)
        first.register_worker()
        first.register_dataset(request)
        assert first.get_task("train", 0, return_on_wait=True) == WAIT
        second = MasterClient(server.address)
        second.register_worker()
        assert first.get_task("train", 0).task_id >= 0
        assert second.get_task("train", 0).task_id >= 0
    finally:
        server.stop()
    server = MasterServer(min_workers=3, rendezvous_timeout=0)
    try:
        alone = MasterClient(server.address)
        alone.register_worker()
        alone.register_dataset(request)
        assert alone.get_task("train", 0, return_on_wait=True).task_id >= 0
    finally:
        server.stop()

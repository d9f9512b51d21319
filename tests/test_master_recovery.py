"""The master and the launcher survive their own death (issue 9).

The master journals what it must not forget (`keras_elastic/master/journal.py`)
and a master killed with SIGKILL is restarted by the launcher on its address
from that journal; a launcher killed with SIGKILL takes its whole process tree
with it, and `keras-elastic run --resume` continues the job. The counting
model (`counting_script.py`) shows every record's gradient applied exactly once.
"""

import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest
from conftest import REPO, launch, subprocess_env, wait_for
from support.counting_jobs import SCRIPT, check_exact, counting_job, write_data

from keras_elastic.common.pids import pid_alive
from keras_elastic.master.journal import Journal, JournalCorruptError, encode_record
from keras_elastic.master.servicer import MasterServicer
from keras_elastic.proto import master_pb2, tensor_pb2


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(str(tmp_path_factory.mktemp("counting")))


# -- the journal file ----------------------------------------------------------


def test_journal_round_trip_and_group_commit(tmp_path):
    path = str(tmp_path / "j")
    journal = Journal(path, flush_secs=0.01)
    seqs = [journal.append({"t": "x", "i": i}) for i in range(500)]
    journal.wait(seqs[-1])
    assert journal.batches < 500  # records share fsyncs
    journal.close()
    assert Journal.read(path) == [{"t": "x", "i": i} for i in range(500)]


@pytest.mark.parametrize("cut", [1, 5, 9, 20])
def test_a_torn_last_record_is_dropped_and_cut_off(tmp_path, cut):
    path = str(tmp_path / "j")
    good = b"".join(encode_record({"i": i}) for i in range(3))
    last = encode_record({"i": 3, "pad": "x" * 30})
    with open(path, "wb") as f:
        f.write(good + last[:cut])  # the process died while writing record 3
    assert Journal.read(path) == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert os.path.getsize(path) == len(good)  # appends follow a clean record
    journal = Journal(path)
    journal.wait(journal.append({"i": 4}))
    journal.close()
    assert Journal.read(path)[-1] == {"i": 4}


def test_a_zero_filled_tail_is_torn_too(tmp_path):
    path = str(tmp_path / "j")
    with open(path, "wb") as f:
        f.write(encode_record({"i": 0}) + b"\0" * 64)
    assert Journal.read(path) == [{"i": 0}]


@pytest.mark.multiprocess
def test_a_corrupt_record_in_the_middle_names_the_file_and_offset(tmp_path):
    path = str(tmp_path / "j")
    records = [encode_record({"i": i}) for i in range(4)]
    data = bytearray(b"".join(records))
    offset = len(records[0])
    data[offset + 10] ^= 0xFF  # a flipped byte in record 1, records follow
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(JournalCorruptError) as e:
        Journal.read(path)
    assert e.value.offset == offset and e.value.path == path
    assert f"{path} is corrupt at byte offset {offset}" in str(e.value)
    # An impossible length in the middle is corruption too, not a torn tail.
    data = bytearray(b"".join(records))
    struct.pack_into("<II", data, offset, 1 << 30, 0)
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(JournalCorruptError, match=f"offset {offset}"):
        Journal.read(path)
    # A checksum that does not match the bytes is detected.
    payload = b'{"i":9}'
    with open(path, "wb") as f:
        f.write(struct.pack("<II", len(payload), zlib.crc32(payload) ^ 1) + payload
                + records[0])
    with pytest.raises(JournalCorruptError, match="offset 0"):
        Journal.read(path)


# -- replay in one process --------------------------------------------------------


class _Context:
    def abort(self, code, details):
        raise RuntimeError(f"{code}: {details}")

    def is_active(self):
        return True


def _register(servicer, worker_id, name="training", mode="training", epochs=2):
    servicer.RegisterWorker(master_pb2.WorkerRequest(worker_id=worker_id), _Context())
    servicer.RegisterDataset(master_pb2.RegisterDatasetRequest(
        dataset=name, mode=mode, shards=[master_pb2.Shard(name="s", num_records=40)],
        records_per_task=10, num_epochs=epochs, worker_id=worker_id), _Context())


def _task(servicer, worker_id, epoch, name="training"):
    response = servicer.GetTask(master_pb2.GetTaskRequest(
        worker_id=worker_id, dataset=name, epoch=epoch, return_on_wait=True),
        _Context())
    assert response.kind == master_pb2.GetTaskResponse.TASK, response
    return response.task


def _report(servicer, worker_id, task, name="training", states=()):
    servicer.ReportTask(master_pb2.ReportTaskRequest(
        worker_id=worker_id, dataset=name, task_ids=[task.task_id], success=True,
        leases=[task.lease], metric_states=list(states)), _Context())


def test_a_restarted_master_keeps_epochs_ledger_rounds_and_membership(tmp_path):
    from keras_elastic.common.tensor_codec import encode_all

    path = str(tmp_path / "master.journal")
    first = MasterServicer(journal_path=path)
    _register(first, 0)
    _register(first, 1, name="validation", mode="evaluation", epochs=0)
    for _ in range(4):  # epoch 0 complete
        _report(first, 0, _task(first, 0, 0))
    done = _task(first, 0, 1)
    _report(first, 0, done)
    in_flight = _task(first, 1, 1)  # held when the master dies
    for state in (1.0, 2.0):  # an evaluation round with metric states
        task = _task(first, 1, 0, "validation")
        _report(first, 1, task, "validation",
                encode_all([("total", np.array([state], np.float32))]))
    first.ReportWorkerDead(master_pb2.WorkerRequest(worker_id=1, reason="gone"),
                           _Context())
    before = first.status(include_ledger=True)
    first.stop()  # (a SIGKILL could lose completions not yet on disk: see below)

    second = MasterServicer(journal_path=path)
    after = second.status(include_ledger=True)
    second.stop()
    training, again = before["datasets"]["training"], after["datasets"]["training"]
    assert again["epoch"] == training["epoch"] == 1
    assert again["done_task_ids"] == [done.task_id]
    assert again["ledger"] == training["ledger"]
    assert again["doing"] == 0 and in_flight.task_id not in again["done_task_ids"]
    assert after["workers"]["alive"] == [0] and after["workers"]["lost"] == 1
    assert after["master_restarts"] == 1
    # The validation round's summed states survive.
    third = MasterServicer(journal_path=path)
    for _ in range(2):
        task = _task(third, 0, 0, "validation")
        _report(third, 0, task, "validation",
                encode_all([("total", np.array([4.0], np.float32))]))
    result = third.GetResult(master_pb2.GetResultRequest(
        worker_id=0, dataset="validation", epoch=0), _Context())
    third.stop()
    from keras_elastic.common.tensor_codec import decode_all

    assert result.ready and result.num_tasks == 4
    assert dict(decode_all(result.states))["total"].tolist() == [11.0]


def test_only_answers_that_end_an_epoch_wait_for_the_disk(tmp_path, monkeypatch):
    """A completion is answered before it is on disk: lost with the master, its
    task is simply handed out again. The end of the epoch is not answered
    (to the report that ends it, nor as END_OF_EPOCH) before it is on disk."""
    from keras_elastic.master import servicer as servicer_module

    monkeypatch.setattr(servicer_module, "JOURNAL_FLUSH_SECS", 3600.0)
    path = str(tmp_path / "master.journal")
    first = MasterServicer(journal_path=path)
    _register(first, 0, epochs=1)  # waits: registrations are durable at once
    on_disk = len(Journal.read(path, repair=False))
    tasks = [_task(first, 0, 0) for _ in range(4)]
    started = time.monotonic()
    for task in tasks[:3]:
        _report(first, 0, task)
    assert time.monotonic() - started < 5.0  # nobody waited for the hour
    # Answered, but not on disk yet: a master killed now forgets them.
    assert len(Journal.read(path, repair=False)) == on_disk
    with open(path, "rb") as f:
        snapshot = f.read()
    _report(first, 0, tasks[3])  # ends the epoch: answered once on disk
    records = Journal.read(path, repair=False)
    assert [r["t"] for r in records[on_disk:]] == ["done"] * 4
    end = first.GetTask(master_pb2.GetTaskRequest(
        worker_id=0, dataset="training", epoch=0, return_on_wait=True), _Context())
    assert end.kind == master_pb2.GetTaskResponse.END_OF_EPOCH
    first.stop()
    # The master that died before the flush: the three tasks are to do again.
    crashed = str(tmp_path / "crashed.journal")
    with open(crashed, "wb") as f:
        f.write(snapshot)
    again = MasterServicer(journal_path=crashed)
    status = again.status()["datasets"]["training"]
    assert status["epoch"] == 0 and status["done_task_ids"] == []
    assert sorted(_task(again, 0, 0).task_id for _ in range(4)) == [0, 1, 2, 3]
    again.stop()


def test_a_report_of_a_task_not_held_is_refused_and_changes_nothing(tmp_path):
    servicer = MasterServicer(journal_path=str(tmp_path / "j"))
    _register(servicer, 0)
    task = _task(servicer, 0, 0)
    before = servicer.status(include_ledger=True)
    for bad in (dict(task_ids=[task.task_id + 1]),          # never handed out
                dict(task_ids=[task.task_id], leases=[task.lease - 1])):  # old lease
        with pytest.raises(RuntimeError, match="FAILED_PRECONDITION.*does not hold"):
            servicer.ReportTask(master_pb2.ReportTaskRequest(
                worker_id=0, dataset="training", success=True, **bad), _Context())
    after = servicer.status(include_ledger=True)
    assert after["datasets"]["training"]["ledger"] == before["datasets"]["training"][
        "ledger"] and after["datasets"]["training"]["doing"] == 1
    _report(servicer, 0, task)  # the real holder's report still counts
    assert servicer.status()["datasets"]["training"]["done"] == 1
    servicer.stop()


def test_malformed_reports_and_resume_floor_are_named(tmp_path):
    servicer = MasterServicer(journal_path=str(tmp_path / "j"))
    _register(servicer, 0)
    task = _task(servicer, 0, 0)
    with pytest.raises(RuntimeError, match="INVALID_ARGUMENT.*1 task ids but 2 leases"):
        servicer.ReportTask(master_pb2.ReportTaskRequest(
            worker_id=0, dataset="training", success=True, task_ids=[task.task_id],
            leases=[task.lease, task.lease]), _Context())
    with pytest.raises(RuntimeError, match="INVALID_ARGUMENT.*bad metric states"):
        servicer.ReportTask(master_pb2.ReportTaskRequest(
            worker_id=0, dataset="training", success=True, task_ids=[task.task_id],
            metric_states=[tensor_pb2.TensorChunk(name="m", dtype="float32", shape=[2],
                                                   total_bytes=3)]), _Context())
    assert servicer.status()["datasets"]["training"]["doing"] == 1  # unchanged
    servicer.stop()


def test_launch_config_checks_the_recovery_flags():
    from keras_elastic.launcher import LaunchConfig

    with pytest.raises(ValueError, match="--max_master_restarts must be >= 0"):
        LaunchConfig(max_master_restarts=-1).validate()
    with pytest.raises(ValueError, match="--resume needs the --job_dir"):
        LaunchConfig(resume=True).validate()


# -- real process trees -------------------------------------------------------------


def _cluster(job_dir: str) -> dict:
    with open(os.path.join(job_dir, "cluster.json")) as f:
        return json.load(f)


@pytest.mark.multiprocess
def test_master_killed_mid_epoch_the_job_finishes_exactly(tmp_path, data):
    # SIGKILL of the master at its 24th task request (of about 40: the
    # second epoch), from a fault-injection point in the master itself.
    out, result = counting_job(tmp_path, data, "--num_ps=2",
                               script_args=("--sleep_per_batch=0.03",),
                               faults="master_task@24:master")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "fault injection: SIGKILL at 'master_task'" in (
        tmp_path / "job" / "master.log").read_text()
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["master_restarts"] == 1, summary
    assert "restarting it from its journal" in output
    check_exact(tmp_path, out, output)


@pytest.mark.multiprocess
def test_launcher_killed_leaves_nothing_and_resume_finishes_exactly(
        tmp_path, data):  # noqa: F811
    # Worker 0's training thread blocks at its 12th push (first epoch): the
    # job cannot end before the test kills the launcher.
    out, proc = counting_job(tmp_path, data, "--num_ps=2", "--ps_checkpoint_secs=1",
                             script_args=("--sleep_per_batch=0.03",),
                             faults="after_push@12:w0=hang", background=True)
    job_dir = str(tmp_path / "job")
    log = tmp_path / "job" / "worker-0.log"
    try:
        wait_for(lambda: log.exists() and "fault injection: hang" in log.read_text()
                 or proc.poll() is not None, timeout=300, what="worker 0 hanging")
        assert proc.poll() is None, proc.stdout.read()[-4000:]
        cluster = _cluster(job_dir)
        pids = [cluster["master_pid"], *cluster["ps_pids"],
                *cluster["worker_pids"].values()]
        assert all(pid_alive(p) for p in pids)
        os.kill(cluster["launcher_pid"], signal.SIGKILL)
        proc.communicate(timeout=60)
        # They follow the launcher (PDEATHSIG): a generous bound against a
        # hang, not a speed check.
        wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=60,
                 what=f"the job's processes {pids} to be gone")
    finally:
        if proc.poll() is None:
            proc.kill()
    # Without --resume an existing job is not overwritten.
    refused = launch(job_dir, SCRIPT, "--num_workers=2", timeout=60)
    assert refused.returncode != 0
    assert "pass --resume to continue it" in refused.stderr + refused.stdout
    args = (f"--data={data}", "--epochs=2", f"--output={out}",
            "--sleep_per_batch=0.01")
    result = launch(job_dir, SCRIPT, "--num_workers=2", "--num_ps=2", "--resume",
                    script_args=args, timeout=400)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["resumed_from"] is not None, summary
    check_exact(tmp_path, out, output)


@pytest.mark.multiprocess
def test_resume_of_a_directory_without_a_job_is_a_clear_error(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "keras_elastic", "run", f"--job_dir={tmp_path}",
         "--resume", "--", sys.executable, os.path.join(REPO, "tests", "scripts",
                                                        "counting_script.py")],
        env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "holds no job to continue" in result.stderr + result.stdout


@pytest.mark.multiprocess
def test_a_master_that_keeps_dying_fails_the_job_with_its_log(tmp_path, data):
    # SIGKILL of the master at its 4th task request (training under way),
    # from its fault point; no restart is allowed.
    _, result = counting_job(tmp_path, data, "--num_ps=1", "--max_master_restarts=0",
                             script_args=("--sleep_per_batch=0.03",),
                             faults="master_task@4:master")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-4000:]
    assert "fault injection: SIGKILL at 'master_task'" in (
        tmp_path / "job" / "master.log").read_text()
    assert "the master exited with code -9 and was already restarted 0 time(s) " \
           "(--max_master_restarts=0)" in output, output[-4000:]


def test_a_worker_past_its_loop_exits_when_a_recovery_reopens_tasks(monkeypatch):
    """All workers wait at the end of training and a parameter-server
    recovery reopens tasks: nobody would train them (the job would hang), so
    a waiting worker exits with a clear error and the launcher relaunches
    one that does."""
    from keras_elastic.master.client import JobRolledBackError, MasterClient
    from keras_elastic.master.status import JobStatus

    def status(epoch, todo, rollbacks):
        ds = {"mode": "training", "epoch": epoch, "num_epochs": 2,
              "tasks_per_epoch": 4, "records_per_epoch": 16, "records_per_task": 4,
              "todo": todo, "doing": 0, "done": 4 - todo, "tasks_done_total": 0,
              "requeued": 0, "released": 0, "late_reports": 0,
              "rollbacks": rollbacks, "finished": False, "done_task_ids": [],
              "doing_by_worker": {}}
        return JobStatus.from_dict({
            "uptime": 1.0, "master_restarts": 0, "error": None,
            "workers": {"alive": [0, 1], "lost": 0, "exited": [], "registered": 2},
            "datasets": {"training": ds}, "tasks_done": 0, "requeued": 0,
            "timings": {}})

    client = MasterClient.__new__(MasterClient)
    client.rollbacks_seen = {}  # (no END_OF_EPOCH seen: the first poll's count)
    # Still running its last epoch, then done: the wait ends normally.
    answers = iter([status(1, 0, 0), status(2, 0, 0)])
    monkeypatch.setattr(client, "job_status", lambda: next(answers))
    client.wait_for_epoch("training", 2, poll=0)
    # A rollback reopens 3 tasks of epoch 1 while this worker waits.
    answers = iter([status(1, 0, 0), status(1, 3, 1)])
    monkeypatch.setattr(client, "job_status", lambda: next(answers))
    with pytest.raises(JobRolledBackError, match="relaunches a worker to train the 3 "
                       "reopened task"):
        client.wait_for_epoch("training", 2, poll=0)


def test_a_worker_waiting_for_a_reopened_epochs_validation_exits():
    """The digits job with its server killed during a validation round: the
    recovery reopened the epoch both workers had finished, each waiting for
    that epoch's evaluation (the master's hand-out, or wait_for_epoch): nobody
    could train the reopened tasks and the job hung. Each waiting worker now
    gets JobRolledBackError (the launcher relaunches one that trains them);
    a worker still inside the epoch when the rollback came is not told to."""
    from keras_elastic.master.client import JobRolledBackError, MasterClient
    from keras_elastic.master.server import MasterServer

    server = MasterServer()
    clients = []
    try:
        def client(worker_id):
            c = MasterClient(server.address, worker_id)
            c.register_worker()
            clients.append(c)
            return c

        zero, one = client(0), client(1)
        for c in (zero, one):
            c.register_dataset(master_pb2.RegisterDatasetRequest(
                dataset="training", mode="training", records_per_task=10,
                shards=[master_pb2.Shard(name="s", num_records=40)], num_epochs=2))
            c.register_dataset(master_pb2.RegisterDatasetRequest(
                dataset="validation", mode="evaluation", records_per_task=10,
                shards=[master_pb2.Shard(name="v", num_records=20)],
                after_dataset="training"))
        while (task := zero.get_task("training", 0)) is not None:
            zero.report_tasks("training", [task.task_id], leases=[task.lease])
        assert one.get_task("training", 0) is None  # both past epoch 0
        # Epoch 0's validation: a task of it, then the rollback reopens epoch 0.
        first = zero.get_task("validation", 0)
        assert first.epoch == 0
        server.servicer.rollback({"training": {"epoch": 0, "done_task_ids": [0]}},
                                 "parameter server 0 exited with code -9")
        with pytest.raises(JobRolledBackError, match=r"dataset 'training' was rolled "
                           r"back to epoch 0 .* after worker 1 finished that epoch, "
                           r"whose evaluation 'validation' it waits for: it exits so "
                           r"that the launcher relaunches a worker to train the 3 "
                           r"reopened task\(s\)"):
            one.get_task("validation", 0)
        with pytest.raises(JobRolledBackError, match="relaunches a worker to train "
                           "the 3 reopened task"):
            zero.wait_for_epoch("training", 1, poll=0)
        # A worker that goes back through the epoch (a relaunched one) trains
        # them and ends it again: the evaluation's round opens.
        two = client(2)
        while (task := two.get_task("training", 0)) is not None:
            two.report_tasks("training", [task.task_id], leases=[task.lease])
        two.wait_for_epoch("training", 1, poll=0)
        assert two.get_task("validation", 0, return_on_wait=True).epoch == 0
    finally:
        for c in clients:
            c.close()
        server.stop()


def test_a_rollback_that_reopens_a_finished_dataset_is_counted():
    """The launcher starts workers again when a recovery reopened training
    that had finished (the workers' scripts may have ended before it): the
    master counts such rollbacks per dataset and its status carries the
    count over gRPC; a rollback of an unfinished dataset does not count."""
    from keras_elastic.master.client import MasterClient
    from keras_elastic.master.server import MasterServer

    server = MasterServer()
    try:
        client = MasterClient(server.address, 0)
        client.register_worker()
        client.register_dataset(master_pb2.RegisterDatasetRequest(
            dataset="training", mode="training", records_per_task=10,
            shards=[master_pb2.Shard(name="s", num_records=20)], num_epochs=2))

        def train(epochs):
            for epoch in epochs:
                for _ in range(2):
                    task = client.get_task("training", epoch)
                    client.report_tasks("training", [task.task_id])

        back = {"training": {"epoch": 0, "done_task_ids": [], "records_per_task": 10}}
        train([0])
        client.rollback(back, "mid-training")  # not finished: not counted
        train([0, 1])
        assert client.job_status().datasets["training"].finished
        client.rollback(back, "after the end")
        ds = client.job_status().datasets["training"]
        assert (ds.finished, ds.rollbacks, ds.reopened_after_finish) == (False, 2, 1)
        client.close()
    finally:
        server.stop()


def test_a_relaunched_worker_registering_before_the_death_report_replaces_it(
        tmp_path):
    """A worker forked from a warm process registers within milliseconds of
    its predecessor's death, before the launcher's report of that death
    reaches the master (it goes off the launcher's loop): the registration
    names the worker it replaces, which is lost then, its task requeued, and
    the job's maximum is kept."""
    servicer = MasterServicer(journal_path=str(tmp_path / "j"), max_workers=2)
    _register(servicer, 0)
    _register(servicer, 1)
    held = _task(servicer, 1, 0)
    refused = servicer.RegisterWorker(master_pb2.WorkerRequest(worker_id=2), _Context())
    assert not refused.accepted and "maximum of 2 workers" in refused.error
    accepted = servicer.RegisterWorker(
        master_pb2.WorkerRequest(worker_id=2, replaces=1), _Context())
    assert accepted.accepted, accepted.error
    assert servicer._membership.alive() == [0, 2]
    # Worker 1's task went back to the queue: the replacement gets it.
    assert _task(servicer, 2, 0).task_id == held.task_id

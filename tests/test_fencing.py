"""Fencing (issue 25): a replaced server can never act in the job again.

The servers here are real processes that no launcher started, so nobody can
kill them for the job: a parameter server and a master of generation 0 (the
ones replaced) next to their replacements of generation 1. A client of the
job's generation 1 (its cluster.json says so) sent to the old server is
refused and changes nothing; a client still of generation 0 is refused by
the new one until it re-reads the cluster. A replaced master frozen
(SIGSTOP) and woken (SIGCONT) after its replacement wrote the journal stops
without writing a record, and a restart skips any record of an older
generation.
"""

import json
import os
import signal
import subprocess
import sys

import grpc
import numpy as np
import pytest
from conftest import subprocess_env, wait_for

from keras_elastic.common import fencing, resolver, rpc
from keras_elastic.master.journal import Journal
from keras_elastic.proto import master_pb2, master_pb2_grpc
from keras_elastic.ps.update import Update

SGD = {"class_name": "SGD", "config": {"learning_rate": 1.0}}


def start(tmp_path, name: str, module: str, *args: str) -> tuple[subprocess.Popen, str]:
    ready = tmp_path / f"{name}.ready.json"
    log = open(tmp_path / f"{name}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", module, f"--ready_file={ready}",
                             *args], env=subprocess_env(), stdout=log,
                            stderr=subprocess.STDOUT)
    wait_for(lambda: ready.exists() or proc.poll() is not None, timeout=120,
             what=f"{name} serving")
    assert proc.poll() is None, (tmp_path / f"{name}.log").read_text()
    return proc, json.loads(ready.read_text())["address"]


def stop(*procs):
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.fixture
def job_of_generation(tmp_path, monkeypatch):
    """Makes this process a worker of a job whose cluster.json names
    `addresses` (master, ps) and `generation`."""
    job = tmp_path / "job"
    job.mkdir()

    def make(master: str, ps: list[str], generation: int):
        (job / "cluster.json").write_text(json.dumps(
            {"master": master, "ps": ps, "generation": generation}))
        monkeypatch.setenv("KERAS_ELASTIC_JOB_DIR", str(job))
        monkeypatch.setenv(fencing.GENERATION_ENV, str(generation))
        resolver._resolvers.clear()
    yield make
    resolver._resolvers.clear()


@pytest.mark.multiprocess
def test_a_replaced_parameter_server_serves_nobody_of_the_new_generation(
        tmp_path, job_of_generation):
    from keras_elastic.ps import PSClient

    old, old_address = start(tmp_path, "ps-old", "keras_elastic.ps", "--generation=0")
    new, new_address = start(tmp_path, "ps-new", "keras_elastic.ps", "--generation=1")
    try:
        # The launcher's calls carry no generation: both initialize.
        for address in (old_address, new_address):
            admin = PSClient([address], worker_id=-1, connect_timeout=30, resolver=None)
            admin.init({"w": (np.zeros(3, np.float32), True)}, SGD)
            admin.close()

        # A worker of generation 1 sent to the old server (which woke up at the
        # address it had): refused, and the old server's values do not move.
        job_of_generation("127.0.0.1:1", [old_address], 1)
        misdirected = PSClient([old_address], worker_id=0, connect_timeout=30,
                               reconnect_timeout=2)
        with pytest.raises(ConnectionError, match="was replaced"):
            misdirected.send(Update(grads={"w": np.ones(3, np.float32)}))
        misdirected.close()
        admin = PSClient([old_address], worker_id=-1, connect_timeout=30, resolver=None)
        np.testing.assert_array_equal(admin.pull()["w"], np.zeros(3))
        admin.close()

        # A worker still of generation 0 at the new server: refused (the job
        # recovered since) ...
        job_of_generation("127.0.0.1:1", [new_address], 0)
        stale = PSClient([new_address], worker_id=0, connect_timeout=30,
                         reconnect_timeout=2)
        with pytest.raises(ConnectionError, match="the job recovered a service"):
            stale.send(Update(grads={"w": np.ones(3, np.float32)}))
        # ... until it re-reads the cluster: then it is served.
        (tmp_path / "job" / "cluster.json").write_text(json.dumps(
            {"master": "127.0.0.1:1", "ps": [new_address], "generation": 1}))
        resolver.for_process().roles(max_age=0)  # what a retry does
        values = stale.send(Update(grads={"w": np.ones(3, np.float32)})).values
        np.testing.assert_array_equal(values["w"], -np.ones(3))
        stale.close()

        # Fence moves a live server forward, never back.
        channel = rpc.make_channel(old_address, resolver=None)
        assert fencing.fence(channel, 1) == 1 and fencing.fence(channel, 0) == 1
        channel.close()
    finally:
        stop(old, new)


def _register(address: str, generation: int | None, worker_id: int = 0):
    metadata = [] if generation is None else [
        (fencing.METADATA_KEY, str(generation))]
    channel = rpc.make_channel(address, resolver=None)
    stub = master_pb2_grpc.MasterStub(channel)
    return channel, stub, lambda method, request: getattr(stub, method)(
        request, timeout=10, metadata=metadata)


@pytest.mark.multiprocess
def test_a_replaced_master_woken_up_writes_nothing_and_hands_out_nothing(tmp_path):
    journal = str(tmp_path / "master.journal")
    old, old_address = start(tmp_path, "master-old", "keras_elastic.master",
                             f"--journal={journal}", "--generation=0",
                             "--heartbeat_timeout=600")
    new = None
    try:
        channel, _, call = _register(old_address, 0)
        call("RegisterWorker", master_pb2.WorkerRequest(worker_id=0))
        call("RegisterDataset", master_pb2.RegisterDatasetRequest(
            dataset="train", mode="training", records_per_task=5, num_epochs=1,
            shards=[master_pb2.Shard(name="a", num_records=20)]))
        channel.close()
        wait_for(lambda: len(Journal.read(journal)) >= 3, timeout=30,
                 what="the old master's records on disk")
        # The old master freezes; a new one takes over the journal.
        os.kill(old.pid, signal.SIGSTOP)
        new, new_address = start(tmp_path, "master-new", "keras_elastic.master",
                                 f"--journal={journal}", "--generation=1",
                                 "--heartbeat_timeout=600")
        records = Journal.read(journal)
        assert records[-1]["t"] == "start" and records[-1]["g"] == 1
        before = len(records)

        # The old master wakes up and a worker still of generation 0 registers
        # there: the old master would journal it, but the journal was written
        # by another master since, so it writes nothing and stops.
        os.kill(old.pid, signal.SIGCONT)
        channel, _, call = _register(old_address, 0)
        for worker_id in range(1, 7):  # a call lost to the wake-up is retried
            try:
                call("RegisterWorker", master_pb2.WorkerRequest(worker_id=worker_id))
            except grpc.RpcError:
                pass  # it may already be stopping
            try:
                old.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        channel.close()
        log = (tmp_path / "master-old.log").read_text()
        assert old.poll() is not None, log[-3000:]
        assert "another master writes it (this one was replaced)" in log, log[-3000:]
        assert len(Journal.read(journal)) == before
        assert all(r["g"] == 1 for r in Journal.read(journal)[before - 1:])

        # The new master serves the job's generation 1, refuses generation 0.
        channel, _, call = _register(new_address, 0)
        with pytest.raises(grpc.RpcError) as refused:
            call("GetTask", master_pb2.GetTaskRequest(worker_id=0, dataset="train"))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "the job recovered a service" in refused.value.details()
        channel.close()
        channel, _, call = _register(new_address, 1)
        task = call("GetTask", master_pb2.GetTaskRequest(worker_id=0, dataset="train"))
        assert task.task.task_id == 0
        channel.close()
    finally:
        stop(old, *([new] if new else []))

    # A record a replaced master managed to append anyway (older generation
    # after a newer one) is skipped by the next master's replay.
    writer = Journal(journal)
    writer.wait(writer.append({"t": "worker", "id": 0, "state": "lost", "g": 0}))
    writer.close()
    again, again_address = start(tmp_path, "master-again", "keras_elastic.master",
                                 f"--journal={journal}", "--generation=2")
    try:
        channel, _, call = _register(again_address, None)
        status = call("GetStatus", master_pb2.StatusRequest())
        assert list(status.workers.alive) == [0] and status.workers.lost == 0
        channel.close()
        assert "1 record(s) of a replaced master skipped" in (
            tmp_path / "master-again.log").read_text()
    finally:
        stop(again)


def test_generation_rules_and_bad_values_are_named(monkeypatch):
    from keras_elastic.launcher import LaunchConfig

    generation = fencing.Generation(2)
    assert generation.refusal(None) is None and generation.refusal("2") is None
    assert "the job recovered a service since" in generation.refusal("1")
    assert "it was replaced" in generation.refusal("3")
    assert generation.refusal("x") == f"bad {fencing.METADATA_KEY} 'x'"
    monkeypatch.setenv(fencing.GENERATION_ENV, "two")
    with pytest.raises(ValueError, match="KERAS_ELASTIC_GENERATION='two' is not an "
                       "integer"):
        fencing.from_env()
    with pytest.raises(ValueError, match="--liveness_timeout must be positive, got 0"):
        LaunchConfig(liveness_timeout=0).validate()
    with pytest.raises(ValueError, match="--rendezvous_timeout must be >= 0, got -1"):
        LaunchConfig(rendezvous_timeout=-1).validate()


STOPPED_BY_ANOTHER_THREAD = """
import os, signal, threading, time
from keras_elastic.common import rpc

class Server:
    address = "127.0.0.1:0"
    def stop(self, grace=None):
        print("stopped", flush=True)

def send():  # a thread of the process signals it, as a fenced master does
    # once serve_until_signal has installed its handler (a condition, not a
    # time: before it, SIGTERM's default action would end the process)
    while signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=send, daemon=True).start()
# Only that thread may take the signal: the kernel delivers it there, never
# to the main thread that waits in serve_until_signal.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
rpc.serve_until_signal(Server(), None)
"""


@pytest.mark.multiprocess
def test_a_service_stops_on_a_signal_another_of_its_threads_received(tmp_path):
    # (the master stopping itself when its journal is fenced: the woken-up
    # master of the test above stayed up for good when its SIGTERM went to a
    # thread other than the main one)
    script = tmp_path / "serve.py"
    script.write_text(STOPPED_BY_ANOTHER_THREAD)
    result = subprocess.run([sys.executable, str(script)], env=subprocess_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == "stopped\n", result.stderr[-2000:]

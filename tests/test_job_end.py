"""A worker notices in the job directory that its job ended without it
(keras_elastic/common/job_end.py; on machines: test_testbed_partitions.py)."""

import json
import os
import subprocess
import sys
import threading
import time

import grpc
import pytest
from conftest import subprocess_env

from keras_elastic.common import job_end, rpc


def write_summary(job_dir, lost_ids=(), exited=()):
    path = os.path.join(job_dir, job_end.SUMMARY)
    with open(path + ".tmp", "w") as f:
        json.dump({"workers": {"lost_ids": list(lost_ids), "exited": list(exited)}}, f)
    os.replace(path + ".tmp", path)


def watch(job_dir, worker_id=1):
    exits = []
    done = threading.Event()

    def exit(status):
        exits.append(status)
        done.set()

    w = job_end.Watch(str(job_dir), lambda: worker_id, exit=exit, poll=0.01).start()
    return w, exits, done


def test_a_lost_worker_leaves_when_the_job_ends(tmp_path):
    w, exits, done = watch(tmp_path)
    write_summary(tmp_path, lost_ids=[1], exited=[0])
    assert done.wait(10)
    assert exits == [job_end.EXIT_LOST] and w.lost


def test_a_worker_there_at_the_end_stays(tmp_path):
    w, exits, _ = watch(tmp_path, worker_id=2)
    write_summary(tmp_path, lost_ids=[1], exited=[0])
    deadline = time.monotonic() + 10
    while w.ended() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert w.ended() is not None and not w.lost
    time.sleep(0.1)
    assert exits == []


def write_cluster(job_dir):
    with open(os.path.join(job_dir, "cluster.json"), "w") as f:
        json.dump({"master": "127.0.0.1:1"}, f)


def test_an_earlier_summary_does_not_count(tmp_path):
    """A resumed job: the summary of the run before is there at the start,
    older than the cluster.json its launcher wrote again."""
    write_summary(tmp_path, lost_ids=[1])
    time.sleep(0.01)  # (a new mtime)
    write_cluster(tmp_path)
    w, exits, done = watch(tmp_path)
    assert not done.wait(0.3) and w.ended() is None
    time.sleep(0.01)  # (a new mtime)
    write_summary(tmp_path, lost_ids=[1])
    assert done.wait(10) and exits == [job_end.EXIT_LOST]


def test_a_summary_written_before_the_watch_began_counts(tmp_path):
    """A worker joined as the job ended: `join` found it running, the
    summary came before the worker's watch began. It is newer than the
    job's cluster.json, so the job ended: the worker's retries of the
    servers gone stop at once (found in the soak on the testbed: such a
    worker retried the master for --connect_timeout, 300 s)."""
    write_cluster(tmp_path)
    time.sleep(0.01)  # (a new mtime)
    write_summary(tmp_path, lost_ids=[1], exited=[0])
    w, exits, done = watch(tmp_path, worker_id=-1)
    deadline = time.monotonic() + 10
    while w.ended() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert w.ended() == {"workers": {"lost_ids": [1], "exited": [0]}}
    assert not w.lost and exits == []


def test_no_job_directory_no_end(tmp_path):
    """A machine that cannot reach the job directory: --connect_timeout rules."""
    w, exits, done = watch(tmp_path / "not-mounted")
    assert not done.wait(0.3) and w.ended() is None and exits == []


class Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "connect failed"


def test_retries_stop_once_the_job_ended(tmp_path, monkeypatch):
    calls = []

    def call():
        calls.append(1)
        raise Unavailable()

    w = job_end.Watch(str(tmp_path), lambda: 1, exit=lambda status: None)
    monkeypatch.setattr(job_end, "_current", w)
    with pytest.raises(Unavailable):  # no end: retried for the timeout
        rpc.retry_unreachable(call, "the master", timeout=0.5)
    assert len(calls) > 2
    write_summary(tmp_path, exited=[1])
    w.check()
    calls.clear()
    start = time.monotonic()
    with pytest.raises(Unavailable):
        rpc.retry_unreachable(call, "the master", timeout=60)
    assert len(calls) == 1 and time.monotonic() - start < 5


@pytest.mark.multiprocess
def test_join_refuses_a_job_that_ended(tmp_path):
    with open(tmp_path / "cluster.json", "w") as f:
        json.dump({"master": "127.0.0.1:1", "ps": ["127.0.0.1:2"]}, f)
    time.sleep(0.01)
    write_summary(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "keras_elastic", "join",
                           f"--job_dir={tmp_path}", "--", "true"], capture_output=True,
                          text=True, env=subprocess_env(), timeout=120)
    assert proc.returncode != 0
    assert "ended" in proc.stderr and "nothing to join" in proc.stderr, proc.stderr


@pytest.mark.multiprocess
@pytest.mark.parametrize("module", ["keras_elastic.ps", "keras_elastic.master"])
def test_a_server_left_running_leaves_when_its_job_ends(tmp_path, module):
    """A master or parameter server still running when its job ended (one the
    launcher replaced and could not stop: cut off on another machine) leaves
    by itself, a second or two after the summary: a real process."""
    from keras_elastic.launcher.backends import start_service

    job_dir = tmp_path / "job"
    job_dir.mkdir()
    write_summary(job_dir)  # an earlier run's (a resumed job): does not count
    name = module.rsplit(".", 1)[1]
    handle, _ = start_service(name, module, [f"--job_dir={job_dir}"], str(job_dir))
    try:
        time.sleep(2)  # the watch's first looks: the old summary is not an end
        assert handle.poll() is None, handle.tail()
        write_summary(job_dir)
        ended = time.monotonic()
        while handle.poll() is None and time.monotonic() - ended < 30:
            time.sleep(0.05)
        assert handle.poll() == job_end.EXIT_LOST, handle.tail()
        assert time.monotonic() - ended < 5
        assert "ended" in handle.tail() and "exits" in handle.tail(), handle.tail()
    finally:
        if handle.poll() is None:
            handle.kill()


@pytest.mark.multiprocess
@pytest.mark.parametrize("error, status", [
    ("WorkerLostError(errors.presumed_lost(2))", job_end.EXIT_LOST),
    ("JobFailedError('a task failed 3 times')", 1),
])
def test_a_worker_the_job_presumed_lost_exits_with_status_3(error, status):
    """The master's answer to a worker it presumed lost is a WorkerLostError
    (master/client.py); uncaught, it ends the worker with status 3 after its
    traceback (`keras-elastic join` then joins again); any other error, 1."""
    code = ("from keras_elastic.common import errors, job_end\n"
            "from keras_elastic.master import client\n"
            "from keras_elastic.master.client import JobFailedError, WorkerLostError\n"
            "assert type(client._job_failed(errors.presumed_lost(2))) is WorkerLostError\n"
            "job_end.exit_lost_on(WorkerLostError)\n"
            "job_end.exit_lost_on(WorkerLostError)  # (once)\n"
            f"raise {error}\n")
    proc = subprocess.run([sys.executable, "-c", code], env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == status, proc.stderr[-3000:]
    assert error.split("(")[0] in proc.stderr.splitlines()[-1], proc.stderr[-3000:]


def test_connecting_stops_once_the_job_ended(tmp_path, monkeypatch):
    """A worker that joined as its job ended waits for its first connection
    (the master gone): it stops within a second of the end instead of
    waiting out --connect_timeout (the testbed soak: a worker rejoined at a
    job's end still ran 10 s after it)."""
    w = job_end.Watch(str(tmp_path), lambda: -1, exit=lambda status: None)
    monkeypatch.setattr(job_end, "_current", w)
    channel = grpc.insecure_channel("127.0.0.1:1")  # nothing listens there
    try:
        with pytest.raises(ConnectionError, match="within 1 s"):
            rpc.wait_ready(channel, "127.0.0.1:1", "master", timeout=1.0)
        write_summary(tmp_path, exited=[1])
        w.check()
        start = time.monotonic()
        with pytest.raises(ConnectionError, match="the job ended"):
            rpc.wait_ready(channel, "127.0.0.1:1", "master", timeout=300)
        assert time.monotonic() - start < 5
    finally:
        channel.close()

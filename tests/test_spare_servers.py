"""Spare parameter-server processes (keras_elastic/launcher/spares.py): the
pool that keeps them started, and a lost server's partitions restored onto
one from a real checkpoint. Real processes: the pool's are `sleep`s (what it
does with a process does not depend on what runs in it), the restore's a
real parameter server."""

from __future__ import annotations

import sys
import threading
import time

import grpc
import keras
import numpy as np
import pytest

from keras_elastic.launcher.backends.local import ManagedProcess
from keras_elastic.launcher.backends.services import start_service
from keras_elastic.launcher.spares import SpareServers, restore_onto
from keras_elastic.ps import ParameterServer, PSClient
from keras_elastic.ps.checkpoint_coordinator import save_checkpoint
from keras_elastic.ps.update import Update

pytestmark = pytest.mark.multiprocess


class Starts:
    """Starts `sleep` processes as spares; each start waits for `go` (the
    test decides when a start is over) and may be told to fail."""

    def __init__(self, tmp_path) -> None:
        self.tmp_path = tmp_path
        self.go = threading.Event()
        self.fail = False
        self.procs: list[ManagedProcess] = []

    def __call__(self, name: str):
        assert self.go.wait(30), "the test never let the start finish"
        if self.fail:
            raise RuntimeError(f"{name} could not start")
        proc = ManagedProcess(name, [sys.executable, "-c", "import time; time.sleep(120)"],
                              str(self.tmp_path / f"{name}.log"), echo=False, kind="ps")
        self.procs.append(proc)
        return proc, f"127.0.0.1:{1000 + len(self.procs)}"


def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_spare_is_handed_out_only_once_started_and_is_replaced(tmp_path):
    starts = Starts(tmp_path)
    spares = SpareServers(starts, count=1)
    try:
        spares.fill()
        assert spares.take() is None  # still starting
        starts.go.set()
        wait_until(lambda: len(starts.procs) == 1)
        wait_until(lambda: spares._pending[0].done())
        proc, address = spares.take()
        assert proc is starts.procs[0] and address == "127.0.0.1:1001"
        assert spares.take() is None  # the only one was taken
        spares.fill()  # a replacement
        wait_until(lambda: len(starts.procs) == 2)
        wait_until(lambda: spares._pending[0].done())
        assert (spares.started, spares.taken) == (2, 1)
        assert [p.name for p in starts.procs] == ["ps-s0", "ps-s1"]
        spares.fill()  # full: nothing more starts
        assert spares.started == 2
    finally:
        spares.stop()
    # The spare still in the pool is ended; the taken one is the taker's.
    wait_until(lambda: starts.procs[1].poll() is not None)
    assert starts.procs[0].poll() is None
    starts.procs[0].kill()


def test_a_dead_or_failed_spare_is_never_handed_out_and_is_replaced(tmp_path):
    starts = Starts(tmp_path)
    starts.go.set()
    spares = SpareServers(starts, count=1, retry_after=0.3)
    try:
        spares.fill()
        wait_until(lambda: spares._pending and spares._pending[0].done())
        starts.procs[0].kill()
        wait_until(lambda: starts.procs[0].poll() is not None)
        assert spares.take() is None
        starts.fail = True
        spares.fill()  # the dead one dropped, its replacement fails to start
        wait_until(lambda: spares.started == 2 and spares._pending[0].done())
        assert spares.take() is None
        starts.fail = False
        spares.fill()  # the failed start dropped; none again before retry_after
        assert spares.started == 2 and not spares._pending
        time.sleep(0.35)
        spares.fill()
        wait_until(lambda: spares.started == 3 and spares._pending[0].done())
        proc, _ = spares.take()
        assert proc is starts.procs[1] and proc.poll() is None
        proc.kill()
    finally:
        spares.stop()


def test_no_spares_with_a_count_of_zero(tmp_path):
    starts = Starts(tmp_path)
    starts.go.set()
    spares = SpareServers(starts, count=0)
    spares.fill()
    assert spares.take() is None and spares.started == 0 and starts.procs == []
    spares.stop()


def test_a_lost_servers_partition_restored_onto_a_spare_process(tmp_path):
    """A real server's partition 1 of 2, checkpointed, restored onto a spare
    process (started with no partition): it serves the checkpoint's values
    paused until resumed."""
    job = tmp_path / "job"
    job.mkdir()
    servers = [ParameterServer(partition=p, num_partitions=2) for p in range(2)]
    client = PSClient([s.address for s in servers])
    spare = None
    try:
        config = keras.optimizers.serialize(keras.optimizers.SGD(0.5))
        client.init({"a": (np.ones(3, np.float32), True),
                     "b": (np.full(4, 2.0, np.float32), True)}, config)
        client.send(Update(grads={"a": np.ones(3, np.float32),
                                  "b": np.ones(4, np.float32)}))
        expected = client.pull()
        info, _ = save_checkpoint(client, str(tmp_path / "ckpts"), "ckpt-000001", None)
        spare, ready = start_service(
            "ps-s0", "keras_elastic.ps", ["--partition=2", "--num_partitions=2",
                                          "--partitions=none", f"--job_dir={job}"],
            str(job))
        address = ready["address"]
        holder = next(p for p, s in enumerate(servers) if s.store.variables)
        restore_onto(address, [holder], info.path)
        restored = PSClient([address], worker_id=-1, partitions=[holder],
                            reconnect_timeout=0)
        try:
            with pytest.raises((ConnectionError, grpc.RpcError)):
                restored.pull()  # paused: no worker takes it before the rollback
            restored.resume(0)
            values = restored.pull()
            assert values and all(np.array_equal(values[k], expected[k]) for k in values)
            assert restored.status(0).ps_index == holder
        finally:
            restored.close()
        # A checkpoint that is not there: an error naming the spare and the step.
        with pytest.raises(ConnectionError) as e:
            restore_onto(address, [1 - holder], str(tmp_path / "missing"))
        assert address in str(e.value) and "Restore" in str(e.value), e.value
    finally:
        client.close()
        for s in servers:
            s.stop(0)
        if spare is not None:
            spare.terminate()
    log = (job / "ps-s0.log").read_text()
    assert f"partition {holder}: held here" in log, log[-2000:]


def test_a_negative_count_of_spares_is_refused():
    from keras_elastic.launcher.config import LaunchConfig

    with pytest.raises(ValueError, match="--ps_spares must not be negative, got -1"):
        LaunchConfig(num_workers=1, ps_spares=-1).validate()
    assert LaunchConfig(num_workers=1).spares == 1
    assert LaunchConfig(num_workers=1, backend="ray").spares == 0

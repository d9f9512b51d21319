"""A parameter server's backup: its state, call for call (`--ps_replicas=2`).

Chain replication, as in the parameter server of Li et al. (OSDI 2014): a
primary forwards every call that changes its state (a worker's Init, pushes,
task claims, lookups that make rows, Flush, Pause, Resume, Restore) to its
backup, in the order it applied them (under its store's lock), and answers
the caller only once the backup applied it too. So the backup holds every
call any caller was answered for. When the primary is lost, the launcher
promotes the backup (`launcher/recovery.py`): nothing is trained again. A
push that reached the primary and not the backup was never answered: the
worker sends it again, to the promoted backup, whose task log
(`ps/task_log.py`) says it lacks it; one that reached both is recognized
there as a repeat.

When the backup cannot be reached for `timeout` seconds (dead, frozen, cut
off) or refuses a call, the primary detaches it and goes on alone: before it
answers anything the backup lacks, it writes `JOB_DIR/ps-<i>.unreplicated`
(`marker_path`). The launcher never promotes the backup of a server with that
file: it recovers the server from its latest checkpoint instead. The
launcher is the only one who attaches a backup (`AttachBackup`).

Example (two servers in this process; the second is the first's backup):

>>> import numpy as np, tempfile
>>> from keras_elastic.ps import ParameterServer
>>> from keras_elastic.ps.client import PSClient, Update
>>> primary, backup = ParameterServer(), ParameterServer()
>>> primary.servicer.job_dir = tempfile.mkdtemp()
>>> client = PSClient([primary.address])
>>> client.attach_backup(0, backup.address)
>>> sgd = {"class_name": "SGD", "config": {"learning_rate": 0.5}}
>>> _ = client.init({"w": (np.ones(2, "float32"), True)}, sgd)
>>> _ = client.send(Update(grads={"w": np.ones(2, "float32")}))
>>> PSClient([backup.address]).pull()["w"].tolist()
[0.5, 0.5]
>>> client.close(); primary.stop(); backup.stop()
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import grpc
from absl import logging

from keras_elastic.common import rpc
from keras_elastic.proto import ps_pb2

_SERVICE = "/keras_elastic.ParameterServer/"

DEFAULT_TIMEOUT = 10.0  # seconds a primary waits for its backup, then detaches


def backup_timeout(liveness_timeout: float) -> float:
    """How long a launched primary retries its backup before going on alone:
    a sixth of the job's liveness timeout, within 2-10 s (its pushes wait
    meanwhile).

    >>> backup_timeout(60), backup_timeout(8)
    (10.0, 2.0)
    """
    return max(2.0, min(DEFAULT_TIMEOUT, liveness_timeout / 6))


def marker_path(job_dir: str, partition: int) -> str:
    """The file that says the server of partition `partition` answered calls
    its backup lacks."""
    return os.path.join(job_dir, f"ps-{partition}.unreplicated")


def is_replicated(job_dir: str, partition: int) -> bool:
    """Whether the backup of partition `partition`'s server (if it has one)
    holds every call the server answered: no `marker_path` file."""
    return not os.path.exists(marker_path(job_dir, partition))


class Backup:
    """The primary's link to its backup: `forward` sends one call and waits
    for it to be applied there, retrying an unreachable backup for
    `timeout` seconds; False once the backup is detached (then the marker
    file exists)."""

    def __init__(self, address: str, partition: int, marker: str,
                 timeout: float = DEFAULT_TIMEOUT,
                 generation: Callable[[], int] | None = None) -> None:
        self.address = address
        self.partition = partition
        self.marker = marker
        self.timeout = timeout
        self._cancelled = threading.Event()
        # The calls carry the server's generation (`generation()`, in a
        # launched job): once the backup took the server's place, it is
        # fenced into the next one and refuses the old server, were it to
        # wake up (common/fencing.py).
        self._channel = rpc.make_channel(address, resolver=None, generation=generation,
                                         partition=partition)
        raw = {"request_serializer": None, "response_deserializer": None}
        self._calls: dict[str, Callable] = {
            "Init": self._channel.stream_unary(_SERVICE + "Init", **raw),
            "PushSmall": self._channel.unary_unary(_SERVICE + "PushSmall", **raw),
            "Lookup": self._channel.unary_unary(_SERVICE + "Lookup", **raw),
        }
        for name, request in (("Claim", ps_pb2.ClaimRequest),
                              ("Flush", ps_pb2.FlushRequest),
                              ("Pause", ps_pb2.PauseRequest),
                              ("Resume", ps_pb2.ResumeRequest),
                              ("Restore", ps_pb2.RestoreRequest)):
            self._calls[name] = self._channel.unary_unary(
                _SERVICE + name, request_serializer=request.SerializeToString,
                response_deserializer=None)

    def forward(self, method: str, request) -> bool:
        """Sends `request` (bytes, a message, or for Init a list of
        serialized messages) as `method` to the backup; True once applied
        there, False if the backup was detached (it stays so)."""
        deadline = time.monotonic() + self.timeout
        delay = 0.05
        while True:
            left = deadline - time.monotonic()
            try:
                payload = iter(request) if method == "Init" else request
                self._calls[method](payload, timeout=max(0.1, left))
                return True
            except grpc.RpcError as e:
                code = e.code()
                retry = rpc.is_unreachable(e) or code == grpc.StatusCode.DEADLINE_EXCEEDED
                if not retry:
                    # The backup refused what the primary applied: their states
                    # differ (a bug); it can no longer stand in for the primary.
                    self.detach(f"it refused {method}: {code.name}: {e.details()}")
                    return False
                if self._cancelled.is_set():
                    self.detach(f"it did not answer {method}, and the launcher "
                                f"found it lost ({code.name})")
                    return False
                if time.monotonic() + delay >= deadline:
                    self.detach(f"it did not answer {method} for {self.timeout:.0f} s "
                                f"({code.name})")
                    return False
                self._cancelled.wait(delay)
                delay = min(1.0, delay * 2)

    def cancel(self) -> None:
        """The launcher found the backup lost: a call waiting on it gives up
        now (it detaches), not after `timeout` (no lock needed)."""
        self._cancelled.set()

    def detach(self, why: str) -> None:
        """Writes the marker (durably: before the call the backup lacks is
        answered), then drops the link."""
        tmp = self.marker + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"backup {self.address} detached: {why}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.marker)
        logging.warning("parameter server %d: backup %s detached: %s; this server "
                        "goes on alone (a loss of it is now recovered from its "
                        "checkpoint, not by its backup)", self.partition, self.address,
                        why)
        self.close()

    def close(self) -> None:
        self._channel.close()


def copy_state(store, partition: int, num_partitions: int, directory: str,
               backup: Backup, paused: bool) -> bool:
    """Gives a new backup this server's state (call it under the store's
    lock: no call changes it meanwhile): this server's part of a checkpoint
    in `directory` (every table row, the task log), which the backup
    restores; then the paused state. False if the backup did not take it
    (it is detached: the marker stays). The copy is removed afterwards."""
    import shutil

    from keras_elastic.checkpoint.layout import temp_dir_for
    from keras_elastic.checkpoint.ps_manifest import write_ps_manifest
    from keras_elastic.ps.checkpoint_part import save_shard

    os.makedirs(directory, exist_ok=True)
    final = os.path.join(directory, f"ps-{partition}-copy")
    temp = temp_dir_for(directory, f"ps-{partition}-copy")
    shutil.rmtree(final, ignore_errors=True)
    try:
        part = save_shard(store, partition, num_partitions, temp,
                          extra={"backup_copy": True})
        write_ps_manifest(temp, final, [part], progress=None, num_ps=num_partitions,
                          sequence=0)
        taken = backup.forward("Restore", ps_pb2.RestoreRequest(path=final))
        if taken and paused:
            taken = backup.forward("Pause", ps_pb2.PauseRequest())
        return taken
    finally:
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)

"""Spare parameter-server processes: started ahead of a loss, holding no
partition, so that a lost server's partitions are restored onto a process
that is already up (TensorFlow imported, its port bound) instead of onto one
started then. The start of a server process is most of what a recovery
costs (5-6 s on 2 cores, against a few tenths of a second for the rest); a
spare pays it before the loss, off the launcher's loop.

- `SpareServers(start, count)`: `fill()` starts, in a background thread, the
  spares that are missing (`start(name)` -> (handle, address)); `take()`
  hands out one that is ready (started and alive), or None (the recovery
  then starts a process as before); `stop()` ends them all. After a start
  that failed, the next waits `retry_after` seconds.
- `restore_onto(address, partitions, path)`: a spare holds `partitions`
  (`HostPartition`), paused, restored from the checkpoint at `path`: what a
  process started with `--partitions=... --restore_from=path --paused` holds.

The launcher (`services.py`) fills its spares from the first periodic
automatic checkpoint on (a short job never starts one), and again after
each recovery; `recovery.py` takes one.

Example:

```python
spares = SpareServers(lambda name: services._start_spare(name), count=1)
spares.fill()
taken = spares.take()          # None while the spare still starts
if taken is not None:
    proc, address = taken
    restore_onto(address, [0], checkpoint.path)
```
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures

import grpc
from absl import logging

from keras_elastic.common import rpc
from keras_elastic.launcher.backends import RoleHandle
from keras_elastic.proto import ps_pb2, ps_pb2_grpc

Spare = tuple[RoleHandle, str]


class SpareServers:
    """Up to `count` started server processes that hold nothing yet."""

    def __init__(self, start: Callable[[str], Spare], count: int,
                 retry_after: float = 30.0) -> None:
        self._start = start
        self.count = max(0, count)
        # After a spare failed to start (a full disk, no room on a node):
        # no new start for this many seconds.
        self.retry_after = retry_after
        self._retry_at = 0.0
        self._lock = threading.Lock()
        self._pending: list[futures.Future] = []
        self._pool = futures.ThreadPoolExecutor(1, "ke-spares")
        self._names = 0
        self._stopped = False
        self.started = 0  # spares started so far
        self.taken = 0  # spares a recovery took

    def fill(self) -> None:
        """Starts (in the background) as many spares as are missing; one
        that failed to start or died is dropped and replaced."""
        with self._lock:
            if self._stopped:
                return
            for future in list(self._pending):
                if future.done() and _spare_of(future) is None:
                    self._pending.remove(future)
                    if not future.cancelled() and future.exception() is not None:
                        logging.warning("a spare parameter server did not start (%s); "
                                        "the next try in %.0f s", future.exception(),
                                        self.retry_after)
                        self._retry_at = time.monotonic() + self.retry_after
            if time.monotonic() < self._retry_at:
                return
            while len(self._pending) < self.count:
                name = f"ps-s{self._names}"
                self._names += 1
                self.started += 1
                self._pending.append(self._pool.submit(self._start_one, name))

    def _start_one(self, name: str) -> Spare:
        spare = self._start(name)
        logging.info("spare parameter server %s ready at %s", name, spare[1])
        return spare

    def take(self) -> Spare | None:
        """A ready spare (it is no longer this pool's), or None if none is
        started and alive now."""
        with self._lock:
            for future in list(self._pending):
                spare = _spare_of(future) if future.done() else None
                if spare is not None:
                    self._pending.remove(future)
                    self.taken += 1
                    return spare
        return None

    def stop(self) -> None:
        """Ends every spare (those still starting once they are up)."""
        with self._lock:
            self._stopped = True
            pending, self._pending = self._pending, []
        for future in pending:
            future.cancel()
        for future in pending:
            try:
                proc, _ = future.result(timeout=60)
            except (futures.CancelledError, futures.TimeoutError, Exception):  # noqa: BLE001
                continue  # never started, or failed to: nothing to end
            proc.terminate()
        self._pool.shutdown(wait=False)


def _spare_of(future: futures.Future) -> Spare | None:
    """The spare a finished start gave, if it started and is still alive."""
    if future.cancelled() or future.exception() is not None:
        return None
    proc, address = future.result()
    return (proc, address) if proc.poll() is None else None


def restore_onto(address: str, partitions: list[int], path: str,
                 timeout: float = 60.0) -> None:
    """Has the spare at `address` hold `partitions`, each paused and
    restored from the checkpoint at `path`. Raises ConnectionError (naming
    the step) if the spare does not do it: the caller kills it and starts a
    process instead."""
    for p in partitions:
        channel = rpc.make_channel(address, resolver=None, partition=p)
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        step = "HostPartition"
        try:
            stub.HostPartition(ps_pb2.HostPartitionRequest(partition=p), timeout=timeout)
            step = "Pause"
            stub.Pause(ps_pb2.PauseRequest(), timeout=timeout)
            step = "Restore"
            stub.Restore(ps_pb2.RestoreRequest(path=path), timeout=timeout)
        except grpc.RpcError as e:
            raise ConnectionError(
                f"the spare parameter server at {address} did not take partition {p} "
                f"({step}: {e.code().name}: {e.details()})") from None
        finally:
            channel.close()

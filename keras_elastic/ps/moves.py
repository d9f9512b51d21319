"""Moves a parameter-server partition from one process to another while
workers train (`keras-elastic scale --num_ps`, a drained server).

A move is a copy, then a switch (docs/elastic_servers.md):

1. the target process holds the partition, empty (`HostPartition`);
2. the source copies the partition's state to it under the partition's lock
   (values, optimizer slots, table rows, its task log) and from then on
   forwards every call that changes it, answering only once the target
   applied it too: the target is the partition's backup
   (`AttachBackup` with a `copy_dir`, `ps/replication.py`);
3. `switch()`: the caller points the job's `cluster.json` at the target;
4. the source lets the partition go (`ReleasePartition`, under its lock):
   its later calls are answered UNAVAILABLE, and callers follow
   `cluster.json` to the target.

Exactly once, as in a failover: every call the source answered, the target
applied; a call the source applied and never answered (the release came
between) is sent again by its worker, to the target, whose task log says
whether it has it. The target's state is a new incarnation: every worker
takes all of its values once.

Example (two processes; partition 1 moves from `a` to `b`):

```python
move_partition(1, a.address, b.address, copy_dir=f"{job_dir}/moves",
               switch=lambda: write_cluster_file(ps=[a.address, b.address]))
```
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
from absl import logging

from keras_elastic.common import rpc
from keras_elastic.proto import ps_pb2, ps_pb2_grpc


class MoveError(ConnectionError):
    """A partition could not be moved; it stays where it was, whole."""


def _stub(address: str, partition: int
          ) -> tuple[grpc.Channel, ps_pb2_grpc.ParameterServerStub]:
    channel = rpc.make_channel(address, resolver=None, partition=partition)
    return channel, ps_pb2_grpc.ParameterServerStub(channel)


def move_partition(partition: int, source: str, target: str, copy_dir: str,
                   switch: Callable[[], None], timeout: float = 120.0) -> float:
    """Moves partition `partition` from the server process at `source` to the
    one at `target` (steps in the module doc); returns the seconds it took.
    Raises `MoveError` if it could not (the partition is then still served
    by `source`, and `switch` was not called), or ValueError for a partition
    with a backup (`--ps_replicas=2`: not moved)."""
    began = time.monotonic()
    source_channel, source_stub = _stub(source, partition)
    target_channel, target_stub = _stub(target, partition)
    try:
        try:
            status = source_stub.Status(ps_pb2.PSStatusRequest(), timeout=timeout)
        except grpc.RpcError as e:
            raise MoveError(f"partition {partition}: its server at {source} did not "
                            f"answer Status ({e.code().name}: {e.details()})") from None
        if status.backup:
            raise ValueError(f"partition {partition} has a backup ({status.backup}): "
                             "a partition with a replica is not moved")
        try:
            target_stub.HostPartition(ps_pb2.HostPartitionRequest(partition=partition),
                                      timeout=timeout)
            source_stub.AttachBackup(ps_pb2.AttachBackupRequest(
                address=target, copy_dir=copy_dir), timeout=timeout)
        except grpc.RpcError as e:
            _undo(partition, source_stub, target_stub)
            raise MoveError(f"partition {partition}: no copy from {source} to {target} "
                            f"({e.code().name}: {e.details()}); it stays at "
                            f"{source}") from None
        try:
            switch()
        except BaseException:
            _undo(partition, source_stub, target_stub)
            raise
        try:
            source_stub.ReleasePartition(ps_pb2.ReleasePartitionRequest(
                partition=partition), timeout=timeout)
        except grpc.RpcError as e:
            # The target has every call answered so far, and cluster.json
            # names it: a source that cannot be reached serves nobody (the
            # launcher replaces a lost process; its partitions that moved are
            # not among those it recovers).
            logging.warning("partition %d: %s did not let it go (%s: %s); it is "
                            "served at %s", partition, source, e.code().name,
                            e.details(), target)
    finally:
        source_channel.close()
        target_channel.close()
    seconds = time.monotonic() - began
    logging.info("partition %d moved from %s to %s in %.2f s", partition, source,
                 target, seconds)
    return seconds


def _undo(partition: int, source_stub, target_stub) -> None:
    """After a failed move: the source forwards no more, the target lets its
    partial copy go."""
    for call, stub, request in (
            ("AttachBackup", source_stub, ps_pb2.AttachBackupRequest(address="")),
            ("ReleasePartition", target_stub,
             ps_pb2.ReleasePartitionRequest(partition=partition))):
        try:
            getattr(stub, call)(request, timeout=10)
        except grpc.RpcError as e:
            logging.warning("partition %d: undoing a failed move, %s failed: %s",
                            partition, call, e.details())

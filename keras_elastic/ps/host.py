"""The partitions one parameter-server process holds, and the calls to each.

A job's model is cut into `P` *partitions* (`ps/partition.py` places each
variable, slice and table row on one of them; `P` is `--ps_partitions`,
`--num_ps` by default). A parameter-server process holds one or more of
them, each a `ParameterServerServicer` over its own store, with its own task
log, version, lock and backup: exactly what a server held before there were
partitions. What the workers see never changes when partitions move between
processes: the same pieces, the same task logs, only the address of a
partition (`cluster.json`'s `ps[p]`).

Every call names its partition in the metadata key `ke-partition`
(`rpc.make_channel(partition=p)`, which every `PSClient` channel uses); a
call without it goes to the process's only partition. A call for a
partition the process does not hold (it moved away) is answered UNAVAILABLE:
the caller reads `cluster.json` again and follows the partition to its new
process, as it follows a restarted one.

Moving partition `p` from process A to process B (`ps/moves.py`):
`HostPartition(p)` on B makes an empty partition there; `AttachBackup` of
`p` on A with a `copy_dir` copies its state to B under its lock and forwards
every later call to B (the chain replication of `ps/replication.py`); the
launcher points `cluster.json` at B; `ReleasePartition(p)` on A lets it go.

Example (one process holding partitions 0 and 1 of 2):

>>> from keras_elastic.ps.store import ParameterStore
>>> from keras_elastic.ps.servicer import ParameterServerServicer
>>> host = PartitionHost(lambda p: ParameterServerServicer(
...     ParameterStore(num_partitions=2), p, 2), [0, 1])
>>> host.held()
[0, 1]
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import grpc
from absl import logging

from keras_elastic.common import faults
from keras_elastic.common.rpc import PARTITION_ELSEWHERE, PARTITION_METADATA
from keras_elastic.proto import ps_pb2
from keras_elastic.ps.servicer import ParameterServerServicer

# The calls a process answers itself, not one of its partitions.
_HOST_METHODS = ("HostPartition", "ReleasePartition")


def partition_of(context: grpc.ServicerContext) -> int | None:
    """The partition a call names (None: it names none)."""
    for key, value in context.invocation_metadata() or ():
        if key == PARTITION_METADATA:
            try:
                return int(value)
            except ValueError:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"metadata {PARTITION_METADATA}={value!r} is not a "
                              "partition number")
    return None


class PartitionHost:
    """Serves the `ParameterServer` service for the partitions of one process:
    each call goes to its partition's servicer (`make_servicer(p)` makes
    one, empty, for partition `p`)."""

    RAW_REQUESTS = ParameterServerServicer.RAW_REQUESTS

    def __init__(self, make_servicer: Callable[[int], ParameterServerServicer],
                 partitions: Iterable[int]) -> None:
        self._make = make_servicer
        self._lock = threading.Lock()
        self._servicers: dict[int, ParameterServerServicer] = {}
        # Partitions this process let go (they moved): named in the answer.
        self._released: set[int] = set()
        for p in partitions:
            self._servicers[p] = make_servicer(p)
        for method in ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"].methods:
            if method.name not in _HOST_METHODS:
                setattr(self, method.name, self._dispatcher(method.name))

    def held(self) -> list[int]:
        """The partitions this process holds now."""
        with self._lock:
            return sorted(self._servicers)

    def servicer(self, partition: int) -> ParameterServerServicer | None:
        with self._lock:
            return self._servicers.get(partition)

    def servicers(self) -> list[ParameterServerServicer]:
        with self._lock:
            return [self._servicers[p] for p in sorted(self._servicers)]

    def _servicer_for(self, context: grpc.ServicerContext) -> ParameterServerServicer:
        partition = partition_of(context)
        with self._lock:
            if partition is None:
                if len(self._servicers) == 1:
                    return next(iter(self._servicers.values()))
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"this parameter-server process holds partitions "
                    f"{sorted(self._servicers)}: a call must name its partition "
                    f"(metadata {PARTITION_METADATA}; a PSClient's calls do)")
            servicer = self._servicers.get(partition)
            moved = partition in self._released
        if servicer is None:
            context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"{PARTITION_ELSEWHERE}parameter-server partition {partition} is not "
                "on this process"
                + (" any more (it moved)" if moved else "")
                + "; its address is in the job's cluster.json: retry there")
        return servicer

    def _dispatcher(self, method: str):
        def call(request, context):
            return getattr(self._servicer_for(context), method)(request, context)

        call.__name__ = method
        return call

    # -- moves ------------------------------------------------------------------
    def HostPartition(self, request, context):
        """Holds partition `request.partition`, empty, from now on (the target
        of a move: its state comes as a backup's, `AttachBackup` with a copy on
        its old process); nothing changes if it is here already."""
        partition = request.partition
        if partition < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"HostPartition: partition {partition} is negative")
        with self._lock:
            if not self._servicers and not self._released:
                # A process that held nothing (a spare, a new process of a
                # scaling) is this partition's server from now: its fault
                # points are those of role ps<partition> (common/faults.py).
                faults.set_role(f"ps{partition}")
            if partition not in self._servicers:
                self._servicers[partition] = self._make(partition)
                self._released.discard(partition)
                logging.info("parameter-server partition %d: held here (empty, "
                             "until its copy arrives)", partition)
            held = sorted(self._servicers)
        return ps_pb2.PartitionsResponse(partitions=held)

    def ReleasePartition(self, request, context):
        """Lets partition `request.partition` go: it moved (cluster.json
        names its new process, which applied every call answered here:
        it was this partition's backup). Under the partition's lock, so no
        call is half applied; its calls are answered UNAVAILABLE from now."""
        partition = request.partition
        servicer = self.servicer(partition)
        if servicer is None:
            return ps_pb2.PartitionsResponse(partitions=self.held())
        with servicer.store.lock:
            with self._lock:
                del self._servicers[partition]
                self._released.add(partition)
            if servicer.backup is not None:
                servicer.backup.close()  # the new holder: no marker, nothing lost
                servicer.backup = None
        held = self.held()
        logging.info("parameter-server partition %d: released (moved away); this "
                     "process holds %s", partition, held)
        return ps_pb2.PartitionsResponse(partitions=held)

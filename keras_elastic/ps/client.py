"""The worker's view of the parameter servers: one logical model store.

Variables are placed on the servers by `ps/partition.layout` (whole, by a
hash of their key, or the large ones split into slices that balance the
servers' bytes; the client cuts what it sends and assembles what it
receives, so callers see whole variables); every call goes to the servers
concerned in parallel, and large tensors are streamed in chunks.
A server that cannot be reached (it crashed and is being restarted) is retried
with backoff for `reconnect_timeout` seconds: pushes carry the element ranges
they contain, so a push repeated after a lost reply is recognized and not
applied twice. A server restarted elsewhere (another node of a cluster) is
followed to its new address, read from the job's cluster.json (`resolver`;
by default the job of `KERAS_ELASTIC_JOB_DIR`).

Optimizer hyperparameters a worker changed (its learning rate) travel in the
header of its next push, to every server whose value differs from the worker's
as far as the client knows (`server_hyperparameters`: from pulls and from the
pushes those servers applied; forgotten when a server restarts or restores);
a server the push carries no tensor for gets an empty push with the change
(see `ps/hyperparameters.py`).

Example (a parameter server in this process, on 127.0.0.1):

>>> import numpy as np
>>> from keras_elastic.ps import ParameterServer
>>> server = ParameterServer()
>>> client = PSClient([server.address])
>>> sgd = {"class_name": "SGD", "config": {"learning_rate": 0.5}}
>>> client.init({"w": (np.ones(2, "float32"), True)}, sgd)["w"].tolist()
[1.0, 1.0]
>>> reply = client.send(Update(grads={"w": np.ones(2, "float32")}))
>>> reply.statuses, reply.values["w"].tolist()
({0: 'applied'}, [0.5, 0.5])
>>> client.close(); server.stop(0)
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from collections.abc import Sequence
from concurrent import futures

import grpc
import numpy as np
from absl import logging

from keras_elastic.common import cluster_env, faults, rpc, variable_slices
from keras_elastic.common.resolver import ClusterResolver
from keras_elastic.common.tensor_codec import (
    BundleParser,
    FrameParser,
    TensorMessageParser,
    bundle_bytes,
    chunk_frames,
    chunk_frames_all,
    decode_all,
    read_stream,
    tensors_bytes,
)
from keras_elastic.proto import ps_pb2, ps_pb2_grpc
from keras_elastic.ps.partition import (
    ASSIGN_PREFIX,
    BASE_PREFIX,
    OPTIMIZER_STATE_PREFIX,
    SPARSE_PREFIX,
    Piece,
    Spec,
    elementwise,
    layout,
    ps_for,
    row_owner,
)
from keras_elastic.ps.task_log import Applied
from keras_elastic.ps.update import Update

# Pushes up to this size (gradients + values, each way) travel as one unary
# message: a stream costs milliseconds more per call in gRPC Python. Replies carry
# as many bytes as the pushed variables, so this also bounds the reply.
SMALL_PUSH_BYTES = 16 << 20
# The most bytes of rows one Lookup call brings back: a bigger lookup (a
# prediction batch of many ids, a wide table) is cut into several calls.
LOOKUP_REPLY_BYTES = 16 << 20


_SERVICE = "/keras_elastic.ParameterServer/"


class _StreamStub:
    """The methods that move tensors (Init, Push, Pull, PushSmall, Lookup), with
    the wire format built and read by hand (`tensor_codec.chunk_frames`,
    `FrameParser`): the same bytes as the generated stub's, one copy of each
    tensor on the way out and one on the way in (protobuf's message objects
    cost three each way)."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.Init = channel.stream_unary(
            _SERVICE + "Init", request_serializer=None,
            response_deserializer=ps_pb2.InitResponse.FromString)
        self.Push = channel.stream_stream(
            _SERVICE + "Push", request_serializer=None,
            response_deserializer=FrameParser(ps_pb2.ModelHeader))
        self.Pull = channel.unary_stream(
            _SERVICE + "Pull", request_serializer=ps_pb2.PullRequest.SerializeToString,
            response_deserializer=FrameParser(ps_pb2.ModelHeader))
        # A push of a small model in one message each way (`bundle_bytes`).
        self.PushSmall = channel.unary_unary(
            _SERVICE + "PushSmall", request_serializer=None,
            response_deserializer=BundleParser(ps_pb2.ModelHeader))
        # Embedding rows (`tensors_bytes`, `TensorMessageParser`).
        self.Lookup = channel.unary_unary(
            _SERVICE + "Lookup", request_serializer=None,
            response_deserializer=TensorMessageParser(ps_pb2.LookupResponse))


@dataclasses.dataclass(frozen=True)
class ServerStatus:
    """What a parameter server says of itself (its Status call).

    `restored_from`: the checkpoint it restored last (None if none);
    `tables`: embedding table -> rows held; `to_dict()` for JSON.
    """

    ps_index: int
    num_ps: int
    initialized: bool
    version: int
    variables: list[str]
    pushes: int
    tables: dict[str, int]
    dropped: int
    duplicates: int
    refused: int
    incarnation: int
    restored_from: str | None
    tasks_logged: int
    paused: bool
    hyperparameters: dict[str, float]
    # embedding table -> {"rows", "admitted", "evicted", "dropped", "bytes"}
    table_stats: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    cpu_seconds: float = 0.0  # the process's, since it started
    backup: str = ""  # its backup's address ("" none: ps/replication.py)
    replicated: bool = False  # every call it answered, its backup applied too

    @classmethod
    def from_proto(cls, m: ps_pb2.PSStatusResponse) -> ServerStatus:
        return cls(ps_index=m.ps_index, num_ps=m.num_ps, initialized=m.initialized,
                   version=m.version, variables=list(m.variables), pushes=m.pushes,
                   tables=dict(m.tables), dropped=m.dropped, duplicates=m.duplicates,
                   refused=m.refused, incarnation=m.incarnation,
                   restored_from=m.restored_from or None,
                   tasks_logged=m.tasks_logged, paused=m.paused,
                   hyperparameters=dict(m.hyperparameters),
                   table_stats={n: {"rows": t.rows, "admitted": t.admitted,
                                    "evicted": t.evicted, "dropped": t.dropped,
                                    "bytes": t.bytes}
                                for n, t in m.table_stats.items()},
                   cpu_seconds=m.cpu_seconds, backup=m.backup,
                   replicated=m.replicated)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class TaskClaim:
    """What one server has applied of a task (see `ps/task_log.py`): the ranges
    and fingerprint of update "" (the model's optimizer's first apply of each
    step), and `others`, those of the other updates that applied any.

    >>> TaskClaim([(0, 32)], 7).updates
    {'': Applied(ranges=[(0, 32)], fingerprint=7)}
    """

    applied: list[tuple[int, int]]
    fingerprint: int | None
    others: dict[str, Applied] = dataclasses.field(default_factory=dict)

    @property
    def updates(self) -> dict[str, Applied]:
        """Every update that applied elements of the task: name -> Applied."""
        out = {"": Applied(list(self.applied), self.fingerprint)} if self.applied else {}
        out.update(self.others)
        return out


@dataclasses.dataclass
class PushReply:
    values: dict[str, np.ndarray]
    # Per server pushed to: "applied", "duplicate", "stale", "fenced", "overlap".
    statuses: dict[int, str]

    @property
    def accepted(self) -> bool:
        return all(s in ("applied", "duplicate") for s in self.statuses.values())

    def refusals(self) -> dict[int, str]:
        return {i: s for i, s in self.statuses.items()
                if s not in ("applied", "duplicate")}


def _server_name(key: str) -> str:
    """A variable key as a server names the variable (and prefixes its
    optimizer slots with it)."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", key)


# The calls of training whose waits a worker reports (`PSClient.waits`):
# each answers at once on a live server (Flush: every worker's at its
# epoch's end). Save, Restore and Init may take long on a live one: they are
# reported only once they could not reach it. (A worker stuck in its
# epoch's Flush to a server cut off from every worker was not reported as
# waiting: the launcher took it for one that reached the server, and blamed
# the other worker as cut off.)
_WATCHED = frozenset({"Pull", "Push", "Lookup", "Claim", "Flush"})


class PSClient:
    """Talks to `len(addresses)` parameter servers."""

    def __init__(self, addresses: list[str], worker_id: int = 0,
                 connect_timeout: float = 60.0,
                 reconnect_timeout: float | None = None,
                 resolver: ClusterResolver | str | None = rpc.AUTO,
                 partitions: Sequence[int] | None = None) -> None:
        if not addresses:
            raise ValueError("PSClient needs at least one parameter server address")
        self.addresses = list(addresses)
        # The partition at each address (`ps/host.py`): server i of the
        # model's layout is partition i, unless a caller talks to some only.
        self.partitions = (list(range(len(self.addresses))) if partitions is None
                           else [int(p) for p in partitions])
        if len(self.partitions) != len(self.addresses):
            raise ValueError(f"PSClient: {len(self.partitions)} partitions for "
                             f"{len(self.addresses)} addresses")
        self.worker_id = worker_id
        self.reconnect_timeout = (connect_timeout if reconnect_timeout is None
                                  else reconnect_timeout)
        self._channels = []
        for address, partition in zip(self.addresses, self.partitions):
            channel = rpc.make_channel(address, resolver=resolver, partition=partition)
            rpc.wait_ready(channel, address, "parameter server", connect_timeout)
            self._channels.append(channel)
        self._stubs = [ps_pb2_grpc.ParameterServerStub(c) for c in self._channels]
        self._streams = [_StreamStub(c) for c in self._channels]
        self.versions = [-1] * len(self.addresses)
        self.incarnations = [0] * len(self.addresses)
        # Each server's settable optimizer hyperparameters as far as this client
        # knows (pulls, pushes it applied); {} after it restarted or restored.
        self.server_hyperparameters: list[dict[str, float]] = [
            {} for _ in self.addresses]
        # Each server's (phase, hyperparameters before that phase's first
        # change), from pulls; and the phase this client's pushes are of (the
        # sync points its worker passed: worker/session.py sets it).
        self.server_phase_starts: list[tuple[int, dict[str, float]]] = [
            (0, {}) for _ in self.addresses]
        self.phase = 0
        self._pool = (futures.ThreadPoolExecutor(len(self.addresses), "ke-ps")
                      if len(self.addresses) > 1 else None)
        self.dropped_pushes = 0
        # Bytes of the variables each server owns (bounds the size of a reply).
        self._owned_bytes = [0] * len(self.addresses)
        # The calls in flight: id -> [server, when it began, when it first
        # found the server unreachable or None, whether _WATCHED]; see `waits`.
        self._in_flight: dict[int, list] = {}
        # Server -> when a call to it last got its answer (`reached`), and
        # the servers asked by `probe_idle` now (off the caller's thread).
        self._answered: dict[int, float] = {}
        self._probing: set[int] = set()
        self._prober: futures.ThreadPoolExecutor | None = None
        self._flight_lock = threading.Lock()
        # Variables split over servers (`init`'s layout): key -> its pieces
        # and shape; slice name -> piece; the newest value of each slice.
        self._split: dict[str, tuple[list[Piece], tuple[int, ...]]] = {}
        # Embedding table -> bytes of one of its rows (from `init`): a lookup
        # is cut into calls whose replies stay under LOOKUP_REPLY_BYTES.
        self._row_bytes: dict[str, int] = {}
        self._piece_of: dict[str, Piece] = {}
        self._slice_values: dict[str, np.ndarray] = {}

    @property
    def num_ps(self) -> int:
        return len(self.addresses)

    def owner(self, name: str) -> int:
        """The server of a variable held whole (the first of a split one's)."""
        if name in self._split:
            return self._split[name][0][0].server
        return ps_for(name, self.num_ps)

    def servers_of(self, name: str) -> list[int]:
        """The servers holding (a slice of) variable `name`."""
        if name in self._split:
            return sorted({p.server for p in self._split[name][0]})
        return [ps_for(name, self.num_ps)]

    def _place(self, name: str, value: np.ndarray):
        """(server, name there, value there) for each piece of `value`."""
        split = self._split.get(name)
        if split is None:
            return [(ps_for(name, self.num_ps), name, value)]
        flat = np.reshape(np.ascontiguousarray(value), -1)
        return [(p.server, p.name, flat[p.begin:p.end]) for p in split[0]]

    def _assemble(self, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Received values with the slices of split variables put together
        (the newest of each slice kept: a reply carries the changed ones)."""
        if not self._piece_of:
            return values
        out: dict[str, np.ndarray] = {}
        touched = set()
        for name, value in values.items():
            piece = self._piece_of.get(name)
            if piece is None:
                out[name] = value
            else:
                self._slice_values[name] = value
                touched.add(piece.key)
        for key in touched:
            pieces, shape = self._split[key]
            first = self._slice_values.get(pieces[0].name)
            if first is None or any(p.name not in self._slice_values for p in pieces):
                continue
            whole = np.empty(int(np.prod(shape, dtype=np.int64)), first.dtype)
            for p in pieces:
                whole[p.begin:p.end] = self._slice_values[p.name]
            out[key] = whole.reshape(shape)
        return out

    def _map(self, fn, indices):
        indices = list(indices)
        if self._pool is None or len(indices) <= 1:
            return [fn(i) for i in indices]
        return list(self._pool.map(fn, indices))

    def _address(self, index: int) -> str:
        """Where server `index` is now (it may have moved since __init__)."""
        return getattr(self._channels[index], "address", self.addresses[index])

    def _error(self, index: int, method: str, e: grpc.RpcError) -> Exception:
        if rpc.is_unreachable(e) or e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return ConnectionError(f"parameter server {index} at {self._address(index)} "
                                   f"did not answer {method}: {e.details()}")
        return ValueError(f"parameter server {index} at {self._address(index)}: "
                          f"{e.details()}")

    def waits(self, at_least: float = 1.0) -> tuple[dict[str, float], dict[str, float]]:
        """The servers this worker waits on: ({"ps-<i>": seconds its oldest
        training call (Pull, Push, Lookup, Claim, Flush) to server i has
        waited, retries included, or any other call since it first failed to
        reach it}, {"ps-<i>": seconds since such a call first found server i
        unreachable}), for waits of `at_least` seconds. The worker's
        heartbeats carry them to the master, where the launcher's liveness
        policy reads them (`launcher/policy.ServiceLiveness`).

        >>> from keras_elastic.ps import ParameterServer
        >>> server = ParameterServer()
        >>> client = PSClient([server.address])
        >>> client.waits(at_least=0.0)  # no call in flight
        ({}, {})
        >>> client.close(); server.stop(0)

        (A worker whose push to server 1 has waited 12.5 s, the server
        unreachable for the last 12.1 s: `({'ps-1': 12.5}, {'ps-1': 12.1})`.)
        """
        now = time.monotonic()
        waiting: dict[str, float] = {}
        unreachable: dict[str, float] = {}
        with self._flight_lock:
            for index, began, failed, watched in self._in_flight.values():
                role = f"ps-{index}"
                if not watched:
                    if failed is None:
                        continue  # a long call that reached it: no wait
                    began = failed
                waiting[role] = max(now - began, waiting.get(role, 0.0))
                if failed is not None:
                    unreachable[role] = max(now - failed, unreachable.get(role, 0.0))
        return ({r: t for r, t in waiting.items() if t >= at_least},
                {r: t for r, t in unreachable.items() if t >= at_least})

    def reached(self) -> dict[str, float]:
        """{"ps-<i>": seconds since server i last answered a call of this
        worker}: evidence, for the launcher's liveness policy, that the
        server is reachable from here (`waits` says where it is not).

        >>> from keras_elastic.ps import ParameterServer
        >>> server = ParameterServer()
        >>> client = PSClient([server.address])
        >>> client.reached()  # no call yet
        {}
        >>> _ = client.status(0)
        >>> list(client.reached())
        ['ps-0']
        >>> client.close(); server.stop(0)
        """
        now = time.monotonic()
        return {f"ps-{i}": now - t for i, t in sorted(self._answered.items())}

    def probe_idle(self, older_than: float) -> None:
        """Asks each server that has not answered this worker for
        `older_than` seconds, and that no call of it waits on, whether it
        is there (a Status call, once, off the caller's thread): its answer
        is the evidence `reached` reports. A worker that trains reaches
        every server at each step; one idle at its epoch's end (waiting for
        another worker's tasks) would otherwise say nothing of a server
        that the other worker cannot reach, and the launcher could not tell
        that worker's partition from the server's (launcher/policy.py). A
        failed probe is not a wait: the worker does not depend on it."""
        now = time.monotonic()
        with self._flight_lock:
            busy = {flight[0] for flight in self._in_flight.values()}
            due = [i for i in range(self.num_ps)
                   if i not in busy and i not in self._probing
                   and now - self._answered.get(i, float("-inf")) >= older_than]
            self._probing.update(due)
            if due and self._prober is None:
                self._prober = futures.ThreadPoolExecutor(1, "ke-ps-probe")
        for i in due:
            self._prober.submit(self._probe, i, max(1.0, min(5.0, older_than)))

    def _probe(self, index: int, timeout: float) -> None:
        try:
            self._stubs[index].Status(ps_pb2.PSStatusRequest(), timeout=timeout)
            self._answered[index] = time.monotonic()
        except (grpc.RpcError, ValueError):  # (ValueError: the channel closed)
            pass
        finally:
            with self._flight_lock:
                self._probing.discard(index)

    def _call(self, index: int, method: str, call, retry: bool = True):
        """`call()` against server `index`, retried while it is unreachable."""
        flight = [index, time.monotonic(), None, method in _WATCHED]  # see `waits`

        def failed() -> None:
            if flight[2] is None:
                flight[2] = time.monotonic()

        with self._flight_lock:
            self._in_flight[id(flight)] = flight
        try:
            result = self._call_once(index, method, call, retry, failed)
            self._answered[index] = time.monotonic()
            return result
        finally:
            with self._flight_lock:
                del self._in_flight[id(flight)]

    def _call_once(self, index: int, method: str, call, retry: bool,
                   on_unreachable=None):
        try:
            if not retry:
                return self._call_misdirected(index, call)
            return rpc.retry_unreachable(
                call, f"parameter server {index} at {self._address(index)}",
                self.reconnect_timeout, on_unreachable)
        except grpc.RpcError as e:
            raise self._error(index, method, e) from None

    def _call_misdirected(self, index: int, call):
        """`call()` (not safe to repeat), sent again only while the process it
        reached says it does not hold the partition (nothing applied: the
        partition moved, and cluster.json says where), for up to
        `reconnect_timeout` seconds."""
        deadline = time.monotonic() + self.reconnect_timeout
        while True:
            try:
                return call()
            except grpc.RpcError as e:
                if not rpc.is_misdirected(e) or time.monotonic() > deadline:
                    raise
                rpc.refresh_all()
                time.sleep(0.05)

    def _took(self, index: int, header) -> None:
        if header.incarnation != self.incarnations[index]:
            self.server_hyperparameters[index] = {}  # restarted or restored
            self.server_phase_starts[index] = (0, {})
        self.versions[index] = header.version
        self.incarnations[index] = header.incarnation

    def init(self, variables: dict[str, tuple[np.ndarray, bool]],
             optimizer_config: dict, restore_from: str = "",
             tables: dict[str, dict] | None = None,
             optimizer_state: dict[str, tuple[np.ndarray, str | None]] | None = None,
             namespace: str = "", partition_bytes: int | None = None
             ) -> dict[str, np.ndarray]:
        """Initializes every server (first caller wins; it also loads the
        parameter-server checkpoint `restore_from`, if given); returns the
        servers' current values. `tables`: embedding tables, name -> {"dim",
        "dtype", "input_dim" (None: unbounded), "initializer" (a Keras
        initializer config)}; every server holds the rows of its ids.
        `optimizer_state`: {server-side name: (value, key of the variable it
        belongs to, or None for every server)} of an optimizer that already
        trained. `namespace`: the model's ("" for the job's first).
        `partition_bytes`: trainable variables of at least this many bytes are
        split over the servers (`ps/partition.layout`; None: none, nor with an
        optimizer whose update is not elementwise); every worker must pass
        the same."""
        config = json.dumps(optimizer_config)
        if not elementwise(optimizer_config):
            partition_bytes = None
        placed = layout([Spec(n, int(np.size(v)), np.asarray(v).dtype.itemsize,
                              bool(t) and np.issubdtype(np.asarray(v).dtype,
                                                        np.floating))
                         for n, (v, t) in variables.items()], self.num_ps,
                        partition_bytes)
        for name, pieces in placed.items():
            if pieces[0].name != name:  # split
                self._split[name] = (pieces, tuple(np.shape(variables[name][0])))
                self._piece_of.update({p.name: p for p in pieces})
        self._row_bytes.update(
            {n: int(t["dim"]) * np.dtype(t.get("dtype", "float32")).itemsize
             for n, t in (tables or {}).items()})
        table_specs = [ps_pb2.TableSpec(
            name=n, dim=t["dim"], dtype=t.get("dtype", "float32"),
            input_dim=t.get("input_dim") or 0,
            initializer=json.dumps(t.get("initializer", "uniform")),
            admit_after=t.get("admit_after") or 0, max_rows=t.get("max_rows") or 0,
            ttl_versions=t.get("ttl_versions") or 0)
            for n, t in (tables or {}).items()]
        parts: list[dict] = [{} for _ in self.addresses]
        for name, (value, trainable) in variables.items():
            for i, there, piece in self._place(name, np.asarray(value)):
                parts[i][there] = (piece, trainable)
        states: list[dict] = [{} for _ in self.addresses]
        for name, (value, key) in (optimizer_state or {}).items():
            if key in self._split:  # a slot: sliced as its variable is
                for i, there, piece in self._place_slot(name, key, np.asarray(value)):
                    states[i][there] = piece
                continue
            for i in ([self.owner(key)] if key else range(self.num_ps)):
                states[i][name] = np.asarray(value)

        def send(i: int) -> None:
            def requests():
                yield ps_pb2.InitRequest(header=ps_pb2.InitHeader(
                    optimizer_config=config, worker_id=self.worker_id,
                    restore_from=restore_from, tables=table_specs, namespace=namespace,
                    variables=[ps_pb2.VariableSpec(
                        name=n, dtype=str(np.asarray(v).dtype),
                        shape=list(np.shape(v)), trainable=t)
                        for n, (v, t) in parts[i].items()],
                    optimizer_state=[ps_pb2.VariableSpec(
                        name=n, dtype=str(v.dtype), shape=list(v.shape))
                        for n, v in states[i].items()])).SerializeToString()
                yield from chunk_frames_all(
                    2, ((n, np.asarray(v)) for n, (v, _) in parts[i].items()))
                yield from chunk_frames_all(
                    2, ((OPTIMIZER_STATE_PREFIX + n, v) for n, v in states[i].items()))
            self._call(i, "Init", lambda: self._streams[i].Init(requests(), timeout=600))

        self._map(send, range(self.num_ps))
        return self.pull()

    def pull(self, since_version: int | None = None, changed_only: bool = False
             ) -> dict[str, np.ndarray]:
        """Every value (`since_version` None), those changed after version
        `since_version`, or (`changed_only`) those each server changed since
        this client's last exchange with it (nothing is sent when none did)."""

        def pull_one(i: int) -> dict[str, np.ndarray]:
            since = (self.versions[i] if changed_only else
                     -1 if since_version is None else since_version)
            header, values = self._call(i, "Pull", lambda: read_stream(
                self._streams[i].Pull(ps_pb2.PullRequest(
                    since_version=since, incarnation=self.incarnations[i]),
                    timeout=600)))
            self._took(i, header)
            self.server_hyperparameters[i] = dict(header.hyperparameters)
            self.server_phase_starts[i] = (header.phase_start,
                                           dict(header.phase_start_hyperparameters))
            if since_version is None and not changed_only:
                self._owned_bytes[i] = sum(v.nbytes for v in values.values())
            return values

        merged: dict[str, np.ndarray] = {}
        for values in self._map(pull_one, range(self.num_ps)):
            merged.update(values)
        return self._assemble(merged)

    def _place_slot(self, name: str, key: str, value: np.ndarray):
        """The pieces of optimizer slot `name` of split variable `key`, as the
        servers name them (`{variable name}{slot suffix}`, see
        `worker/model_sync.server_name`)."""
        prefix = _server_name(key)
        pieces, shape = self._split[key]
        if not name.startswith(prefix) or np.size(value) != np.prod(shape):
            raise ValueError(f"optimizer variable '{name}' of '{key}' is not a slot of "
                             f"its shape {list(shape)}: it cannot be split with it")
        flat = np.reshape(np.ascontiguousarray(value), -1)
        suffix = name[len(prefix):]
        return [(p.server, _server_name(p.name) + suffix, flat[p.begin:p.end])
                for p in pieces]

    def pull_optimizer_state(self) -> dict[str, np.ndarray]:
        """The state of the servers' optimizers: {name relative to its
        optimizer: value}; a variable every server has (`iterations`, the
        learning rate) takes the largest value; the slots of split variables
        come whole, flattened (1-D)."""

        def pull_one(i: int) -> dict[str, np.ndarray]:
            _, values = self._call(i, "Pull", lambda: read_stream(
                self._streams[i].Pull(ps_pb2.PullRequest(optimizer_state=True),
                                      timeout=600)))
            return values

        merged: dict[str, np.ndarray] = {}
        for values in self._map(pull_one, range(self.num_ps)):
            for name, value in values.items():
                if name in merged and np.ndim(value) == 0:
                    value = np.maximum(merged[name], value)
                merged[name] = value
        sliced = {n: v for n, v in merged.items() if variable_slices.parse(n)}
        if sliced:
            merged = {n: v for n, v in merged.items() if n not in sliced}
            merged.update(variable_slices.assemble(sliced))
        return merged

    def _split_rows(self, ids: np.ndarray) -> list[np.ndarray]:
        """Positions in `ids` of the rows each server owns."""
        if self.num_ps == 1:
            return [np.arange(len(ids))]
        owners = row_owner(ids, self.num_ps)
        return [np.flatnonzero(owners == i) for i in range(self.num_ps)]

    def lookup(self, ids: dict[str, np.ndarray], create: bool = True
               ) -> dict[str, np.ndarray]:
        """Rows of embedding tables: {table: int64 ids} -> {table: rows}, one
        call per server concerned (several for more than LOOKUP_REPLY_BYTES
        of its rows), in parallel. A training lookup (`create`)
        makes the rows of admitted ids on first use; an evaluation or
        prediction lookup (`create=False`) makes none (ids without a row get
        their initializer's row). A table given no ids is left out of the
        answer."""
        ids = {t: np.asarray(v, np.int64) for t, v in ids.items()}
        where = {t: self._split_rows(v) for t, v in ids.items()}
        # Each server's share in calls whose replies stay under
        # LOOKUP_REPLY_BYTES (a message may not exceed MAX_MESSAGE_BYTES):
        # (server, {table: positions in ids[table]}).
        calls: list[tuple[int, dict[str, np.ndarray]]] = []
        for i in range(self.num_ps):
            mine = {t: where[t][i] for t in ids if where[t][i].size}
            call: dict[str, np.ndarray] = {}
            room = LOOKUP_REPLY_BYTES
            for t, positions in mine.items():
                per_row = max(self._row_bytes.get(t, 0), 1)
                while positions.size:
                    take = room // per_row
                    if take == 0 and call:  # this call is full: on to the next
                        calls.append((i, call))
                        call, room = {}, LOOKUP_REPLY_BYTES
                        continue
                    take = max(take, 1)
                    call[t], positions = positions[:take], positions[take:]
                    room -= len(call[t]) * per_row
            if call:
                calls.append((i, call))

        def lookup_one(k: int) -> dict[str, np.ndarray]:
            i, call = calls[k]
            request = tensors_bytes(1, ((t, ids[t][p]) for t, p in call.items()),
                                    {2: int(not create)})
            reply = self._call(i, "Lookup", lambda: self._streams[i].Lookup(
                request, timeout=600))
            return dict(decode_all(reply.rows))

        out: dict[str, np.ndarray] = {}
        for (_, call), rows in zip(calls, self._map(lookup_one, range(len(calls)))):
            for t, r in rows.items():
                if t not in out:
                    out[t] = np.empty((len(ids[t]), r.shape[1]), r.dtype)
                out[t][call[t]] = r
        return out

    def hyperparameters_at_phase_start(self) -> list[dict[str, float]]:
        """Each server's hyperparameters as they were when this client's phase
        began (from the last pull): the values from before the phase's first
        change if a push of this phase changed them, else the values now.

        >>> client = PSClient.__new__(PSClient)
        >>> client.phase = 3
        >>> client.server_hyperparameters = [{"learning_rate": 0.005}]
        >>> client.server_phase_starts = [(3, {"learning_rate": 0.01})]
        >>> client.hyperparameters_at_phase_start()
        [{'learning_rate': 0.01}]
        >>> client.server_phase_starts = [(2, {"learning_rate": 0.02})]
        >>> client.hyperparameters_at_phase_start()   # none changed in phase 3
        [{'learning_rate': 0.005}]
        """
        return [dict(start) if phase == self.phase and self.phase else dict(now)
                for now, (phase, start) in zip(self.server_hyperparameters,
                                               self.server_phase_starts)]

    def send(self, update: Update, targets: Sequence[int] | None = None
             ) -> PushReply:
        """Sends `update` (ps/update.py), each server its part (`split`);
        returns what changed since this worker's last exchange and each
        server's answer. `targets`: the servers pushed to (default: every
        server owning a part of it, and every server that does not know the
        update's hyperparameters yet: it gets an empty push carrying them).
        The update's `ranges` go to every server pushed to (its task log
        decides whether it applies its part)."""
        parts = self.split(update)
        ranges = list(update.ranges)
        # A gradient push without ranges could be applied twice if repeated.
        retry = bool(ranges) or not update.trains
        # What the client knows of a group's hyperparameters is kept under
        # "NAME/learning_rate" (as pulls report them), sent as "learning_rate".
        prefix = f"{update.optimizer}/" if update.optimizer else ""
        changes = [{k: float(v) for k, v in update.hyperparameters.items()
                    if known.get(prefix + k) != v}
                   for known in self.server_hyperparameters]
        spec = None if not update.optimizer_spec else ps_pb2.OptimizerSpec(
            config=update.optimizer_spec[0], variables=list(update.optimizer_spec[1]))
        extra: set[int] = set()  # servers pushed to for a change only
        if targets is None:
            targets = [i for i in range(self.num_ps) if parts[i][0] or parts[i][1]]
            # Every server gets a change now, even one this push has nothing
            # for: its next update, maybe another worker's, uses the new value.
            extra = {i for i in range(self.num_ps) if changes[i]} - set(targets)
            targets += sorted(extra)
        targets = list(targets)

        def push_one(i: int) -> tuple[str, dict[str, np.ndarray]]:
            grads, assigns = parts[i]
            header = ps_pb2.PushHeader(
                worker_id=self.worker_id, base_version=self.versions[i],
                incarnation=self.incarnations[i],
                ranges=[] if i in extra else ranges,
                num_tensors=len(grads) + len(assigns), hyperparameters=changes[i],
                optimizer=update.optimizer, optimizer_spec=spec,
                assignment=update.assignment and bool(assigns),
                phase=self.phase)
            status, values = self._push(i, header, grads, assigns, retry or i in extra)
            if changes[i] and status == "applied":  # set with the push
                self.server_hyperparameters[i].update(
                    {prefix + k: v for k, v in changes[i].items()})
            return status, values

        action = targets and update.trains and faults.due("mid_push")
        if action:
            # Fault injection (tests): the first server gets the push, then this
            # process dies before the others do and before it sees the reply.
            push_one(targets[0])
            faults.act("mid_push", action)
        merged: dict[str, np.ndarray] = {}
        statuses: dict[int, str] = {}
        for i, (status, values) in zip(targets, self._map(push_one, targets)):
            statuses[i] = status
            merged.update(values)
        return PushReply(self._assemble(merged), statuses)

    def split(self, update: Update) -> list[tuple[dict[str, np.ndarray],
                                                  dict[str, np.ndarray]]]:
        """Each server's part of `update`: (its gradients and table rows, its
        values and bases), named as its push carries them: each variable (or
        its slices, for a variable split over servers) to its owner, each
        table row to the server owning its id."""
        grad_parts: list[dict] = [{} for _ in self.addresses]
        assign_parts: list[dict] = [{} for _ in self.addresses]
        for name, g in update.grads.items():
            for i, there, piece in self._place(name, g):
                grad_parts[i][there] = piece
        for table, (ids, rows) in update.rows.items():
            for i, at in enumerate(self._split_rows(ids)):
                if at.size:
                    grad_parts[i][f"{SPARSE_PREFIX}{table}/ids"] = ids[at]
                    grad_parts[i][f"{SPARSE_PREFIX}{table}/grads"] = rows[at]
        for name, v in update.assigns.items():
            for i, there, piece in self._place(name, v):
                assign_parts[i][ASSIGN_PREFIX + there] = piece
        for name, v in update.bases.items():
            if name not in update.assigns:
                raise ValueError(f"a base value for '{name}', which the push does "
                                 "not assign")
            for i, there, piece in self._place(name, v):
                assign_parts[i][BASE_PREFIX + there] = piece
        return list(zip(grad_parts, assign_parts))

    def _push(self, i: int, header: ps_pb2.PushHeader, grads: dict[str, np.ndarray],
              assigns: dict[str, np.ndarray], retry: bool
              ) -> tuple[str, dict[str, np.ndarray]]:
        """One server's push: in one message when small, else streamed in
        chunks; (its status, the values its reply carries)."""
        size = sum(g.nbytes for g in grads.values()) + sum(
            v.nbytes for v in assigns.values())
        if max(size, self._owned_bytes[i]) <= SMALL_PUSH_BYTES:
            request = bundle_bytes(header, [*grads.items(), *assigns.items()])
            reply = self._call(i, "Push", lambda: self._streams[i].PushSmall(
                request, timeout=600), retry)
            return self._received(i, reply.header), dict(decode_all(reply.tensors))

        def requests():
            yield ps_pb2.PushRequest(header=header).SerializeToString()
            yield from chunk_frames_all(2, grads.items())
            for n, v in assigns.items():
                yield from chunk_frames(2, n, v)
        reply, values = self._call(i, "Push", lambda: read_stream(
            self._streams[i].Push(requests(), timeout=600)), retry)
        return self._received(i, reply), values

    def _received(self, i: int, header) -> str:
        """A push's status from its reply header (its version noted)."""
        self._took(i, header)
        if header.status == "stale":
            self.dropped_pushes += 1
        return header.status or ("applied" if header.accepted else "stale")

    def claim(self, dataset: str, epoch: int, task_id: int, lease: int
              ) -> list[TaskClaim] | None:
        """Claims a task on every server for `lease`; returns what each has
        applied of it, or None if a newer lease holds it somewhere."""

        def claim_one(i: int):
            return self._call(i, "Claim", lambda: self._stubs[i].Claim(
                ps_pb2.ClaimRequest(dataset=dataset, epoch=epoch, task_id=task_id,
                                    lease=lease, worker_id=self.worker_id),
                timeout=cluster_env.call_deadline(60)))

        replies = self._map(claim_one, range(self.num_ps))
        if not all(r.ok for r in replies):
            logging.info("claim of task %d of epoch %d refused: %s", task_id, epoch,
                         "; ".join(r.error for r in replies if not r.ok))
            return None
        return [TaskClaim(
            list(zip(r.applied[::2], r.applied[1::2])),
            r.fingerprint if r.fingerprint_known else None,
            {u.update: Applied(list(zip(u.applied[::2], u.applied[1::2])),
                               u.fingerprint if u.fingerprint_known else None)
             for u in r.other_updates})
            for r in replies]

    def flush(self) -> None:
        """Has every server apply the gradients it buffers (grads_to_wait > 1)."""
        self._map(lambda i: self._call(i, "Flush", lambda: self._stubs[i].Flush(
            ps_pb2.FlushRequest(), timeout=600)), range(self.num_ps))

    # -- administration: checkpoints, status, rollback ---------------------
    def save_all(self, directory: str, sharding_callback: str = "", *,
                 epoch: int | None = None, batch: int | None = None,
                 step: int | None = None, automatic: bool = False,
                 timeout: float = 3600, table_base: str = ""
                 ) -> list[ps_pb2.SaveResponse]:
        """Has every server write its part of a checkpoint into `directory`
        (`sharding_callback`: `ps.checkpoint_part.encode_callback(...)`, empty
        for ShardByTaskPolicy); returns the parts, in server order.
        `table_base`: an earlier checkpoint of the same servers; their tables'
        rows changed since it are saved, not every row (incremental)."""
        request = ps_pb2.SaveRequest(directory=directory,
                                     sharding_callback=sharding_callback,
                                     automatic=automatic, table_base=table_base)
        for field, value in (("epoch", epoch), ("batch", batch), ("step", step)):
            if value is not None:
                setattr(request, field, int(value))
        return self._map(lambda i: self._call(i, "Save", lambda: self._stubs[i].Save(
            request, timeout=timeout)), range(self.num_ps))

    def restore(self, index: int, path: str, timeout: float = 600
                ) -> ps_pb2.RestoreResponse:
        """Has server `index` load its share of the checkpoint at `path`."""
        return self._call(index, "Restore", lambda: self._stubs[index].Restore(
            ps_pb2.RestoreRequest(path=path), timeout=timeout))

    def restore_all(self, path: str, timeout: float = 600
                    ) -> list[ps_pb2.RestoreResponse]:
        return self._map(lambda i: self.restore(i, path, timeout), range(self.num_ps))

    def status(self, index: int, timeout: float = 60) -> ServerStatus:
        return ServerStatus.from_proto(self._call(
            index, "Status", lambda: self._stubs[index].Status(
                ps_pb2.PSStatusRequest(), timeout=timeout)))

    def status_all(self, timeout: float = 60) -> list[ServerStatus]:
        return self._map(lambda i: self.status(i, timeout), range(self.num_ps))

    def pause(self, index: int, timeout: float = 60) -> None:
        """Server `index` answers data calls UNAVAILABLE until `resume`."""
        self._call(index, "Pause", lambda: self._stubs[index].Pause(
            ps_pb2.PauseRequest(), timeout=timeout))

    def attach_backup(self, index: int, address: str, same_start: bool = False,
                      copy_dir: str = "", timeout: float = 60) -> None:
        """Server `index` applies every call that changes its state on the
        server at `address` too before answering (ps/replication.py); ""
        detaches its backup. `same_start`: both were started from the same
        state (the same checkpoint); `copy_dir`: the backup is new, the
        server copies its state to it through this directory first."""
        self._call(index, "AttachBackup", lambda: self._stubs[index].AttachBackup(
            ps_pb2.AttachBackupRequest(address=address, same_start=same_start,
                                       copy_dir=copy_dir), timeout=timeout))

    def resume(self, index: int, min_lease: int = 0, timeout: float = 60) -> None:
        """Server `index` serves again; after a rollback, claims with a lease
        below `min_lease` (handed out before it) are refused."""
        self._call(index, "Resume", lambda: self._stubs[index].Resume(
            ps_pb2.ResumeRequest(min_lease=int(min_lease)), timeout=timeout))

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        if self._prober is not None:
            self._prober.shutdown(wait=False)

"""The worker's view of the parameter servers: one logical model store.

Variables are partitioned over the servers by `ps_for(name)`; every call goes
to the servers concerned in parallel, and large tensors are streamed in chunks.

Example:

>>> client = PSClient(["127.0.0.1:40125"])                     # doctest: +SKIP
>>> client.init({"w": (w0, True)}, keras.optimizers.serialize(opt))  # doctest: +SKIP
>>> new_values = client.push({"w": grad_w}, {})                # doctest: +SKIP
"""

from __future__ import annotations

import json
from concurrent import futures

import grpc
import numpy as np

from keras_elastic.common import rpc
from keras_elastic.common.tensor_codec import (
    decode_all,
    encode,
    encode_all,
    read_stream,
)
from keras_elastic.proto import ps_pb2, ps_pb2_grpc
from keras_elastic.ps.partition import ps_for
from keras_elastic.ps.servicer import ASSIGN_PREFIX

# Pushes up to this size (gradients + values, each way) travel as one unary
# message: a stream costs milliseconds more per call in gRPC Python. Replies carry
# as many bytes as the pushed variables, so this also bounds the reply.
SMALL_PUSH_BYTES = 16 << 20


class PSClient:
    """Talks to `len(addresses)` parameter servers."""

    def __init__(self, addresses: list[str], worker_id: int = 0,
                 connect_timeout: float = 60.0) -> None:
        if not addresses:
            raise ValueError("PSClient needs at least one parameter server address")
        self.addresses = list(addresses)
        self.worker_id = worker_id
        self._channels = []
        for address in self.addresses:
            channel = rpc.make_channel(address)
            rpc.wait_ready(channel, address, "parameter server", connect_timeout)
            self._channels.append(channel)
        self._stubs = [ps_pb2_grpc.ParameterServerStub(c) for c in self._channels]
        self.versions = [-1] * len(self.addresses)
        self._pool = (futures.ThreadPoolExecutor(len(self.addresses), "ke-ps")
                      if len(self.addresses) > 1 else None)
        self.dropped_pushes = 0
        # Bytes of the variables each server owns (bounds the size of a reply).
        self._owned_bytes = [0] * len(self.addresses)

    @property
    def num_ps(self) -> int:
        return len(self.addresses)

    def owner(self, name: str) -> int:
        return ps_for(name, self.num_ps)

    def _map(self, fn, indices):
        indices = list(indices)
        if self._pool is None or len(indices) <= 1:
            return [fn(i) for i in indices]
        return list(self._pool.map(fn, indices))

    def _error(self, index: int, method: str, e: grpc.RpcError) -> Exception:
        if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return ConnectionError(f"parameter server {index} at {self.addresses[index]} "
                                   f"did not answer {method}: {e.details()}")
        return ValueError(f"parameter server {index} at {self.addresses[index]}: "
                          f"{e.details()}")

    def init(self, variables: dict[str, tuple[np.ndarray, bool]],
             optimizer_config: dict, restore_from: str = "") -> dict[str, np.ndarray]:
        """Initializes every server (first caller wins; it also loads the
        parameter-server checkpoint `restore_from`, if given); returns the
        servers' current values."""
        config = json.dumps(optimizer_config)
        parts: list[dict] = [{} for _ in self.addresses]
        for name, (value, trainable) in variables.items():
            parts[self.owner(name)][name] = (value, trainable)

        def send(i: int) -> None:
            def requests():
                yield ps_pb2.InitRequest(header=ps_pb2.InitHeader(
                    optimizer_config=config, worker_id=self.worker_id,
                    restore_from=restore_from,
                    variables=[ps_pb2.VariableSpec(
                        name=n, dtype=str(np.asarray(v).dtype),
                        shape=list(np.shape(v)), trainable=t)
                        for n, (v, t) in parts[i].items()]))
                for n, (v, _) in parts[i].items():
                    for chunk in encode(n, np.asarray(v)):
                        yield ps_pb2.InitRequest(chunk=chunk)
            try:
                self._stubs[i].Init(requests(), timeout=600)
            except grpc.RpcError as e:
                raise self._error(i, "Init", e) from None

        self._map(send, range(self.num_ps))
        return self.pull()

    def pull(self, since_version: int | None = None) -> dict[str, np.ndarray]:
        """Values changed on each server since our last exchange (None: all)."""

        def pull_one(i: int) -> dict[str, np.ndarray]:
            since = -1 if since_version is None else since_version
            try:
                header, values = read_stream(self._stubs[i].Pull(
                    ps_pb2.PullRequest(since_version=since), timeout=600))
            except grpc.RpcError as e:
                raise self._error(i, "Pull", e) from None
            self.versions[i] = header.version
            if since_version is None:
                self._owned_bytes[i] = sum(v.nbytes for v in values.values())
            return values

        merged: dict[str, np.ndarray] = {}
        for values in self._map(pull_one, range(self.num_ps)):
            merged.update(values)
        return merged

    def push(self, grads: dict[str, np.ndarray], assigns: dict[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
        """Sends gradients and non-trainable values; returns the new values of
        every variable that changed since this worker's last exchange."""
        grad_parts: list[dict] = [{} for _ in self.addresses]
        assign_parts: list[dict] = [{} for _ in self.addresses]
        for name, g in grads.items():
            grad_parts[self.owner(name)][name] = g
        for name, v in assigns.items():
            assign_parts[self.owner(name)][name] = v

        def push_one(i: int) -> dict[str, np.ndarray]:
            size = sum(g.nbytes for g in grad_parts[i].values()) + sum(
                v.nbytes for v in assign_parts[i].values())
            if max(size, self._owned_bytes[i]) <= SMALL_PUSH_BYTES:
                return push_small(i)

            def requests():
                yield ps_pb2.PushRequest(header=ps_pb2.PushHeader(
                    worker_id=self.worker_id, base_version=self.versions[i]))
                for n, g in grad_parts[i].items():
                    for chunk in encode(n, g):
                        yield ps_pb2.PushRequest(chunk=chunk)
                for n, v in assign_parts[i].items():
                    for chunk in encode(ASSIGN_PREFIX + n, v):
                        yield ps_pb2.PushRequest(chunk=chunk)
            try:
                header, values = read_stream(self._stubs[i].Push(
                    requests(), timeout=600))
            except grpc.RpcError as e:
                raise self._error(i, "Push", e) from None
            if not header.accepted:
                self.dropped_pushes += 1
            self.versions[i] = header.version
            return values

        def push_small(i: int) -> dict[str, np.ndarray]:
            tensors = list(encode_all(grad_parts[i].items(), chunk_bytes=1 << 62))
            tensors += list(encode_all(((ASSIGN_PREFIX + n, v) for n, v in
                                        assign_parts[i].items()), chunk_bytes=1 << 62))
            try:
                reply = self._stubs[i].PushSmall(ps_pb2.PushBundle(
                    header=ps_pb2.PushHeader(worker_id=self.worker_id,
                                             base_version=self.versions[i]),
                    tensors=tensors), timeout=600)
            except grpc.RpcError as e:
                raise self._error(i, "Push", e) from None
            if not reply.header.accepted:
                self.dropped_pushes += 1
            self.versions[i] = reply.header.version
            return dict(decode_all(reply.tensors))

        targets = [i for i in range(self.num_ps) if grad_parts[i] or assign_parts[i]]
        merged: dict[str, np.ndarray] = {}
        for values in self._map(push_one, targets):
            merged.update(values)
        return merged

    def call_all(self, method: str, payload: dict, timeout: float = 3600
                 ) -> list[dict]:
        """Calls a JSON method (Save, Restore, Status) on every server."""

        def call(i: int) -> dict:
            try:
                response = getattr(self._stubs[i], method)(
                    ps_pb2.SaveRequest(json=json.dumps(payload)), timeout=timeout)
            except grpc.RpcError as e:
                raise self._error(i, method, e) from None
            return json.loads(response.json)

        return self._map(call, range(self.num_ps))

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)

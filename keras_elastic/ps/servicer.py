"""The parameter server's gRPC service over a `ParameterStore`."""

from __future__ import annotations

import json

import grpc

from keras_elastic.common.tensor_codec import (
    decode_all,
    encode_all,
    read_stream,
)
from keras_elastic.proto import ps_pb2, ps_pb2_grpc
from keras_elastic.ps.partition import ASSIGN_PREFIX
from keras_elastic.ps.store import ParameterStore
from keras_elastic.ps.task_log import Range, StaleLeaseError

__all__ = ["ASSIGN_PREFIX", "ParameterServerServicer"]


def ranges_of(header) -> list[Range]:
    return [Range((r.dataset, r.epoch, r.task_id), r.lease, r.start, r.end,
                  r.fingerprint) for r in header.ranges]


class ParameterServerServicer(ps_pb2_grpc.ParameterServerServicer):
    def __init__(self, store: ParameterStore, ps_index: int = 0, num_ps: int = 1,
                 init_checkpoint_dir: str | None = None, paused: bool = False) -> None:
        self.store = store
        self.ps_index = ps_index
        self.num_ps = num_ps
        # Where the server saves its share of the initial model when a worker
        # initializes it (the job's first recovery point).
        self.init_checkpoint_dir = init_checkpoint_dir
        # Paused during a rollback (see Pause): workers must not act on the
        # restored state before the master has rolled back too.
        self.paused = paused

    def _refuse_if_paused(self, context) -> None:
        if self.paused:
            context.abort(grpc.StatusCode.UNAVAILABLE,
                          f"parameter server {self.ps_index} is paused while the job "
                          "rolls back to a checkpoint; retry")

    def Pause(self, request, context):
        with self.store.lock:  # no push, pull or claim is half done
            self.paused = True
        return ps_pb2.SaveResponse(json=json.dumps({"paused": True}))

    def Resume(self, request, context):
        self.paused = False
        return ps_pb2.SaveResponse(json=json.dumps({"paused": False}))

    def _model_stream(self, header: ps_pb2.ModelHeader, values: dict):
        yield ps_pb2.ModelChunk(header=header)
        for chunk in encode_all(values.items()):
            yield ps_pb2.ModelChunk(chunk=chunk)

    def Init(self, request_iterator, context):
        self._refuse_if_paused(context)
        header, values = read_stream(request_iterator)
        if header is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Init stream had no header")
        trainable = {v.name: v.trainable for v in header.variables}
        missing = sorted(set(trainable) - set(values))
        if missing:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"Init: no values sent for {missing}")
        try:
            with self.store.lock:  # nobody pushes between creating and restoring
                created = self.store.init(values, trainable,
                                          json.loads(header.optimizer_config))
                if created and header.restore_from:
                    from keras_elastic.ps.checkpointing import restore_shard

                    restore_shard(self.store, self.ps_index, self.num_ps,
                                  {"path": header.restore_from})
                if created and self.init_checkpoint_dir:
                    from keras_elastic.ps.checkpointing import save_shard

                    save_shard(self.store, self.ps_index, self.num_ps,
                               {"directory": self.init_checkpoint_dir,
                                "extra": {"initial": True}})
        except (ValueError, OSError) as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return ps_pb2.InitResponse(initialized_now=created, version=self.store.version)

    def Push(self, request_iterator, context):
        header, tensors = read_stream(request_iterator)
        reply, values = self._push(header, tensors, context)
        yield from self._model_stream(reply, values)

    def PushSmall(self, request, context):
        tensors = dict(decode_all(request.tensors))
        reply, values = self._push(request.header, tensors, context)
        return ps_pb2.ModelBundle(
            header=reply, tensors=list(encode_all(values.items(), chunk_bytes=1 << 62)))

    def _since(self, version: int, incarnation: int) -> int:
        """`version` if it belongs to this server's current state, else -1."""
        return version if incarnation == self.store.incarnation else -1

    def _push(self, header, tensors, context):
        grads = {n: v for n, v in tensors.items() if not n.startswith(ASSIGN_PREFIX)}
        assigns = {n[len(ASSIGN_PREFIX):]: v for n, v in tensors.items()
                   if n.startswith(ASSIGN_PREFIX)}
        try:
            with self.store.lock:
                self._refuse_if_paused(context)
                since = self._since(header.base_version, header.incarnation)
                result = self.store.push(grads, assigns, since, ranges_of(header))
                values = self.store.values_since(since)
                incarnation = self.store.incarnation
        except (KeyError, RuntimeError) as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"parameter server {self.ps_index}: {e}")
        return ps_pb2.ModelHeader(version=result.version, accepted=result.accepted,
                                  status=result.status, incarnation=incarnation), values

    def Claim(self, request, context):
        if not self.store.initialized:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"parameter server {self.ps_index} is not initialized")
        try:
            with self.store.lock:
                self._refuse_if_paused(context)
                applied, fingerprint = self.store.claim(
                    (request.dataset, request.epoch, request.task_id), request.lease)
        except StaleLeaseError as e:
            return ps_pb2.ClaimResponse(ok=False, error=str(e))
        return ps_pb2.ClaimResponse(
            ok=True, applied=[x for r in applied for x in r],
            fingerprint_known=fingerprint is not None, fingerprint=fingerprint or 0)

    def Flush(self, request, context):
        self._refuse_if_paused(context)
        if not self.store.initialized:
            return ps_pb2.SaveResponse(json=json.dumps({"version": 0}))
        return ps_pb2.SaveResponse(json=json.dumps({"version": self.store.flush()}))

    def Pull(self, request, context):
        if not self.store.initialized:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"parameter server {self.ps_index} is not initialized")
        with self.store.lock:
            self._refuse_if_paused(context)
            version = self.store.version
            incarnation = self.store.incarnation
            values = self.store.values_since(
                self._since(request.since_version, request.incarnation),
                list(request.names) or None)
        yield from self._model_stream(ps_pb2.ModelHeader(
            version=version, accepted=True, status="applied", incarnation=incarnation),
            values)

    def Status(self, request, context):
        store = self.store
        return ps_pb2.SaveResponse(json=json.dumps({
            "ps_index": self.ps_index, "num_ps": self.num_ps,
            "initialized": store.initialized, "version": store.version,
            "variables": sorted(store.variables), "pushes": store.pushes,
            "dropped": store.dropped, "duplicates": store.duplicates,
            "refused": store.refused, "incarnation": store.incarnation,
            "restored_from": store.restored_from, "tasks_logged": len(store.log),
            "paused": self.paused,
        }))

    def Save(self, request, context):
        from keras_elastic.ps.checkpointing import save_shard

        try:
            return ps_pb2.SaveResponse(json=json.dumps(save_shard(
                self.store, self.ps_index, self.num_ps, json.loads(request.json))))
        except (ValueError, OSError) as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"parameter server {self.ps_index} could not save: {e}")

    def Restore(self, request, context):
        from keras_elastic.ps.checkpointing import restore_shard

        try:
            return ps_pb2.SaveResponse(json=json.dumps(restore_shard(
                self.store, self.ps_index, self.num_ps, json.loads(request.json))))
        except (ValueError, OSError) as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"parameter server {self.ps_index} could not restore: {e}")

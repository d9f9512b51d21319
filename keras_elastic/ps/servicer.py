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
from keras_elastic.ps.store import ParameterStore

ASSIGN_PREFIX = "="  # chunk names of non-trainable values in a push


class ParameterServerServicer(ps_pb2_grpc.ParameterServerServicer):
    def __init__(self, store: ParameterStore, ps_index: int = 0, num_ps: int = 1) -> None:
        self.store = store
        self.ps_index = ps_index
        self.num_ps = num_ps

    def _model_stream(self, header: ps_pb2.ModelHeader, values: dict):
        yield ps_pb2.ModelChunk(header=header)
        for chunk in encode_all(values.items()):
            yield ps_pb2.ModelChunk(chunk=chunk)

    def Init(self, request_iterator, context):
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
        except (ValueError, OSError) as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return ps_pb2.InitResponse(initialized_now=created, version=self.store.version)

    def Push(self, request_iterator, context):
        header, tensors = read_stream(request_iterator)
        accepted, version, values = self._push(header, tensors, context)
        yield from self._model_stream(
            ps_pb2.ModelHeader(version=version, accepted=accepted), values)

    def PushSmall(self, request, context):
        tensors = dict(decode_all(request.tensors))
        accepted, version, values = self._push(request.header, tensors, context)
        return ps_pb2.ModelBundle(
            header=ps_pb2.ModelHeader(version=version, accepted=accepted),
            tensors=list(encode_all(values.items(), chunk_bytes=1 << 62)))

    def _push(self, header, tensors, context):
        grads = {n: v for n, v in tensors.items() if not n.startswith(ASSIGN_PREFIX)}
        assigns = {n[len(ASSIGN_PREFIX):]: v for n, v in tensors.items()
                   if n.startswith(ASSIGN_PREFIX)}
        try:
            with self.store.lock:
                accepted, version = self.store.push(grads, assigns, header.base_version)
                values = self.store.values_since(header.base_version)
        except (KeyError, RuntimeError) as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"parameter server {self.ps_index}: {e}")
        return accepted, version, values

    def Pull(self, request, context):
        if not self.store.initialized:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"parameter server {self.ps_index} is not initialized")
        with self.store.lock:
            version = self.store.version
            values = self.store.values_since(request.since_version,
                                             list(request.names) or None)
        yield from self._model_stream(ps_pb2.ModelHeader(version=version,
                                                         accepted=True), values)

    def Status(self, request, context):
        store = self.store
        return ps_pb2.SaveResponse(json=json.dumps({
            "ps_index": self.ps_index, "num_ps": self.num_ps,
            "initialized": store.initialized, "version": store.version,
            "variables": sorted(store.variables), "pushes": store.pushes,
            "dropped": store.dropped,
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

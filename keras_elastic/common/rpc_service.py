"""Registers a gRPC service whose requests that do not parse get a clear error.

The generated `add_*Servicer_to_server` functions let gRPC parse requests
before the servicer runs: a malformed request is answered INTERNAL "Exception
deserializing request!", naming neither the method nor the problem. `add_service`
builds the handlers from the service's proto descriptor instead (unary or
streaming on each side, as the `.proto` declares), receives each request as raw
bytes and parses it inside the handler, so that a request that does not parse is
answered INVALID_ARGUMENT naming the service, the method, the message type and
the parser's error. On a streaming request every message is parsed as the
servicer reads it; the first bad one ends the call the same way. The servicer
itself sees parsed messages, exactly as with the generated code.

Example:

>>> from keras_elastic.common import rpc
>>> from keras_elastic.proto import ps_pb2
>>> from keras_elastic.ps.servicer import ParameterServerServicer
>>> from keras_elastic.ps.store import ParameterStore
>>> server = rpc.make_server()
>>> add_service(server, ParameterServerServicer(ParameterStore()),
...             ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"])
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf import descriptor, message, message_factory


def _parser(cls: type[message.Message], where: str,
            raw: Callable[[bytes], Any] | None = None
            ) -> Callable[[bytes, grpc.ServicerContext, str], message.Message]:
    """A function parsing one request of type `cls` (with `raw(data)`, if
    given, instead of protobuf), aborting the call with INVALID_ARGUMENT when
    it does not parse."""
    read = raw or cls.FromString

    def parse(data: bytes, context: grpc.ServicerContext,
              which: str = "the request") -> message.Message:
        try:
            return read(data)
        except (message.DecodeError, ValueError, TypeError) as e:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{where}: {which} ({len(data)} bytes) is not a valid "
                f"{cls.DESCRIPTOR.full_name}: {e or type(e).__name__}")
            raise  # not reached: abort raises

    return parse


def _parsed_stream(requests: Iterator[bytes], parse, context: grpc.ServicerContext
                   ) -> Iterator[message.Message]:
    """The messages of a request stream, each parsed as the servicer reads it."""
    for i, data in enumerate(requests):
        yield parse(data, context, f"message {i} of the request stream")


def _serializer(cls: type[message.Message]) -> Callable[[Any], bytes]:
    """Serializes a response message; `bytes` (a message the servicer
    serialized itself, e.g. `tensor_codec.chunk_frames`) go as they are."""
    serialize = cls.SerializeToString

    def serialized(response: Any) -> bytes:
        return response if isinstance(response, bytes) else serialize(response)

    return serialized


def method_handler(method: descriptor.MethodDescriptor, behavior: Callable,
                   raw: Callable[[bytes], Any] | None = None) -> grpc.RpcMethodHandler:
    """The handler of one method: `behavior(request(s), context)` gets parsed
    messages (parsed by `raw(data)` when given: e.g. a
    `tensor_codec.FrameParser`, whose chunks are views of the request's bytes
    rather than protobuf copies); requests that do not parse are answered
    INVALID_ARGUMENT. `behavior` may return (or yield) responses already
    serialized, as `bytes`.

    >>> from keras_elastic.proto import ps_pb2
    >>> status = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"] \\
    ...     .methods_by_name["Status"]
    >>> handler = method_handler(status, lambda request, context: request)
    >>> handler.request_streaming, handler.response_streaming
    (False, False)
    """
    request_cls = message_factory.GetMessageClass(method.input_type)
    response_cls = message_factory.GetMessageClass(method.output_type)
    parse = _parser(request_cls, f"{method.containing_service.full_name}/{method.name}",
                    raw)
    serialize = _serializer(response_cls)
    if method.client_streaming:
        def streaming(requests: Iterator[bytes], context: grpc.ServicerContext) -> Any:
            return behavior(_parsed_stream(requests, parse, context), context)

        make = (grpc.stream_stream_rpc_method_handler if method.server_streaming
                else grpc.stream_unary_rpc_method_handler)
        return make(streaming, request_deserializer=None, response_serializer=serialize)

    def unary(data: bytes, context: grpc.ServicerContext) -> Any:
        return behavior(parse(data, context), context)

    make = (grpc.unary_stream_rpc_method_handler if method.server_streaming
            else grpc.unary_unary_rpc_method_handler)
    return make(unary, request_deserializer=None, response_serializer=serialize)


def add_service(server: grpc.Server, servicer: object,
                service: descriptor.ServiceDescriptor) -> None:
    """Serves every method of `service` on `server` with the servicer's method
    of the same name (in place of the generated `add_*Servicer_to_server`);
    the servicer's `RAW_REQUESTS` ({method: parser of its request's bytes})
    replaces protobuf's parsing where given.

    >>> from keras_elastic.common import rpc
    >>> from keras_elastic.master.servicer import MasterServicer
    >>> from keras_elastic.proto import master_pb2
    >>> server = rpc.make_server()
    >>> add_service(server, MasterServicer(),
    ...             master_pb2.DESCRIPTOR.services_by_name["Master"])
    """
    raw = getattr(servicer, "RAW_REQUESTS", {})
    handlers = {m.name: method_handler(m, getattr(servicer, m.name), raw.get(m.name))
                for m in service.methods}
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),))
    if hasattr(server, "add_registered_method_handlers"):  # grpcio >= 1.63
        server.add_registered_method_handlers(service.full_name, handlers)

"""Tensors on the wire: raw bytes with dtype and shape, cut into chunks.

A tensor travels as one or more `TensorChunk` messages holding at most
`CHUNK_BYTES` of its buffer; small tensors share nothing and need one chunk.
`ChunkAssembler` puts chunks back together without extra copies beyond the one
into the destination array.

Chunks come from other processes, so every header is checked against its bytes
before anything is allocated or copied: a known dtype that can travel as raw
bytes, no negative dimension, `total_bytes` equal to the shape's size times the
item size, the chunk's bytes inside the tensor, the chunks of one tensor
agreeing and arriving in order, no tensor twice. A violation raises
`TensorError` naming the tensor (servers answer it INVALID_ARGUMENT).

Example:

>>> import numpy as np
>>> chunks = list(encode("w", np.arange(6, dtype="float32").reshape(2, 3)))
>>> dict(decode_all(chunks))["w"].shape
(2, 3)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from keras_elastic.proto import tensor_pb2

# gRPC's default message limit is 4 MiB; stay well under it.
CHUNK_BYTES = 2 << 20

# Message size limit set on every channel and server: chunks keep messages small,
# this only leaves room for headers.
MAX_MESSAGE_BYTES = 64 << 20


class TensorError(ValueError):
    """Tensor chunks that do not describe a valid tensor: a header that does not
    match its bytes or the tensor's earlier chunks, a missing or repeated chunk,
    a tensor sent twice, or a stream out of order."""


# `check(name, dtype, shape)`, called on the first chunk of each tensor before
# its buffer is allocated: raises to refuse the tensor.
TensorCheck = Callable[[str, np.dtype, tuple[int, ...]], None]


def check_header(chunk: tensor_pb2.TensorChunk) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape of `chunk`, after checking that its header
    describes its bytes; raises `TensorError` naming the tensor otherwise.

    >>> chunk, = encode("w", np.zeros((2, 3), "float32"))
    >>> check_header(chunk)
    (dtype('float32'), (2, 3))
    >>> chunk.shape[:] = [2, 4]
    >>> try:
    ...     check_header(chunk)
    ... except TensorError as e:
    ...     print(e)
    tensor 'w': total_bytes is 24, but float32 of shape [2, 4] is 32 bytes
    """
    name = chunk.name
    try:
        dtype = np.dtype(chunk.dtype)
    except (TypeError, ValueError, SyntaxError):
        raise TensorError(f"tensor '{name}': unknown dtype {chunk.dtype!r}") from None
    if dtype.hasobject or dtype.fields is not None or dtype.itemsize == 0:
        raise TensorError(f"tensor '{name}': dtype {chunk.dtype!r} cannot travel as "
                          "raw bytes")
    shape = tuple(chunk.shape)
    if any(d < 0 for d in shape):
        raise TensorError(f"tensor '{name}': negative dimension in shape {list(shape)}")
    size = math.prod(shape) * dtype.itemsize
    if chunk.total_bytes != size:
        raise TensorError(f"tensor '{name}': total_bytes is {chunk.total_bytes}, but "
                          f"{chunk.dtype} of shape {list(shape)} is {size} bytes")
    end = chunk.offset + len(chunk.content)
    if chunk.offset < 0 or end > chunk.total_bytes:
        raise TensorError(f"tensor '{name}': chunk bytes [{chunk.offset}, {end}) are "
                          f"outside the tensor's {chunk.total_bytes} bytes")
    return dtype, shape


def encode(name: str, array: np.ndarray,
           chunk_bytes: int = CHUNK_BYTES) -> Iterator[tensor_pb2.TensorChunk]:
    """Yields the chunks of one array."""
    array = np.asarray(array)
    if not array.flags.c_contiguous:  # (ascontiguousarray would make 0-d arrays 1-d)
        array = np.ascontiguousarray(array)
    if array.dtype == object:
        raise TypeError(f"tensor '{name}': object arrays cannot be sent; "
                        "convert strings to bytes tensors first")
    buf = memoryview(array).cast("B") if array.nbytes else b""
    total = array.nbytes
    shape = list(array.shape)
    dtype = array.dtype.str if array.dtype.kind == "S" else array.dtype.name
    if total <= chunk_bytes:
        yield tensor_pb2.TensorChunk(name=name, dtype=dtype, shape=shape, offset=0,
                                     total_bytes=total, content=bytes(buf))
        return
    for offset in range(0, total, chunk_bytes):
        yield tensor_pb2.TensorChunk(
            name=name, dtype=dtype, shape=shape, offset=offset, total_bytes=total,
            content=bytes(buf[offset:offset + chunk_bytes]))


def encode_all(named: Iterable[tuple[str, np.ndarray]],
               chunk_bytes: int = CHUNK_BYTES) -> Iterator[tensor_pb2.TensorChunk]:
    for name, array in named:
        yield from encode(name, array, chunk_bytes)


class ChunkAssembler:
    """Collects chunks into whole arrays, checking every header (see
    `check_header`); `check`, if given, is called on the first chunk of each
    tensor, before its buffer is allocated, and raises to refuse it.

    `add` returns `(name, array)` when a tensor is complete, else None.
    """

    def __init__(self, check: TensorCheck | None = None) -> None:
        # name -> (buffer, bytes received, first chunk's (dtype, shape, total))
        self._partial: dict[str, tuple[np.ndarray, int, tuple]] = {}
        self._done: set[str] = set()
        self._check = check

    def add(self, chunk: tensor_pb2.TensorChunk) -> tuple[str, np.ndarray] | None:
        dtype, shape = check_header(chunk)
        name = chunk.name
        if name in self._done:
            raise TensorError(f"tensor '{name}' was sent twice")
        if name not in self._partial:
            if chunk.offset != 0:
                raise TensorError(f"tensor '{name}': first chunk has offset "
                                  f"{chunk.offset}, expected 0")
            if self._check is not None:
                self._check(name, dtype, shape)
            if len(chunk.content) == chunk.total_bytes:
                self._done.add(name)
                return name, np.frombuffer(chunk.content, dtype=dtype).reshape(shape)
            try:
                buf = np.empty(chunk.total_bytes, np.uint8)
            except MemoryError:
                raise TensorError(f"tensor '{name}': cannot allocate its "
                                  f"{chunk.total_bytes} bytes") from None
            self._partial[name] = (buf, 0, (chunk.dtype, shape, chunk.total_bytes))
        buf, received, first = self._partial[name]
        if (chunk.dtype, shape, chunk.total_bytes) != first:
            raise TensorError(
                f"tensor '{name}': chunk at offset {chunk.offset} says "
                f"{chunk.dtype} of shape {list(shape)}, but its first chunk said "
                f"{first[0]} of shape {list(first[1])}")
        if chunk.offset != received:
            raise TensorError(f"tensor '{name}': chunk at offset {chunk.offset}, "
                              f"expected {received}")
        end = chunk.offset + len(chunk.content)
        buf[chunk.offset:end] = np.frombuffer(chunk.content, np.uint8)
        if end < chunk.total_bytes:
            self._partial[name] = (buf, end, first)
            return None
        del self._partial[name]
        self._done.add(name)
        return name, buf.view(dtype).reshape(shape)

    def check_complete(self) -> None:
        if self._partial:
            names = ", ".join(sorted(self._partial))
            raise TensorError(f"stream ended with incomplete tensors: {names}")


def decode_all(chunks: Iterable[tensor_pb2.TensorChunk],
               check: TensorCheck | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """Yields `(name, array)` for every complete tensor in `chunks`; raises
    `TensorError` on a malformed chunk (see `ChunkAssembler` for `check`)."""
    assembler = ChunkAssembler(check)
    for chunk in chunks:
        done = assembler.add(chunk)
        if done is not None:
            yield done
    assembler.check_complete()


def read_stream(messages, check: Callable[[Any, str, np.dtype, tuple[int, ...]], None]
                | None = None) -> tuple[Any, dict[str, np.ndarray]]:
    """Splits a stream of `{header | chunk}` messages (the services' stream
    types) into its header and its complete tensors.

    `check(header, name, dtype, shape)`, if given, is called on the first chunk
    of each tensor with the header read so far (None if none yet) and raises to
    refuse it. Raises `TensorError` on a malformed stream: a second header, a
    message with neither part, or a malformed chunk.

    >>> from keras_elastic.proto import ps_pb2
    >>> messages = [ps_pb2.PushRequest(header=ps_pb2.PushHeader(worker_id=3))] + [
    ...     ps_pb2.PushRequest(chunk=c) for c in encode("w", np.ones(2, "float32"))]
    >>> header, tensors = read_stream(messages)
    >>> header.worker_id, tensors["w"].tolist()
    (3, [1.0, 1.0])
    """
    header = None
    tensors: dict[str, np.ndarray] = {}
    assembler = ChunkAssembler(
        None if check is None else lambda *tensor: check(header, *tensor))
    for i, message in enumerate(messages):
        if message.HasField("header"):
            if header is not None:
                raise TensorError(f"message {i} of the stream is a second header")
            header = message.header
        elif message.HasField("chunk"):
            done = assembler.add(message.chunk)
            if done is not None:
                tensors[done[0]] = done[1]
        else:
            raise TensorError(f"message {i} of the stream has neither a header nor "
                              "a chunk")
    assembler.check_complete()
    return header, tensors

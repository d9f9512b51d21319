"""Tensors on the wire: raw bytes with dtype and shape, cut into chunks.

A tensor travels as one or more `TensorChunk` messages holding at most
`CHUNK_BYTES` of its buffer; small tensors share nothing and need one chunk.
`ChunkAssembler` puts chunks back together without extra copies beyond the one
into the destination array.

Example:

>>> import numpy as np
>>> chunks = list(encode("w", np.arange(6, dtype="float32").reshape(2, 3)))
>>> dict(decode_all(chunks))["w"].shape
(2, 3)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from keras_elastic.proto import tensor_pb2

# gRPC's default message limit is 4 MiB; stay well under it.
CHUNK_BYTES = 2 << 20

# Message size limit set on every channel and server: chunks keep messages small,
# this only leaves room for headers.
MAX_MESSAGE_BYTES = 64 << 20


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
    """Collects chunks into whole arrays.

    `add` returns `(name, array)` when a tensor is complete, else None.
    """

    def __init__(self) -> None:
        self._partial: dict[str, tuple[np.ndarray, int]] = {}

    def add(self, chunk: tensor_pb2.TensorChunk) -> tuple[str, np.ndarray] | None:
        dtype = np.dtype(chunk.dtype)
        shape = tuple(chunk.shape)
        if chunk.offset == 0 and len(chunk.content) == chunk.total_bytes:
            array = np.frombuffer(chunk.content, dtype=dtype).reshape(shape)
            return chunk.name, array
        if chunk.name not in self._partial:
            if chunk.offset != 0:
                raise ValueError(f"tensor '{chunk.name}': first chunk has offset "
                                 f"{chunk.offset}, expected 0")
            self._partial[chunk.name] = (np.empty(chunk.total_bytes, np.uint8), 0)
        buf, received = self._partial[chunk.name]
        if chunk.offset != received:
            raise ValueError(f"tensor '{chunk.name}': chunk at offset {chunk.offset}, "
                             f"expected {received}")
        end = chunk.offset + len(chunk.content)
        buf[chunk.offset:end] = np.frombuffer(chunk.content, np.uint8)
        if end < chunk.total_bytes:
            self._partial[chunk.name] = (buf, end)
            return None
        del self._partial[chunk.name]
        return chunk.name, buf.view(dtype).reshape(shape)

    def check_complete(self) -> None:
        if self._partial:
            names = ", ".join(sorted(self._partial))
            raise ValueError(f"stream ended with incomplete tensors: {names}")


def decode_all(chunks: Iterable[tensor_pb2.TensorChunk]) -> Iterator[
        tuple[str, np.ndarray]]:
    """Yields `(name, array)` for every complete tensor in `chunks`."""
    assembler = ChunkAssembler()
    for chunk in chunks:
        done = assembler.add(chunk)
        if done is not None:
            yield done
    assembler.check_complete()


def read_stream(messages) -> tuple[Any, dict[str, np.ndarray]]:
    """Splits a stream of `{header | chunk}` messages (the services' stream
    types) into its header and its complete tensors."""
    header = None
    tensors: dict[str, np.ndarray] = {}
    assembler = ChunkAssembler()
    for message in messages:
        if message.HasField("header"):
            header = message.header
        else:
            done = assembler.add(message.chunk)
            if done is not None:
                tensors[done[0]] = done[1]
    assembler.check_complete()
    return header, tensors

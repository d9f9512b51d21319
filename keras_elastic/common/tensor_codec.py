"""Tensors on the wire: raw bytes with dtype and shape, cut into chunks.

A tensor travels as one or more `TensorChunk` messages holding at most
`CHUNK_BYTES` of its buffer; small tensors share nothing and need one chunk.
`ChunkAssembler` puts chunks back together without extra copies beyond the one
into the destination array (a tensor of one chunk is not copied at all).

Large transfers skip protobuf's message objects on the side that can
(`chunk_frames`, `FrameParser`): the same wire bytes, built with one copy of
the array's buffer and read without copying the chunks' contents out of the
received message (protobuf's Python objects cost three copies each way:
the bytes field, the wrapping message, the serialization).

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

import functools
import math
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from keras_elastic.common import errors
from keras_elastic.proto import tensor_pb2

# gRPC's default message limit is 4 MiB; stay well under it.
CHUNK_BYTES = 2 << 20

# Message size limit set on every channel and server: chunks keep messages small,
# this only leaves room for headers.
MAX_MESSAGE_BYTES = 64 << 20


class TensorError(errors.DataError, ValueError):
    """Tensor chunks that do not describe a valid tensor: a header that does not
    match its bytes or the tensor's earlier chunks, a missing or repeated chunk,
    a tensor sent twice, or a stream out of order."""


# `check(name, dtype, shape)`, called on the first chunk of each tensor before
# its buffer is allocated: raises to refuse the tensor.
TensorCheck = Callable[[str, np.dtype, tuple[int, ...]], None]


def check_header(chunk: tensor_pb2.TensorChunk, content=None
                 ) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape of `chunk`, after checking that its header
    describes its bytes (`content`: `chunk.content`, if read already: each
    read of a protobuf bytes field copies it); raises `TensorError` naming the
    tensor otherwise.

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
    spec = _spec(chunk.dtype, tuple(chunk.shape), chunk.total_bytes)
    if isinstance(spec, str):
        raise TensorError(f"tensor '{name}': {spec}")
    dtype, shape = spec
    end = chunk.offset + len(chunk.content if content is None else content)
    if chunk.offset < 0 or end > chunk.total_bytes:
        raise TensorError(f"tensor '{name}': chunk bytes [{chunk.offset}, {end}) are "
                          f"outside the tensor's {chunk.total_bytes} bytes")
    return dtype, shape


@functools.lru_cache(maxsize=1 << 12)
def _spec(dtype_text: str, shape: tuple[int, ...], total: int
          ) -> tuple[np.dtype, tuple[int, ...]] | str:
    """A chunk's (dtype, shape), or what is wrong with them (`check_header`);
    remembered: every push of a variable has the same."""
    try:
        dtype = np.dtype(dtype_text)
    except (TypeError, ValueError, SyntaxError):
        return f"unknown dtype {dtype_text!r}"
    if dtype.hasobject or dtype.fields is not None or dtype.itemsize == 0:
        return f"dtype {dtype_text!r} cannot travel as raw bytes"
    if any(d < 0 for d in shape):
        return f"negative dimension in shape {list(shape)}"
    size = math.prod(shape) * dtype.itemsize
    if total != size:
        return (f"total_bytes is {total}, but {dtype_text} of shape {list(shape)} "
                f"is {size} bytes")
    return dtype, shape


def _as_buffer(name: str, array) -> tuple[np.ndarray, memoryview | bytes, str]:
    array = np.asarray(array)
    if not array.flags.c_contiguous:  # (ascontiguousarray would make 0-d arrays 1-d)
        array = np.ascontiguousarray(array)
    if array.dtype == object:
        raise TypeError(f"tensor '{name}': object arrays cannot be sent; "
                        "convert strings to bytes tensors first")
    buf = memoryview(array).cast("B") if array.nbytes else b""
    return array, buf, dtype_name(array.dtype)


@functools.lru_cache(maxsize=256)
def dtype_name(dtype: np.dtype) -> str:
    """The name a chunk gives `dtype` ("float32"; "|S5" for fixed-size bytes),
    remembered: NumPy builds `dtype.name` anew at each read (~3 us, as long
    as the rest of a small tensor's encoding).

    >>> dtype_name(np.dtype("float32")), dtype_name(np.dtype("S5"))
    ('float32', '|S5')
    """
    return dtype.str if dtype.kind == "S" else dtype.name


def chunk_fields(name: str, array: np.ndarray, chunk_bytes: int = CHUNK_BYTES
                 ) -> Iterator[dict[str, Any]]:
    """The fields of each `TensorChunk` of one array, as keyword arguments
    (to build a message that holds the chunk in place, e.g.
    `ModelChunk(chunk=fields)`, without copying a `TensorChunk` into it)."""
    array, buf, dtype = _as_buffer(name, array)
    total = array.nbytes
    shape = list(array.shape)
    if total <= chunk_bytes:
        yield {"name": name, "dtype": dtype, "shape": shape, "offset": 0,
               "total_bytes": total, "content": bytes(buf)}
        return
    for offset in range(0, total, chunk_bytes):
        yield {"name": name, "dtype": dtype, "shape": shape, "offset": offset,
               "total_bytes": total, "content": bytes(buf[offset:offset + chunk_bytes])}


def encode(name: str, array: np.ndarray,
           chunk_bytes: int = CHUNK_BYTES) -> Iterator[tensor_pb2.TensorChunk]:
    """Yields the chunks of one array."""
    for fields in chunk_fields(name, array, chunk_bytes):
        yield tensor_pb2.TensorChunk(**fields)


# -- the wire format by hand ---------------------------------------------------
# A TensorChunk's bytes field `content` is its last field (6), so its encoding
# is the other fields' (protobuf's own serialization) followed by the content.
_LENGTH_DELIMITED = 2
_CONTENT_KEY = b"\x32"  # field 6, length-delimited


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def chunk_frames(field: int, name: str, array: np.ndarray,
                 chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The serialized messages `{field: TensorChunk}` (e.g. a `PushRequest`
    holding a chunk, field 2) of one array: byte for byte what protobuf
    serializes for `PushRequest(chunk=c)` for each `c` of `encode(name,
    array, chunk_bytes)`, built with one copy of the array's buffer.

    >>> from keras_elastic.proto import ps_pb2
    >>> a = np.arange(6, dtype="float32")
    >>> list(chunk_frames(2, "w", a, 8)) == [
    ...     ps_pb2.PushRequest(chunk=c).SerializeToString() for c in encode("w", a, 8)]
    True
    """
    for pieces in _chunk_pieces(field, name, array, chunk_bytes):
        yield b"".join(pieces)


def _chunk_pieces(field: int, name: str, array: np.ndarray, chunk_bytes: int
                  ) -> Iterator[tuple]:
    """The pieces of each frame of `chunk_frames` (the array's bytes as
    views), to be joined with one copy."""
    array, buf, dtype = _as_buffer(name, array)
    total = array.nbytes
    shape = tuple(array.shape)
    if total <= chunk_bytes:  # one chunk: everything but the bytes is cached
        yield (_frame_prefix(field, name, dtype, shape, total), buf)
        return
    key = _varint(field << 3 | _LENGTH_DELIMITED)
    for offset in range(0, total, chunk_bytes):
        piece = buf[offset:offset + chunk_bytes]
        head = tensor_pb2.TensorChunk(name=name, dtype=dtype, shape=shape, offset=offset,
                                      total_bytes=total).SerializeToString()
        content = (_CONTENT_KEY, _varint(len(piece)), piece)
        size = len(head) + sum(len(p) for p in content)
        yield (key, _varint(size), head, *content)


@functools.lru_cache(maxsize=1 << 14)
def _frame_prefix(field: int, name: str, dtype: str, shape: tuple[int, ...],
                  total: int) -> bytes:
    """What precedes a whole tensor's bytes in its frame `{field: TensorChunk}`:
    the field's key and size, the chunk's fields, the content's key and size.
    The same for every push of a variable, so built once (a protobuf message
    built and serialized per tensor cost ~4 us, most of a small tensor's
    encoding)."""
    head = tensor_pb2.TensorChunk(name=name, dtype=dtype, shape=shape,
                                  total_bytes=total).SerializeToString()
    content = _CONTENT_KEY + _varint(total) if total else b""
    return (_varint(field << 3 | _LENGTH_DELIMITED)
            + _varint(len(head) + len(content) + total) + head + content)


def bundle_bytes(header, named: Iterable[tuple[str, np.ndarray]]) -> bytes:
    """A serialized bundle message (`{Header header = 1; repeated TensorChunk
    tensors = 2}`: `PushBundle`, `ModelBundle`) of `header` and one chunk per
    array: byte for byte what protobuf serializes for `Bundle(header=header,
    tensors=encode_all(named, 1 << 62))`, built with one copy of the arrays'
    bytes.

    >>> from keras_elastic.proto import ps_pb2
    >>> h, a = ps_pb2.ModelHeader(version=3), np.arange(4, dtype="float32")
    >>> bundle_bytes(h, [("w", a)]) == ps_pb2.ModelBundle(
    ...     header=h, tensors=list(encode_all([("w", a)], 1 << 62))).SerializeToString()
    True
    """
    head = header.SerializeToString()
    return b"".join([_varint(1 << 3 | _LENGTH_DELIMITED), _varint(len(head)), head,
                     *_whole_chunk_pieces(2, named)])


def _whole_chunk_pieces(field: int, named: Iterable[tuple[str, np.ndarray]]
                        ) -> Iterator:
    """The pieces of one chunk per array in field `field` (`_chunk_pieces`),
    to be joined with one copy."""
    for name, array in named:
        for frame in _chunk_pieces(field, name, array, 1 << 62):
            yield from frame


def tensors_bytes(field: int, named: Iterable[tuple[str, np.ndarray]],
                  varints: dict[int, int] | None = None) -> bytes:
    """A serialized message holding one chunk per array in its repeated
    `TensorChunk` field number `field` (e.g. `LookupResponse.rows`), and the
    non-negative varint fields `varints` ({number: value}, e.g.
    `LookupRequest.no_create`; zeros left out, as protobuf does): byte for
    byte protobuf's serialization, built with one copy of the arrays' bytes.
    `TensorMessageParser` reads it back without copying them.

    >>> from keras_elastic.proto import ps_pb2
    >>> a = np.arange(3, dtype="int64")
    >>> tensors_bytes(1, [("t", a)], {2: 1}) == ps_pb2.LookupRequest(
    ...     ids=list(encode_all([("t", a)], 1 << 62)), no_create=True).SerializeToString()
    True
    """
    pieces = list(_whole_chunk_pieces(field, named))
    for number, value in sorted((varints or {}).items()):
        if value < 0:
            raise ValueError(f"field {number}: only non-negative varints, got {value}")
        if value:
            pieces += [_varint(number << 3), _varint(value)]
    return b"".join(pieces)


def chunk_frames_all(field: int, named: Iterable[tuple[str, np.ndarray]],
                     chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    for name, array in named:
        yield from chunk_frames(field, name, array, chunk_bytes)


class RawChunk:
    """A `TensorChunk` read by `FrameParser`: the same attributes, `content` a
    memoryview of the received message (no copy)."""

    __slots__ = ("name", "dtype", "shape", "offset", "total_bytes", "content")

    def __init__(self) -> None:
        self.name = self.dtype = ""
        self.shape: list[int] = []
        self.offset = self.total_bytes = 0
        self.content: memoryview | bytes = b""


class Frame:
    """One message of a `{header | chunk}` stream, read by `FrameParser`:
    `HasField`, `header` and `chunk` as on the protobuf message."""

    __slots__ = ("header", "chunk")

    def __init__(self, header=None, chunk: RawChunk | None = None) -> None:
        self.header = header
        self.chunk = chunk

    def HasField(self, name: str) -> bool:  # noqa: N802 (protobuf's name)
        return getattr(self, name) is not None


def _read_varint(data: memoryview, i: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= end or shift > 63:
            raise TensorError("malformed message: a varint runs past its field")
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _fields(data: memoryview, start: int, end: int
            ) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of each field of a message's bytes:
    an int for varints and fixed-size fields, a memoryview for
    length-delimited ones."""
    i = start
    while i < end:
        key, i = _read_varint(data, i, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(data, i, end)
        elif wire == _LENGTH_DELIMITED:
            size, i = _read_varint(data, i, end)
            if i + size > end:
                raise TensorError("malformed message: a field runs past its end")
            value, i = data[i:i + size], i + size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if i + width > end:
                raise TensorError("malformed message: a field runs past its end")
            value, i = int.from_bytes(data[i:i + width], "little"), i + width
        else:
            raise TensorError(f"malformed message: wire type {wire}")
        if number == 0:
            raise TensorError("malformed message: field number 0")
        yield number, wire, value


def _text(value, what: str) -> str:
    if not isinstance(value, memoryview):
        raise TensorError(f"malformed message: {what} is not length-delimited")
    try:
        return str(value, "utf-8")
    except UnicodeDecodeError:
        raise TensorError(f"malformed message: {what} is not UTF-8") from None


def parse_chunk(data: memoryview) -> RawChunk:
    """A serialized `TensorChunk` as a `RawChunk` whose content is a view of
    `data`.

    A variable's chunk has the same bytes every push but its content's, so a
    whole chunk's fields between its name and its content are remembered by
    name once read field by field (`_parse_chunk_fields`, 3-4 us a tensor in
    Python): a chunk whose bytes there are those, and whose content fills the
    rest, reads as they did (what the field-by-field reading would give).

    >>> data = memoryview(next(encode("w", np.ones(2, "float32"))).SerializeToString())
    >>> first, again = parse_chunk(data), parse_chunk(data)
    >>> (again.name, again.dtype, again.shape, again.total_bytes,
    ...  np.frombuffer(again.content, "float32").tolist())
    ('w', 'float32', [2], 8, [1.0, 1.0])
    """
    if len(data) > 2 and data[0] == _NAME_KEY and data[1] < 0x80:
        start = 2 + data[1]
        known = _KNOWN_CHUNKS.get(bytes(data[2:start]))
        if known is not None:
            middle, name, dtype, shape, total = known
            content = start + len(middle)
            if len(data) == content + total and data[start:content] == middle:
                chunk = RawChunk()
                chunk.name, chunk.dtype, chunk.shape = name, dtype, list(shape)
                chunk.total_bytes, chunk.content = total, data[content:]
                return chunk
    chunk = _parse_chunk_fields(data)
    _remember_chunk(data, chunk)
    return chunk


_NAME_KEY = 0x0A  # field 1 (name), length-delimited
# name's UTF-8 -> (the bytes between the name and the content, name, dtype,
# shape, total_bytes) of a whole chunk read field by field (`parse_chunk`).
_KNOWN_CHUNKS: dict[bytes, tuple[bytes, str, str, tuple[int, ...], int]] = {}
_KNOWN_CHUNKS_MAX = 1 << 14


def _remember_chunk(data: memoryview, chunk: RawChunk) -> None:
    """Remembers a whole chunk's bytes between its name and its content, when
    the name is its first field (one byte of length) and the content its
    last, filling the message to its end."""
    total = chunk.total_bytes
    if (chunk.offset or len(chunk.content) != total or total < 1
            or len(data) < 2 or data[0] != _NAME_KEY or data[1] >= 0x80):
        return
    start, content = 2 + data[1], len(data) - total
    if start > content or not (isinstance(chunk.content, memoryview)
                               and _same_view(chunk.content, data, content)):
        return
    if len(_KNOWN_CHUNKS) >= _KNOWN_CHUNKS_MAX:
        _KNOWN_CHUNKS.clear()
    _KNOWN_CHUNKS[bytes(data[2:start])] = (bytes(data[start:content]), chunk.name,
                                           chunk.dtype, tuple(chunk.shape), total)


def _same_view(view: memoryview, data: memoryview, offset: int) -> bool:
    """Whether `view` is `data[offset:]`, the same memory."""
    return (np.frombuffer(view, np.uint8).ctypes.data
            == np.frombuffer(data, np.uint8).ctypes.data + offset)


def _parse_chunk_fields(data: memoryview) -> RawChunk:
    """`parse_chunk`, field by field."""
    chunk = RawChunk()
    for number, wire, value in _fields(data, 0, len(data)):
        if number == 1:
            chunk.name = _text(value, "a chunk's name")
        elif number == 2:
            chunk.dtype = _text(value, "a chunk's dtype")
        elif number == 3:  # repeated int64: packed, or one per field
            if wire == _LENGTH_DELIMITED:
                i, end = 0, len(value)
                while i < end:
                    d, i = _read_varint(value, i, end)
                    chunk.shape.append(_int64(d))
            else:
                chunk.shape.append(_int64(value))
        elif number in (4, 5):
            if wire != 0:
                raise TensorError("malformed message: a chunk's offset or size is "
                                  "not a varint")
            setattr(chunk, "offset" if number == 4 else "total_bytes", _int64(value))
        elif number == 6:
            if not isinstance(value, memoryview):
                raise TensorError("malformed message: a chunk's content is not "
                                  "length-delimited")
            chunk.content = value
    return chunk


class FrameParser:
    """Reads the serialized messages of a `{header | chunk}` stream type
    (`oneof {Header header = 1; TensorChunk chunk = 2}`, e.g. `ModelChunk`)
    as `Frame`s, the chunk's content a view of the message: a gRPC response
    deserializer. `header_type` parses the header (a protobuf class).

    >>> from keras_elastic.proto import ps_pb2
    >>> data = ps_pb2.ModelChunk(chunk=next(encode("w", np.ones(2, "float32"))))
    >>> frame = FrameParser(ps_pb2.ModelHeader)(data.SerializeToString())
    >>> frame.HasField("chunk"), frame.chunk.name, frame.chunk.shape
    (True, 'w', [2])
    """

    def __init__(self, header_type) -> None:
        self._header_type = header_type

    def __call__(self, data: bytes) -> Frame:
        view = memoryview(data)
        frame = Frame()
        for number, _, value in _fields(view, 0, len(view)):
            if number == 1:
                if not isinstance(value, memoryview):
                    raise TensorError("malformed message: the header is not "
                                      "length-delimited")
                frame.header, frame.chunk = self._header_type.FromString(value), None
            elif number == 2:
                if not isinstance(value, memoryview):
                    raise TensorError("malformed message: a chunk is not "
                                      "length-delimited")
                frame.chunk, frame.header = parse_chunk(value), None
        return frame


class Bundle:
    """A bundle message read by `BundleParser`: `header` and `tensors` (the
    chunks, each a `RawChunk` whose content is a view of the message);
    `byte_size`, the message's size."""

    __slots__ = ("header", "tensors", "byte_size")

    def __init__(self, header, tensors: list[RawChunk], byte_size: int = 0) -> None:
        self.header = header
        self.tensors = tensors
        self.byte_size = byte_size


class BundleParser:
    """Reads a serialized bundle message (`PushBundle`, `ModelBundle`: see
    `bundle_bytes`) as a `Bundle` without copying the tensors' bytes: a
    gRPC deserializer. `header_type` parses the header (a protobuf class).

    >>> from keras_elastic.proto import ps_pb2
    >>> data = bundle_bytes(ps_pb2.ModelHeader(version=3), [("w", np.ones(2, "f4"))])
    >>> bundle = BundleParser(ps_pb2.ModelHeader)(data)
    >>> bundle.header.version, [(n, a.tolist()) for n, a in decode_all(bundle.tensors)]
    (3, [('w', [1.0, 1.0])])
    """

    def __init__(self, header_type) -> None:
        self._header_type = header_type

    def __call__(self, data: bytes) -> Bundle:
        view = memoryview(data)
        header, tensors = self._header_type(), []
        for number, _, value in _fields(view, 0, len(view)):
            if number in (1, 2) and not isinstance(value, memoryview):
                raise TensorError(f"malformed message: field {number} is not "
                                  "length-delimited")
            if number == 1:
                header = self._header_type.FromString(value)
            elif number == 2:
                tensors.append(parse_chunk(value))
        return Bundle(header, tensors, len(data))


class TensorMessageParser:
    """Reads a serialized message whose fields are repeated `TensorChunk`s
    and varints (bool and integer fields: e.g. `LookupRequest`,
    `LookupResponse`) as an object with the same attribute names: the chunks
    as `RawChunk`s whose content is a view of the message (no copy), the
    varints as Python values; `byte_size` is the message's size. A gRPC
    deserializer (see `tensors_bytes`). Unknown fields are skipped, as
    protobuf skips them.

    >>> from keras_elastic.proto import ps_pb2
    >>> data = tensors_bytes(1, [("t", np.arange(3))], {2: 1})
    >>> request = TensorMessageParser(ps_pb2.LookupRequest)(data)
    >>> request.no_create, [(n, a.tolist()) for n, a in decode_all(request.ids)]
    (True, [('t', [0, 1, 2])])
    """

    def __init__(self, message_type) -> None:
        self._chunks: dict[int, str] = {}
        self._varints: dict[int, tuple[str, str]] = {}  # number -> (name, kind)
        chunk_type = tensor_pb2.TensorChunk.DESCRIPTOR.full_name
        for f in message_type.DESCRIPTOR.fields:
            if f.message_type is not None and f.message_type.full_name == chunk_type:
                self._chunks[f.number] = f.name
                continue
            kind = {f.TYPE_BOOL: "bool", f.TYPE_INT32: "signed", f.TYPE_INT64: "signed",
                    f.TYPE_ENUM: "signed", f.TYPE_UINT32: "unsigned",
                    f.TYPE_UINT64: "unsigned"}.get(f.type)
            repeated = f.is_repeated if hasattr(f, "is_repeated") else (
                f.label == f.LABEL_REPEATED)
            if kind is None or repeated:
                raise TypeError(f"{message_type.DESCRIPTOR.full_name}.{f.name}: "
                                "TensorMessageParser reads only TensorChunk and "
                                "single varint fields")
            self._varints[f.number] = (f.name, kind)

    def __call__(self, data: bytes) -> types.SimpleNamespace:
        message = types.SimpleNamespace(byte_size=len(data))
        for name in self._chunks.values():
            setattr(message, name, [])
        for name, kind in self._varints.values():
            setattr(message, name, False if kind == "bool" else 0)
        view = memoryview(data)
        for number, wire, value in _fields(view, 0, len(view)):
            if number in self._chunks:
                if not isinstance(value, memoryview):
                    raise TensorError(f"malformed message: field {number} is not "
                                      "length-delimited")
                getattr(message, self._chunks[number]).append(parse_chunk(value))
            elif number in self._varints:
                if wire != 0:
                    raise TensorError(f"malformed message: field {number} is not "
                                      "a varint")
                name, kind = self._varints[number]
                setattr(message, name, bool(value) if kind == "bool" else
                        _int64(value) if kind == "signed" else value)
        return message


def encode_all(named: Iterable[tuple[str, np.ndarray]],
               chunk_bytes: int = CHUNK_BYTES) -> Iterator[tensor_pb2.TensorChunk]:
    for name, array in named:
        yield from encode(name, array, chunk_bytes)


def empty_aligned(nbytes: int, alignment: int = 64) -> np.ndarray:
    """An uninitialized uint8 buffer starting at a multiple of `alignment`
    (what TensorFlow needs to use it without a copy, see `ps/store.py`)."""
    raw = np.empty(nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start:start + nbytes]


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
        content = chunk.content  # (read once: each read of a protobuf field copies)
        dtype, shape = check_header(chunk, content)
        name = chunk.name
        if name in self._done:
            raise TensorError(f"tensor '{name}' was sent twice")
        if name not in self._partial:
            if chunk.offset != 0:
                raise TensorError(f"tensor '{name}': first chunk has offset "
                                  f"{chunk.offset}, expected 0")
            if self._check is not None:
                self._check(name, dtype, shape)
            if len(content) == chunk.total_bytes:
                self._done.add(name)
                return name, np.frombuffer(content, dtype=dtype).reshape(shape)
            try:
                buf = empty_aligned(chunk.total_bytes)
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
        end = chunk.offset + len(content)
        buf[chunk.offset:end] = np.frombuffer(content, np.uint8)
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

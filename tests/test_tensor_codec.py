"""Tensors on the wire: chunking and reassembly."""

import numpy as np
import pytest

from keras_elastic.common.tensor_codec import ChunkAssembler, decode_all, encode, encode_all


def test_small_tensor_is_one_chunk():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    chunks = list(encode("w", a))
    assert len(chunks) == 1
    (name, b), = decode_all(chunks)
    assert name == "w" and b.dtype == np.float32 and np.array_equal(a, b)


def test_large_tensor_is_chunked_and_reassembled():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(1000, 700)).astype(np.float32)  # 2.8 MB
    b = rng.integers(0, 100, size=(5,), dtype=np.int64)
    chunks = list(encode_all([("a", a), ("b", b)], chunk_bytes=1 << 20))
    assert len(chunks) == 4
    assert max(len(c.content) for c in chunks) <= 1 << 20
    out = dict(decode_all(chunks))
    assert np.array_equal(out["a"], a) and np.array_equal(out["b"], b)


def test_scalar_and_empty_tensors():
    out = dict(decode_all(encode_all([("s", np.float64(3.5)),
                                      ("e", np.zeros((0, 3), np.int32))])))
    assert out["s"].shape == () and out["s"] == 3.5
    assert out["e"].shape == (0, 3)


def test_missing_chunk_is_detected():
    a = np.zeros(1000, np.float32)
    chunks = list(encode("a", a, chunk_bytes=1000))
    assembler = ChunkAssembler()
    assembler.add(chunks[0])
    with pytest.raises(ValueError, match="tensor 'a': chunk at offset 2000, expected 1000"):
        assembler.add(chunks[2])
    with pytest.raises(ValueError, match="incomplete tensors: a"):
        list(decode_all(chunks[:2]))


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4), np.float64(3.5),
    np.zeros((0, 3), np.int32), np.array([b"ab", b"c"]),
    np.arange(3000, dtype=np.int64)[::2],  # not contiguous
    np.random.default_rng(0).normal(size=(300, 7)),  # several chunks
])
def test_hand_built_frames_are_protobufs_bytes_and_read_back(array):
    """The client's wire format (chunk_frames / FrameParser) is protobuf's."""
    from keras_elastic.common.tensor_codec import FrameParser, chunk_frames, read_stream
    from keras_elastic.proto import ps_pb2

    frames = list(chunk_frames(2, "w", array, chunk_bytes=4096))
    assert frames == [ps_pb2.PushRequest(chunk=c).SerializeToString()
                      for c in encode("w", array, chunk_bytes=4096)]
    header = ps_pb2.ModelChunk(header=ps_pb2.ModelHeader(version=7)).SerializeToString()
    parse = FrameParser(ps_pb2.ModelHeader)
    got_header, tensors = read_stream([parse(header)] + [parse(f) for f in frames])
    assert got_header.version == 7
    assert tensors["w"].dtype == np.asarray(array).dtype
    np.testing.assert_array_equal(tensors["w"], array)


def test_frame_parser_refuses_malformed_messages():
    from keras_elastic.common.tensor_codec import FrameParser, TensorError
    from keras_elastic.proto import ps_pb2

    parse = FrameParser(ps_pb2.ModelHeader)
    good = ps_pb2.ModelChunk(chunk=next(encode("w", np.ones(4, np.float32))))
    data = good.SerializeToString()
    for bad in (data[:-3], b"\x12\xff", b"\x13", b"\x00\x01"):
        with pytest.raises(TensorError, match="malformed message"):
            parse(bad)
    # Fields it does not know are skipped, as protobuf does.
    unknown = b"\x38\x05" + data  # field 7, a varint
    assert bytes(parse(unknown).chunk.content) == good.chunk.content


@pytest.mark.parametrize("no_create", [False, True])
def test_tensor_messages_are_protobufs_bytes_and_read_back(no_create):
    """Lookup's wire format (tensors_bytes / TensorMessageParser) is protobuf's,
    both ways; the parsed chunks are views of the message."""
    from keras_elastic.common.tensor_codec import TensorMessageParser, tensors_bytes
    from keras_elastic.proto import ps_pb2

    named = [("a", np.arange(5, dtype=np.int64)), ("b", np.arange(3, dtype=np.int64) * 7)]
    data = tensors_bytes(1, named, {2: int(no_create)})
    assert data == ps_pb2.LookupRequest(ids=list(encode_all(named, 1 << 62)),
                                        no_create=no_create).SerializeToString()
    request = TensorMessageParser(ps_pb2.LookupRequest)(data)
    assert request.no_create is no_create and request.byte_size == len(data)
    got = dict(decode_all(request.ids))
    assert {n: a.tolist() for n, a in got.items()} == {n: a.tolist() for n, a in named}
    assert isinstance(request.ids[0].content, memoryview)
    # A reply built by protobuf reads the same.
    rows = np.ones((5, 2), np.float32)
    reply = ps_pb2.LookupResponse(rows=list(encode("a", rows))).SerializeToString()
    assert reply == tensors_bytes(1, [("a", rows)])
    np.testing.assert_array_equal(
        dict(decode_all(TensorMessageParser(ps_pb2.LookupResponse)(reply).rows))["a"], rows)


def test_tensor_message_parser_refuses_malformed_messages_and_other_types():
    from keras_elastic.common.tensor_codec import (
        TensorError,
        TensorMessageParser,
        tensors_bytes,
    )
    from keras_elastic.proto import ps_pb2

    parse = TensorMessageParser(ps_pb2.LookupRequest)
    data = tensors_bytes(1, [("a", np.arange(4))], {2: 1})
    with pytest.raises(TensorError, match="malformed message: field 1 is not "
                                          "length-delimited"):
        parse(b"\x08\x01")  # field 1 as a varint
    with pytest.raises(TensorError, match="malformed message: field 2 is not a varint"):
        parse(data[:-2] + b"\x12\x00")  # field 2 as bytes
    with pytest.raises(TensorError, match="malformed message"):
        parse(data[:-4])  # cut short
    with pytest.raises(ValueError, match="field 2: only non-negative varints, got -1"):
        tensors_bytes(1, [], {2: -1})
    # A message with other kinds of fields is not one this parser reads.
    with pytest.raises(TypeError, match=r"keras_elastic\.ModelBundle\.header: "
                                        "TensorMessageParser reads only TensorChunk "
                                        "and single varint fields"):
        TensorMessageParser(ps_pb2.ModelBundle)


def test_a_chunk_read_again_reads_as_protobuf_reads_it():
    """`parse_chunk` remembers a variable's chunk fields by name (every push
    sends the same); a chunk that differs anywhere but its content's bytes,
    or whose content does not fill the message, is read field by field: each
    read equals protobuf's, whatever came before."""
    from keras_elastic.common.tensor_codec import TensorError, parse_chunk
    from keras_elastic.proto import tensor_pb2

    def chunk(**fields):
        fields = {"name": "layer/kernel", "dtype": "float32", "shape": [2, 2],
                  "total_bytes": 16, "content": np.arange(4, dtype="f4").tobytes(),
                  **fields}
        return tensor_pb2.TensorChunk(**fields).SerializeToString()

    def read(data: bytes):
        got = parse_chunk(memoryview(data))
        want = tensor_pb2.TensorChunk.FromString(data)
        assert (got.name, got.dtype, list(got.shape), got.offset, got.total_bytes,
                bytes(got.content)) == (want.name, want.dtype, list(want.shape),
                                        want.offset, want.total_bytes, want.content)
        return got

    read(chunk())  # remembered
    again = read(chunk(content=np.full(4, 7, "f4").tobytes()))
    assert isinstance(again.content, memoryview)
    assert np.frombuffer(again.content, "f4").tolist() == [7.0] * 4
    read(chunk(dtype="int32"))                       # another dtype, same name
    read(chunk(shape=[4], content=bytes(16)))        # another shape
    read(chunk(total_bytes=12, content=bytes(12)))   # a size that differs
    read(chunk(content=bytes(8)))                    # content shorter than the tensor
    read(chunk(offset=8, content=bytes(8)))          # a later chunk of the tensor
    read(chunk() + b"\x0a\x01x")                     # a field after the content
    read(chunk(name="n" * 200))                      # a long name
    read(chunk())                                    # and the first form again
    # A message cut short of its content is refused, not read as remembered.
    with pytest.raises(TensorError, match="malformed message"):
        parse_chunk(memoryview(chunk()[:-1]))


def test_encoded_frames_are_protobufs_bytes_for_every_dtype_and_shape():
    """The remembered frame prefixes (`bundle_bytes`) stay byte for byte
    protobuf's as dtypes and shapes of one name change."""
    from keras_elastic.common.tensor_codec import bundle_bytes
    from keras_elastic.proto import ps_pb2

    header = ps_pb2.ModelHeader(version=2)
    for array in (np.ones((2, 3), "float32"), np.ones(6, "float32"),
                  np.ones((2, 3), "float64"), np.array([b"ab", b"c"]),
                  np.zeros((0, 4), "int32"), np.float32(2.5)):
        want = ps_pb2.ModelBundle(header=header, tensors=list(
            encode_all([("w", array)], 1 << 62))).SerializeToString()
        assert bundle_bytes(header, [("w", array)]) == want

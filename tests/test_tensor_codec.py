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

"""Each canned reducer against a reference computed another way, on random shapes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keras_elastic.batching as kb

SETTINGS = settings(max_examples=15, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def dense_elements(draw, min_rank=1, max_rank=2, max_size=4):
    """A list of int32 arrays of one rank and random shapes, with distinct values."""
    rank = draw(st.integers(min_rank, max_rank))
    count = draw(st.integers(1, 7))
    out = []
    for i in range(count):
        shape = tuple(draw(st.integers(0, max_size)) for _ in range(rank))
        out.append((np.arange(int(np.prod(shape)), dtype=np.int32) + 1 + 100 * i)
                   .reshape(shape))
    return out


@st.composite
def sparse_elements(draw, rank=2, max_size=4):
    """(indices, values, dense_shape) triples of random dense_shapes."""
    count = draw(st.integers(1, 6))
    out = []
    for i in range(count):
        shape = [draw(st.integers(0, max_size)) for _ in range(rank)]
        cells = [tuple(c) for c in np.ndindex(*shape)]
        chosen = sorted(draw(st.sets(st.sampled_from(cells), max_size=len(cells)))) \
            if cells else []
        values = [100 * i + j + 1 for j in range(len(chosen))]
        out.append((np.array(chosen, np.int64).reshape(-1, rank),
                    np.array(values, np.int32), np.array(shape, np.int64)))
    return out


def _dense_dataset(arrays, shape=None):
    rank = arrays[0].ndim
    spec = tf.TensorSpec(shape if shape is not None else [None] * rank, tf.int32)
    return tf.data.Dataset.from_generator(lambda: iter(arrays), output_signature=spec)


def _sparse_dataset(triples, rank=2):
    def gen():
        for indices, values, shape in triples:
            yield tf.SparseTensor(indices, values, shape)

    return tf.data.Dataset.from_generator(
        gen, output_signature=tf.SparseTensorSpec([None] * rank, tf.int32))


def _ragged_dataset(arrays):
    """Ragged elements of ragged_rank 1: each array's rows, trailing zeros cut."""
    elements = [tf.ragged.constant([list(row[: len(row) - k % (len(row) + 1)])
                                    for k, row in enumerate(a.tolist())],
                                   dtype=tf.int32, ragged_rank=1)
                if a.shape[0] else tf.RaggedTensor.from_row_lengths(
                    tf.zeros([0], tf.int32), tf.zeros([0], tf.int64))
                for a in arrays]
    return elements, tf.data.Dataset.from_generator(
        lambda: iter(elements),
        output_signature=tf.RaggedTensorSpec([None, None], tf.int32, 1))


def _chunks(items, size, drop=False):
    out = [items[i:i + size] for i in range(0, len(items), size)]
    return [c for c in out if len(c) == size] if drop else out


def _pad_reference(arrays, padded_shape, value):
    rank = arrays[0].ndim
    target = [padded_shape[d] if padded_shape and padded_shape[d] is not None
              else max(a.shape[d] for a in arrays) for d in range(rank)]
    out = np.full([len(arrays)] + target, value, np.int32)
    for i, a in enumerate(arrays):
        out[(i,) + tuple(slice(0, s) for s in a.shape)] = a
    return out


def _sparse_to_numpy(triple):
    indices, values, shape = triple
    dense = np.zeros(shape, np.int32)
    for index, value in zip(indices, values, strict=True):
        dense[tuple(index)] = value
    return dense


@SETTINGS
@given(arrays=dense_elements(), batch_size=st.integers(1, 4), extra=st.integers(0, 2),
       fix=st.lists(st.booleans(), min_size=2, max_size=2), value=st.integers(-3, 3))
def test_padded_matches_numpy_padding(arrays, batch_size, extra, fix, value):
    rank = arrays[0].ndim
    largest = [max(a.shape[d] for a in arrays) for d in range(rank)]
    padded_shape = [largest[d] + extra if fix[d] else None for d in range(rank)]
    batches = list(kb.batch(_dense_dataset(arrays), batch_size,
                            components=kb.padded(padded_shape, value)))
    expected = [_pad_reference(c, padded_shape, value)
                for c in _chunks(arrays, batch_size)]
    assert len(batches) == len(expected)
    for got, want in zip(batches, expected, strict=True):
        np.testing.assert_array_equal(got, want)


@SETTINGS
@given(arrays=dense_elements(min_rank=2, max_rank=2), batch_size=st.integers(1, 4),
       extra=st.integers(0, 2), value=st.integers(-3, 3))
def test_padded_on_ragged_input_matches_numpy_padding(arrays, batch_size, extra, value):
    elements, ds = _ragged_dataset(arrays)
    dense = [e.to_tensor(default_value=value).numpy().reshape(
        [int(e.nrows()), int(e.bounding_shape()[1]) if e.nrows() else 0])
        for e in elements]
    padded_shape = [None, max(d.shape[1] for d in dense) + extra]
    batches = list(kb.batch(ds, batch_size, components=kb.padded(padded_shape, value)))
    expected = [_pad_reference(c, padded_shape, value)
                for c in _chunks(dense, batch_size)]
    for got, want in zip(batches, expected, strict=True):
        np.testing.assert_array_equal(got, want)


@SETTINGS
@given(arrays=dense_elements(), batch_size=st.integers(1, 4))
def test_dense_matches_numpy_stack(arrays, batch_size):
    same = [np.resize(a, arrays[0].shape) for a in arrays]
    for shape in (list(arrays[0].shape), [None] * arrays[0].ndim):
        batches = list(kb.batch(_dense_dataset(same, shape), batch_size,
                                components=kb.dense()))
        expected = [np.stack(c) for c in _chunks(same, batch_size)]
        for got, want in zip(batches, expected, strict=True):
            np.testing.assert_array_equal(got, want)


@SETTINGS
@given(triples=sparse_elements(), batch_size=st.integers(1, 4), extra=st.integers(0, 2),
       fix=st.lists(st.booleans(), min_size=2, max_size=2))
def test_padded_sparse_matches_padding_the_dense_form(triples, batch_size, extra, fix):
    largest = [max(int(t[2][d]) for t in triples) for d in range(2)]
    padded_shape = [largest[d] + extra if fix[d] else None for d in range(2)]
    batches = list(kb.batch(_sparse_dataset(triples), batch_size,
                            components=kb.padded_sparse(padded_shape)))
    chunks = _chunks([_sparse_to_numpy(t) for t in triples], batch_size)
    for got, chunk in zip(batches, chunks, strict=True):
        want = _pad_reference(chunk, padded_shape, 0)
        assert isinstance(got, tf.SparseTensor)
        assert got.dense_shape.numpy().tolist() == list(want.shape)
        np.testing.assert_array_equal(tf.sparse.to_dense(got), want)
        # Only the stored values are kept: no explicit zeros for the padding.
        assert got.values.shape[0] == sum(int(np.count_nonzero(c)) for c in chunk)


@SETTINGS
@given(triples=sparse_elements(), batch_size=st.integers(1, 4))
def test_sparse_matches_dataset_batch(triples, batch_size):
    ds = _sparse_dataset(triples)
    ours = list(kb.batch(ds, batch_size, components=kb.sparse()))
    native = list(ds.batch(batch_size))
    for got, want in zip(ours, native, strict=True):
        assert got.dense_shape.numpy().tolist() == want.dense_shape.numpy().tolist()
        np.testing.assert_array_equal(got.indices, want.indices)
        np.testing.assert_array_equal(got.values, want.values)


@SETTINGS
@given(arrays=dense_elements(), batch_size=st.integers(1, 4))
def test_ragged_on_dense_matches_ragged_stack(arrays, batch_size):
    batches = list(kb.batch(_dense_dataset(arrays), batch_size,
                            components=kb.ragged()))
    for got, chunk in zip(batches, _chunks(arrays, batch_size), strict=True):
        assert isinstance(got, tf.RaggedTensor)
        want = tf.ragged.stack([tf.constant(a) for a in chunk])
        assert got.to_list() == want.to_list()


@SETTINGS
@given(arrays=dense_elements(min_rank=2, max_rank=2), batch_size=st.integers(1, 4))
def test_ragged_on_ragged_matches_ragged_stack(arrays, batch_size):
    elements, ds = _ragged_dataset(arrays)
    batches = list(kb.batch(ds, batch_size, components=kb.ragged()))
    for got, chunk in zip(batches, _chunks(elements, batch_size), strict=True):
        assert got.to_list() == tf.ragged.stack(chunk).to_list()
        assert got.ragged_rank == 2


@SETTINGS
@given(arrays=dense_elements(min_rank=2, max_rank=2), triples=sparse_elements(),
       batch_size=st.integers(1, 3))
def test_sparse_and_ragged_through_padded_batch_match_their_references(
        arrays, triples, batch_size):
    """dense() on a shape with unknown sizes only runs on padded_batch, so the
    sparse and ragged components of the same element travel as dense parts."""
    count = min(len(arrays), len(triples))
    arrays, triples = arrays[:count], triples[:count]
    elements, ragged_ds = _ragged_dataset(arrays)
    checked = tf.data.Dataset.range(count).map(lambda i: tf.fill([i % 1 + 2], i))
    ds = tf.data.Dataset.zip({"r": ragged_ds, "s": _sparse_dataset(triples),
                              "d": checked})
    assert ds.element_spec["d"].shape.as_list() == [None]
    components = {"r": kb.ragged(), "s": kb.padded_sparse([5, None]), "d": kb.dense()}
    batches = list(kb.batch(ds, batch_size, components=components))
    dense_sparse = [_sparse_to_numpy(t) for t in triples]
    for got, r_chunk, s_chunk, start in zip(
            batches, _chunks(elements, batch_size), _chunks(dense_sparse, batch_size),
            range(0, count, batch_size), strict=True):
        assert got["r"].to_list() == tf.ragged.stack(r_chunk).to_list()
        want = _pad_reference(s_chunk, [5, None], 0)
        assert got["s"].dense_shape.numpy().tolist() == list(want.shape)
        np.testing.assert_array_equal(tf.sparse.to_dense(got["s"]), want)
        np.testing.assert_array_equal(
            got["d"], [[i, i] for i in range(start, start + len(r_chunk))])


def test_ragged_of_ragged_rank_zero_elements_through_padded_batch():
    """from_tensor_slices of a ragged tensor gives ragged_rank-0 elements."""
    values = tf.ragged.constant([[1], [2, 3], [], [4, 5, 6]])
    ds = tf.data.Dataset.zip((tf.data.Dataset.from_tensor_slices(values),
                              tf.data.Dataset.range(4).map(
                                  lambda i: tf.ensure_shape(tf.fill([i % 1 + 1], i),
                                                            [None]))))
    assert ds.element_spec[0].ragged_rank == 0
    # Through Dataset.batch as they are; through padded_batch as dense parts
    # (dense() of [None] needs it); through a per-element map before
    # Dataset.batch (ragged() of dense [None] needs one).
    for components in [(kb.ragged(), None), (kb.ragged(), kb.dense()),
                       (None, kb.dense()), (None, kb.ragged())]:
        got = [r.to_list() for r, _ in kb.batch(ds, 3, components=components)]
        assert got == [[[1], [2, 3], []], [[4, 5, 6]]], components


def test_count_per_batch():
    ds = tf.data.Dataset.range(10).map(lambda i: {"x": tf.fill([i], i), "y": i})
    counts = [b["x"].numpy() for b in kb.batch(
        ds, 4, components={"x": kb.count(), "y": None})]
    assert counts == [4, 4, 2]


@pytest.mark.parametrize("make", [
    lambda: tf.constant([[0, 7, 0], [5, 0, 0]]),
    lambda: tf.constant([[1.5, 0.0], [0.0, 0.0]]),
])
def test_sparse_of_dense_elements_matches_from_dense(make):
    dense = make()
    ds = tf.data.Dataset.from_tensor_slices(dense)
    got = kb.sparse().reduce(ds)
    want = tf.sparse.from_dense(dense)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.values, want.values)
    np.testing.assert_array_equal(got.dense_shape, want.dense_shape)

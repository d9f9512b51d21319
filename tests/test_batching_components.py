"""Per-component batching of nested elements, defaults, drop_remainder, Batching."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf

import keras_elastic.batching as kb

TOKENS = [[1, 2, 3], [4], [5, 6], [], [7, 8, 9, 10]]
TAG_SHAPES = [[2, 3], [1, 1], [3, 2], [1, 4], [2, 2]]


def _element(i):
    tags = tf.SparseTensor([[0, 0]], [i + 1], TAG_SHAPES[i])
    return {"features": {"tokens": tf.constant(TOKENS[i], tf.int32),
                         "tags": tags,
                         "words": tf.ragged.constant([["w"] * (i + 1)] * (i % 2 + 1))},
            "label": tf.constant(i, tf.int64)}


def _dataset():
    spec = {"features": {"tokens": tf.TensorSpec([None], tf.int32),
                         "tags": tf.SparseTensorSpec([None, None], tf.int32),
                         "words": tf.RaggedTensorSpec([None, None], tf.string, 1)},
            "label": tf.TensorSpec([], tf.int64)}
    return tf.data.Dataset.from_generator(lambda: (_element(i) for i in range(5)),
                                          output_signature=spec)


def test_dict_element_with_dense_padded_sparse_and_ragged_parts():
    components = {"features": {"tokens": kb.padded([6], -1),
                               "tags": kb.padded_sparse([4, None]),
                               "words": kb.ragged()},
                  "label": kb.dense()}
    batches = list(kb.batch(_dataset(), 2, components=components))
    assert len(batches) == 3
    for b, batch in enumerate(batches):
        items = range(2 * b, min(2 * b + 2, 5))
        np.testing.assert_array_equal(batch["label"], list(items))
        tokens = [TOKENS[i] + [-1] * (6 - len(TOKENS[i])) for i in items]
        np.testing.assert_array_equal(batch["features"]["tokens"], tokens)
        tags = batch["features"]["tags"]
        width = max(TAG_SHAPES[i][1] for i in items)
        assert tags.dense_shape.numpy().tolist() == [len(items), 4, width]
        assert tags.indices.numpy().tolist() == [[k, 0, 0] for k in range(len(items))]
        assert tags.values.numpy().tolist() == [i + 1 for i in items]
        words = batch["features"]["words"]
        assert words.to_list() == [[[b"w"] * (i + 1)] * (i % 2 + 1) for i in items]


def test_a_reducer_can_stand_for_a_sub_nest():
    ds = tf.data.Dataset.range(4).map(
        lambda i: {"a": {"x": tf.fill([i + 1], i), "y": tf.fill([2, i], i)},
                   "b": i})
    batch = next(iter(kb.batch(ds, 4, components={"a": kb.padded(), "b": None})))
    np.testing.assert_array_equal(batch["a"]["x"][3], [3, 3, 3, 3])
    np.testing.assert_array_equal(batch["a"]["x"][0], [0, 0, 0, 0])
    assert batch["a"]["y"].shape == (4, 2, 3)
    np.testing.assert_array_equal(batch["b"], [0, 1, 2, 3])


def test_one_reducer_for_all_components():
    ds = tf.data.Dataset.range(3).map(lambda i: (tf.fill([i], i), tf.fill([3 - i], i)))
    first, second = next(iter(kb.batch(ds, 3, components=kb.ragged())))
    assert first.to_list() == [[], [1], [2, 2]]
    assert second.to_list() == [[0, 0, 0], [1, 1], [2]]


def test_padded_with_a_partly_known_static_shape():
    ds = tf.data.Dataset.range(3).map(
        lambda i: tf.ensure_shape(tf.fill(tf.stack([i + 1, 3]), i), [None, 3]))
    assert ds.element_spec.shape.as_list() == [None, 3]
    batch = next(iter(kb.batch(ds, 3, components=kb.padded([4, 5], -1))))
    assert batch.shape == (3, 4, 5)
    expected = -tf.ones([3, 4, 5], tf.int64).numpy()
    for i in range(3):
        expected[i, : i + 1, :3] = i
    np.testing.assert_array_equal(batch, expected)


def test_tuple_components_may_be_a_list():
    ds = tf.data.Dataset.range(2).map(lambda i: (i, tf.fill([i + 1], i)))
    _, second = next(iter(kb.batch(ds, 2, components=[None, kb.padded([3])])))
    np.testing.assert_array_equal(second, [[0, 0, 0], [1, 1, 0]])


def test_namedtuple_elements_keep_their_type():
    Pair = collections.namedtuple("Pair", ["ids", "size"])
    ds = tf.data.Dataset.range(3).map(lambda i: Pair(tf.fill([i], i), i))
    batch = next(iter(kb.batch(ds, 3, components=Pair(kb.padded(), None))))
    assert isinstance(batch, Pair)
    np.testing.assert_array_equal(batch.ids, [[0, 0], [1, 0], [2, 2]])


def _same_batches(ours, native):
    ours, native = list(ours), list(native)
    assert len(ours) == len(native)
    for a, b in zip(ours, native, strict=True):
        for x, y in zip(tf.nest.flatten(a, expand_composites=True),
                        tf.nest.flatten(b, expand_composites=True), strict=True):
            np.testing.assert_array_equal(x, y)


def test_default_is_what_dataset_batch_does():
    ds = tf.data.Dataset.from_tensor_slices({
        "dense": tf.reshape(tf.range(12), [6, 2]),
        "ragged": tf.ragged.constant([[1], [2, 3], [], [4], [5, 6, 7], [8]]),
        "sparse": tf.sparse.from_dense(tf.reshape(tf.range(12) % 3, [6, 2])),
    })
    for drop in (False, True):
        ours = kb.batch(ds, 4, drop_remainder=drop)
        native = ds.batch(4, drop_remainder=drop)
        assert ours.element_spec == native.element_spec
        _same_batches(ours, native)


def _dataset_ops(ds):
    graph = tf.compat.v1.GraphDef.FromString(ds._as_serialized_graph().numpy())
    return [node.op for node in graph.node if "Dataset" in node.op]


def test_native_when_every_component_fits_the_native_op():
    """All dense: exactly Dataset.batch. Dense and padded: exactly padded_batch."""
    ds = tf.data.Dataset.range(8).map(lambda i: (i, tf.fill([i % 3], i)))
    source_ops = _dataset_ops(ds)
    plain = kb.batch(ds.map(lambda i, _: i), 4, components=kb.dense())
    assert _dataset_ops(plain) == source_ops + ["MapDataset", "BatchDatasetV2"]
    padded = kb.batch(ds, 4, components=(kb.dense(), kb.padded()))
    assert _dataset_ops(padded) == source_ops + ["PaddedBatchDatasetV2"]
    fixed = kb.batch(ds, 4, components=(None, kb.padded([5])))
    # A fixed size the elements' static shape cannot promise: one per-batch
    # map checks and pads (in parallel, keeping order).
    assert _dataset_ops(fixed) == source_ops + ["PaddedBatchDatasetV2",
                                                "ParallelMapDatasetV2"]


@pytest.mark.parametrize("drop", [False, True])
def test_drop_remainder_on_the_native_path(drop):
    ds = tf.data.Dataset.range(7).map(lambda i: tf.fill([i % 3 + 1], i))
    out = kb.batch(ds, 3, components=kb.padded([4]), drop_remainder=drop)
    assert out.element_spec.shape.as_list() == [3 if drop else None, 4]
    sizes = [b.shape[0] for b in out]
    assert sizes == ([3, 3] if drop else [3, 3, 1])


@pytest.mark.parametrize("drop", [False, True])
def test_drop_remainder_on_the_window_path(drop):
    total = kb.reducer(lambda key: tf.constant(0, tf.int64), lambda s, v: s + v)
    ds = tf.data.Dataset.range(7).map(lambda i: (i, tf.fill([i % 3 + 1], i)))
    out = kb.batch(ds, 3, components=(total, kb.padded([4])), drop_remainder=drop)
    assert out.element_spec[1].shape.as_list() == [3 if drop else None, 4]
    got = [(int(s), p.shape[0]) for s, p in out]
    assert got == ([(3, 3), (12, 3)] if drop else [(3, 3), (12, 3), (6, 1)])


def test_drop_remainder_with_sparse_and_padded_sparse():
    ds = tf.data.Dataset.from_tensor_slices(tf.sparse.from_dense(tf.eye(5)))
    out = list(kb.batch(ds, 2, components=kb.padded_sparse([7]), drop_remainder=True))
    assert len(out) == 2
    assert all(b.dense_shape.numpy().tolist() == [2, 7] for b in out)


def test_batching_spec_object_equals_the_function():
    spec = kb.Batching(2, components=(kb.dense(), kb.padded([3])), drop_remainder=True)
    assert "Batching(batch_size=2" in repr(spec)
    ds = tf.data.Dataset.range(5).map(lambda i: (i, tf.fill([i % 2 + 1], i)))
    _same_batches(spec(ds), kb.batch(ds, 2, components=(kb.dense(), kb.padded([3])),
                                     drop_remainder=True))
    assert len(list(spec(ds))) == 2


def test_batching_spec_checks_its_arguments_when_made():
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        kb.Batching(0)
    with pytest.raises(TypeError, match="drop_remainder must be a bool"):
        kb.Batching(2, drop_remainder=1)

"""The examples of the window + reducer batching RFC (seed 002), reproduced exactly."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import keras_elastic.batching as kb


def _gen():
    yield ("a", [1])
    yield ("b", [2])
    yield ("c", [3])
    yield ("d", [4, 4])


def _seed_dataset() -> tf.data.Dataset:
    # As in the RFC: output types only, so both components have unknown shapes.
    return tf.data.Dataset.from_generator(_gen, (tf.string, tf.int32))


def _as_lists(batches):
    return [tuple(np.asarray(part).tolist() for part in batch) for batch in batches]


EXPECTED_END_TO_END = [([b"a", b"b"], [[1, 0], [2, 0]]),
                       ([b"c", b"d"], [[3, 0], [4, 4]])]


def test_count_reducer_counts_range_10():
    assert kb.count().reduce(tf.data.Dataset.range(10)).numpy() == 10


def test_count_written_as_the_rfc_reducer_gives_10():
    def init_fn(_):
        return 0

    def reduce_fn(state, value):
        return state + 1

    def finalize_fn(state):
        return state

    count_reducer = kb.reducer(init_fn, reduce_fn, finalize_fn)
    assert count_reducer.reduce(tf.data.Dataset.range(10)).numpy() == 10


def test_count_of_a_dataset_of_unknown_cardinality():
    ds = tf.data.Dataset.range(10).filter(lambda x: x % 3 == 0)
    assert ds.cardinality().numpy() < 0
    assert kb.count().reduce(ds).numpy() == 4


def test_batch_of_dense_tensors_example():
    np.testing.assert_array_equal(kb.dense().reduce(tf.data.Dataset.range(5)),
                                  [0, 1, 2, 3, 4])


def test_padded_batch_of_dense_tensors_example():
    ds = tf.data.Dataset.from_tensor_slices([[1], [2]])
    np.testing.assert_array_equal(kb.padded([2], 0).reduce(ds), [[1, 0], [2, 0]])


def test_end_to_end_example_with_batch():
    batches = kb.batch(_seed_dataset(), 2, components=(kb.dense(), kb.padded([2])))
    assert _as_lists(batches) == EXPECTED_END_TO_END


def test_end_to_end_example_with_window_and_reducers():
    def map_fn(a, b):
        return kb.dense().reduce(a), kb.padded([2]).reduce(b)

    batches = kb.window(_seed_dataset(), 2, 2).map(map_fn)
    assert _as_lists(batches) == EXPECTED_END_TO_END


def test_end_to_end_example_as_written_in_the_rfc():
    def map_fn(a, b):
        return tf.data.Dataset.zip((a.batch(2), b.padded_batch(2, [2])))

    batches = kb.window(_seed_dataset(), 2, 2).flat_map(map_fn)
    assert _as_lists(batches) == EXPECTED_END_TO_END


def test_end_to_end_example_with_a_custom_reducer_takes_the_window_path():
    collect = kb.reducer(lambda key: tf.zeros([0], tf.string),
                         lambda state, value: tf.concat([state, [value]], 0))
    batches = kb.batch(_seed_dataset(), 2, components=(collect, kb.padded([2])))
    assert _as_lists(batches) == EXPECTED_END_TO_END


def _windows(windows):
    return [list(w.as_numpy_iterator()) for w in windows]


@pytest.mark.parametrize("args, expected", [
    ((5, 3), [[0, 1, 2], [1, 2, 3], [2, 3, 4]]),
    ((5, 3, 3, 1, False), [[0, 1, 2], [3, 4]]),
    ((6, 3, 1, 2), [[0, 2, 4], [1, 3, 5]]),
])
def test_window_examples(args, expected):
    n, *rest = args
    assert _windows(kb.window(tf.data.Dataset.range(n), *rest)) == expected


def test_window_of_a_dict_element_is_a_dict_of_datasets():
    ds = tf.data.Dataset.from_tensor_slices({"a": [1, 2, 3], "b": [4, 5, 6]})
    sums = kb.window(ds, 2).map(
        lambda w: w["a"].reduce(0, lambda s, v: s + v) * 10
        + w["b"].reduce(0, lambda s, v: s + v))
    assert list(sums.as_numpy_iterator()) == [39, 61]


@pytest.mark.parametrize("kwargs, error, words", [
    ({"size": 0}, ValueError, ["size", "at least 1", "0"]),
    ({"size": 2, "shift": -1}, ValueError, ["shift", "-1"]),
    ({"size": 2, "stride": 1.5}, TypeError, ["stride", "1.5"]),
    ({"size": 2, "drop_remainder": "yes"}, TypeError, ["drop_remainder", "yes"]),
])
def test_window_rejects_bad_arguments(kwargs, error, words):
    with pytest.raises(error) as info:
        kb.window(tf.data.Dataset.range(3), **kwargs)
    for word in words:
        assert word in str(info.value)


def test_window_rejects_a_non_dataset():
    with pytest.raises(TypeError, match="tf.data.Dataset.*list"):
        kb.window([1, 2, 3], 2)

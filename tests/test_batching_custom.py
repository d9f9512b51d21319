"""Custom reducers: nested state, keys, sub-nests, mixing with canned reducers."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf

import keras_elastic.batching as kb


def _mean_reducer():
    def init_fn(key):
        return {"sum": tf.constant(0.0), "count": tf.constant(0, tf.int64)}

    def reduce_fn(state, value):
        return {"sum": state["sum"] + tf.reduce_sum(value),
                "count": state["count"] + tf.size(value, out_type=tf.int64)}

    def finalize_fn(state):
        return state["sum"] / tf.cast(state["count"], tf.float32)

    return kb.reducer(init_fn, reduce_fn, finalize_fn)


def test_running_sum_and_count_give_the_mean_per_window():
    values = [1.0, 2.0, 6.0, 4.0, 10.0, 0.5, 3.5]
    ds = tf.data.Dataset.from_tensor_slices(
        {"x": tf.constant(values), "id": tf.range(7)})
    batches = list(kb.batch(ds, 3, components={"x": _mean_reducer(), "id": kb.dense()}))
    means = [float(b["x"]) for b in batches]
    np.testing.assert_allclose(means, [3.0, (4 + 10 + 0.5) / 3, 3.5])
    np.testing.assert_array_equal(batches[2]["id"], [6])


def test_nested_state_with_a_growing_tensor():
    """State shapes may change between steps (here a list that grows)."""
    def init_fn(key):
        return (tf.zeros([0], tf.int64), {"max": tf.constant(-1, tf.int64)})

    def reduce_fn(state, value):
        seen, stats = state
        return (tf.concat([seen, [value]], 0),
                {"max": tf.maximum(stats["max"], value)})

    def finalize_fn(state):
        seen, stats = state
        return {"reversed": tf.reverse(seen, [0]), "max": stats["max"]}

    collect = kb.reducer(init_fn, reduce_fn, finalize_fn)
    out = list(kb.batch(tf.data.Dataset.range(5), 2, components=collect))
    assert [b["reversed"].numpy().tolist() for b in out] == [[1, 0], [3, 2], [4]]
    assert [int(b["max"]) for b in out] == [1, 3, 4]


def test_init_fn_gets_the_batch_index_as_key():
    first_key = kb.reducer(lambda key: key, lambda state, value: state)
    out = kb.batch(tf.data.Dataset.range(7), 3, components=first_key)
    assert [int(k) for k in out] == [0, 1, 2]


def test_a_custom_reducer_over_a_sub_nest_sees_whole_sub_elements():
    ds = tf.data.Dataset.range(4).map(
        lambda i: {"pair": (i, 10 * i), "tokens": tf.fill([i + 1], i)})
    dot = kb.reducer(lambda key: tf.constant(0, tf.int64),
                     lambda state, pair: state + pair[0] * pair[1])
    out = list(kb.batch(ds, 2, components={"pair": dot, "tokens": kb.ragged()}))
    assert [int(b["pair"]) for b in out] == [0 + 10, 40 + 90]
    assert out[1]["tokens"].to_list() == [[2, 2, 2], [3, 3, 3, 3]]


def test_canned_reducers_next_to_a_custom_one_reduce_their_windows():
    ds = tf.data.Dataset.range(5).map(lambda i: (
        i, tf.fill([i % 3], i), tf.sparse.from_dense(tf.fill([1, i % 2 + 1], i + 1))))
    count = kb.reducer(lambda key: tf.constant(0, tf.int64), lambda s, v: s + 1)
    out = list(kb.batch(ds, 2, components=(count, kb.padded([3], -1),
                                           kb.padded_sparse([1, 4]))))
    assert [int(b[0]) for b in out] == [2, 2, 1]
    np.testing.assert_array_equal(out[0][1], [[-1, -1, -1], [1, -1, -1]])
    np.testing.assert_array_equal(out[1][1], [[2, 2, -1], [-1, -1, -1]])
    assert out[2][2].dense_shape.numpy().tolist() == [1, 1, 4]
    np.testing.assert_array_equal(tf.sparse.to_dense(out[1][2]),
                                  [[[3, 0, 0, 0]], [[4, 4, 0, 0]]])


def test_window_path_with_a_namedtuple_element():
    Example = collections.namedtuple("Example", ["ids", "weight"])
    ds = tf.data.Dataset.range(5).map(
        lambda i: Example(tf.fill([i % 2 + 1], i), tf.cast(i, tf.float32)))
    out = list(kb.batch(ds, 2, components=Example(kb.padded([2]), _mean_reducer())))
    assert all(isinstance(b, Example) for b in out)
    np.testing.assert_allclose([float(b.weight) for b in out], [0.5, 2.5, 4.0])
    np.testing.assert_array_equal(out[1].ids, [[2, 0], [3, 3]])


def test_a_user_subclass_of_reducer_takes_the_window_path():
    class Last(kb.Reducer):
        def reduce(self, dataset, key=0):
            return dataset.reduce(tf.constant(-1, tf.int64), lambda s, v: v)

    out = kb.batch(tf.data.Dataset.range(5), 2, components=Last())
    assert [int(x) for x in out] == [1, 3, 4]


def test_a_state_that_changes_dtype_is_reported_with_its_component():
    bad = kb.reducer(lambda key: tf.constant(0, tf.int32),
                     lambda state, value: tf.cast(value, tf.float32))
    ds = tf.data.Dataset.range(4).map(lambda i: {"stats": {"x": i}, "y": i})
    with pytest.raises((TypeError, ValueError)) as info:
        kb.batch(ds, 2, components={"stats": bad, "y": None})
    message = str(info.value)
    assert "component `stats`" in message
    assert "reducer(" in message


def test_reducer_rejects_non_callables():
    with pytest.raises(TypeError, match="reduce_fn must be callable, got 3"):
        kb.reducer(lambda key: 0, 3)
    with pytest.raises(TypeError, match="finalize_fn must be callable or None"):
        kb.reducer(lambda key: 0, lambda s, v: s, "x")

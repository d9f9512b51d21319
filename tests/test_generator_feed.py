"""The task feed: a generator-fed dataset without tf.data's GeneratorDataset.

`GeneratorDataset` pins glibc's mmap threshold for the whole process
(keras_elastic/data/feed.py says why that slows training); these tests hold
`generator_dataset` to `from_generator`'s behaviour and the elastic pipeline
to not building that op.
"""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

import keras_elastic as ke
from keras_elastic.data.feed import generator_dataset

SIGNATURE = (tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.int64),
             {"image": tf.TensorSpec([None, 2, 3], tf.float32),
              "label": tf.TensorSpec([None], tf.int64),
              "name": tf.TensorSpec([None], tf.string)})


def _elements(n):
    rng = np.random.default_rng(n)
    for i in range(n):
        rows = int(rng.integers(0, 4))
        yield (np.int64(i), np.int64(rows % 2), {
            "image": rng.normal(size=(rows, 2, 3)).astype(np.float32),
            "label": rng.integers(0, 10, size=rows),
            "name": np.array([f"r{i}-{j}".encode() for j in range(rows)], dtype=object)})


def _as_lists(dataset):
    return [tf.nest.map_structure(lambda t: t.tolist(), e)
            for e in dataset.as_numpy_iterator()]


def _ops(dataset):
    graph = graph_pb2.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops.update(node.op for node in function.node_def)
    return ops


def test_same_elements_and_spec_as_from_generator():
    ours = generator_dataset(lambda: _elements(7), SIGNATURE)
    theirs = tf.data.Dataset.from_generator(lambda: _elements(7),
                                            output_signature=SIGNATURE)
    assert ours.element_spec == theirs.element_spec
    expected = _as_lists(theirs)
    assert len(expected) == 7
    assert _as_lists(ours) == expected


def test_each_iteration_calls_the_generator_again():
    calls = []

    def gen():
        calls.append(len(calls))
        yield from ((np.int64(i), np.int64(0), {"image": np.zeros((1, 2, 3), np.float32),
                                                  "label": np.array([i]),
                                                  "name": np.array([b"x"], dtype=object)})
                    for i in range(3))

    ds = generator_dataset(gen, SIGNATURE)
    assert [int(e[0]) for e in ds] == [0, 1, 2]
    assert [int(e[0]) for e in ds] == [0, 1, 2]
    assert calls == [0, 1]
    assert [int(e[0]) for e in generator_dataset(lambda: iter(()), SIGNATURE)] == []


def test_a_failing_generator_raises_its_error_in_the_pipeline():
    def gen():
        yield next(_elements(1))
        raise RuntimeError("record 17 of shard s-3 is corrupt")

    ds = generator_dataset(gen, SIGNATURE)
    it = iter(ds)
    next(it)
    with pytest.raises(tf.errors.OpError, match="record 17 of shard s-3 is corrupt"):
        next(it)


def test_an_element_of_the_wrong_shape_is_an_error_naming_it():
    def gen():
        yield (np.int64(0), np.int64(0), {"image": np.zeros((1, 3, 3), np.float32),
                                          "label": np.array([1]),
                                          "name": np.array([b"x"], dtype=object)})

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"\[1,3,3\]"):
        list(generator_dataset(gen, SIGNATURE))


def test_the_elastic_pipeline_builds_no_generator_dataset_op():
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    y = np.arange(20, dtype=np.int64)
    for mode in ("training", "evaluation"):
        dataset = ke.ElasticDataset((x, y), batch_size=4, mode=mode)
        ops = _ops(dataset.build(lambda: iter(()), per_task=mode != "training"))
        assert "FlatMapDataset" in ops  # the graph is the pipeline's
        assert "GeneratorDataset" not in ops, sorted(ops)
    assert "GeneratorDataset" in _ops(tf.data.Dataset.from_generator(
        lambda: iter(()), output_signature=tf.TensorSpec([], tf.int64)))


def test_elements_do_not_share_memory_with_the_generator_arrays():
    # TensorFlow takes a numpy_function's aligned result without a copy and,
    # holding the only tensor reference, may reuse the buffer in place for an
    # op's output: an element aliasing the user's arrays (a task's records are
    # views of them) wrote over them (sample weights divided by the batch
    # size in a later epoch of fit). Elements are copies.
    data = np.linspace(0.5, 2.0, 256).astype(np.float32)
    original = data.copy()

    def gen():
        for start in range(0, 256, 64):
            yield data[start:start + 64]  # views, as a task's records

    iterator = iter(generator_dataset(gen, tf.TensorSpec([None], tf.float32))
                    .rebatch(32))

    @tf.function
    def step(iterator):  # as an elastic step takes its batch
        batch = iterator.get_next_as_optional()
        return tf.cond(batch.has_value(),
                       lambda: tf.reduce_sum(batch.get_value() / 32.0),
                       lambda: tf.constant(-1.0))

    sums = [float(step(iterator)) for _ in range(9)]
    np.testing.assert_array_equal(data, original)
    np.testing.assert_allclose(sums[:8], [original[k:k + 32].sum() / 32.0
                                          for k in range(0, 256, 32)], rtol=1e-6)
    assert sums[8] == -1.0

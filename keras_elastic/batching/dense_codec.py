"""Checked batching of dense components whose static shape is not fully known.

`Dataset.batch` fails on such components when two elements differ in shape,
with a message that names the flattened component index only. This codec
batches them with `padded_batch` together with each element's shape, and
then checks per batch that all shapes agree, so the error names the
component path, the batch positions and both shapes. For an unknown static
rank the element travels flattened, so that elements of different ranks
reach the check too.
"""

from __future__ import annotations

import tensorflow as tf

from keras_elastic.batching import checks
from keras_elastic.batching.plan import Plan
from keras_elastic.batching.structure import Path


def _first_mismatch(rows: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Whether all rows of `rows` equal its first, and the first that does not."""
    same = tf.reduce_all(tf.equal(rows, rows[:1]),
                         axis=list(range(1, rows.shape.rank)))
    bad = tf.argmin(tf.cast(same, tf.int32), output_type=tf.int64)
    return tf.reduce_all(same), bad


def _check_same_shape(shapes: tf.Tensor, path: Path, name: str) -> tf.Operation:
    ok, bad = _first_mismatch(shapes)
    return checks.runtime_assert(
        ok, path, name,
        "elements of one batch differ in shape: the first element has shape",
        shapes[0], "but the element at batch position", bad, "has shape",
        shapes[bad], "(use padded() or ragged() for elements of varying shape)")


def checked_dense_plan(spec: tf.TensorSpec, path: Path, name: str) -> Plan:
    """`PADDED` plan that stacks dense elements and checks their shapes agree."""
    shape = spec.shape
    if shape.rank is not None:
        rank = shape.rank

        def encode(value: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"value": value,
                    "shape": tf.shape(value, out_type=tf.int64)}

        def decode(batched: dict[str, tf.Tensor]) -> tf.Tensor:
            check = _check_same_shape(batched["shape"], path, name)
            return checks.after([check], batched["value"])

        return Plan(encode=encode, decode=decode,
                    padded_shapes={"value": shape, "shape": tf.TensorShape([rank])},
                    padding_values={"value": tf.zeros([], spec.dtype),
                                    "shape": tf.constant(0, tf.int64)})

    def encode_flat(value: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"flat": tf.reshape(value, [-1]),
                "shape": tf.shape(value, out_type=tf.int64),
                "rank": tf.rank(value)}

    def decode_flat(batched: dict[str, tf.Tensor]) -> tf.Tensor:
        shapes, ranks = batched["shape"], batched["rank"]
        same_rank, bad = _first_mismatch(ranks)
        rank_ok = checks.runtime_assert(
            same_rank, path, name,
            "elements of one batch differ in rank: the first element has rank",
            ranks[0], "and shape", shapes[0][:ranks[0]],
            "but the element at batch position", bad, "has rank", ranks[bad],
            "and shape", shapes[bad][:ranks[bad]])
        with tf.control_dependencies([rank_ok]):
            shape_ok = _check_same_shape(shapes, path, name)
        first = shapes[0][:ranks[0]]
        size = tf.reduce_prod(first)
        with tf.control_dependencies([shape_ok]):
            flat = batched["flat"][:, :size]
        return tf.reshape(flat, tf.concat([tf.shape(flat, out_type=tf.int64)[:1],
                                           first], 0))

    return Plan(encode=encode_flat, decode=decode_flat,
                padded_shapes={"flat": tf.TensorShape([None]),
                               "shape": tf.TensorShape([None]),
                               "rank": tf.TensorShape([])},
                padding_values={"flat": tf.zeros([], spec.dtype),
                                "shape": tf.constant(-1, tf.int64),
                                "rank": tf.constant(0, tf.int32)})

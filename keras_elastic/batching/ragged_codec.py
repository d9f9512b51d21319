"""`tf.RaggedTensor` components through `padded_batch`.

`padded_batch` takes dense tensors only. When a ragged component shares one
pass with padded components, each element travels as dense parts: its number
of rows, its nested row lengths and its flat values, each padded with zeros.
Per batch, the padding is masked out (a row-lengths vector of one element has
as many entries as the previous level's lengths sum to) and the batch is
rebuilt with `RaggedTensor.from_nested_row_lengths`: the same ragged tensor
`Dataset.batch` would produce, with ragged_rank one higher than the element's.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from keras_elastic.batching import checks
from keras_elastic.batching.plan import Plan
from keras_elastic.batching.structure import Path


def _masked(batched: tf.Tensor, counts: tf.Tensor) -> tf.Tensor:
    """Concatenates `batched[i, :counts[i]]` over the batch."""
    width = tf.shape(batched, out_type=tf.int64)[1]
    return tf.boolean_mask(batched, tf.sequence_mask(counts, width))


def ragged_codec_plan(spec: tf.RaggedTensorSpec, path: Path, name: str) -> Plan:
    """`PADDED` plan batching a ragged component as dense parts."""
    ragged_rank = spec.ragged_rank
    splits_dtype = spec.row_splits_dtype
    inner = spec.shape[ragged_rank + 1:]
    check_inner = not inner.is_fully_defined()

    def encode(value: Any) -> dict[str, Any]:
        if ragged_rank == 0:  # a plain tensor inside map; see plan.py
            flat = value
            parts = {"nrows": tf.shape(value, out_type=tf.int64)[0],
                     "lengths": (), "flat": flat}
        else:
            flat = value.flat_values
            parts = {"nrows": tf.cast(value.nrows(), tf.int64),
                     "lengths": tuple(value.nested_row_lengths()),
                     "flat": flat}
        if check_inner:
            parts["inner"] = tf.shape(flat, out_type=tf.int64)[1:]
        return parts

    def decode(batched: dict[str, Any]) -> tf.RaggedTensor:
        counts = batched["nrows"]
        lengths = [tf.cast(counts, splits_dtype)]
        for level in batched["lengths"]:
            lengths.append(_masked(level, counts))
            counts = tf.reduce_sum(tf.cast(level, tf.int64), axis=1)
        flat = _masked(batched["flat"], counts)
        if check_inner:
            inner_shapes = batched["inner"]
            same = tf.reduce_all(tf.equal(inner_shapes, inner_shapes[:1]), axis=1)
            bad = tf.argmin(tf.cast(same, tf.int32), output_type=tf.int64)
            check = checks.runtime_assert(
                tf.reduce_all(same), path, name,
                "elements of one batch differ in their uniform inner dimensions:"
                " the first element has", inner_shapes[0],
                "but the element at batch position", bad, "has",
                inner_shapes[bad])
            flat = checks.after([check], flat)
        return tf.RaggedTensor.from_nested_row_lengths(flat, lengths,
                                                       validate=False)

    padded_shapes: dict[str, Any] = {
        "nrows": tf.TensorShape([]),
        "lengths": tuple(tf.TensorShape([None]) for _ in range(ragged_rank)),
        "flat": tf.TensorShape([None]).concatenate(inner),
    }
    padding_values: dict[str, Any] = {
        "nrows": tf.constant(0, tf.int64),
        "lengths": tuple(tf.constant(0, splits_dtype) for _ in range(ragged_rank)),
        "flat": tf.zeros([], spec.dtype),
    }
    if check_inner:
        padded_shapes["inner"] = tf.TensorShape([len(inner)])
        padding_values["inner"] = tf.constant(0, tf.int64)
    return Plan(encode=encode, decode=decode, padded_shapes=padded_shapes,
                padding_values=padding_values)

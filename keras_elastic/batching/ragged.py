"""`ragged()`: batch components of different shapes into a `tf.RaggedTensor`."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from keras_elastic.batching import checks
from keras_elastic.batching.plan import (
    BATCH,
    PADDED,
    RAGGED,
    Kind,
    Plan,
    kind_of,
    last_unknown_axis,
    ragged_feasible,
    ragged_passthrough,
    unwrap_ragged,
    wrap_as_ragged,
    zero,
)
from keras_elastic.batching.ragged_codec import ragged_codec_plan
from keras_elastic.batching.reducer import CannedReducer
from keras_elastic.batching.structure import Path


class Ragged(CannedReducer):
    """See `ragged()`."""

    accepts = (Kind.DENSE, Kind.RAGGED)

    def __init__(self, row_splits_dtype: tf.DType = tf.int64) -> None:
        row_splits_dtype = tf.as_dtype(row_splits_dtype)
        if row_splits_dtype not in (tf.int32, tf.int64):
            raise ValueError(
                f"ragged(): row_splits_dtype must be int32 or int64, got "
                f"{row_splits_dtype.name}.")
        self.row_splits_dtype = row_splits_dtype

    def __repr__(self) -> str:
        return f"ragged(row_splits_dtype={self.row_splits_dtype.name})"

    def plan(self, spec: Any, path: Path, mode: str, mapped: bool) -> Plan:
        self.check(spec, path)
        if kind_of(spec) is Kind.RAGGED:
            if mode == RAGGED:
                ragged_feasible(spec, path, repr(self))
            if mode != PADDED:
                return ragged_passthrough(spec, mapped)
            return ragged_codec_plan(spec, path, repr(self))
        shape = spec.shape
        if shape.rank is None or shape.rank == 0:
            what = "unknown rank" if shape.rank is None else "rank 0"
            raise checks.build_error(
                path, repr(self),
                f"the component has {what}, but a ragged batch needs elements "
                "of a known rank of at least 1 (fix the rank with tf.ensure_shape "
                "or the dataset's output_signature).")
        splits = self.row_splits_dtype
        if shape.is_fully_defined():
            def to_ragged(batched: tf.Tensor) -> tf.RaggedTensor:
                return tf.RaggedTensor.from_tensor(batched, ragged_rank=1,
                                                   row_splits_dtype=splits)

            if mode != PADDED:
                return Plan(decode=to_ragged)
            return Plan(decode=to_ragged, padded_shapes=shape,
                        padding_values=zero(spec.dtype))
        # Ragged up to the last dimension of unknown size, as Dataset.ragged_batch.
        last = last_unknown_axis(shape)
        if mode == RAGGED:  # what Dataset.ragged_batch gives, with int64 splits
            if splits == tf.int64:
                return Plan()
            return Plan(decode=lambda b: b.with_row_splits_dtype(splits))
        if mode == BATCH:
            return Plan(encode=lambda x: wrap_as_ragged(x, last + 1, splits),
                        decode=unwrap_ragged)
        element_spec = tf.RaggedTensorSpec(shape, spec.dtype, ragged_rank=last,
                                           row_splits_dtype=splits)
        codec = ragged_codec_plan(element_spec, path, repr(self))
        if last == 0:
            return codec
        return codec.before(lambda x: tf.RaggedTensor.from_tensor(
            x, ragged_rank=last, row_splits_dtype=splits))


def ragged(row_splits_dtype: tf.DType = tf.int64) -> Ragged:
    """Batches components into a `tf.RaggedTensor`, for elements of any shapes.

    Ragged elements are batched as `Dataset.batch` does (the batch has
    ragged_rank one higher than the elements). Dense elements become ragged
    up to their last dimension of statically unknown size, as with
    `Dataset.ragged_batch`; dense elements of a fully known shape give a
    uniform ragged batch `[n, (d0), d1, ...]`. Compare `tf.ragged.stack`.

    Example:

    ```python
    import tensorflow as tf
    import keras_elastic.batching as kb

    ds = tf.data.Dataset.range(4).map(lambda i: tf.range(i))
    next(iter(kb.batch(ds, 4, components=kb.ragged())))
    # <tf.RaggedTensor [[], [0], [0, 1], [0, 1, 2]]>
    ```

    Args:
      row_splits_dtype: the row-splits dtype of ragged dimensions made from
        dense elements (int64 or int32); ragged elements keep their own.

    Returns:
      A canned reducer for dense and ragged components.
    """
    return Ragged(row_splits_dtype)

"""Validating `padded_shape` arguments and padding values."""

from __future__ import annotations

import numbers
from typing import Any

import tensorflow as tf

from keras_elastic.batching import checks
from keras_elastic.batching.structure import Path


def normalize_padded_shape(padded_shape: Any,
                           reducer_name: str) -> list[int | None] | None:
    """`padded_shape` as a list of ints and Nones (-1 also means None)."""
    if padded_shape is None:
        return None
    if isinstance(padded_shape, tf.TensorShape):
        if padded_shape.rank is None:
            return None
        return padded_shape.as_list()
    if isinstance(padded_shape, numbers.Integral) or not isinstance(
            padded_shape, (list, tuple)):
        raise TypeError(
            f"{reducer_name}: padded_shape must be a list, tuple or TensorShape "
            f"of ints and Nones, got {padded_shape!r}.")
    out: list[int | None] = []
    for dim in padded_shape:
        if dim is None or (isinstance(dim, numbers.Integral) and dim == -1):
            out.append(None)
        elif isinstance(dim, numbers.Integral) and not isinstance(dim, bool) \
                and dim >= 0:
            out.append(int(dim))
        else:
            raise ValueError(
                f"{reducer_name}: padded_shape entries must be non-negative ints "
                f"or None, got {dim!r} in {padded_shape!r}.")
    return out


def target_shape(padded_shape: list[int | None] | None, static: tf.TensorShape,
                 path: Path, reducer_name: str,
                 what: str = "shape") -> list[int | None]:
    """The padded shape for a component of known rank, checked against `static`.

    Raises:
      ValueError: if the ranks differ, or a statically known dimension of the
        component is larger than `padded_shape`.
    """
    rank = static.rank
    if padded_shape is None:
        return [None] * rank
    if len(padded_shape) != rank:
        raise checks.build_error(
            path, reducer_name,
            f"padded_shape {checks.shape_str(padded_shape)} has rank "
            f"{len(padded_shape)} but the component's {what} "
            f"{checks.shape_str(static)} has rank {rank}.")
    for axis, (size, limit) in enumerate(zip(static.as_list(), padded_shape,
                                             strict=True)):
        if size is not None and limit is not None and size > limit:
            raise checks.build_error(
                path, reducer_name,
                f"the component's {what} {checks.shape_str(static)} is larger than "
                f"padded_shape {checks.shape_str(padded_shape)} in dimension "
                f"{axis} ({size} > {limit}).")
    return list(padded_shape)


def padding_constant(value: Any, dtype: tf.DType, path: Path,
                     reducer_name: str) -> tf.Tensor:
    """The scalar padding value for `dtype` (None: 0, False or b'')."""
    if value is None:
        return tf.zeros([], dtype)
    try:
        if isinstance(value, tf.Tensor):
            constant = tf.cast(value, dtype) if value.dtype != dtype else value
        else:
            constant = tf.constant(value, dtype)
    except (TypeError, ValueError, tf.errors.InvalidArgumentError) as error:
        raise checks.build_error(
            path, reducer_name,
            f"padding_value {value!r} cannot be a {dtype.name} (the component's "
            f"dtype): {error}") from error
    if constant.shape.rank != 0:
        raise checks.build_error(
            path, reducer_name,
            f"padding_value must be a scalar, got shape {constant.shape}.")
    return constant

"""Build-time and run-time checks whose errors name the component and sizes."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from keras_elastic.batching.structure import Path, path_str


def shape_str(shape: Any) -> str:
    """Shows a static shape (list, tuple or TensorShape) as `[None, 5]`."""
    if isinstance(shape, tf.TensorShape):
        if shape.rank is None:
            return "<unknown rank>"
        shape = shape.as_list()
    return "[" + ", ".join("None" if d is None else str(d) for d in shape) + "]"


def build_error(path: Path, reducer_name: str, message: str) -> ValueError:
    """A ValueError raised while building the pipeline, naming the component."""
    return ValueError(f"{reducer_name} at component `{path_str(path)}`: {message}")


def runtime_assert(condition: tf.Tensor, path: Path, reducer_name: str,
                   *data: Any) -> tf.Operation:
    """An assertion that fails with `InvalidArgumentError` naming the component.

    `data` alternates strings and tensors; the tensors' values (such as the
    offending sizes) are printed in the error message. Integer tensors are
    shown as int32 (sizes), which lets `tf.debugging.Assert` emit a bare
    `Assert` op without a conditional around it: the check then costs a
    couple of small ops per batch.
    """
    shown = [tf.cast(d, tf.int32) if isinstance(d, tf.Tensor) and d.dtype.is_integer
             else d for d in data]
    return tf.debugging.Assert(
        condition, [f"{reducer_name} at component `{path_str(path)}`:", *shown],
        summarize=64)


def after(checks: list[Any], value: Any) -> Any:
    """Returns `value` (any nest, composites too) computed after `checks` ran."""
    if not checks:
        return value
    with tf.control_dependencies(checks):
        return tf.nest.map_structure(tf.identity, value, expand_composites=True)


def slack(sizes: tf.Tensor, limit: list[int | None]) -> tf.Tensor:
    """`limit[i] - sizes[i]` where a limit is set, else 0 (dtype of `sizes`).

    `sizes` holds the batch's largest sizes per dimension; a negative entry
    means an element did not fit.
    """
    bound = tf.constant([0 if d is None else d for d in limit], sizes.dtype)
    if all(d is not None for d in limit):
        return bound - sizes
    mask = tf.constant([0 if d is None else 1 for d in limit], sizes.dtype)
    return bound - sizes * mask


def fits(room: tf.Tensor) -> tf.Tensor:
    """Whether every entry of a `slack` vector is non-negative."""
    return tf.reduce_all(room >= 0)


def check_rank(value_shape: tf.Tensor, rank: int, path: Path,
               reducer_name: str, what: str) -> tf.Operation:
    """Run-time check that a tensor whose static rank is unknown has `rank`."""
    actual = tf.size(value_shape)
    return runtime_assert(
        tf.equal(actual, rank), path, reducer_name,
        f"an element's {what} has rank", actual,
        "with shape", value_shape, f"but rank {rank} is expected")

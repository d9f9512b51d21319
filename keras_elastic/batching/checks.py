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
    offending sizes) are printed in the error message.
    """
    return tf.debugging.Assert(
        condition, [f"{reducer_name} at component `{path_str(path)}`:", *data],
        summarize=64)


def after(checks: list[Any], value: Any) -> Any:
    """Returns `value` (any nest, composites too) computed after `checks` ran."""
    if not checks:
        return value
    with tf.control_dependencies(checks):
        return tf.nest.map_structure(tf.identity, value, expand_composites=True)


def fits(actual: tf.Tensor, limit: list[int | None]) -> tf.Tensor:
    """Whether each `actual[i] <= limit[i]`, over the dimensions with a limit."""
    dims = [i for i, d in enumerate(limit) if d is not None]
    if not dims:
        return tf.constant(True)
    bound = tf.constant([limit[i] for i in dims], tf.int64)
    picked = tf.gather(tf.cast(actual, tf.int64), dims)
    return tf.reduce_all(picked <= bound)


def check_rank(value_shape: tf.Tensor, rank: int, path: Path,
               reducer_name: str, what: str) -> tf.Operation:
    """Run-time check that a tensor whose static rank is unknown has `rank`."""
    actual = tf.size(value_shape)
    return runtime_assert(
        tf.equal(actual, rank), path, reducer_name,
        f"an element's {what} has rank", actual,
        "with shape", value_shape, f"but rank {rank} is expected")

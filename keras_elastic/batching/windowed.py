"""Batching through windows and reducers, for components with custom reducers.

This is the RFC's general form: `Dataset.window` makes one finite dataset
per batch and a `map` reduces each component's window with its reducer.
Canned reducers reduce their window with one native batching op; custom
reducers run their `reduce_fn` per element inside the tf.data graph.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from keras_elastic.batching.native import map_element, set_batch_dim
from keras_elastic.batching.reducer import CannedReducer
from keras_elastic.batching.structure import (
    Path,
    children,
    get_at,
    path_str,
)


def replace_at(structure: Any, values: dict[Path, Any], prefix: Path = ()) -> Any:
    """`structure` with the parts at the paths of `values` replaced."""
    if prefix in values:
        return values[prefix]
    kids = children(structure)
    if kids is None:
        return structure
    new = {key: replace_at(child, values, prefix + (key,)) for key, child in kids}
    if isinstance(structure, dict):
        return new
    if hasattr(structure, "_fields"):
        return type(structure)(**new)
    return type(structure)(new[i] for i in range(len(structure)))


def batch_by_windows(dataset: tf.data.Dataset, units: list[tuple[Path, Any]],
                     batch_size: int, drop_remainder: bool) -> tf.data.Dataset:
    """Batches `dataset` by reducing windows of `batch_size` elements.

    Args:
      dataset: the dataset to batch.
      units: `(path, reducer)` pairs; canned reducers at leaves of the
        element, custom reducers at any part of it (a sub-nest is zipped).
      batch_size: the number of elements per batch.
      drop_remainder: whether to drop a last, smaller batch.

    Returns:
      The batched dataset: the element's structure, with each unit's part
      replaced by its reducer's result.
    """
    element_spec = dataset.element_spec
    windows = dataset.window(batch_size, shift=batch_size,
                             drop_remainder=drop_remainder).enumerate()

    def reduce_window(indexed: tuple[tf.Tensor, Any]) -> Any:
        index, window = indexed
        results = {}
        for path, reducer in units:
            part = get_at(window, path)
            part = part if children(part) is None else tf.data.Dataset.zip(part)
            if isinstance(reducer, CannedReducer):
                result = reducer.reduce_at(part, path, size=batch_size)
                if drop_remainder:
                    result = set_batch_dim(result, batch_size)
            else:
                try:
                    result = reducer.reduce(part, key=index)
                except (TypeError, ValueError) as error:
                    kind = TypeError if isinstance(error, TypeError) else ValueError
                    raise kind(
                        f"{reducer!r} at component `{path_str(path)}` failed on "
                        f"the window of its elements (element spec "
                        f"{part.element_spec}): {error}") from error
            results[path] = result
        return replace_at(element_spec, results)

    return map_element(windows, reduce_window)

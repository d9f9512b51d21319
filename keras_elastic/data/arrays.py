"""In-memory NumPy arrays as a data source: tasks are index ranges."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from keras_elastic.data.source import DataSource


class ArraySource(DataSource):
    """Serves a nest (array, tuple, dict) of NumPy arrays of equal length.

    Every worker must build the same arrays (for example by running the same
    script): only index ranges travel through the master.

    Example:

    >>> import numpy as np
    >>> src = ArraySource((np.zeros((10, 3)), np.arange(10)))
    >>> src.shards()
    [('arrays', 10)]
    >>> src.read("arrays", 2, 4)[1].tolist()
    [2, 3]
    """

    def __init__(self, arrays: Any, name: str = "arrays") -> None:
        arrays = tf.nest.map_structure(np.asarray, arrays)
        lengths = {a.shape[0] if a.ndim else None for a in tf.nest.flatten(arrays)}
        if None in lengths:
            raise ValueError("ArraySource: every array needs a leading (record) axis; "
                             "got a scalar")
        if len(lengths) != 1:
            paths = [
                f"{'/'.join(map(str, p)) or '<root>'}: {a.shape[0]}"
                for p, a in _flatten_with_paths(arrays)]
            raise ValueError("ArraySource: arrays have different numbers of records: "
                             + ", ".join(paths))
        self._arrays = arrays
        self._name = name
        self._length = lengths.pop()

    def shards(self) -> list[tuple[str, int]]:
        return [(self._name, self._length)]

    def read(self, shard: str, start: int, end: int) -> Any:
        if shard != self._name:
            raise KeyError(f"ArraySource has no shard '{shard}'")
        return tf.nest.map_structure(lambda a: a[start:end], self._arrays)

    @property
    def record_spec(self) -> Any:
        return tf.nest.map_structure(
            lambda a: tf.TensorSpec(a.shape[1:], tf.as_dtype(a.dtype)), self._arrays)

    def describe(self) -> str:
        return f"arrays ({self._length} records)"


def _flatten_with_paths(nest: Any):
    if isinstance(nest, dict):
        for k in sorted(nest):
            for p, v in _flatten_with_paths(nest[k]):
                yield (k,) + p, v
    elif isinstance(nest, (list, tuple)):
        for i, x in enumerate(nest):
            for p, v in _flatten_with_paths(x):
                yield (i,) + p, v
    else:
        yield (), nest

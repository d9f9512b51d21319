"""The interface every data source implements."""

from __future__ import annotations

import abc
from typing import Any

import tensorflow as tf


class DataSource(abc.ABC):
    """Shards of records that tasks are cut from.

    Subclasses say what shards there are and how many records each has, and
    read the records of one range. `read` runs in the worker's input thread and
    returns the whole range at once (one Python call per task, not per record).
    """

    @abc.abstractmethod
    def shards(self) -> list[tuple[str, int]]:
        """`(shard name, number of records)` of every shard, in order."""

    @abc.abstractmethod
    def read(self, shard: str, start: int, end: int) -> Any:
        """Returns records `[start, end)` of `shard`, batched along axis 0.

        The structure matches `record_spec` with a leading dimension.
        """

    @property
    @abc.abstractmethod
    def record_spec(self) -> Any:
        """`tf.TensorSpec` nest of one record."""

    def describe(self) -> str:
        return type(self).__name__

    def num_records(self) -> int:
        return sum(n for _, n in self.shards())

    def batched_spec(self) -> Any:
        return tf.nest.map_structure(
            lambda s: tf.TensorSpec([None] + list(s.shape), s.dtype), self.record_spec)


def as_source(data: Any, index_dir: str | None = None) -> DataSource:
    """Turns what a user passes to `ElasticDataset` into a `DataSource`.

    Accepts a `DataSource`, a file pattern or a list of patterns (TFRecord), or
    a NumPy array / tuple / dict of arrays.
    """
    import numpy as np

    from keras_elastic.data.arrays import ArraySource
    from keras_elastic.data.tfrecord import TFRecordSource

    if isinstance(data, DataSource):
        return data
    if isinstance(data, (str, bytes)) or (
            isinstance(data, (list, tuple)) and data
            and all(isinstance(p, str) for p in data)):
        return TFRecordSource(data, index_dir=index_dir)
    leaves = tf.nest.flatten(data)
    if leaves and all(isinstance(x, np.ndarray) or hasattr(x, "__array__")
                      for x in leaves):
        return ArraySource(data)
    raise TypeError(
        "ElasticDataset expects a file pattern, a list of file patterns, NumPy "
        f"arrays (a nest of them) or a keras_elastic.data.DataSource; got "
        f"{type(data).__name__}.")

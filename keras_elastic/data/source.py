"""The interface every data source implements."""

from __future__ import annotations

import abc
import importlib
import threading
from collections.abc import Callable
from types import ModuleType
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

    @tf.autograph.experimental.do_not_convert
    def decode(self, records: tf.data.Dataset) -> tf.data.Dataset:
        """Maps one task's records (`read`'s output, as a dataset) to what
        `dataset_fn` receives: unchanged unless the source knows how its
        records are encoded (a TFDS dataset decodes with its features)."""
        return records

    def describe(self) -> str:
        return type(self).__name__

    def content_fingerprints(self) -> list[tuple[str, int]]:
        """`(path, 64-bit hash)` of each part of the data that every worker
        builds in memory, for the master to check that all hold the same data
        (`ArraySource`); [] for files, which are the same files everywhere."""
        return []

    def num_records(self) -> int:
        return sum(n for _, n in self.shards())

    def batched_spec(self) -> Any:
        return tf.nest.map_structure(
            lambda s: tf.TensorSpec([None] + list(s.shape), s.dtype), self.record_spec)


class FirstRecords(DataSource):
    """The first `count` records of another source, in shard order (what
    `ElasticDataset.take` reads).

    Example:

    >>> import numpy as np
    >>> from keras_elastic.data.arrays import ArraySource
    >>> FirstRecords(ArraySource(np.arange(10)), 4).shards()
    [('arrays', 4)]
    """

    def __init__(self, source: DataSource, count: int) -> None:
        self.source = source
        self.count = int(count)
        shards, left = [], self.count
        for name, n in source.shards():
            if left <= 0:
                break
            shards.append((name, min(n, left)))
            left -= n
        self._shards = shards

    def shards(self) -> list[tuple[str, int]]:
        return list(self._shards)

    def read(self, shard: str, start: int, end: int) -> Any:
        check_range(type(self).__name__, shard, dict(self._shards).get(shard), start,
                    end)
        return self.source.read(shard, start, end)

    @property
    def record_spec(self) -> Any:
        return self.source.record_spec

    def decode(self, records: tf.data.Dataset) -> tf.data.Dataset:
        return self.source.decode(records)

    def describe(self) -> str:
        return f"the first {self.count} records of {self.source.describe()}"

    def content_fingerprints(self) -> list[tuple[str, int]]:
        return self.source.content_fingerprints()


def optional_module(module: str, needed_for: str, package: str) -> ModuleType:
    """Imports `module`, which only some sources need; if it is missing, an
    `ImportError` saying what needs it and how to install it.

    Example:

    >>> optional_module("json", "reading JSON", "json").dumps(1)
    '1'
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{needed_for} needs the {package} package, a requirement of "
            f"keras-elastic that is missing here: pip install {package}") from e


def check_range(owner: str, shard: str, count: int | None, start: int,
                end: int) -> None:
    """Checks that records `[start, end)` of `shard` (`count` records, None if
    `owner` has no such shard) exist, for `DataSource.read`.

    Example:

    >>> check_range("ArrayRecordSource", "a.array_record", 10, 0, 12)
    Traceback (most recent call last):
    ...
    IndexError: a.array_record: records [0, 12) out of range (the shard has 10)
    """
    if count is None:
        raise KeyError(f"{owner} has no shard '{shard}'")
    if not 0 <= start <= end <= count:
        raise IndexError(f"{shard}: records [{start}, {end}) out of range (the shard "
                         f"has {count})")


class PerThreadReaders:
    """File readers opened on first use, one per (thread, file): `read` runs in
    a worker's input thread, and a random-access reader is not shared across
    threads.

    Example:

    >>> readers = PerThreadReaders(lambda path: [path])  # a reader: open(path)
    >>> readers.get("a.bin") is readers.get("a.bin")
    True
    """

    def __init__(self, open_reader: Callable[[str], Any]) -> None:
        self._open = open_reader
        self._local = threading.local()

    def get(self, path: str) -> Any:
        readers = getattr(self._local, "readers", None)
        if readers is None:
            readers = self._local.readers = {}
        if path not in readers:
            readers[path] = self._open(path)
        return readers[path]

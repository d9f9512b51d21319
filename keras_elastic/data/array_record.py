"""ArrayRecord files as a data source: random access, no offset index.

An ArrayRecord file (https://github.com/google/array_record, the format of
Grain and of TFDS' `file_format="array_record"`) keeps the position of every
record in its footer: the number of records is known without reading the
records, and a task reads its range `[start, end)` directly. Each record is
returned as it was written (bytes, e.g. a serialized `tf.train.Example`);
`dataset_fn` parses it.

Uses the `array_record` package (installed with keras-elastic).

Example:

>>> import os
>>> from array_record.python.array_record_module import ArrayRecordWriter
>>> os.makedirs("data")
>>> for shard, n in enumerate([20, 17]):
...     writer = ArrayRecordWriter(f"data/train-{shard:05d}.array_record",
...                                "group_size:1")
...     for i in range(n):
...         writer.write(f"record {shard}.{i}".encode())
...     writer.close()
>>> src = ArrayRecordSource("data/train-*.array_record")
>>> src.shards()
[('data/train-00000.array_record', 20), ('data/train-00001.array_record', 17)]
>>> src.read(src.shards()[0][0], 10, 12)
array([b'record 0.10', b'record 0.11'], dtype=object)
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from keras_elastic.data.source import (
    DataSource,
    PerThreadReaders,
    check_range,
    optional_module,
)

# Random access: no read-ahead, no reader threads (a task reads its own range).
READER_OPTIONS = "readahead_buffer_size:0,max_parallelism:0"


def open_reader(path: str) -> Any:
    """An `ArrayRecordReader` of `path` for random access; a file that is not
    an ArrayRecord file (or whose footer is damaged or cut off) raises
    `ValueError` naming it."""
    module = optional_module("array_record.python.array_record_module",
                             "reading ArrayRecord files", "array-record")
    if not os.path.exists(path) and "://" not in path:
        raise FileNotFoundError(f"{path}: no such ArrayRecord file")
    try:
        reader = module.ArrayRecordReader(os.fspath(path), READER_OPTIONS)
    except (RuntimeError, ValueError, OSError) as e:
        raise ValueError(f"{path}: not a readable ArrayRecord file (damaged, cut "
                         f"short or another format): {e}") from None
    if not reader.ok():
        raise ValueError(f"{path}: not a readable ArrayRecord file (damaged, cut "
                         "short or another format)")
    return reader


class ArrayRecordSource(DataSource):
    """Records of ArrayRecord files; each file is one shard.

    The record counts come from the files' footers (no pass over the records);
    a task reads its range at random. Records are byte strings, as written.

    Example:

    >>> from array_record.python.array_record_module import ArrayRecordWriter
    >>> writer = ArrayRecordWriter("train.array_record", "group_size:1")
    >>> for i in range(20):
    ...     writer.write(b"%d" % i)
    >>> writer.close()
    >>> src = ArrayRecordSource("train.array_record")
    >>> src.read("train.array_record", 10, 12)
    array([b'10', b'11'], dtype=object)
    """

    def __init__(self, patterns: str | Sequence[str]) -> None:
        from keras_elastic.data.tfrecord import expand_patterns

        counts = {}
        for path in expand_patterns(patterns):
            reader = open_reader(path)
            try:
                counts[path] = int(reader.num_records())
            finally:
                reader.close()
        self._init(counts)

    @classmethod
    def with_counts(cls, counts: Mapping[str, int]) -> ArrayRecordSource:
        """ArrayRecord files whose record counts are known already (a TFDS
        dataset's info): no file is opened until a task reads it.

        Example:

        >>> src = ArrayRecordSource.with_counts({"a.array_record": 10})
        >>> src.shards()
        [('a.array_record', 10)]
        """
        source = cls.__new__(cls)
        source._init(dict(counts))
        return source

    def _init(self, counts: dict[str, int]) -> None:
        self._counts = counts
        self._readers = PerThreadReaders(open_reader)

    @property
    def files(self) -> list[str]:
        return list(self._counts)

    def shards(self) -> list[tuple[str, int]]:
        return list(self._counts.items())

    @property
    def record_spec(self) -> tf.TensorSpec:
        return tf.TensorSpec([], tf.string)

    def read(self, shard: str, start: int, end: int) -> np.ndarray:
        check_range("ArrayRecordSource", shard, self._counts.get(shard), start, end)
        out = np.empty(end - start, dtype=object)
        if end > start:
            try:
                out[:] = self._readers.get(shard).read(start, end)
            except (RuntimeError, ValueError, IndexError) as e:
                raise ValueError(f"{shard}: cannot read records [{start}, {end}): "
                                 f"{e}") from None
        return out

    def describe(self) -> str:
        return f"{len(self._counts)} ArrayRecord file(s), {self.num_records()} records"

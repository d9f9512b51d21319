"""`as_source`: what a user passes to `ElasticDataset`, as a `DataSource`.

The factory sits above the sources it chooses among (`source.py` is their
interface and imports none of them).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from keras_elastic.common.file_formats import is_array_record_path
from keras_elastic.data.array_record import ArrayRecordSource
from keras_elastic.data.arrays import ArraySource
from keras_elastic.data.source import DataSource
from keras_elastic.data.tfrecord import TFRecordSource, expand_patterns


def as_source(data: Any, index_dir: str | None = None) -> DataSource:
    """Turns what a user passes to `ElasticDataset` into a `DataSource`.

    Accepts a `DataSource`, a file pattern or a list of patterns (TFRecord
    files; ArrayRecord files when every file matched is named `*.array_record`,
    `*.arrayrecord` or `*.array_record-NNNNN-of-NNNNN`), or a NumPy array /
    tuple / dict of arrays.

    Example:

    >>> import numpy as np
    >>> as_source({"x": np.zeros((4, 2))}).shards()
    [('arrays', 4)]
    >>> from array_record.python.array_record_module import ArrayRecordWriter
    >>> writer = ArrayRecordWriter("train-00000.array_record", "group_size:1")
    >>> writer.write(b"a record")
    >>> writer.close()
    >>> as_source("train-*.array_record")
    <keras_elastic.data.array_record.ArrayRecordSource object at ...>
    """
    if isinstance(data, DataSource):
        return data
    if isinstance(data, (str, bytes)) or (
            isinstance(data, (list, tuple)) and data
            and all(isinstance(p, str) for p in data)):
        files = expand_patterns(data)
        array_records = [f for f in files if is_array_record_path(f)]
        if array_records and len(array_records) == len(files):
            return ArrayRecordSource(files)
        if array_records:
            other = next(f for f in files if not is_array_record_path(f))
            raise ValueError(
                f"the files mix ArrayRecord files ({array_records[0]}) with others "
                f"read as TFRecord ({other}); one dataset reads one format")
        return TFRecordSource(files, index_dir=index_dir)
    leaves = tf.nest.flatten(data)
    if leaves and all(isinstance(x, np.ndarray) or hasattr(x, "__array__")
                      for x in leaves):
        return ArraySource(data)
    raise TypeError(
        "ElasticDataset expects a file pattern, a list of file patterns, NumPy "
        f"arrays (a nest of them) or a keras_elastic.data.DataSource; got "
        f"{type(data).__name__}.")

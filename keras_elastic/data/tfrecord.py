"""TFRecord files as a data source; a task reads only its own record range."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.lib.io import tf_record

from keras_elastic.data.source import DataSource, PerThreadReaders
from keras_elastic.data.tfrecord_index import CorruptRecordError, load_or_build_index


def expand_patterns(patterns: str | Sequence[str]) -> list[str]:
    """Expands file patterns in order; raises `FileNotFoundError` naming a
    pattern that matches nothing."""
    if isinstance(patterns, (str, bytes)):
        patterns = [patterns]
    files: list[str] = []
    for pattern in patterns:
        pattern = os.fspath(pattern)
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else (
            [pattern] if os.path.exists(pattern) else [])
        if not matches:
            raise FileNotFoundError(
                f"no file matches '{pattern}'" + (
                    "" if glob.has_magic(pattern) else " (file not found)"))
        files.extend(m for m in matches if m not in files)
    return files


class TFRecordSource(DataSource):
    """Records of TFRecord files; each file is one shard.

    Builds (and caches) a record-offset index of every file when created, so a
    corrupt file is reported before training starts, naming the file and the
    byte offset of the bad record.

    Example:

    >>> os.makedirs("data")
    >>> for shard in range(2):
    ...     with tf.io.TFRecordWriter(f"data/train-{shard:05d}.tfrecord") as w:
    ...         for i in range(3):
    ...             w.write(f"record {shard}.{i}".encode())
    >>> src = TFRecordSource("data/train-*.tfrecord")
    >>> src.shards()
    [('data/train-00000.tfrecord', 3), ('data/train-00001.tfrecord', 3)]
    >>> src.read(src.shards()[1][0], 1, 3)
    array([b'record 1.1', b'record 1.2'], dtype=object)
    """

    def __init__(self, patterns: str | Sequence[str],
                 index_dir: str | None = None) -> None:
        self._files = expand_patterns(patterns)
        self._offsets = {f: load_or_build_index(f, index_dir) for f in self._files}
        self._readers = PerThreadReaders(tf_record.tf_record_random_reader)

    def shards(self) -> list[tuple[str, int]]:
        return [(f, len(self._offsets[f]) - 1) for f in self._files]

    @property
    def files(self) -> list[str]:
        return list(self._files)

    @property
    def record_spec(self) -> tf.TensorSpec:
        return tf.TensorSpec([], tf.string)

    def _reader(self, path: str):
        return self._readers.get(path)

    def read(self, shard: str, start: int, end: int) -> np.ndarray:
        offsets = self._offsets.get(shard)
        if offsets is None:
            raise KeyError(f"TFRecordSource has no file '{shard}'")
        if not 0 <= start <= end <= len(offsets) - 1:
            raise IndexError(f"{shard}: records [{start}, {end}) out of range "
                             f"(the file has {len(offsets) - 1})")
        reader = self._reader(shard)
        out = np.empty(end - start, dtype=object)
        for i, offset in enumerate(offsets[start:end]):
            try:
                out[i], _ = reader.read(int(offset))
            except (tf.errors.DataLossError, IndexError) as e:
                msg = getattr(e, "message", str(e))
                raise CorruptRecordError(
                    f"{shard}: corrupt record #{start + i} at byte offset {offset}: "
                    f"{msg}") from None
        return out

    def describe(self) -> str:
        return f"{len(self._files)} TFRecord file(s), {self.num_records()} records"

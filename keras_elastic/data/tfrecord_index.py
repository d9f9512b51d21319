"""Record-offset index of a TFRecord file, cached on disk.

A TFRecord file has no index, so reading records `[start, end)` would mean
scanning from the beginning. The index holds the byte offset of every record;
building it reads the file once (checking every record's CRC, so a corrupt
record is found here, with its offset) and caches the result keyed by the
file's path, size and modification time.

Example:

>>> import tensorflow as tf
>>> with tf.io.TFRecordWriter("train-00000.tfrecord") as writer:
...     for i in range(4096):
...         writer.write(b"%d" % i)
>>> offsets = load_or_build_index("train-00000.tfrecord")
>>> len(offsets) - 1   # number of records; the last entry is the file size
4096
>>> int(offsets[-1]) == os.path.getsize("train-00000.tfrecord")
True
"""

from __future__ import annotations

import hashlib
import os
import tempfile

import numpy as np
import tensorflow as tf
from tensorflow.python.lib.io import tf_record

from keras_elastic.common import errors


class CorruptRecordError(errors.DataError, ValueError):
    """A TFRecord file holds a record that fails its checksum or is cut short."""


def default_index_dir() -> str:
    return os.environ.get(
        "KERAS_ELASTIC_INDEX_DIR",
        os.path.join(os.path.expanduser("~"), ".cache", "keras_elastic",
                     "tfrecord_index"))


def _cache_path(path: str, index_dir: str) -> str:
    st = os.stat(path)
    key = f"{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}".encode()
    return os.path.join(index_dir, hashlib.sha1(key).hexdigest() + ".npy")


def build_index(path: str) -> np.ndarray:
    """Scans `path`; returns the offsets of its records followed by the file size."""
    reader = tf_record.tf_record_random_reader(path)
    offsets = []
    offset = 0
    try:
        while True:
            try:
                _, next_offset = reader.read(offset)
            except IndexError:  # clean end of file
                break
            except tf.errors.DataLossError as e:
                raise CorruptRecordError(
                    f"{path}: corrupt record #{len(offsets)} at byte offset {offset}: "
                    f"{e.message}") from None
            offsets.append(offset)
            offset = next_offset
    finally:
        reader.close()
    size = os.path.getsize(path)
    if offset != size:
        raise CorruptRecordError(
            f"{path}: {size - offset} trailing bytes after the last complete record "
            f"(record #{len(offsets)} at byte offset {offset} is cut short)")
    offsets.append(offset)
    return np.asarray(offsets, dtype=np.int64)


def load_or_build_index(path: str, index_dir: str | None = None) -> np.ndarray:
    """Returns the offset index of `path`, from the cache when it is fresh."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"TFRecord file not found: {path}")
    index_dir = index_dir or default_index_dir()
    cache = _cache_path(path, index_dir)
    if os.path.exists(cache):
        try:
            return np.load(cache)
        except (OSError, ValueError):
            pass  # unreadable cache entry: rebuild it
    offsets = build_index(path)
    try:
        os.makedirs(index_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=index_dir, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.save(f, offsets)
        os.replace(tmp, cache)
    except OSError:
        pass  # a read-only cache is not an error: the index is just not kept
    return offsets

"""Data sources: TFRecord offset index, range reads, arrays, bad input."""

import os

import numpy as np
import pytest
import tensorflow as tf
from support.tfrecord_data import make_arrays, write_shards

from keras_elastic.data import ArraySource, TFRecordSource, as_source
from keras_elastic.data.tfrecord_index import CorruptRecordError, build_index


def test_tfrecord_source_reads_exact_ranges(tmp_path):
    x, y = make_arrays(100)
    paths = write_shards(str(tmp_path), x, y, num_shards=3)
    src = TFRecordSource(str(tmp_path / "train-*.tfrecord"))
    assert src.shards() == [(paths[0], 34), (paths[1], 33), (paths[2], 33)]
    records = src.read(paths[1], 5, 9)
    expected = list(tf.data.TFRecordDataset(paths[1]).skip(5).take(4).as_numpy_iterator())
    assert list(records) == expected


def test_index_is_cached_and_rebuilt_when_the_file_changes(tmp_path):
    x, y = make_arrays(20)
    (path,) = write_shards(str(tmp_path / "d"), x, y, 1)
    cache = tmp_path / "index-cache"
    TFRecordSource(path)
    assert len(os.listdir(cache)) == 1
    write_shards(str(tmp_path / "d"), *make_arrays(30), 1)
    assert TFRecordSource(path).shards() == [(path, 30)]


def test_missing_file_and_empty_pattern_are_named(tmp_path):
    with pytest.raises(FileNotFoundError,
                       match=r"no file matches '.*nothing-\*\.tfrecord'"):
        TFRecordSource(str(tmp_path / "nothing-*.tfrecord"))
    with pytest.raises(FileNotFoundError,
                       match=r"'.*absent\.tfrecord' \(file not found\)"):
        TFRecordSource(str(tmp_path / "absent.tfrecord"))


def test_corrupt_record_names_file_record_and_offset(tmp_path):
    x, y = make_arrays(10)
    (path,) = write_shards(str(tmp_path), x, y, 1)
    offsets = build_index(path)
    data = bytearray(open(path, "rb").read())
    data[offsets[4] + 20] ^= 0xFF  # inside record #4's payload
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptRecordError,
                       match=rf"{path}: corrupt record #4 at byte offset {offsets[4]}"):
        TFRecordSource(path)


def test_truncated_file_is_reported(tmp_path):
    x, y = make_arrays(5)
    (path,) = write_shards(str(tmp_path), x, y, 1)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 7)
    with pytest.raises(CorruptRecordError, match=rf"{path}: .*record #4 at byte offset"):
        TFRecordSource(path)


def test_array_source_and_as_source():
    x, y = make_arrays(10)
    src = as_source({"x": x, "y": y})
    assert isinstance(src, ArraySource) and src.shards() == [("arrays", 10)]
    part = src.read("arrays", 3, 6)
    assert np.array_equal(part["x"], x[3:6]) and np.array_equal(part["y"], y[3:6])
    assert src.record_spec["x"] == tf.TensorSpec([8], tf.float32)


def test_array_source_rejects_ragged_lengths():
    with pytest.raises(ValueError, match="different numbers of records: 0: 10, 1: 9"):
        ArraySource((np.zeros((10, 2)), np.zeros(9)))


def test_as_source_rejects_unknown_input():
    with pytest.raises(TypeError, match="got int"):
        as_source(42)

"""Data files checked at launch without TensorFlow (common/file_formats.py):
real TFRecord and ArrayRecord files pass; other formats, damaged files and
mixed formats are named with what is wrong. The CLI side (exit 2, no process
started) is in tests/test_cli.py."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys

import pytest
import tensorflow as tf
from conftest import REPO, subprocess_env
from support.tfrecord_data import make_arrays, write_shards

from keras_elastic.common import file_formats
from keras_elastic.common.file_formats import (
    FileFormatError,
    check_data_files,
    check_tfrecord_file,
)


@pytest.fixture
def tfrecord(tmp_path):
    x, y = make_arrays(file_formats.CHECKED_RECORDS - 14)  # all headers checked
    return write_shards(str(tmp_path / "d"), x, y, 1)[0]


def test_crc32c_is_tfrecords_checksum(tfrecord):
    assert file_formats.crc32c(b"123456789") == 0xE3069283  # the standard check
    with open(tfrecord, "rb") as f:
        header = f.read(12)
    assert file_formats.masked_crc32c(header[:8]) == int.from_bytes(header[8:], "little")


def test_real_tfrecord_files_pass(tfrecord, tmp_path):
    check_tfrecord_file(tfrecord)
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    check_tfrecord_file(str(empty))  # no records
    big = str(tmp_path / "big.tfrecord")  # a first record beyond the data check
    with tf.io.TFRecordWriter(big) as w:
        w.write(os.urandom(file_formats.CHECKED_DATA_BYTES + 10))
        w.write(b"x")
    check_tfrecord_file(big)
    assert check_data_files([tfrecord, big]) == "tfrecord"


def _damaged(tfrecord: str, tmp_path, name: str, edit) -> str:
    data = bytearray(open(tfrecord, "rb").read())
    path = str(tmp_path / name)
    with open(path, "wb") as f:
        f.write(edit(data))
    return path


def test_damaged_and_foreign_files_are_named_with_the_problem(tfrecord, tmp_path):
    size = os.path.getsize(tfrecord)
    first = int.from_bytes(open(tfrecord, "rb").read(8), "little") + 16

    def flip(offset):
        def edit(data):
            data[offset] ^= 0xFF
            return bytes(data)
        return edit

    cases = {
        "cut.tfrecord": (lambda d: bytes(d[:size - 5]),
                         "past the end of the file"),
        "header.tfrecord": (flip(first + 2),
                            "the length header of record #1 (byte offset "
                            f"{first}) fails its CRC-32C"),
        "data.tfrecord": (flip(20), "the data of record #0 fails its CRC-32C"),
        "tail.tfrecord": (lambda d: bytes(d) + b"\0" * 7,
                          "inside the 12-byte record header"),
    }
    for name, (edit, problem) in cases.items():
        path = _damaged(tfrecord, tmp_path, name, edit)
        with pytest.raises(FileFormatError) as e:
            check_tfrecord_file(path)
        assert str(e.value).startswith(f"{path} is not a TFRecord file: "), name
        assert problem in str(e.value), (name, str(e.value))
    foreign = {
        "train.csv": (b"age,label\n31,1\n", "looks like a text file (CSV, JSON"),
        "train.tfrecord.gz": (gzip.compress(open(tfrecord, "rb").read()),
                              "looks like a gzip-compressed file (compressed TFRecord "
                              "files are not read: decompress it"),
        "0.png": (b"\x89PNG\r\n\x1a\n" + os.urandom(64), "looks like a PNG image"),
        "x.npy": (b"\x93NUMPY\x01\x00" + os.urandom(64), "looks like a NumPy .npy file"),
    }
    for name, (content, problem) in foreign.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(FileFormatError) as e:
            check_data_files([tfrecord, str(path)])
        assert f"{path} is not a TFRecord file: it {problem}" in str(e.value), name
        assert "keras-elastic reads TFRecord files" in str(e.value)


def test_array_record_files(tmp_path, tfrecord):
    from array_record.python.array_record_module import ArrayRecordWriter

    good = str(tmp_path / "train-00000.array_record")
    writer = ArrayRecordWriter(good, "group_size:1")
    for i in range(5):
        writer.write(f"record {i}".encode())
    writer.close()
    assert check_data_files([good]) == "array_record"
    fake = tmp_path / "train-00001.array_record"
    fake.write_bytes(open(tfrecord, "rb").read())
    with pytest.raises(FileFormatError, match=f"{fake} is not a readable ArrayRecord "
                       "file"):
        check_data_files([good, str(fake)])
    with pytest.raises(FileFormatError, match="the files mix ArrayRecord files "
                       f"\\({good}\\) with others read as TFRecord \\({tfrecord}\\)"):
        check_data_files([good, tfrecord])


@pytest.mark.multiprocess
def test_the_check_imports_no_tensorflow(tfrecord):
    code = ("import sys\n"
            "from keras_elastic.jobs import job_flags\n"
            "from keras_elastic.common.file_formats import check_data_files\n"
            f"print(check_data_files([{tfrecord!r}]))\n"
            "print('tensorflow' in sys.modules, 'keras' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], env=subprocess_env(),
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["tfrecord", "False", "False"]

"""Which data files a job can read, checked without TensorFlow.

`keras-elastic train | evaluate | predict` checks its data files here before
any process starts (the launcher imports no TensorFlow): every file must be a
TFRecord file, or all of them ArrayRecord files (named `*.array_record`). A
file in another format (a CSV, an image, a gzip-compressed TFRecord, a README
left in a data directory, ...) is named with what is wrong, instead of failing
the workers later.

A TFRecord file is a sequence of records, each
`uint64 length | uint32 masked CRC-32C of length | data | uint32 masked CRC-32C
of data`; `check_tfrecord_file` walks the headers of the first records (and
checks the first record's data) so that another format is caught at once. The
workers still check every record's CRC when they index a file.

Example:

>>> import tensorflow as tf
>>> os.makedirs("data")
>>> with tf.io.TFRecordWriter("data/train-00000.tfrecord") as writer:
...     writer.write(b"a record")
>>> check_tfrecord_file("data/train-00000.tfrecord")
>>> with open("data/README.md", "w") as f:
...     f.write("label,pixels")
12
>>> check_tfrecord_file("data/README.md")
Traceback (most recent call last):
...
keras_elastic.common.file_formats.FileFormatError: data/README.md is not a \
TFRecord file: it looks like a text file (CSV, JSON, ...); ...
"""

from __future__ import annotations

import os
import re
import struct

from keras_elastic.common import errors

# Records whose headers are checked per file, and the largest first record
# whose data CRC is checked (pure Python, about 1 ms per 4 KiB: kept cheap for
# jobs of thousands of files; the header CRCs already tell another format).
CHECKED_RECORDS = 64
CHECKED_DATA_BYTES = 1 << 12

# The names ArrayRecord files go by (keras_elastic.data reads them by this rule too).
_ARRAY_RECORD_SUFFIX = re.compile(r"\.array_?record(-\d+-of-\d+)?$")


class FileFormatError(errors.DataError, ValueError):
    """A data file is not in a format the job can read."""


def is_array_record_path(path: str) -> bool:
    """File names ArrayRecord files go by: `*.array_record`, `*.arrayrecord`,
    TFDS' `*.array_record-00000-of-00004`.

    Example:

    >>> is_array_record_path("mnist-train.array_record-00000-of-00004")
    True
    >>> is_array_record_path("train-00000.tfrecord")
    False
    """
    return bool(_ARRAY_RECORD_SUFFIX.search(os.fspath(path)))


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord files use it.

    Example:

    >>> hex(crc32c(b"123456789"))
    '0xe3069283'
    """
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C of `data`."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _looks_like(head: bytes) -> str | None:
    """What a file that is not a TFRecord file seems to be, from its first bytes."""
    signatures = [
        (b"\x1f\x8b", "a gzip-compressed file (compressed TFRecord files are not "
         "read: decompress it, e.g. with gunzip)"),
        (b"\x28\xb5\x2f\xfd", "a zstd-compressed file (decompress it)"),
        (b"PK\x03\x04", "a zip archive (extract it)"),
        (b"\x89PNG", "a PNG image (write the images into TFRecord files of "
         "tf.train.Example first)"),
        (b"\xff\xd8\xff", "a JPEG image (write the images into TFRecord files of "
         "tf.train.Example first)"),
        (b"\x93NUMPY", "a NumPy .npy file (give the arrays to ke.ElasticDataset in a "
         "script, or write them into TFRecord files)"),
        (b"PAR1", "a Parquet file (convert it to TFRecord files)"),
    ]
    for magic, what in signatures:
        if head.startswith(magic):
            return what
    if head and all(32 <= b < 127 or b in (9, 10, 13) for b in head[:512]):
        return "a text file (CSV, JSON, ...; convert it to TFRecord files)"
    return None


def check_tfrecord_file(path: str) -> None:
    """Raises `FileFormatError` naming `path` and the problem unless the file
    starts like a TFRecord file: the headers of its first `CHECKED_RECORDS`
    records pass their CRC and fit in the file, and the first record's data
    passes its CRC. An empty file (no records) passes.

    Example:

    >>> import tensorflow as tf
    >>> with tf.io.TFRecordWriter("train-00000.tfrecord") as writer:
    ...     writer.write(b"a record")
    >>> check_tfrecord_file("train-00000.tfrecord")
    """
    try:
        size = os.path.getsize(path)
        f = open(path, "rb")
    except OSError as e:
        raise FileFormatError(f"{path} cannot be read: {e.strerror or e}") from None
    with f:
        head = f.read(512)
        f.seek(0)
        offset = 0
        for index in range(CHECKED_RECORDS):
            if offset == size:
                return
            header = f.read(12)
            problem = None
            if len(header) < 12:
                problem = (f"it ends {size - offset} byte(s) after record #{index}'s "
                           "start, inside the 12-byte record header")
            else:
                length, crc = struct.unpack("<QI", header)
                if masked_crc32c(header[:8]) != crc:
                    problem = (f"the length header of record #{index} (byte offset "
                               f"{offset}) fails its CRC-32C")
                elif offset + 16 + length > size:
                    problem = (f"record #{index} (byte offset {offset}) says it holds "
                               f"{length} bytes, past the end of the file ({size} "
                               "bytes): the file is cut short")
            if problem is None and index == 0 and length <= CHECKED_DATA_BYTES:
                data = f.read(length)
                (data_crc,) = struct.unpack("<I", f.read(4))
                if masked_crc32c(data) != data_crc:
                    problem = "the data of record #0 fails its CRC-32C"
            elif problem is None:
                f.seek(length + 4, os.SEEK_CUR)
            if problem is not None:
                what = _looks_like(head) if index == 0 else None
                raise FileFormatError(
                    f"{path} is not a TFRecord file: "
                    + (f"it looks like {what}" if what else problem)
                    + ". keras-elastic reads TFRecord files (ArrayRecord files when "
                    "all are named *.array_record); convert it, or move it out of "
                    "the data directory")
            offset += 16 + length


def check_data_files(files: list[str]) -> str:
    """Checks the files of one dataset; returns their format, `"tfrecord"` or
    `"array_record"`. Raises `FileFormatError` naming the first file that is
    not readable as such (ArrayRecord files are opened with the array_record
    package, which reads their footers; TFRecord files as
    `check_tfrecord_file`), or files that mix the two formats.

    Example:

    >>> import tensorflow as tf
    >>> with tf.io.TFRecordWriter("train-00000.tfrecord") as writer:
    ...     writer.write(b"a record")
    >>> check_data_files(["train-00000.tfrecord"])
    'tfrecord'
    """
    array_records = [f for f in files if is_array_record_path(f)]
    if array_records and len(array_records) != len(files):
        other = next(f for f in files if not is_array_record_path(f))
        raise FileFormatError(
            f"the files mix ArrayRecord files ({array_records[0]}) with others read "
            f"as TFRecord ({other}); one dataset reads one format")
    if not array_records:
        for path in files:
            check_tfrecord_file(path)
        return "tfrecord"
    try:
        from array_record.python import array_record_module
    except ImportError:
        raise FileFormatError(
            f"reading ArrayRecord files ({files[0]}) needs the array-record "
            "package, a requirement of keras-elastic that is missing here: pip "
            "install array-record") from None
    for path in files:
        try:
            reader = array_record_module.ArrayRecordReader(
                os.fspath(path), "readahead_buffer_size:0,max_parallelism:0")
            ok = reader.ok()
            getattr(reader, "close", lambda: None)()
        except (RuntimeError, ValueError, OSError) as e:
            ok, detail = False, f": {e}"
        else:
            detail = ""
        if not ok:
            raise FileFormatError(f"{path} is not a readable ArrayRecord file "
                                  f"(damaged, cut short or another format){detail}")
    return "array_record"

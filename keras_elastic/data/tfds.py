"""A prepared TensorFlow Datasets (TFDS) dataset as a data source.

Reads the dataset's own files, as `builder.download_and_prepare()` (or `tfds
build`) wrote them, in either of TFDS' record formats:

- `file_format="tfrecord"`: the first task of a file in a worker walks the
  file's record headers to find where each record starts (12 bytes read a
  record, no pass over the data, no cache on disk); tasks then read their
  ranges at random through `TFRecordSource`'s reader (CRCs checked);
- `file_format="array_record"`: a task reads its range directly
  (`ArrayRecordSource`).

Shards and their record counts come from the dataset's `dataset_info.json`
(`file_instructions` of the split, so `"train[:80%]"` and `"train+test"` work):
nothing is scanned to cut tasks. Records are the serialized examples; unless
`decode=False`, they are decoded with the builder's features (`decoders=` as in
`tfds.load`) before `dataset_fn` sees them, and `as_supervised=True` makes
them `(input, target)` tuples from the dataset's `supervised_keys`.

Uses `tensorflow-datasets` (and `array_record` for that format), both
installed with keras-elastic. Nothing is downloaded: a dataset that
is not prepared in `data_dir` is an error.

Example:

>>> import numpy as np
>>> import tensorflow_datasets as tfds
>>> class Pairs(tfds.core.GeneratorBasedBuilder, skip_registration=True):
...     VERSION = tfds.core.Version("1.0.0")  # 20 examples: x [i, -i], label i % 2
...     code_path = None                      # defined here, not in a file
...     def _info(self):
...         features = tfds.features.FeaturesDict({
...             "x": tfds.features.Tensor(shape=(2,), dtype=np.float32),
...             "label": tfds.features.ClassLabel(num_classes=2)})
...         return tfds.core.DatasetInfo(builder=self, features=features,
...                                      supervised_keys=("x", "label"))
...     def _split_generators(self, dl_manager):
...         return {"train": self._generate_examples()}
...     def _generate_examples(self):
...         for i in range(20):
...             yield i, {"x": [i, -i], "label": i % 2}
>>> tfds.disable_progress_bar()
>>> Pairs(data_dir="tensorflow_datasets").download_and_prepare()
Downloading and preparing dataset ...
Dataset pairs downloaded and prepared to tensorflow_datasets/pairs/1.0.0. ...
>>> import keras_elastic as ke
>>> train = ke.ElasticDataset.from_tfds(Pairs, split="train",
...                                     data_dir="tensorflow_datasets",
...                                     as_supervised=True, batch_size=4)
>>> train.source.shards()
[('tensorflow_datasets/pairs/1.0.0/pairs-train.tfrecord-00000-of-00001', 20)]
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.lib.io import tf_record

from keras_elastic.data.array_record import ArrayRecordSource
from keras_elastic.data.source import (
    DataSource,
    PerThreadReaders,
    check_range,
    optional_module,
)
from keras_elastic.data.tfrecord import TFRecordSource
from keras_elastic.data.tfrecord_index import CorruptRecordError

FORMATS = ("tfrecord", "array_record")


def _tfds() -> Any:
    return optional_module("tensorflow_datasets", "ElasticDataset.from_tfds",
                           "tensorflow-datasets")


def _is_path(name: str) -> bool:
    """A directory rather than a TFDS name (`name[/config][:version]`)."""
    return name.startswith(("/", "~", ".")) or "://" in name or os.path.isfile(
        os.path.join(name, "dataset_info.json"))


def load_builder(name_or_builder: Any, data_dir: str | None = None) -> Any:
    """A TFDS builder whose prepared files are on disk.

    `name_or_builder`: a registered dataset name (`"mnist"`, `"mnist:3.0.1"`,
    `"name/config"`), a `DatasetBuilder` (instance or class), or the directory
    of a prepared dataset version (`.../mnist/3.0.1`, read without its code).
    A dataset that is not prepared is a `FileNotFoundError` (nothing is
    downloaded).

    Example:

    >>> load_builder("mnist", "tensorflow_datasets")   # not prepared there
    Traceback (most recent call last):
    ...
    FileNotFoundError: TFDS dataset 'mnist' is not prepared in \
tensorflow_datasets/mnist/3.0.1: prepare it first ...
    """
    tfds = _tfds()
    if data_dir is not None:
        data_dir = os.path.expanduser(os.fspath(data_dir))
    if isinstance(name_or_builder, type) and issubclass(
            name_or_builder, tfds.core.DatasetBuilder):
        builder = name_or_builder(data_dir=data_dir)
    elif isinstance(name_or_builder, tfds.core.DatasetBuilder):
        builder = name_or_builder
    elif isinstance(name_or_builder, (str, os.PathLike)):
        name = os.fspath(name_or_builder)
        if _is_path(name):
            path = os.path.expanduser(name)
            if not tf.io.gfile.exists(os.path.join(path, "dataset_info.json")):
                raise FileNotFoundError(
                    f"{path} is not a prepared TFDS dataset version (no "
                    "dataset_info.json there): pass the directory of a prepared "
                    "version (DATA_DIR/NAME/VERSION), or the dataset's name with "
                    "data_dir=DATA_DIR")
            builder = tfds.builder_from_directory(path)
        else:
            builder = _builder_by_name(tfds, name, data_dir)
    else:
        raise TypeError("from_tfds expects a dataset name, a tfds DatasetBuilder or "
                        "the directory of a prepared dataset; got "
                        f"{type(name_or_builder).__name__}")
    info_path = os.path.join(os.fspath(builder.data_dir), "dataset_info.json")
    if not tf.io.gfile.exists(info_path):
        raise FileNotFoundError(
            f"TFDS dataset '{builder.name}' is not prepared in {builder.data_dir}: "
            "prepare it first (builder.download_and_prepare(), or `tfds build`); "
            "keras-elastic reads prepared files and downloads nothing.")
    return builder


def _builder_by_name(tfds: Any, name: str, data_dir: str | None) -> Any:
    where = data_dir or "TFDS' default data_dir"
    try:
        # try_gcs=False: never look for (or download) the public copy.
        return tfds.builder(name, data_dir=data_dir, try_gcs=False)
    except tfds.core.registered.DatasetNotFoundError:
        raise FileNotFoundError(
            f"no TFDS dataset '{name}': it is neither registered in this process "
            "(import the module that defines its builder, or pass the builder) "
            f"nor prepared in {where}") from None
    except AssertionError as e:  # e.g. a version the dataset does not have
        raise ValueError(f"cannot load TFDS dataset '{name}' from {where}: "
                         f"{e}") from None


def file_format(builder: Any) -> str:
    """The record format a prepared TFDS dataset is stored in, one of
    `FORMATS`; another format is a `ValueError`."""
    fmt = getattr(builder.info, "file_format", None)
    value = getattr(fmt, "value", fmt) or "tfrecord"
    if value not in FORMATS:
        raise ValueError(
            f"TFDS dataset '{builder.name}' is stored as {value!r}; keras-elastic "
            f"reads {' and '.join(FORMATS)} (prepare it with file_format="
            "'tfrecord' or 'array_record').")
    return value


def scan_tfrecord_headers(path: str, num_records: int) -> np.ndarray:
    """The byte offsets of the `num_records` records of a TFRecord file,
    followed by the file size (`uint64 length, uint32 crc` before each record:
    one seek and 12 bytes read a record); `CorruptRecordError` naming the
    file and the record if the file does not hold exactly that many records.

    Example:

    >>> with tf.io.TFRecordWriter("train.tfrecord-00000-of-00001") as writer:
    ...     for i in range(3):
    ...         writer.write(b"x" * 298)       # 298 bytes of data, 16 of framing
    >>> scan_tfrecord_headers("train.tfrecord-00000-of-00001", 3)
    array([  0, 314, 628, 942])
    """
    offsets = np.empty(num_records + 1, dtype=np.int64)
    local = "://" not in path
    with (open(path, "rb", buffering=1 << 20) if local  # noqa: SIM115
          else tf.io.gfile.GFile(path, "rb")) as f:
        size = os.path.getsize(path) if local else f.size()
        offset = 0
        for i in range(num_records):
            offsets[i] = offset
            f.seek(offset)
            header = f.read(12)
            if len(header) < 12:
                raise CorruptRecordError(
                    f"{path}: the dataset info says {num_records} records, but the "
                    f"file ends after {i} (byte {offset} of {size})")
            (length,) = struct.unpack("<Q", header[:8])
            offset += length + 16  # header, data, data CRC
            if offset > size:
                raise CorruptRecordError(
                    f"{path}: record #{i} at byte offset {offsets[i]} is cut short or "
                    f"its header is corrupt (length {length}, file size {size})")
    if offset != size:
        raise CorruptRecordError(
            f"{path}: the dataset info says {num_records} records, but "
            f"{size - offset} bytes follow record #{num_records - 1}")
    offsets[num_records] = offset
    return offsets


class _HeaderOffsets(Mapping):
    """`{file: record offsets}` for `TFRecordSource`, each file's offsets
    found by `scan_tfrecord_headers` on first use (once per process)."""

    def __init__(self, counts: Mapping[str, int]) -> None:
        self._counts = dict(counts)
        self._offsets: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def __getitem__(self, path: str) -> np.ndarray:
        num_records = self._counts[path]
        with self._lock:
            if path not in self._offsets:
                self._offsets[path] = scan_tfrecord_headers(path, num_records)
            return self._offsets[path]

    def __iter__(self) -> Iterator[str]:
        return iter(self._counts)

    def __len__(self) -> int:
        return len(self._counts)


class HeaderIndexedTFRecords(TFRecordSource):
    """TFRecord files whose record counts are known (a TFDS dataset's info):
    `TFRecordSource`, with each file's record offsets found by walking its
    record headers when a task first reads it, instead of an index built (and
    cached on disk) for every file up front.

    Example:

    >>> with tf.io.TFRecordWriter("ds-train.tfrecord-00000-of-00001") as writer:
    ...     for i in range(3):
    ...         writer.write(b"record %d" % i)
    >>> src = HeaderIndexedTFRecords({"ds-train.tfrecord-00000-of-00001": 3})
    >>> src.shards()                       # no file read yet
    [('ds-train.tfrecord-00000-of-00001', 3)]
    >>> src.read("ds-train.tfrecord-00000-of-00001", 1, 3)
    array([b'record 1', b'record 2'], dtype=object)
    """

    def __init__(self, counts: Mapping[str, int]) -> None:
        # Not TFRecordSource.__init__: it reads every file to build its index.
        self._files = list(counts)
        self._offsets = _HeaderOffsets(counts)
        self._readers = PerThreadReaders(tf_record.tf_record_random_reader)

    def _reader(self, path: str) -> Any:
        return self._readers.get(path)


class TFDSSource(DataSource):
    """The files of one split of a prepared TFDS dataset.

    A shard is one file instruction of the split: a whole file (named by its
    path) or, for a sliced split, a record range of one (`path[skip:end]`).
    Usually made by `ElasticDataset.from_tfds`.

    Example:

    >>> import numpy as np
    >>> import tensorflow_datasets as tfds
    >>> class Pairs(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    ...     VERSION = tfds.core.Version("1.0.0")  # 20 examples: x [i, -i], label i % 2
    ...     code_path = None                      # defined here, not in a file
    ...     def _info(self):
    ...         features = tfds.features.FeaturesDict({
    ...             "x": tfds.features.Tensor(shape=(2,), dtype=np.float32),
    ...             "label": tfds.features.ClassLabel(num_classes=2)})
    ...         return tfds.core.DatasetInfo(builder=self, features=features,
    ...                                      supervised_keys=("x", "label"))
    ...     def _split_generators(self, dl_manager):
    ...         return {"train": self._generate_examples()}
    ...     def _generate_examples(self):
    ...         for i in range(20):
    ...             yield i, {"x": [i, -i], "label": i % 2}
    >>> tfds.disable_progress_bar()
    >>> Pairs(data_dir="tensorflow_datasets").download_and_prepare()
    Downloading and preparing dataset ...
    Dataset pairs downloaded and prepared to tensorflow_datasets/pairs/1.0.0. ...
    >>> builder = load_builder(Pairs, "tensorflow_datasets")
    >>> src = TFDSSource(builder, "train[:10%]", as_supervised=True)
    >>> src.shards()
    [('.../pairs-train.tfrecord-00000-of-00001[0:2]', 2)]
    """

    def __init__(self, builder: Any, split: str = "train", decode: bool = True,
                 as_supervised: bool = False, decoders: Any = None) -> None:
        self.builder = builder
        self.split = split
        self.format = file_format(builder)
        self.decode_records = bool(decode)
        self.as_supervised = bool(as_supervised)
        self.decoders = decoders
        if as_supervised and not decode:
            raise ValueError("as_supervised=True needs decode=True (it picks decoded "
                             "features)")
        if as_supervised and not builder.info.supervised_keys:
            raise ValueError(f"TFDS dataset '{builder.name}' has no supervised_keys: "
                             "as_supervised=True cannot apply")
        try:
            instructions = builder.info.splits[split].file_instructions
        except (KeyError, ValueError) as e:
            raise ValueError(
                f"TFDS dataset '{builder.name}' has no split {split!r} (it has "
                f"{sorted(builder.info.splits)}): {e}") from None
        # shard name -> (file, first record, number of records)
        self._shards: dict[str, tuple[str, int, int]] = {}
        counts: dict[str, int] = {}  # file -> records in the file
        for fi in instructions:
            filename = os.fspath(fi.filename)
            total = int(fi.examples_in_shard)
            skip = int(fi.skip)
            take = total - skip if fi.take in (-1, None) else int(fi.take)
            name = filename if (skip, take) == (0, total) else (
                f"{filename}[{skip}:{skip + take}]")
            base, k = name, 1
            while name in self._shards:  # the same range twice ("train+train")
                k += 1
                name = f"{base}#{k}"
            self._shards[name] = (filename, skip, take)
            counts[filename] = total
        missing = [f for f in counts if "://" not in f and not os.path.exists(f)]
        if missing:
            raise FileNotFoundError(
                f"TFDS dataset '{builder.name}' in {builder.data_dir} is incomplete: "
                f"{len(missing)} file(s) of split {split!r} are missing, e.g. "
                f"{missing[0]}; prepare it again")
        self._files: DataSource = (ArrayRecordSource.with_counts(counts)
                                   if self.format == "array_record"
                                   else HeaderIndexedTFRecords(counts))

    def shards(self) -> list[tuple[str, int]]:
        return [(name, take) for name, (_, _, take) in self._shards.items()]

    @property
    def record_spec(self) -> tf.TensorSpec:
        return tf.TensorSpec([], tf.string)

    def read(self, shard: str, start: int, end: int) -> np.ndarray:
        path, skip, take = self._shards.get(shard, (None, 0, None))
        check_range(f"TFDS split '{self.split}' of '{self.builder.name}'", shard, take,
                    start, end)
        return self._files.read(path, skip + start, skip + end)

    def decode(self, records: tf.data.Dataset) -> tf.data.Dataset:
        """Serialized examples -> the builder's features (a dict, or `(input,
        target)` with `as_supervised`); unchanged with `decode=False`."""
        if not self.decode_records:
            return records
        features = self.builder.info.features
        decoders = self.decoders

        def decode_one(serialized):
            return features.deserialize_example(serialized, decoders=decoders)

        decoded = records.map(decode_one, num_parallel_calls=tf.data.AUTOTUNE,
                              deterministic=True)
        if self.as_supervised:
            keys = self.builder.info.supervised_keys
            decoded = decoded.map(
                lambda ex: tf.nest.map_structure(lambda k: ex[k], keys))
        return decoded

    def describe(self) -> str:
        return (f"TFDS '{self.builder.name}' split '{self.split}' ({self.format}, "
                f"{len(self._shards)} shard(s), {self.num_records()} records)")

"""CIFAR-10 data for the example and the benchmark: TFDS when prepared, else synthetic.

Two sources of records:

- `tfds_train_files(data_dir)`: the TFRecord files of tensorflow-datasets'
  "cifar10" train split, when TFDS is installed *and* the dataset is already
  prepared under `data_dir` (nothing is ever downloaded). Their records are
  TFDS-encoded (a PNG "image", an int64 "label"); `tfds_parse` decodes one into
  the model's input.
- `write_synthetic(...)`: CIFAR-shaped synthetic TFRecords in ElasticDL's layout
  ("image": 32x32x3 floats in 0..255, "label": one int64), for machines without
  the real data. Each class has its own random template, blurred by noise, so
  a model can learn something.

Example:

```python
files = write_synthetic("/tmp/cifar10_synthetic", num_records=8192)
train = ke.ElasticDataset(files, dataset_fn=model.dataset_fn, batch_size=128)
```
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
from absl import logging

IMAGE_SHAPE = (32, 32, 3)
NUM_CLASSES = 10


def synthetic_paths(output_dir: str, num_records: int, num_shards: int) -> list[str]:
    return [os.path.join(output_dir, f"synthetic-{num_records}-{i:05d}-of-"
                                     f"{num_shards:05d}.tfrecord")
            for i in range(num_shards)]


def _serialize(image: np.ndarray, label: int) -> bytes:
    import tensorflow as tf

    feature = {
        "image": tf.train.Feature(float_list=tf.train.FloatList(value=image.ravel())),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    }
    return tf.train.Example(
        features=tf.train.Features(feature=feature)).SerializeToString()


def _write_shard(path: str, images: np.ndarray, labels: np.ndarray) -> None:
    import tensorflow as tf

    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path),
                               prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    os.close(fd)
    os.chmod(tmp, 0o644)
    try:
        with tf.io.TFRecordWriter(tmp) as writer:
            for image, label in zip(images, labels):
                writer.write(_serialize(image, label))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_synthetic(output_dir: str, num_records: int, num_shards: int = 2,
                    seed: int = 0, overwrite: bool = False) -> list[str]:
    """Writes `num_records` CIFAR-shaped examples to `num_shards` TFRecord files.

    Idempotent: complete existing files are kept unless `overwrite`; every
    file is written under a temporary name and renamed. Returns the paths.

    Example:

    ```python
    files = write_synthetic("/tmp/cifar10_synthetic", num_records=1024)
    ```
    """
    if not isinstance(num_records, int) or num_records < 1:
        raise ValueError(f"write_synthetic: num_records must be a positive integer, "
                         f"got {num_records!r}")
    if not isinstance(num_shards, int) or not 1 <= num_shards <= num_records:
        raise ValueError(f"write_synthetic: num_shards must be within [1, num_records="
                         f"{num_records}], got {num_shards!r}")
    os.makedirs(output_dir, exist_ok=True)
    paths = synthetic_paths(output_dir, num_records, num_shards)
    if not overwrite and all(os.path.exists(p) for p in paths):
        logging.info("synthetic CIFAR-10: %d records already in %s", num_records,
                     output_dir)
        return paths
    rng = np.random.default_rng(seed)
    templates = rng.uniform(0, 255, size=(NUM_CLASSES, *IMAGE_SHAPE))
    bounds = np.linspace(0, num_records, num_shards + 1).astype(int)
    for i, path in enumerate(paths):
        n = bounds[i + 1] - bounds[i]
        labels = rng.integers(0, NUM_CLASSES, size=n)
        noise = rng.uniform(0, 255, size=(n, *IMAGE_SHAPE))
        images = np.round(0.5 * templates[labels] + 0.5 * noise).astype(np.float32)
        _write_shard(path, images, labels)
    logging.info("synthetic CIFAR-10: wrote %d records to %d shards in %s",
                 num_records, num_shards, output_dir)
    return paths


def tfds_train_files(data_dir: str | None) -> tuple[list[str], object] | None:
    """The prepared TFDS cifar10 train split's TFRecord files and features, or None.

    Never downloads: returns None (and logs why) when tensorflow-datasets is
    not installed, the dataset is not prepared under `data_dir`, or it is
    stored in a format other than TFRecord.
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        logging.info("tensorflow-datasets is not installed: no real CIFAR-10 data")
        return None
    try:
        builder = tfds.builder("cifar10", data_dir=data_dir)
    except Exception as e:  # noqa: BLE001 - TFDS raises many kinds here
        logging.info("TFDS has no usable cifar10 builder under %s: %s", data_dir, e)
        return None
    info_file = os.path.join(builder.data_dir, "dataset_info.json")
    if not os.path.exists(info_file):
        logging.info("TFDS cifar10 is not prepared under %s (no %s); this example "
                     "never downloads it", data_dir or "the default TFDS dir", info_file)
        return None
    file_format = str(getattr(builder.info, "file_format", "tfrecord") or "tfrecord")
    if "tfrecord" not in file_format.lower():
        logging.info("TFDS cifar10 under %s is stored as %s, not TFRecord",
                     builder.data_dir, file_format)
        return None
    split = builder.info.splits["train"]
    files = [os.path.join(builder.data_dir, f) for f in split.filenames]
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        logging.info("TFDS cifar10 under %s lacks %d of its train files (first: %s)",
                     builder.data_dir, len(missing), missing[0])
        return None
    return files, builder.info.features


def make_tfds_parse(features) -> object:
    """`parse(record, mode)` for TFDS-encoded cifar10 records (`features` from
    `tfds_train_files`)."""
    import tensorflow as tf

    def parse(record, mode):
        example = features.deserialize_example(record)
        image = {"image": tf.cast(example["image"], tf.float32) / 255.0}
        if mode == "prediction":
            return image
        return image, tf.reshape(tf.cast(example["label"], tf.int32), [1])

    return parse

"""Writes scikit-learn's handwritten digits to TFRecord shards.

The data is the real UCI handwritten digits set that ships with scikit-learn
(`sklearn.datasets.load_digits`: 1797 images of 8x8 pixels, 16 grey levels),
split with a fixed seed into a training part and a validation part. Every
record is a `tf.train.Example` with

- "image": 64 floats, the pixels scaled to [0, 1];
- "label": one int64, the digit.

Files: `train-00000-of-0000N.tfrecord` ... and `validation-00000-of-0000M.tfrecord`
in `--output_dir`. The script is idempotent (it leaves complete existing files
alone unless `--overwrite`) and writes every file under a temporary name first,
so a reader (or a second worker preparing the same data) never sees half a
file.

Example:

```
python examples/digits/prepare_data.py --output_dir /tmp/digits --num_shards 2
```
"""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile

import numpy as np
from absl import app, flags, logging

DEFAULT_DIR = os.path.join(tempfile.gettempdir(), "keras_elastic_examples", "digits")
NUM_PIXELS = 64
NUM_CLASSES = 10
VALIDATION_FRACTION = 0.2
SPLIT_SEED = 20190724  # fixed: every worker and every run get the same split


def shard_paths(output_dir: str, split: str, num_shards: int) -> list[str]:
    """The file names of one split's shards."""
    return [os.path.join(output_dir, f"{split}-{i:05d}-of-{num_shards:05d}.tfrecord")
            for i in range(num_shards)]


def file_pattern(data_dir: str, split: str) -> str:
    """A glob matching every shard of `split` ("train" or "validation")."""
    return os.path.join(data_dir, f"{split}-*-of-*.tfrecord")


def load_split(seed: int = SPLIT_SEED) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The digits as `{"train": (images, labels), "validation": (...)}`.

    Images are float32 `(n, 64)` in [0, 1]; labels int64 `(n,)`. The split is
    stratified by digit and fixed by `seed`.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.data / 16.0).astype(np.float32)  # pixels are 0..16
    labels = digits.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    train_idx, val_idx = [], []
    for digit in range(NUM_CLASSES):
        idx = rng.permutation(np.flatnonzero(labels == digit))
        n_val = int(round(len(idx) * VALIDATION_FRACTION))
        val_idx.extend(idx[:n_val])
        train_idx.extend(idx[n_val:])
    train_idx = rng.permutation(np.asarray(train_idx))
    val_idx = rng.permutation(np.asarray(val_idx))
    return {"train": (images[train_idx], labels[train_idx]),
            "validation": (images[val_idx], labels[val_idx])}


def _example(image: np.ndarray, label: int) -> bytes:
    import tensorflow as tf

    feature = {
        "image": tf.train.Feature(float_list=tf.train.FloatList(value=image.tolist())),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    }
    return tf.train.Example(
        features=tf.train.Features(feature=feature)).SerializeToString()


def _write_atomically(path: str, images: np.ndarray, labels: np.ndarray) -> None:
    import tensorflow as tf

    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.",
                               suffix=".tmp")
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp creates 0600; the shards are ordinary data files
    try:
        with tf.io.TFRecordWriter(tmp) as writer:
            for image, label in zip(images, labels):
                writer.write(_example(image, label))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def prepare(output_dir: str = DEFAULT_DIR, num_shards: int = 2,
            overwrite: bool = False) -> dict[str, list[str]]:
    """Writes the train and validation shards; returns their paths per split.

    A split whose shards all exist is skipped unless `overwrite`. The
    validation split gets `min(num_shards, 2)` shards (it is small).

    Example:

    ```python
    paths = prepare("/tmp/digits", num_shards=2)
    paths["train"]   # ['/tmp/digits/train-00000-of-00002.tfrecord', ...]
    ```
    """
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"prepare_data: --num_shards must be a positive integer, "
                         f"got {num_shards!r}")
    os.makedirs(output_dir, exist_ok=True)
    splits = None
    written: dict[str, list[str]] = {}
    for split, shards in (("train", num_shards), ("validation", min(num_shards, 2))):
        paths = shard_paths(output_dir, split, shards)
        written[split] = paths
        stale = sorted(set(glob.glob(file_pattern(output_dir, split))) - set(paths))
        if not overwrite and not stale and all(os.path.exists(p) for p in paths):
            logging.info("prepare_data: %s split already in %s (%d shards), skipping",
                         split, output_dir, shards)
            continue
        if splits is None:
            splits = load_split()
        images, labels = splits[split]
        if len(images) < shards:
            raise ValueError(f"prepare_data: the {split} split has {len(images)} "
                             f"examples, fewer than --num_shards={shards}")
        for i, path in enumerate(paths):
            _write_atomically(path, images[i::shards], labels[i::shards])
        for path in stale:  # shards of an earlier --num_shards would double the data
            logging.info("prepare_data: removing %s (another --num_shards)", path)
            with contextlib.suppress(FileNotFoundError):  # another worker did it
                os.remove(path)
        logging.info("prepare_data: wrote %d %s examples to %d shards in %s",
                     len(images), split, shards, output_dir)
    return written


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    prepare(FLAGS.output_dir, FLAGS.num_shards, FLAGS.overwrite)


FLAGS = flags.FLAGS

if __name__ == "__main__":
    flags.DEFINE_string("output_dir", DEFAULT_DIR, "Where to write the TFRecord shards.")
    flags.DEFINE_integer("num_shards", 2, "Number of training shards.")
    flags.DEFINE_bool("overwrite", False, "Rewrite shards that already exist.")
    app.run(main)

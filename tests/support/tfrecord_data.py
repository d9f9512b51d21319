"""Small real TFRecord datasets for tests: (x, y) examples in shards."""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

NUM_FEATURES = 8


def make_arrays(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, NUM_FEATURES)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int64")
    return x, y


def write_shards(directory: str, x: np.ndarray, y: np.ndarray, num_shards: int,
                 prefix: str = "train") -> list[str]:
    """Writes consecutive slices of (x, y) to `num_shards` TFRecord files."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i, idx in enumerate(np.array_split(np.arange(len(x)), num_shards)):
        path = os.path.join(directory, f"{prefix}-{i:05d}.tfrecord")
        with tf.io.TFRecordWriter(path) as w:
            for j in idx:
                w.write(tf.train.Example(features=tf.train.Features(feature={
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=x[j])),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[y[j]])),
                })).SerializeToString())
        paths.append(path)
    return paths


FEATURES = {"x": tf.io.FixedLenFeature([NUM_FEATURES], tf.float32),
            "y": tf.io.FixedLenFeature([], tf.int64)}


def parse(record):
    e = tf.io.parse_single_example(record, FEATURES)
    return e["x"], e["y"]


def dataset_fn(records, mode):
    return records.map(parse)

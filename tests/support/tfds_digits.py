"""scikit-learn's digits as a TFDS dataset and as plain ArrayRecord files.

`KeDigits` is a `tfds` `GeneratorBasedBuilder` over the digits split of
examples/digits (the same images and labels): "image" 64 floats in [0, 1],
"label" a class label; supervised keys (image, label). `prepare` writes it
into a data_dir in either TFDS file format, offline (nothing to download, no
GCS). `write_array_record` writes serialized `tf.train.Example`s in the
examples/digits format (its `model_def.dataset_fn` parses them) to plain
ArrayRecord files.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "examples", "digits"))
import prepare_data  # noqa: E402


class KeDigits(tfds.core.GeneratorBasedBuilder):
    """The digits (1437 training, 360 validation examples)."""

    VERSION = tfds.core.Version("1.0.0")
    # This file, where TFDS looks for a checksums.tsv beside the builder. TFDS
    # finds it by itself for a top-level module, but for one in a package
    # (support.tfds_digits) it goes through the `importlib_resources` package,
    # which TFDS does not require and this environment lacks.
    code_path = epath.Path(__file__)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Tensor(shape=(64,), dtype=np.float32),
                "label": tfds.features.ClassLabel(num_classes=10),
            }),
            supervised_keys=("image", "label"))

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        return {"train": self._generate_examples("train"),
                "validation": self._generate_examples("validation")}

    def _generate_examples(self, split):
        images, labels = prepare_data.load_split()[split]
        for i, (image, label) in enumerate(zip(images, labels)):
            yield i, {"image": image, "label": int(label)}


def prepare(data_dir: str, file_format: str, num_shards: int = 3) -> KeDigits:
    """Prepares KeDigits under `data_dir` (offline); returns the builder."""
    builder = KeDigits(data_dir=data_dir, file_format=file_format)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
        try_download_gcs=False, num_shards=num_shards))
    return builder


def write_array_record(directory: str, split: str, num_shards: int) -> list[str]:
    """The split's examples (examples/digits' tf.train.Example format) in
    `num_shards` ArrayRecord files."""
    from array_record.python.array_record_module import ArrayRecordWriter

    images, labels = prepare_data.load_split()[split]
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i, idx in enumerate(np.array_split(np.arange(len(images)), num_shards)):
        path = os.path.join(directory, f"{split}-{i:05d}.array_record")
        writer = ArrayRecordWriter(path, "group_size:1")
        for j in idx:
            writer.write(prepare_data._example(images[j], int(labels[j])))
        writer.close()
        paths.append(path)
    return paths

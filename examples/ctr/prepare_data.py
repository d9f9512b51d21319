"""Writes synthetic, Criteo-shaped click data to TFRecord shards.

Every record is a `tf.train.Example` with

- "dense": 13 floats (standardized numeric features);
- "cat": 26 int64 ids, one per categorical field, in [0, NUM_IDS);
- "label": one int64, 1 for a click.

How it is made (all from `--seed`, vectorized NumPy):

- Categorical field f has its own vocabulary of `FIELD_SIZES[f]` raw
  categories (10 to 100,000); a record draws each field's category from a
  Zipf-like distribution (P(rank r) proportional to (r + 1) ** -ZIPF_EXPONENT),
  so a few categories are frequent and most are rare, as in real logs.
- The id of (field, category) is a stable integer hash (splitmix64) of the
  pair into one id space of NUM_IDS ids shared by all fields: what a model
  with a single hashed embedding table sees. Different pairs may collide.
- The label is drawn from a known logistic model,
  `logit = bias + dense_weights . dense + sum_f field_weights[f][category_f]`.
  Half the categories have a zero weight, the others a normal one whose
  scale falls with the category's rank (rare categories matter less); the
  bias gives a click rate of about 25 %. The true model's AUC is about 0.82.

Files in `--output_dir`: `train-00000-of-0000N.tfrecord` ...,
`validation-00000-of-00001.tfrecord`, `true_prob-validation.npy` (the true
click probability of every validation record, in record order: the best any
model can do, e.g. its AUC) and `metadata.json` (the flags and the true
model's validation AUC, written last). The script leaves complete data made
with the same flags alone unless `--overwrite`, and writes every file under a
temporary name first, so a reader (or a second worker preparing the same
data) never sees half a file.

Example:

```
python examples/ctr/prepare_data.py --output_dir /tmp/ctr --num_train 200000
```
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import os
import tempfile
from dataclasses import dataclass

import numpy as np
from absl import app, flags, logging

DEFAULT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
NUM_DENSE = 13
NUM_FIELDS = 26
NUM_IDS = 1_000_000  # the shared (hashed) id space of the 26 fields
# Vocabulary size of each categorical field: 10 to 100,000 on a geometric scale.
FIELD_SIZES = (5248, 44, 832, 30, 7586, 1202, 15849, 10, 47863, 10965, 398, 191, 132,
               14, 69183, 1738, 2512, 91, 3631, 63, 100000, 33113, 21, 22909, 275, 575)
ZIPF_EXPONENT = 1.4
# The true model: the weight of a category is nonzero for NONZERO_FRACTION of
# the categories, drawn from N(0, (FIELD_SCALE / (1 + rank / HEAD_RANKS))**2):
# the rarer the category, the smaller (a model learns it from fewer records).
NONZERO_FRACTION = 0.5
FIELD_SCALE = 0.5
HEAD_RANKS = 10.0
DENSE_SCALE = 0.3  # dense weights: N(0, DENSE_SCALE**2), about 30 % set to 0
CLICK_RATE = 0.25
FORMAT_VERSION = 1  # in metadata.json: data of another version is rewritten

TRUE_PROB_FILE = "true_prob-validation.npy"
METADATA_FILE = "metadata.json"


def shard_paths(output_dir: str, split: str, num_shards: int) -> list[str]:
    """The file names of one split's shards."""
    return [os.path.join(output_dir, f"{split}-{i:05d}-of-{num_shards:05d}.tfrecord")
            for i in range(num_shards)]


def file_pattern(data_dir: str, split: str) -> str:
    """A glob matching every shard of `split` ("train" or "validation")."""
    return os.path.join(data_dir, f"{split}-*-of-*.tfrecord")


# -- the data --------------------------------------------------------------
def hash_ids(fields: np.ndarray, categories: np.ndarray,
             num_ids: int = NUM_IDS) -> np.ndarray:
    """The shared id of each (field, category) pair: splitmix64 of the pair,
    modulo `num_ids`. Stable across runs, machines and NumPy versions.

    >>> hash_ids(np.array([0, 1]), np.array([7, 7])).tolist()
    [374487, 192863]
    """
    x = (np.asarray(fields, np.uint64) << np.uint64(32)) | np.asarray(categories,
                                                                       np.uint64)
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(num_ids)).astype(np.int64)


@functools.cache
def _category_cdf(size: int) -> np.ndarray:
    p = np.arange(1, size + 1, dtype=np.float64) ** -ZIPF_EXPONENT
    return np.cumsum(p / p.sum())


@dataclass(frozen=True)
class TrueModel:
    """The logistic model the labels are drawn from."""

    bias: float
    dense_weights: np.ndarray          # (NUM_DENSE,)
    field_weights: tuple[np.ndarray, ...]  # NUM_FIELDS arrays, one per category

    def logits(self, dense: np.ndarray, categories: np.ndarray) -> np.ndarray:
        """`dense` (n, NUM_DENSE), raw `categories` (n, NUM_FIELDS) -> (n,)."""
        logit = self.bias + dense.astype(np.float64) @ self.dense_weights
        for f, weights in enumerate(self.field_weights):
            logit += weights[categories[:, f]]
        return logit


def true_model(seed: int) -> TrueModel:
    """The true model of `--seed`: weights drawn from a seeded RNG, the bias
    set for a click rate of CLICK_RATE."""
    rng = np.random.default_rng([seed, 0])
    dense_weights = rng.normal(0.0, DENSE_SCALE, NUM_DENSE)
    dense_weights[rng.random(NUM_DENSE) < 0.3] = 0.0  # some features are noise
    field_weights = []
    for size in FIELD_SIZES:
        scale = FIELD_SCALE / (1.0 + np.arange(size) / HEAD_RANKS)
        nonzero = rng.random(size) < NONZERO_FRACTION
        field_weights.append(rng.normal(0.0, 1.0, size) * scale * nonzero)
    model = TrueModel(0.0, dense_weights, tuple(field_weights))
    # The bias: bisection on a sample for the mean probability CLICK_RATE.
    dense, categories = _features(np.random.default_rng([seed, 9]), 50_000)
    logits = model.logits(dense, categories)
    low, high = -10.0, 10.0
    for _ in range(50):
        mid = (low + high) / 2
        if np.mean(1.0 / (1.0 + np.exp(-(logits + mid)))) < CLICK_RATE:
            low = mid
        else:
            high = mid
    return TrueModel((low + high) / 2, dense_weights, tuple(field_weights))


def _features(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    dense = rng.standard_normal((n, NUM_DENSE)).astype(np.float32)
    categories = np.empty((n, NUM_FIELDS), np.int64)
    for f, size in enumerate(FIELD_SIZES):
        cdf = _category_cdf(size)
        categories[:, f] = np.minimum(np.searchsorted(cdf, rng.random(n)), size - 1)
    return dense, categories


def generate(model: TrueModel, seed: int, split: str, n: int) -> dict[str, np.ndarray]:
    """`n` records of `split`: {"dense", "cat" (hashed ids), "label",
    "true_prob"}. Each split has its own random stream, so the validation data
    does not depend on --num_train."""
    rng = np.random.default_rng([seed, {"train": 1, "validation": 2}[split]])
    dense, categories = _features(rng, n)
    true_prob = 1.0 / (1.0 + np.exp(-model.logits(dense, categories)))
    label = (rng.random(n) < true_prob).astype(np.int64)
    ids = hash_ids(np.broadcast_to(np.arange(NUM_FIELDS), categories.shape), categories)
    return {"dense": dense, "cat": ids, "label": label, "true_prob": true_prob}


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """The area under the ROC curve (ties count one half), NumPy only.

    >>> roc_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8]))
    0.75
    """
    labels = np.asarray(labels).astype(bool)
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]  # 1-based, ties averaged
    positives = int(labels.sum())
    negatives = len(labels) - positives
    return float((ranks[labels].sum() - positives * (positives + 1) / 2.0)
                 / (positives * negatives))


# -- the files -------------------------------------------------------------
def _serialized(records: dict[str, np.ndarray]):
    from tensorflow.core.example import example_pb2

    for dense, ids, label in zip(records["dense"].tolist(), records["cat"].tolist(),
                                 records["label"].tolist()):
        example = example_pb2.Example()
        feature = example.features.feature
        feature["dense"].float_list.value.extend(dense)
        feature["cat"].int64_list.value.extend(ids)
        feature["label"].int64_list.value.append(label)
        yield example.SerializeToString()


@contextlib.contextmanager
def _atomic(path: str):
    """Yields a temporary name beside `path`, renamed to `path` on success."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.",
                               suffix=".tmp")
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp creates 0600; these are ordinary data files
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _write_shard(path: str, records: dict[str, np.ndarray]) -> None:
    import tensorflow as tf

    with _atomic(path) as tmp, tf.io.TFRecordWriter(tmp) as writer:
        for record in _serialized(records):
            writer.write(record)


def read_metadata(data_dir: str) -> dict | None:
    """The data's metadata.json (flags, true AUC), or None if there is none."""
    try:
        with open(os.path.join(data_dir, METADATA_FILE)) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def prepare(output_dir: str = DEFAULT_DIR, num_train: int = 200_000,
            num_validation: int = 20_000, num_shards: int = 4, seed: int = 0,
            overwrite: bool = False) -> dict[str, list[str]]:
    """Writes the train and validation shards (unless data made with the same
    arguments is there); returns their paths per split.

    Example:

    ```python
    paths = prepare("/tmp/ctr", num_train=60_000, num_validation=10_000)
    paths["validation"]   # ['/tmp/ctr/validation-00000-of-00001.tfrecord']
    ```
    """
    for name, value, low in (("num_shards", num_shards, 1),
                             ("num_train", num_train, num_shards),
                             ("num_validation", num_validation, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"prepare_data: --{name} must be an integer >= {low}, "
                             f"got {value!r}")
    os.makedirs(output_dir, exist_ok=True)
    paths = {"train": shard_paths(output_dir, "train", num_shards),
             "validation": shard_paths(output_dir, "validation", 1)}
    wanted = {"version": FORMAT_VERSION, "num_train": num_train,
              "num_validation": num_validation, "num_shards": num_shards, "seed": seed}
    metadata = read_metadata(output_dir)
    files = [*paths["train"], *paths["validation"],
             os.path.join(output_dir, TRUE_PROB_FILE)]
    if (not overwrite and metadata is not None
            and {k: metadata.get(k) for k in wanted} == wanted
            and all(os.path.exists(p) for p in files)):
        logging.info("prepare_data: data already in %s, skipping", output_dir)
        return paths

    model = true_model(seed)
    train = generate(model, seed, "train", num_train)
    for path, part in zip(paths["train"], np.array_split(np.arange(num_train),
                                                         num_shards)):
        _write_shard(path, {k: v[part] for k, v in train.items()})
    validation = generate(model, seed, "validation", num_validation)
    _write_shard(paths["validation"][0], validation)
    with _atomic(os.path.join(output_dir, TRUE_PROB_FILE)) as tmp, open(tmp, "wb") as f:
        np.save(f, validation["true_prob"])
    for split in ("train", "validation"):  # shards of other flags would add data
        for path in sorted(set(glob.glob(file_pattern(output_dir, split)))
                           - set(paths[split])):
            logging.info("prepare_data: removing %s (other flags)", path)
            with contextlib.suppress(FileNotFoundError):  # another worker did it
                os.remove(path)
    true_auc = roc_auc(validation["label"], validation["true_prob"])
    with _atomic(os.path.join(output_dir, METADATA_FILE)) as tmp, open(tmp, "w") as f:
        json.dump({**wanted, "num_ids": NUM_IDS,
                   "train_click_rate": float(train["label"].mean()),
                   "validation_click_rate": float(validation["label"].mean()),
                   "true_validation_auc": true_auc}, f, indent=1)
    logging.info("prepare_data: wrote %d train records (%d shards) and %d validation "
                 "records to %s; click rate %.3f, true model's validation AUC %.4f",
                 num_train, num_shards, num_validation, output_dir,
                 train["label"].mean(), true_auc)
    return paths


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    prepare(FLAGS.output_dir, FLAGS.num_train, FLAGS.num_validation, FLAGS.num_shards,
            FLAGS.seed, FLAGS.overwrite)


FLAGS = flags.FLAGS

if __name__ == "__main__":
    flags.DEFINE_string("output_dir", DEFAULT_DIR, "Where to write the TFRecord shards.")
    flags.DEFINE_integer("num_train", 200_000, "Training records.")
    flags.DEFINE_integer("num_validation", 20_000, "Validation records.")
    flags.DEFINE_integer("num_shards", 4, "Training shards.")
    flags.DEFINE_integer("seed", 0, "Seed of the true model and of the records.")
    flags.DEFINE_bool("overwrite", False, "Rewrite the data even if it exists.")
    app.run(main)

"""A model with dense, padded variable-length and sparse inputs, trained
elastically with per-component batching (`keras_elastic.batching`).

Each record has 4 dense features, a variable-length list of token ids (padded
per batch to 12) and a sparse multi-hot vector of 16 features (batched as one
`SparseTensor` of dense shape [batch, 16], which `Dataset.padded_batch`
cannot do). The label depends on all three.

```
python examples/mixed_inputs/train.py --epochs 4
keras-elastic run --num_workers 2 -- python examples/mixed_inputs/train.py
```
"""

from __future__ import annotations

import json
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf
from absl import app, flags

import keras_elastic as ke
import keras_elastic.batching as kb

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", os.path.join(tempfile.gettempdir(),
                                             "keras_elastic_examples", "mixed"),
                    "Where the TFRecord shards are (written if missing).")
flags.DEFINE_integer("num_records", 4096, "Records to generate.")
flags.DEFINE_integer("epochs", 4, "Passes over the data.")
flags.DEFINE_integer("batch_size", 64, "Elements per batch.")
flags.DEFINE_string("output", None, "Write final metrics here (JSON, worker 0).")

MAX_TOKENS, VOCAB, NUM_SPARSE = 12, 50, 16


def write_data(directory: str, num_records: int, num_shards: int = 2) -> str:
    """Synthetic records whose label is learnable from all three inputs."""
    pattern = os.path.join(directory, "mixed-*.tfrecord")
    if tf.io.gfile.glob(pattern):
        return pattern
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    weights = rng.normal(size=VOCAB)
    sparse_weights = rng.normal(size=NUM_SPARSE)
    for shard, ids in enumerate(np.array_split(np.arange(num_records), num_shards)):
        path = os.path.join(directory, f"mixed-{shard:05d}.tfrecord")
        tmp = path + ".tmp"
        with tf.io.TFRecordWriter(tmp) as writer:
            for _ in ids:
                dense = rng.normal(size=4).astype(np.float32)
                tokens = rng.integers(1, VOCAB, size=rng.integers(1, MAX_TOKENS + 1))
                active = rng.choice(NUM_SPARSE, size=rng.integers(1, 5), replace=False)
                score = dense[0] + weights[tokens].mean() + sparse_weights[active].sum()
                feature = {
                    "dense": tf.train.Feature(float_list=tf.train.FloatList(value=dense)),
                    "tokens": tf.train.Feature(int64_list=tf.train.Int64List(
                        value=tokens)),
                    "active": tf.train.Feature(int64_list=tf.train.Int64List(
                        value=np.sort(active))),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(
                        value=[int(score > 0)])),
                }
                writer.write(tf.train.Example(features=tf.train.Features(
                    feature=feature)).SerializeToString())
        os.replace(tmp, path)
    return pattern


SPEC = {"dense": tf.io.FixedLenFeature([4], tf.float32),
        "tokens": tf.io.VarLenFeature(tf.int64),
        "active": tf.io.VarLenFeature(tf.int64),
        "label": tf.io.FixedLenFeature([], tf.int64)}


def parse(record):
    e = tf.io.parse_single_example(record, SPEC)
    active = e["active"].values
    features = {
        "numeric": e["dense"],
        "tokens": e["tokens"].values,  # variable length
        "active": tf.SparseTensor(tf.expand_dims(active, 1),
                                  tf.ones_like(active, tf.float32), [NUM_SPARSE]),
    }
    return features, e["label"]


def dataset_fn(records, mode):
    return records.map(parse)


# One reducer per component: dense as Dataset.batch would, tokens padded to a
# fixed length, the sparse vector batched to one SparseTensor [batch, 16].
BATCHING = ({"numeric": None, "tokens": kb.padded([MAX_TOKENS]),
             "active": kb.padded_sparse([NUM_SPARSE])}, None)


def build_model() -> keras.Model:
    numeric = keras.Input((4,), name="numeric")
    tokens = keras.Input((MAX_TOKENS,), dtype="int64", name="tokens")
    active = keras.Input((NUM_SPARSE,), sparse=True, name="active")
    embedded = keras.layers.Embedding(VOCAB, 8, mask_zero=True)(tokens)
    pooled = keras.layers.GlobalAveragePooling1D()(embedded)
    sparse_part = keras.layers.Dense(8)(active)
    h = keras.layers.Concatenate()([numeric, pooled, sparse_part])
    h = keras.layers.Dense(32, activation="relu")(h)
    outputs = keras.layers.Dense(1, activation="sigmoid")(h)
    model = ke.Model({"numeric": numeric, "tokens": tokens, "active": active}, outputs)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                  metrics=["accuracy"])
    return model


def main(argv):
    del argv
    keras.utils.set_random_seed(0)
    pattern = write_data(FLAGS.data_dir, FLAGS.num_records)
    train = ke.ElasticDataset(pattern, dataset_fn=dataset_fn, batch_size=FLAGS.batch_size,
                              minibatches_per_task=8, batching=BATCHING)
    model = build_model()
    history = model.fit(train, epochs=FLAGS.epochs, verbose=2)
    accuracy = history.history["accuracy"][-1]
    print(f"training accuracy after {FLAGS.epochs} epochs: {accuracy:.4f}", flush=True)
    if FLAGS.output and os.environ.get("KERAS_ELASTIC_WORKER_ID", "0") == "0":
        with open(FLAGS.output, "w") as f:
            json.dump({k: [float(x) for x in v] for k, v in history.history.items()}, f)


if __name__ == "__main__":
    app.run(main)

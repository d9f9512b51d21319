"""The click-through-rate model (a DeepFM) and its `dataset_fn`: a `--model_def` module.

Used by `train.py`, and by the ElasticDL-style jobs without a script:

```
keras-elastic train --model_def=examples.ctr.model_def:custom_model ...
```

The 26 categorical ids of a record share one id space (`prepare_data.NUM_IDS`,
a million ids) and two tables that live on the parameter servers
(`ke.layers.Embedding`): the first-order weights (one float per id) and the
factors (EMBEDDING_DIM floats per id) of the factorization machine and of the
deep part. A server creates a row when its id is first looked up, and updates
only the rows of each step (row-wise Adagrad).
"""

from __future__ import annotations

import keras
import tensorflow as tf

import keras_elastic as ke

NUM_DENSE = 13
NUM_FIELDS = 26
NUM_IDS = 1_000_000  # as prepare_data.NUM_IDS
EMBEDDING_DIM = 8
DENSE_UNITS = 16
HIDDEN_UNITS = (64, 32)
LEARNING_RATE = 0.2

FEATURES = {
    "dense": tf.io.FixedLenFeature([NUM_DENSE], tf.float32),
    "cat": tf.io.FixedLenFeature([NUM_FIELDS], tf.int64),
    "label": tf.io.FixedLenFeature([], tf.int64),
}


def parse_example(record: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """One serialized `tf.train.Example` -> `({"dense", "cat"}, label)`."""
    example = tf.io.parse_single_example(record, FEATURES)
    features = {"dense": example["dense"], "cat": example["cat"]}
    return features, tf.cast(example["label"], tf.float32)


def dataset_fn(records: tf.data.Dataset, mode: str) -> tf.data.Dataset:
    """Raw records of one task -> unbatched elements: `(features, label)` for
    training and evaluation, `features` for prediction."""
    elements = records.map(parse_example, num_parallel_calls=tf.data.AUTOTUNE)
    if mode == "prediction":
        return elements.map(lambda features, label: features)
    return elements


@keras.saving.register_keras_serializable(package="ctr")
class SumOverFields(keras.layers.Layer):
    """(batch, fields, 1) -> (batch, 1): the sum of the first-order weights."""

    def call(self, inputs):
        return keras.ops.sum(inputs, axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2])


@keras.saving.register_keras_serializable(package="ctr")
class FactorizationMachine(keras.layers.Layer):
    """(batch, fields, k) -> (batch, 1): the sum over all pairs of fields of the
    dot products of their factors, `((sum v)^2 - sum v^2) / 2` summed over k."""

    def call(self, inputs):
        square_of_sum = keras.ops.square(keras.ops.sum(inputs, axis=1))
        sum_of_squares = keras.ops.sum(keras.ops.square(inputs), axis=1)
        return 0.5 * keras.ops.sum(square_of_sum - sum_of_squares, axis=1, keepdims=True)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], 1)


# Admission and a row bound on the tables (ke.layers.Embedding's keywords):
# an id gets rows once seen in 2 training batches (ids seen once, most of a
# Zipf tail, stay on the initializer's row and cost no memory), and each
# table keeps at most MAX_ROWS rows over the servers, the least recently used
# removed past it. See docs/embeddings.md, "Memory per row, and sizing".
ADMIT_AFTER = 2
MAX_ROWS = 500_000


def custom_model(learning_rate: float = LEARNING_RATE,
                 embedding_dim: int = EMBEDDING_DIM, admit_after: int = ADMIT_AFTER,
                 max_rows: int | None = MAX_ROWS) -> keras.Model:
    """A DeepFM: first-order terms + factorization machine + MLP, summed into
    the logit of a click.

    - First order: one weight per id (a `ke.layers.Embedding` of dim 1) summed
      over the 26 fields, plus a linear term of the dense features.
    - Second order: the factorization machine over the factors of the 26
      fields (one shared `ke.layers.Embedding` of dim `embedding_dim`).
    - Deep: an MLP over the same factors and the dense features (through a
      small Dense layer first).

    Compiled with Adagrad, which the parameter servers apply row-wise to the
    tables. (The servers' row-wise optimizers refuse weight_decay, clipnorm,
    clipvalue, global_clipnorm, use_ema and loss_scale_factor: leave them unset.)
    """
    layers = keras.layers
    dense = keras.Input((NUM_DENSE,), name="dense")
    ids = keras.Input((NUM_FIELDS,), dtype="int64", name="cat")

    limits = {"admit_after": admit_after, "max_rows": max_rows}
    weights = ke.layers.Embedding(NUM_IDS, 1, embeddings_initializer="zeros",
                                  name="first_order", **limits)(ids)
    first_order = layers.Add(name="first_order_sum")([
        SumOverFields(name="sum_over_fields")(weights),
        layers.Dense(1, name="dense_linear")(dense)])

    factors = ke.layers.Embedding(NUM_IDS, embedding_dim, name="factors",
                                  **limits)(ids)
    second_order = FactorizationMachine(name="fm")(factors)

    deep = layers.Concatenate(name="deep_input")([
        layers.Flatten(name="flat_factors")(factors),
        layers.Dense(DENSE_UNITS, activation="relu", name="dense_features")(dense)])
    for i, units in enumerate(HIDDEN_UNITS):
        deep = layers.Dense(units, activation="relu", name=f"deep_{i}")(deep)
    deep = layers.Dense(1, name="deep_logit")(deep)

    logit = layers.Add(name="logit")([first_order, second_order, deep])
    click = layers.Activation("sigmoid", name="click")(logit)
    model = keras.Model({"dense": dense, "cat": ids}, click, name="deepfm")
    model.compile(optimizer=keras.optimizers.Adagrad(learning_rate),
                  loss="binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    return model

"""ElasticDL's CIFAR-10 model (`model_zoo/cifar10/cifar10_functional_api.py`).

The model of seed 000's performance study: three blocks of two 3x3
convolutions (32, 64, 128 filters), each followed by batch normalization
(epsilon 1e-6, momentum 0.9) and ReLU, then 2x2 max pooling and dropout (0.2,
0.3, 0.4); flatten; a dense layer of 10 units. As in ElasticDL the last layer
emits logits and the loss applies the softmax
(`sparse_softmax_cross_entropy_with_logits` there,
`SparseCategoricalCrossentropy(from_logits=True)` here); the optimizer is SGD
with learning rate 0.1.

Records follow ElasticDL's layout: a `tf.train.Example` with "image" (32x32x3
floats, 0..255) and "label" (one int64). `dataset_fn` parses them into
`({"image": image / 255}, label)` and, in training mode, shuffles within a
1024-element buffer, as ElasticDL's `dataset_fn` does (seeded here: exactly-once
training replays a task through `dataset_fn` and needs the same order).

Example:

```python
import keras_elastic as ke
import model as cifar10

model = ke.wrap(cifar10.custom_model())
model.compile(optimizer=cifar10.optimizer(), loss=cifar10.loss(),
              metrics=["accuracy"])
train = ke.ElasticDataset("data/cifar10/train-*.tfrecord",
                          dataset_fn=cifar10.dataset_fn,
                          batch_size=128, minibatches_per_task=32)
model.fit(train, epochs=1)
```
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

IMAGE_SHAPE = (32, 32, 3)
NUM_CLASSES = 10
SHUFFLE_BUFFER = 1024
SHUFFLE_SEED = 1


def _conv_bn_relu(x, filters: int):
    x = keras.layers.Conv2D(filters, kernel_size=(3, 3), padding="same", use_bias=True,
                            activation=None)(x)
    x = keras.layers.BatchNormalization(epsilon=1e-06, axis=-1, momentum=0.9)(x)
    return keras.layers.Activation(tf.nn.relu)(x)


def custom_model() -> keras.Model:
    """ElasticDL's `cifar10_functional_api.custom_model`, in Keras 3.

    Input: `{"image": float32 [batch, 32, 32, 3]}` in [0, 1]. Output: logits
    `[batch, 10]`.

    Example:

    ```python
    model = custom_model()
    model({"image": np.zeros((2, 32, 32, 3), "float32")}).shape   # (2, 10)
    ```
    """
    inputs = keras.layers.Input(shape=IMAGE_SHAPE, name="image")
    x = inputs
    for filters, dropout in ((32, 0.2), (64, 0.3), (128, 0.4)):
        x = _conv_bn_relu(x, filters)
        x = _conv_bn_relu(x, filters)
        x = keras.layers.MaxPooling2D(pool_size=(2, 2))(x)
        x = keras.layers.Dropout(dropout)(x)
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(NUM_CLASSES, name="output")(x)
    # A dict of inputs (ElasticDL passes the bare tensor) so that Keras 3 matches the
    # `{"image": ...}` features of `dataset_fn` by name, without a warning.
    return keras.Model(inputs={"image": inputs}, outputs=outputs, name="cifar10_model")


def loss() -> keras.losses.Loss:
    """Softmax cross-entropy on the model's logits (ElasticDL's `loss`)."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def optimizer(learning_rate: float = 0.1) -> keras.optimizers.Optimizer:
    """ElasticDL's optimizer: plain SGD, learning rate 0.1."""
    return keras.optimizers.SGD(learning_rate)


def feature_description(mode: str) -> dict[str, tf.io.FixedLenFeature]:
    features = {"image": tf.io.FixedLenFeature(IMAGE_SHAPE, tf.float32)}
    if mode != "prediction":
        features["label"] = tf.io.FixedLenFeature([1], tf.int64)
    return features


def parse_data(record: tf.Tensor, mode: str):
    """One serialized example -> `{"image": image / 255}` (and the label)."""
    r = tf.io.parse_single_example(record, feature_description(mode))
    features = {"image": tf.math.divide(tf.cast(r["image"], tf.float32), 255.0)}
    if mode == "prediction":
        return features
    return features, tf.cast(r["label"], tf.int32)


def make_dataset_fn(shuffle_buffer: int = SHUFFLE_BUFFER,
                    parse: Callable | None = None) -> Callable:
    """Returns a `dataset_fn(records, mode)` for `ke.ElasticDataset`.

    Args:
        shuffle_buffer: elements of the training-mode shuffle buffer (0: none).
        parse: `parse(record, mode)` for one record; default: `parse_data`
            (ElasticDL's record layout).

    Example:

    ```python
    fn = make_dataset_fn(shuffle_buffer=0)
    elements = fn(tf.data.TFRecordDataset(files), "evaluation")
    ```
    """
    if shuffle_buffer < 0:
        raise ValueError(f"make_dataset_fn: shuffle_buffer must be >= 0, got "
                         f"{shuffle_buffer}")
    parse = parse or parse_data

    def dataset_fn(records: tf.data.Dataset, mode: str) -> tf.data.Dataset:
        dataset = records.map(lambda r: parse(r, mode),
                              num_parallel_calls=tf.data.AUTOTUNE)
        if mode == "training" and shuffle_buffer:
            # Seeded: a task's elements come out in the same order every time,
            # which exactly-once training needs to replay a task after a
            # failure (docs/exactly_once.md). The task order and the records
            # within a task still change per epoch (ElasticDataset shuffle=True).
            dataset = dataset.shuffle(buffer_size=shuffle_buffer, seed=SHUFFLE_SEED)
        return dataset

    return dataset_fn


dataset_fn = make_dataset_fn()

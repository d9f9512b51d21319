"""Mirrors keras-io examples/keras_recipes/antirectifier.py ("Simple custom layer
example: Antirectifier").

Keras features exercised:
- a custom `keras.layers.Layer` (`Antirectifier`) with its own `__init__`
  (an initializer argument), `build` creating a weight with `add_weight`,
  `call` in TensorFlow ops, and `get_config` for serialization;
- a `keras.Sequential` model mixing it with `Dense` and `Dropout`;
- `compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
  optimizer=keras.optimizers.RMSprop(...),
  metrics=[keras.metrics.SparseCategoricalAccuracy()])`: loss, optimizer and
  metric objects instead of strings;
- `fit(x, y, batch_size=128, epochs=..., validation_split=0.15)` on NumPy arrays;
- `evaluate(x_test, y_test)` on NumPy arrays.

Data: instead of MNIST, scikit-learn's digits upsampled to 28x28 and flattened
to 784 floats (tests/keras_io/example_data.py). 10 epochs instead of 20, and
RMSprop's learning rate 2.5e-4 instead of its default 1e-3: with 10 batches an
epoch, the default's steps make the validation accuracy jump between 0.65 and
0.97 from one epoch to the next (the final figure then depends on luck).

Prints one line `RESULT {json}` at the end.
"""
# ruff: noqa: I001

import json

import keras
import tensorflow as tf
from keras import layers

from example_data import load_mnist_like

keras.utils.set_random_seed(1337)


class Antirectifier(layers.Layer):
    """Centers its input, then concatenates the positive part and the negated
    negative part (twice the features) and projects back to the input's size."""

    def __init__(self, initializer="he_normal", **kwargs):
        super().__init__(**kwargs)
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape):
        output_dim = input_shape[-1]
        self.kernel = self.add_weight(shape=(output_dim * 2, output_dim),
                                      initializer=self.initializer, name="kernel",
                                      trainable=True)

    def call(self, inputs):
        centered = inputs - tf.reduce_mean(inputs, axis=-1, keepdims=True)
        both = tf.concat([tf.nn.relu(centered), tf.nn.relu(-centered)], axis=-1)
        return tf.matmul(both, self.kernel)

    def get_config(self):
        config = super().get_config()
        config["initializer"] = keras.initializers.serialize(self.initializer)
        return config


batch_size = 128
num_classes = 10
epochs = 10

(x_train, y_train), (x_test, y_test) = load_mnist_like()
x_train = x_train.reshape(-1, 784).astype("float32") / 255
x_test = x_test.reshape(-1, 784).astype("float32") / 255
print(len(x_train), "train samples,", len(x_test), "test samples")



def build_model():
    return keras.Sequential(
        [
            keras.Input(shape=(784,)),
            layers.Dense(256),
            Antirectifier(),
            layers.Dense(256),
            Antirectifier(),
            layers.Dropout(0.5),
            layers.Dense(num_classes),
        ]
    )


model = build_model()
model.compile(
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    optimizer=keras.optimizers.RMSprop(learning_rate=2.5e-4),
    metrics=[keras.metrics.SparseCategoricalAccuracy()],
)
history = model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs,
                    validation_split=0.15, verbose=2)
test_loss, test_accuracy = model.evaluate(x_test, y_test, verbose=0)

result = {
    "test_loss": float(test_loss),
    "test_accuracy": float(test_accuracy),
    "loss": float(history.history["loss"][-1]),
    "val_sparse_categorical_accuracy": float(
        history.history["val_sparse_categorical_accuracy"][-1]),
    "epochs_run": len(history.history["loss"]),
}
print("RESULT " + json.dumps(result), flush=True)

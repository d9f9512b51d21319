"""Mirrors keras-io examples/vision/mnist_convnet.py ("Simple MNIST convnet").

Keras features exercised:
- a `keras.Sequential` convnet: `keras.Input`, `Conv2D`, `MaxPooling2D`,
  `Flatten`, `Dropout`, `Dense` with softmax;
- one-hot labels (`keras.utils.to_categorical`) and
  `compile(loss="categorical_crossentropy", optimizer="adam",
  metrics=["accuracy"])`;
- `fit(x, y, batch_size=..., epochs=..., validation_split=0.1)` on NumPy arrays;
- `evaluate(x_test, y_test)` on NumPy arrays, its list of [loss, accuracy].

Data: instead of downloading MNIST, scikit-learn's bundled digits upsampled to
28x28 uint8 (tests/keras_io/example_data.py); 1500 training, 297 test images.
Batches of 64 and 10 epochs instead of 128 and 15.

Prints one line `RESULT {json}` at the end.
"""
# ruff: noqa: I001

import json

import keras
import keras_elastic as ke
import numpy as np
from keras import layers

from example_data import load_mnist_like

keras.utils.set_random_seed(1337)

# Model / data parameters.
num_classes = 10
input_shape = (28, 28, 1)

(x_train, y_train), (x_test, y_test) = load_mnist_like()
# Pixels to [0, 1], one channel.
x_train = np.expand_dims(x_train.astype("float32") / 255, -1)
x_test = np.expand_dims(x_test.astype("float32") / 255, -1)
print("x_train shape:", x_train.shape, "-", len(x_test), "test samples")

# Class vectors to one-hot matrices.
y_train = keras.utils.to_categorical(y_train, num_classes)
y_test = keras.utils.to_categorical(y_test, num_classes)


def build_convnet():
    return keras.Sequential(
        [
            keras.Input(shape=input_shape),
            layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Flatten(),
            layers.Dropout(0.5),
            layers.Dense(num_classes, activation="softmax"),
        ]
    )


model = ke.wrap(build_convnet())
model.summary()

batch_size = 64
epochs = 10

model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
history = model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs,
                    validation_split=0.1, verbose=2)

score = model.evaluate(x_test, y_test, verbose=0)
print("Test loss:", score[0])
print("Test accuracy:", score[1])

result = {
    "test_loss": float(score[0]),
    "test_accuracy": float(score[1]),
    "loss": float(history.history["loss"][-1]),
    "val_accuracy": float(history.history["val_accuracy"][-1]),
    "epochs_run": len(history.history["loss"]),
}
print("RESULT " + json.dumps(result), flush=True)

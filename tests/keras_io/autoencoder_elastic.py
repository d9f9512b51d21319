"""Mirrors keras-io examples/vision/autoencoder.py ("Convolutional Autoencoder
For Image Denoising").

Keras features exercised:
- a functional convolutional autoencoder: `Input`, `Conv2D` (relu, sigmoid),
  `MaxPooling2D(padding="same")`, `UpSampling2D`, built with
  `keras.models.Model(input, output)`;
- `compile(optimizer="adam", loss="binary_crossentropy")` without metrics;
- `fit(x=images, y=images, epochs=..., batch_size=128, shuffle=True,
  validation_data=(test_images, test_images))`: the input is its own target;
- a second `fit` of the same model (noisy images -> clean images, validation on
  noisy -> clean test images), as keras-io retrains it for denoising;
- `predict` on the test images after each fit.

Data: instead of MNIST, scikit-learn's digits upsampled to 28x28
(tests/keras_io/example_data.py); noise as keras-io adds it (factor 0.4,
clipped to [0, 1]) from a seeded generator. 3 + 3 epochs instead of 50 + 100.

Prints one line `RESULT {json}` at the end.
"""
# ruff: noqa: I001

import json

import keras
import keras_elastic as ke
import numpy as np
from keras.layers import Conv2D, Input, MaxPooling2D, UpSampling2D
from keras.models import Model

from example_data import load_mnist_like

keras.utils.set_random_seed(1337)
rng = np.random.default_rng(1337)


def preprocess(array):
    """uint8 images to float32 in [0, 1], shape (n, 28, 28, 1)."""
    return np.reshape(array.astype("float32") / 255.0, (len(array), 28, 28, 1))


def add_noise(array):
    noisy = array + 0.4 * rng.normal(loc=0.0, scale=1.0, size=array.shape)
    return np.clip(noisy, 0.0, 1.0).astype("float32")


(train_data, _), (test_data, _) = load_mnist_like()
train_data = preprocess(train_data)
test_data = preprocess(test_data)
noisy_train_data = add_noise(train_data)
noisy_test_data = add_noise(test_data)


def build_autoencoder():
    inputs = Input(shape=(28, 28, 1))
    # Encoder.
    x = Conv2D(32, (3, 3), activation="relu", padding="same")(inputs)
    x = MaxPooling2D((2, 2), padding="same")(x)
    x = Conv2D(32, (3, 3), activation="relu", padding="same")(x)
    x = MaxPooling2D((2, 2), padding="same")(x)
    # Decoder.
    x = Conv2D(32, (3, 3), activation="relu", padding="same")(x)
    x = UpSampling2D((2, 2))(x)
    x = Conv2D(32, (3, 3), activation="relu", padding="same")(x)
    x = UpSampling2D((2, 2))(x)
    outputs = Conv2D(1, (3, 3), activation="sigmoid", padding="same")(x)
    return Model(inputs, outputs)


autoencoder = ke.wrap(build_autoencoder())
autoencoder.compile(optimizer="adam", loss="binary_crossentropy")
autoencoder.summary()

# 1. Reconstruct the images.
history = autoencoder.fit(
    x=train_data,
    y=train_data,
    epochs=3,
    batch_size=128,
    shuffle=True,
    validation_data=(test_data, test_data),
    verbose=2,
)
predictions = autoencoder.predict(test_data, verbose=0)
reconstruction_mse = float(np.mean((predictions - test_data) ** 2))

# 2. Retrain the same model to denoise: noisy in, clean out.
denoise_history = autoencoder.fit(
    x=noisy_train_data,
    y=train_data,
    epochs=3,
    batch_size=128,
    shuffle=True,
    validation_data=(noisy_test_data, test_data),
    verbose=2,
)
predictions = autoencoder.predict(noisy_test_data, verbose=0)
denoised_mse = float(np.mean((predictions - test_data) ** 2))
noisy_mse = float(np.mean((noisy_test_data - test_data) ** 2))

result = {
    "loss": float(history.history["loss"][-1]),
    "val_loss": float(history.history["val_loss"][-1]),
    "reconstruction_mse": reconstruction_mse,
    "denoise_loss": float(denoise_history.history["loss"][-1]),
    "denoise_val_loss": float(denoise_history.history["val_loss"][-1]),
    "denoise_best_val_loss": float(min(denoise_history.history["val_loss"])),
    "denoised_mse": denoised_mse,
    "noisy_mse": noisy_mse,
    "epochs_run": len(history.history["loss"]) + len(denoise_history.history["loss"]),
}
print("RESULT " + json.dumps(result), flush=True)

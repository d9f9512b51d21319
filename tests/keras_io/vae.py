"""Mirrors keras-io examples/generative/vae.py ("Variational AutoEncoder").

Keras features exercised:
- a custom layer (`Sampling`, a `keras.layers.Layer` drawing epsilon with
  `keras.random.normal` and a `SeedGenerator`);
- two functional models (encoder with three outputs: z_mean, z_log_var, z;
  decoder with `Dense`, `Reshape`, `Conv2DTranspose`) held by a subclassed
  `keras.Model` (`VAE`) that overrides `train_step` with a
  `tf.GradientTape`, its own loss (binary cross-entropy reconstruction + KL
  divergence) and `self.optimizer.apply_gradients`, tracks three
  `keras.metrics.Mean` loss trackers listed in its `metrics` property, and
  defines `call`;
- `compile(optimizer=keras.optimizers.Adam())` without a loss;
- `fit(x, epochs=..., batch_size=128)` on NumPy images without targets.

Data: instead of MNIST (70000 images), scikit-learn's digits upsampled to 28x28
(1797 images; tests/keras_io/example_data.py). 6 epochs instead of 30.

Prints one line `RESULT {json}` at the end.
"""
# ruff: noqa: I001

import json

import keras
import numpy as np
import tensorflow as tf
from keras import layers

from example_data import load_mnist_like

keras.utils.set_random_seed(1337)


class Sampling(layers.Layer):
    """Draws z ~ N(z_mean, exp(z_log_var)) with the reparametrization trick."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        epsilon = keras.random.normal(shape=tf.shape(z_mean), seed=self.seed_generator)
        return z_mean + tf.exp(0.5 * z_log_var) * epsilon


latent_dim = 2

encoder_inputs = keras.Input(shape=(28, 28, 1))
h = layers.Conv2D(32, 3, activation="relu", strides=2, padding="same")(encoder_inputs)
h = layers.Conv2D(64, 3, activation="relu", strides=2, padding="same")(h)
h = layers.Flatten()(h)
h = layers.Dense(16, activation="relu")(h)
z_mean = layers.Dense(latent_dim, name="z_mean")(h)
z_log_var = layers.Dense(latent_dim, name="z_log_var")(h)
z = Sampling()([z_mean, z_log_var])
encoder = keras.Model(encoder_inputs, [z_mean, z_log_var, z], name="encoder")

latent_inputs = keras.Input(shape=(latent_dim,))
h = layers.Dense(7 * 7 * 64, activation="relu")(latent_inputs)
h = layers.Reshape((7, 7, 64))(h)
h = layers.Conv2DTranspose(64, 3, activation="relu", strides=2, padding="same")(h)
h = layers.Conv2DTranspose(32, 3, activation="relu", strides=2, padding="same")(h)
decoder_outputs = layers.Conv2DTranspose(1, 3, activation="sigmoid", padding="same")(h)
decoder = keras.Model(latent_inputs, decoder_outputs, name="decoder")


class VAE(keras.Model):
    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.decoder = decoder
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
        self.reconstruction_loss_tracker = keras.metrics.Mean(name="reconstruction_loss")
        self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [self.total_loss_tracker, self.reconstruction_loss_tracker,
                self.kl_loss_tracker]

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = self.decoder(z)
            per_pixel = keras.losses.binary_crossentropy(data, reconstruction)
            reconstruction_loss = tf.reduce_mean(tf.reduce_sum(per_pixel, axis=(1, 2)))
            kl = -0.5 * (1 + z_log_var - tf.square(z_mean) - tf.exp(z_log_var))
            kl_loss = tf.reduce_mean(tf.reduce_sum(kl, axis=1))
            total_loss = reconstruction_loss + kl_loss
        grads = tape.gradient(total_loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.total_loss_tracker.update_state(total_loss)
        self.reconstruction_loss_tracker.update_state(reconstruction_loss)
        self.kl_loss_tracker.update_state(kl_loss)
        return {
            "loss": self.total_loss_tracker.result(),
            "reconstruction_loss": self.reconstruction_loss_tracker.result(),
            "kl_loss": self.kl_loss_tracker.result(),
        }

    def call(self, x):
        z_mean, z_log_var, z = self.encoder(x)
        return self.decoder(z)


(x_train, _), (x_test, _) = load_mnist_like()
digits = np.concatenate([x_train, x_test], axis=0)
digits = np.expand_dims(digits, -1).astype("float32") / 255

vae = VAE(encoder, decoder)
vae.compile(optimizer=keras.optimizers.Adam())
history = vae.fit(digits, epochs=6, batch_size=128, verbose=2)

# Reconstruction of a few images through the trained model (z_mean's decoding).
z_mean_test, _, _ = vae.encoder.predict(digits[:256], verbose=0)
decoded = vae.decoder.predict(z_mean_test, verbose=0)
reconstruction_mse = float(np.mean((decoded - digits[:256]) ** 2))

result = {
    "loss": float(history.history["loss"][-1]),
    "reconstruction_loss": float(history.history["reconstruction_loss"][-1]),
    "kl_loss": float(history.history["kl_loss"][-1]),
    "first_epoch_loss": float(history.history["loss"][0]),
    "reconstruction_mse": reconstruction_mse,
    "epochs_run": len(history.history["loss"]),
}
print("RESULT " + json.dumps(result), flush=True)

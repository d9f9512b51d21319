"""Mirrors the end-to-end GAN of keras-io guides/custom_train_step_in_tensorflow.py
("Customizing what happens in `fit()` with TensorFlow", "Wrapping up: an
end-to-end GAN example").

Keras features exercised:
- two `keras.Sequential` models: a discriminator (`Conv2D` strided,
  `LeakyReLU(negative_slope=0.2)`, `GlobalMaxPooling2D`, `Dense(1)` logits) and a
  generator (`Dense`, `LeakyReLU`, `Reshape`, `Conv2DTranspose`, `Conv2D` sigmoid);
- a subclassed `keras.Model` (`GAN`) holding both, with its own
  `compile(d_optimizer, g_optimizer, loss_fn)` signature that calls
  `super().compile()` and keeps two `keras.optimizers.Adam` optimizers and a
  `keras.losses.BinaryCrossentropy(from_logits=True)`;
- its own `train_step`: latent vectors from `keras.random.normal` with a
  `keras.random.SeedGenerator`, noisy labels, one `tf.GradientTape` and
  `d_optimizer.apply` for the discriminator, then one for the generator
  through the frozen discriminator and `g_optimizer.apply`;
- its own `keras.metrics.Mean` trackers (d_loss, g_loss) in a `metrics` property;
- `fit` on a `tf.data.Dataset` of images only (no targets): as in the guide,
  `Dataset.from_tensor_slices(images).shuffle(1024).batch(64)` and
  `gan.fit(dataset.take(n), epochs=1)`. The guide fits a tf.data.Dataset, so
  this script keeps one (not NumPy arrays).

Changes for runtime: 32 filters where the guide has 64/128 (same layers, same
shapes: 28x28x1 images, a 7x7 map upsampled twice), latent_dim 64 instead of
128, 24 batches instead of 100. Data: instead of MNIST, scikit-learn's digits
upsampled to 28x28 (tests/keras_io/example_data.py).

Prints one line `RESULT {json}` with the final d_loss and g_loss.
"""
# ruff: noqa: I001

import json

import keras
import keras_elastic as ke
import numpy as np
import tensorflow as tf
from keras import layers

from example_data import load_mnist_like

keras.utils.set_random_seed(1337)

discriminator = keras.Sequential(
    [
        keras.Input(shape=(28, 28, 1)),
        layers.Conv2D(32, (3, 3), strides=(2, 2), padding="same"),
        layers.LeakyReLU(negative_slope=0.2),
        layers.Conv2D(32, (3, 3), strides=(2, 2), padding="same"),
        layers.LeakyReLU(negative_slope=0.2),
        layers.GlobalMaxPooling2D(),
        layers.Dense(1),
    ],
    name="discriminator",
)

latent_dim = 64
generator = keras.Sequential(
    [
        keras.Input(shape=(latent_dim,)),
        # 7 * 7 * 32 coefficients, reshaped into a 7x7x32 map.
        layers.Dense(7 * 7 * 32),
        layers.LeakyReLU(negative_slope=0.2),
        layers.Reshape((7, 7, 32)),
        layers.Conv2DTranspose(32, (4, 4), strides=(2, 2), padding="same"),
        layers.LeakyReLU(negative_slope=0.2),
        layers.Conv2DTranspose(32, (4, 4), strides=(2, 2), padding="same"),
        layers.LeakyReLU(negative_slope=0.2),
        layers.Conv2D(1, (7, 7), padding="same", activation="sigmoid"),
    ],
    name="generator",
)


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
        self.seed_generator = keras.random.SeedGenerator(1337)

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn

    def train_step(self, real_images):
        if isinstance(real_images, tuple):
            real_images = real_images[0]
        batch_size = tf.shape(real_images)[0]

        # Discriminator: generated images labelled 1, real ones 0, labels noised.
        latent = keras.random.normal(shape=(batch_size, self.latent_dim),
                                     seed=self.seed_generator)
        fakes = self.generator(latent)
        images = tf.concat([fakes, real_images], axis=0)
        labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
        labels += 0.05 * keras.random.uniform(tf.shape(labels), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(images))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply(grads, self.discriminator.trainable_weights)

        # Generator: make the discriminator say "real" (0); only the generator
        # is updated.
        latent = keras.random.normal(shape=(batch_size, self.latent_dim),
                                     seed=self.seed_generator)
        misleading_labels = tf.zeros((batch_size, 1))
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(misleading_labels,
                                  self.discriminator(self.generator(latent)))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply(grads, self.generator.trainable_weights)

        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(),
                "g_loss": self.g_loss_tracker.result()}


batch_size = 64
(x_train, _), (x_test, _) = load_mnist_like()
all_digits = np.concatenate([x_train, x_test]).astype("float32") / 255.0
all_digits = np.reshape(all_digits, (-1, 28, 28, 1))
dataset = ke.ElasticDataset(all_digits, batch_size=batch_size, shuffle=True)

gan = ke.wrap(GAN(discriminator=discriminator, generator=generator, latent_dim=latent_dim))
gan.compile(
    d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
    g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
    loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
)
history = gan.fit(dataset.take(24), epochs=1, verbose=2)

result = {
    "d_loss": float(history.history["d_loss"][-1]),
    "g_loss": float(history.history["g_loss"][-1]),
    "epochs_run": len(history.history["d_loss"]),
}
print("RESULT " + json.dumps(result), flush=True)

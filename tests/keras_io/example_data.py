"""Local stand-ins for the data sets the keras-io examples download.

Every function is deterministic (a seeded NumPy generator or scikit-learn's
bundled digits, no network) and returns arrays of the shape and dtype the
original loader returns, with structure a model can learn, so the accuracy
an example reports means something. Sizes are small: each example script
runs in seconds on two CPU cores.
"""

from __future__ import annotations

import numpy as np

NUM_DIGITS_TRAIN = 1500  # of scikit-learn's 1797 digits; the rest is the test split


Arrays = tuple[np.ndarray, np.ndarray]


def load_mnist_like() -> tuple[Arrays, Arrays]:
    """Like `keras.datasets.mnist.load_data()`: ((x_train, y_train), (x_test, y_test)),
    images uint8 (n, 28, 28) in 0..255, labels uint8 (n,) in 0..9.

    scikit-learn's 8x8 handwritten digits (values 0..16), each pixel repeated
    3x3 (24x24), padded by 2 on every side (28x28, MNIST's border), scaled to
    0..255. 1500 training and 297 test images.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images.astype(np.float64)  # (1797, 8, 8), 0..16
    images = np.repeat(np.repeat(images, 3, axis=1), 3, axis=2)  # (1797, 24, 24)
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))  # (1797, 28, 28)
    images = np.clip(np.round(images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    labels = digits.target.astype(np.uint8)
    n = NUM_DIGITS_TRAIN
    return (images[:n], labels[:n]), (images[n:], labels[n:])


def load_creditcard_like(num_samples: int = 8000, fraud_rate: float = 0.03,
                         seed: int = 42) -> Arrays:
    """Like the Kaggle credit-card fraud CSV as the imbalanced-classification
    example reads it: features float32 (n, 30) (time, 28 PCA components,
    amount), targets uint8 (n, 1), about `fraud_rate` of them 1.

    Legitimate rows are Gaussian; fraudulent rows are shifted along a few
    components and have larger amounts, with overlap (not separable).
    """
    rng = np.random.default_rng(seed)
    targets = (rng.random(num_samples) < fraud_rate).astype(np.uint8)
    time = np.sort(rng.uniform(0, 172_800, num_samples))  # two days, in seconds
    components = rng.normal(size=(num_samples, 28))
    shift = np.zeros(28)
    shift[[0, 2, 3, 9, 13, 16]] = [-1.8, -1.5, 1.6, -1.2, -2.0, -1.4]
    components[targets == 1] += shift
    amount = rng.lognormal(mean=3.0, sigma=1.0, size=num_samples)
    amount[targets == 1] *= 1.8
    features = np.column_stack([time, components, amount]).astype("float32")
    return features, targets.reshape(-1, 1)


def load_forda_like(length: int = 96, num_train: int = 1000, num_test: int = 200,
                    seed: int = 7) -> tuple[Arrays, Arrays]:
    """Like the FordA files as the time-series example reads them
    (`readucr`): x float64 (n, length), z-normalized per series; y int
    (n,) in {-1, 1}.

    Class 1 is a noisy burst of a higher frequency than class -1's, at a random
    phase, position and amplitude, over noise.
    """
    rng = np.random.default_rng(seed)

    def make(n: int) -> Arrays:
        y = rng.choice(np.array([-1, 1]), size=n)
        t = np.arange(length)
        freq = np.where(y == 1, 0.11, 0.06)[:, None] * rng.uniform(0.9, 1.1, (n, 1))
        phase = rng.uniform(0, 2 * np.pi, (n, 1))
        center = rng.uniform(0.3, 0.7, (n, 1)) * length
        envelope = np.exp(-(((t[None, :] - center) / (0.25 * length)) ** 2))
        amplitude = rng.uniform(0.8, 1.5, (n, 1))
        x = amplitude * envelope * np.sin(2 * np.pi * freq * t[None, :] + phase)
        x += rng.normal(scale=0.6, size=(n, length))
        x = (x - x.mean(axis=1, keepdims=True)) / x.std(axis=1, keepdims=True)
        return x, y.astype(int)

    return make(num_train), make(num_test)


def _gratings(orientation: np.ndarray, frequency: np.ndarray, size: int,
              rng: np.random.Generator) -> np.ndarray:
    """uint8 RGB images (n, size, size, 3): a sinusoidal grating of the given
    orientation (radians) and frequency (cycles per image) at a random phase,
    in a random pair of colours, over pixel noise."""
    n = len(orientation)
    coords = np.arange(size) / size
    yy, xx = np.meshgrid(coords, coords, indexing="ij")
    along = (np.cos(orientation)[:, None, None] * xx[None]
             + np.sin(orientation)[:, None, None] * yy[None])
    phase = rng.uniform(0, 2 * np.pi, (n, 1, 1))
    wave = 0.5 + 0.5 * np.sin(2 * np.pi * frequency[:, None, None] * along + phase)
    dark = rng.uniform(0, 110, (n, 1, 1, 3))
    light = rng.uniform(145, 255, (n, 1, 1, 3))
    images = dark + (light - dark) * wave[..., None]
    images += rng.normal(scale=30.0, size=images.shape)
    return np.clip(np.round(images), 0, 255).astype(np.uint8)


def load_imagenet_like(num_images: int = 1200, size: int = 48,
                       seed: int = 11) -> Arrays:
    """A stand-in for the ImageNet weights the transfer-learning guide
    downloads: data to pretrain a small base model on, in the script. Images
    uint8 (n, size, size, 3) in 0..255, labels int64 (n,) in 0..3: the
    frequency band of a grating (2..3.5, 3.5..5, 5..7 or 7..9 cycles per
    image), at any orientation and phase, in random colours, over noise.
    """
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, num_images)
    bands = np.array([2.0, 3.5, 5.0, 7.0, 9.0])
    frequency = rng.uniform(bands[labels], bands[labels + 1])
    orientation = rng.uniform(0, np.pi, num_images)
    return _gratings(orientation, frequency, size, rng), labels.astype(np.int64)


def load_cats_vs_dogs_like(num_images: int = 1000, size: int = 48,
                           seed: int = 12) -> Arrays:
    """Like TFDS "cats_vs_dogs" (`as_supervised=True`), already resized to one
    size: images uint8 (n, size, size, 3) in 0..255, labels int64 (n,) in
    {0 ("cat"), 1 ("dog")}, about half each.

    A "cat" is a coarse grating (2..4.5 cycles per image), a "dog" a fine one
    (5.5..9), at any orientation, phase and colours, over noise: the texture
    features a base pretrained on `load_imagenet_like` learned carry over,
    and neither a flip nor a small rotation changes the class.
    """
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, num_images)
    orientation = rng.uniform(0, np.pi, num_images)
    frequency = np.where(labels == 1, rng.uniform(5.5, 9.0, num_images),
                         rng.uniform(2.0, 4.5, num_images))
    return _gratings(orientation, frequency, size, rng), labels.astype(np.int64)


def load_cifar10_like() -> tuple[Arrays, Arrays]:
    """Like `keras.datasets.cifar10.load_data()`: ((x_train, y_train), (x_test,
    y_test)), images uint8 (n, 32, 32, 3) in 0..255, labels uint8 (n, 1) in 0..9.

    scikit-learn's 8x8 digits, each pixel repeated 4x4 (32x32), in a random
    colour over a random darker background, with pixel noise (seeded). 1500
    training and 297 test images.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(10)
    ink = np.repeat(np.repeat(digits.images / 16.0, 4, axis=1), 4, axis=2)  # (n, 32, 32)
    n = len(ink)
    background = rng.uniform(0, 100, (n, 1, 1, 3))
    colour = rng.uniform(140, 255, (n, 1, 1, 3))
    images = background + (colour - background) * ink[..., None]
    images += rng.normal(scale=12.0, size=images.shape)
    images = np.clip(np.round(images), 0, 255).astype(np.uint8)
    labels = digits.target.astype(np.uint8).reshape(-1, 1)
    m = NUM_DIGITS_TRAIN
    return (images[:m], labels[:m]), (images[m:], labels[m:])

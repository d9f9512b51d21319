"""Fails early, and clearly, when Keras is not running on TensorFlow."""

import os


def check_tensorflow_backend() -> None:
    """Raises `ImportError` unless Keras uses the TensorFlow backend."""
    import keras

    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ImportError(
            "keras_elastic needs Keras 3 with the TensorFlow backend, but Keras "
            f"is using the '{backend}' backend (KERAS_BACKEND="
            f"{os.environ.get('KERAS_BACKEND', '<unset>')!r}). Set "
            "KERAS_BACKEND=tensorflow before importing keras, or set "
            '"backend": "tensorflow" in ~/.keras/keras.json.'
        )

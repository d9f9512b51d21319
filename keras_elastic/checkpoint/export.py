"""Exports a trained model as a single `.keras` file, atomically."""

from __future__ import annotations

import os
import uuid

import keras


def export_keras(model: keras.Model, path: str) -> str:
    """Saves `model` as a `.keras` file, written to a temporary name first.

    A reader of `path` sees either the previous file or the complete new one.
    An elastic model (`ke.Model`, `ke.Sequential`, `ke.wrap(...)`) is saved as
    its plain Keras class, so that serving loads it without keras_elastic.

    Args:
        model: The model to save.
        path: Destination; must end in `.keras`.

    Returns:
        The absolute path written.

    Raises:
        ValueError: If `path` does not end in `.keras`.

    Example:

    ```python
    import keras
    import keras_elastic as ke

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    ke.checkpoint.export_keras(model, "/tmp/final.keras")
    restored = keras.saving.load_model("/tmp/final.keras")
    ```
    """
    path = os.path.abspath(os.fspath(path))
    if not path.endswith(".keras"):
        raise ValueError(
            f"export_keras writes the Keras format; the path must end in "
            f"'.keras', got {path}")
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(
        directory, f".{os.path.basename(path)[:-6]}.{uuid.uuid4().hex[:8]}.keras")
    elastic_class = type(model)
    serving_class = getattr(model, "serving_class", elastic_class)
    try:
        model.__class__ = serving_class
        try:
            model.save(tmp)
        finally:
            model.__class__ = elastic_class
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path

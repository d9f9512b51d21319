"""Exports a trained model as a single `.keras` file, atomically."""

from __future__ import annotations

import os
import uuid

import keras
import numpy as np

from keras_elastic.common import keras_compat


def export_keras(model: keras.Model, path: str) -> str:
    """Saves `model` as a `.keras` file, written to a temporary name first.

    A reader of `path` sees either the previous file or the complete new one.
    An elastic model (`ke.Model`, `ke.Sequential`, `ke.wrap(...)`) keeps its
    plain Keras class, so that serving loads it without keras_elastic; its
    `ke.layers.Embedding` layers become `keras.layers.Embedding` layers holding
    the whole table, read from the parameter servers (bounded tables of
    functional and sequential models only).

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
    model = with_local_tables(model)
    try:
        # An elastic model keeps its Keras class (ke.wrap changes no class):
        # Keras saves the plain model.
        model.save(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


# Ids read from the servers per call when a table is materialized.
_EXPORT_CHUNK = 1 << 20


def with_local_tables(model: keras.Model) -> keras.Model:
    """`model` itself if it has no `ke.layers.Embedding`; else a copy of it
    (sharing every other layer) whose such layers are `keras.layers.Embedding`
    layers holding the whole table, read from the parameter servers.

    >>> import numpy as np
    >>> import keras_elastic as ke
    >>> inputs = keras.Input((2,), dtype="int64")
    >>> table = ke.layers.Embedding(10, 3, name="table")(inputs)
    >>> model = ke.Model(inputs, keras.layers.Dense(1)(keras.layers.Flatten()(table)))
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> _ = model.predict(np.array([[1, 2]]), verbose=0)  # connects it (embedded)
    >>> local = with_local_tables(model)
    >>> layer = local.get_layer("table")    # a keras.layers.Embedding
    >>> isinstance(layer, ke.layers.Embedding), tuple(layer.embeddings.shape)
    (False, (10, 3))
    >>> with_local_tables(local) is local   # no table on the servers: itself
    True
    """
    from keras_elastic.layers.embedding import Embedding

    layers = [layer for layer in keras_compat.all_layers(model, include_self=False)
              if isinstance(layer, Embedding)]
    if not layers:
        return model
    for layer in layers:
        if layer.input_dim is None:
            raise ValueError(
                f"cannot export embedding '{layer.name}' as a keras.layers.Embedding: "
                "its table is unbounded (input_dim=None). Export a bounded table, or "
                "save the model with ShardedModelCheckpoint instead")
        if layer._rows_of is None:
            raise ValueError(
                f"cannot export embedding '{layer.name}': its table lives on the "
                "parameter servers and the model is not connected to them (export "
                "after fit, evaluate or predict)")
    from keras_elastic.common.keras_compat import Functional

    if not isinstance(model, (Functional, keras.Sequential)):
        raise ValueError(
            f"cannot export {type(model).__name__} with ke.layers.Embedding layers "
            "as a plain Keras model: only functional and sequential models can have "
            "their embedding layers replaced. Save it with ShardedModelCheckpoint")
    local = {}
    for layer in layers:
        table = np.concatenate([
            # Reading makes no rows (ids without one get their initializer's).
            layer._rows_of(np.arange(start, min(start + _EXPORT_CHUNK, layer.input_dim),
                                     dtype=np.int64), False)
            for start in range(0, layer.input_dim, _EXPORT_CHUNK)])
        plain = keras.layers.Embedding(
            layer.input_dim, layer.output_dim, name=layer.name, mask_zero=layer.mask_zero,
            embeddings_initializer=layer.embeddings_initializer, dtype=layer.dtype_policy)
        plain.build()
        plain.embeddings.assign(table)
        local[id(layer)] = plain
    return keras.models.clone_model(
        model, clone_function=lambda layer: local.get(id(layer), layer))

"""Reads checkpoints written by `keras_elastic.checkpoint` back into objects."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import keras
import tensorflow as tf

from keras_elastic.checkpoint import layout
from keras_elastic.checkpoint.errors import CheckpointError
from keras_elastic.checkpoint.manifest import MANIFEST_NAME, SaveInfo, read_manifest


def resolve(path: str) -> SaveInfo:
    """The checkpoint at `path`: a checkpoint directory, or the latest in a
    checkpoints directory.

    Raises:
        CheckpointError: If `path` holds no complete checkpoint.

    Example:

    ```python
    import keras_elastic as ke

    print(ke.checkpoint.resolve("/tmp/ckpts").path)
    ```
    """
    if os.path.isfile(os.path.join(path, MANIFEST_NAME)):
        return read_manifest(path)
    info = layout.latest(path)
    if info is None:
        what = "does not exist" if not os.path.exists(path) else (
            "is neither a complete checkpoint (no manifest.json) nor a "
            "directory holding complete checkpoints")
        raise CheckpointError(f"No checkpoint to restore: {path} {what}")
    return info


def restore_trackables(
    path: str,
    trackables: Mapping[str, Any],
    *,
    allow_partial: bool = False,
) -> SaveInfo:
    """Restores `trackables` from a checkpoint; the reader of `save_trackables`.

    Args:
        path: A checkpoint directory, or a checkpoints directory (its latest
            complete checkpoint is used).
        trackables: `{name: trackable}` with names the checkpoint was saved
            with (a subset is fine). Their variables must exist already.
        allow_partial: If `False`, every variable of `trackables` must get a
            value from the checkpoint.

    Returns:
        The restored checkpoint's `SaveInfo`.

    Raises:
        CheckpointError: If there is no checkpoint, a name is not in it, or
            (unless `allow_partial`) some variable got no value.

    Example:

    ```python
    import tensorflow as tf
    import keras_elastic as ke

    module = tf.Module()
    module.w = tf.Variable(tf.zeros([4, 4]))
    ke.checkpoint.save_trackables("/tmp/ps-ckpts", "ps-0", {"vars": module})
    info = ke.checkpoint.restore_trackables("/tmp/ps-ckpts/ps-0",
                                            {"vars": module})
    ```
    """
    info = resolve(path)
    unknown = [name for name in trackables if name not in info.trackables]
    if unknown:
        raise CheckpointError(
            f"Checkpoint {info.path} holds {info.trackables}, not {unknown}")
    checkpoint = tf.train.Checkpoint(**trackables)
    try:
        status = checkpoint.read(info.tf_prefix)
    except (tf.errors.OpError, ValueError) as e:
        raise CheckpointError(f"Cannot read checkpoint {info.path}: {e}") from e
    if not allow_partial:
        try:
            status.assert_existing_objects_matched()
        except AssertionError as e:
            raise CheckpointError(
                f"Checkpoint {info.path} does not match the objects being "
                f"restored ({list(trackables)}): {e}") from e
    status.expect_partial()
    return info


def restore_model(model: keras.Model, path: str, *,
                  optimizer: bool = True) -> SaveInfo:
    """Restores a built Keras model (and its optimizer state) from a checkpoint.

    The optimizer is built first if needed (Keras 3 creates its slot variables
    lazily), so momentum and other slots are restored too. A checkpoint
    written with `save_weights_only=True` (it holds `weights`, the list
    `model.weights`) restores the weights only.

    Args:
        model: A built `keras.Model`.
        path: A checkpoint directory, or a checkpoints directory (latest).
        optimizer: Also restore `model.optimizer` when the checkpoint has it.

    Returns:
        The restored checkpoint's `SaveInfo` (`.initial_epoch` says where to
        resume `fit`).

    Raises:
        CheckpointError: If the model is not built, there is no checkpoint or
            it does not match the model.

    Example:

    ```python
    import keras
    import numpy as np
    import keras_elastic as ke

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    ke.checkpoint.save_trackables("/tmp/ckpts", "ckpt-0001",
                                  {"model": model}, extra_manifest={"epoch": 1})
    info = ke.checkpoint.restore_model(model, "/tmp/ckpts")
    x, y = np.ones((8, 4)), np.ones((8, 1))
    model.fit(x, y, epochs=3, initial_epoch=info.initial_epoch, verbose=0)
    ```
    """
    if not model.built:
        raise CheckpointError(
            f"Model {model.name!r} is not built, so it has no variables to "
            f"restore from {path}: call it on a batch or `model.build(...)` "
            "first")
    info = resolve(path)
    if "model" not in info.trackables and "weights" in info.trackables:
        # Written with save_weights_only=True: the model's weights, in order.
        return restore_trackables(info.path, {"weights": list(model.weights)})
    trackables: dict[str, Any] = {"model": model}
    opt = getattr(model, "optimizer", None)
    if optimizer and opt is not None and "optimizer" in info.trackables:
        if not opt.built:
            opt.build(model.trainable_variables)
        trackables["optimizer"] = opt
    return restore_trackables(info.path, trackables)


def initial_epoch(directory: str) -> int:
    """The `initial_epoch` for `model.fit` to resume from `directory`'s latest
    checkpoint (0 when there is none).

    Example:

    ```python
    import keras_elastic as ke

    epoch = ke.checkpoint.initial_epoch("/tmp/ckpts")
    ```
    """
    info = layout.latest(directory)
    return 0 if info is None else info.initial_epoch

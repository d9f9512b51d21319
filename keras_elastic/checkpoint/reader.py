"""Reads checkpoints written by `keras_elastic.checkpoint` back into objects."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import keras
import tensorflow as tf
from absl import logging

from keras_elastic.checkpoint import integrity, layout, ps_layout
from keras_elastic.checkpoint.errors import CheckpointError
from keras_elastic.checkpoint.manifest import MANIFEST_NAME, SaveInfo, read_manifest


def resolve(path: str) -> SaveInfo:
    """The checkpoint at `path`: a checkpoint directory, or the latest in a
    checkpoints directory.

    Raises:
        CheckpointError: If `path` holds no complete checkpoint, or is a
            checkpoint whose files do not verify (`integrity.verify`).
        NoIntactCheckpointError: If every checkpoint in `path` is damaged.

    Example:

    ```python
    import keras_elastic as ke

    print(ke.checkpoint.resolve("/tmp/ckpts").path)
    ```
    """
    if os.path.isfile(os.path.join(path, MANIFEST_NAME)):
        info = read_manifest(path)
        faults = integrity.verify(info)
        if faults:
            raise CheckpointError(f"checkpoint {path} is damaged: {'; '.join(faults)}")
        return info
    # The newest intact one: newer damaged ones are skipped (and logged).
    info = layout.latest_intact(path)
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


def restore_model(model: keras.Model, path: str) -> SaveInfo:
    """Restores a built Keras model (and its optimizer state) from a checkpoint.

    The optimizer is built first if needed (Keras 3 creates its slot variables
    lazily), so momentum and other slots are restored too. A checkpoint
    written with `save_weights_only=True` (it holds `weights`, the list
    `model.weights`) restores the weights only.

    Args:
        model: A built `keras.Model`.
        path: A checkpoint directory, or a checkpoints directory (latest).

    Returns:
        The restored checkpoint's `SaveInfo` (`.initial_epoch` says where to
        resume `fit`).

    Raises:
        CheckpointError: If the model is not built, there is no checkpoint, or
            it lacks some of the model's weights or has other shapes. (Missing
            optimizer variables only log a warning: e.g. a checkpoint saved
            before the first training step has no slots yet.)

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
    if ps_layout.is_ps_checkpoint(info):
        # Saved by the parameter servers of an elastic job: the weights, by key.
        ps_layout.restore_model_variables(model, info)
        return info
    if "model" not in info.trackables and "weights" in info.trackables:
        # Written with save_weights_only=True: the model's weights, in order.
        return restore_trackables(info.path, {"weights": list(model.weights)})
    if "model" not in info.trackables:
        raise CheckpointError(
            f"Checkpoint {info.path} holds {info.trackables}, no 'model' or "
            "'weights' to restore a Keras model from")
    trackables: dict[str, Any] = {"model": model}
    opt = getattr(model, "optimizer", None)
    if opt is not None:
        if not opt.built:  # Keras 3 creates the slot variables lazily.
            opt.build(model.trainable_variables)
        if "optimizer" in info.trackables:
            trackables["optimizer"] = opt
    matched = tf.train.CheckpointView(info.tf_prefix).match(
        tf.train.Checkpoint(**trackables))
    found = {id(t) for t in matched.values()}
    missing = [w.path for w in model.weights if id(w) not in found]
    if missing:
        raise CheckpointError(
            f"Checkpoint {info.path} does not match model {model.name!r}: it "
            f"has no value for {len(missing)} of its {len(model.weights)} "
            f"weights, e.g. {missing[:5]}")
    restore_trackables(info.path, trackables, allow_partial=True)
    if opt is not None:
        fresh = [v.path for v in opt.variables if id(v) not in found]
        if fresh:
            # E.g. saved before the optimizer had slots, or another optimizer.
            logging.warning(
                "Checkpoint %s has no value for %d optimizer variables (%s); "
                "they keep their current values", info.path, len(fresh),
                fresh[:5])
    return info


def initial_epoch(directory: str) -> int:
    """The `initial_epoch` for `model.fit` to resume from `directory`'s latest
    checkpoint (0 when there is none).

    Example:

    ```python
    import keras_elastic as ke

    epoch = ke.checkpoint.initial_epoch("/tmp/ckpts")
    ```
    """
    info = layout.latest_intact(directory)
    return 0 if info is None else info.initial_epoch

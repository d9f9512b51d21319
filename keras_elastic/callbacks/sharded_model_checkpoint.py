"""`ShardedModelCheckpoint`: Keras' `ModelCheckpoint`, writing sharded
`tf.train.Checkpoint`s through any checkpoint sharding callback."""

from __future__ import annotations

import os
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from keras_elastic.checkpoint import layout
from keras_elastic.checkpoint.manifest import MANIFEST_NAME, SaveInfo
from keras_elastic.checkpoint.reader import restore_model
from keras_elastic.checkpoint.signature import (
    SIGNATURE_KEY,
    check_model_matches,
    model_signature,
)
from keras_elastic.checkpoint.validation import check_sharding_callback
from keras_elastic.checkpoint.writer import CheckpointWriter
from keras_elastic.worker.checkpoint_resume import RestoringCheckpoint
from keras_elastic.worker.session import session_of

_DIRECTORY_PATTERNS = {"epoch": "ckpt-{epoch:04d}",
                       "batch": "ckpt-{epoch:04d}-{batch:06d}"}


def _split_filepath(filepath: str, save_freq: Any) -> tuple[str, str]:
    """(checkpoints directory, checkpoint name pattern) of a filepath."""
    path = os.fspath(filepath)
    if not path:
        raise ValueError("ShardedModelCheckpoint needs a non-empty filepath")
    is_directory = path.endswith(("/", os.sep)) or (
        os.path.isdir(path)
        and not os.path.isfile(os.path.join(path, MANIFEST_NAME)))
    if is_directory:
        root = path.rstrip("/" + os.sep) or os.sep
        pattern = _DIRECTORY_PATTERNS["epoch" if save_freq == "epoch" else "batch"]
    else:
        root, pattern = os.path.split(path)
        root = root or "."
    if "{" in root or "}" in root:
        raise ValueError(
            f"ShardedModelCheckpoint filepath {path!r}: only the last path "
            f"component may hold format fields like {{epoch}}; the directory "
            f"{root!r} must be fixed")
    if pattern.startswith("."):
        raise ValueError(
            f"ShardedModelCheckpoint filepath {path!r}: checkpoint names must "
            "not start with '.' (hidden names are reserved for saves in "
            "progress)")
    return root, pattern


def _cluster_of(model) -> Any:
    """The cluster an elastic model is training on, or None (plain Keras)."""
    session = session_of(model)
    if session is None or not session.connected:
        return None
    from keras_elastic.worker.cluster import get_cluster

    return get_cluster()


def _as_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(np.asarray(value))
    except (TypeError, ValueError):
        return None


class ShardedModelCheckpoint(keras.callbacks.ModelCheckpoint, RestoringCheckpoint):
    """`ModelCheckpoint` writing sharded `tf.train.Checkpoint`s, validated,
    atomically, resumable.

    Saves `tf.train.Checkpoint(model=..., optimizer=...)` through
    `tf.train.CheckpointOptions(experimental_sharding_callback=...)`, with the
    callback's shards checked first (TensorFlow does not check them: a
    callback that drops a tensor raises `ShardingCallbackError` here and
    nothing is written). Each checkpoint is a directory that appears only
    once complete, with a `manifest.json` recording the callback's
    description, its latency, the shards and their sizes, the epoch and step.
    `monitor`, `mode`, `save_best_only`, `initial_value_threshold` and
    `save_freq` mean what they mean for `keras.callbacks.ModelCheckpoint`, and
    the defaults are Keras' too: every checkpoint is kept (unless
    `max_to_keep`), nothing is restored (unless `restore_on_start`). Keras'
    own `model_checkpoint_test.py` passes against it
    (`tests/test_keras_model_checkpoint_parity.py`).

    Resuming is explicit: with `restore_on_start=True` the latest complete
    checkpoint *of this callback* is restored (weights and optimizer slots)
    when `fit` starts, and `fit` continues from the saved epoch: `fit(epochs=4)`
    after two saved epochs runs epochs 3 and 4 (through the
    `model._initial_epoch` hook that `keras.callbacks.BackupAndRestore` uses).
    A checkpoint saved in the middle of an epoch resumes at the start of that
    epoch, with the saved weights. Alternatively call `restore()` yourself and
    pass `initial_epoch=callback.initial_epoch` to `fit`. Never silently:

    - a checkpoint whose variables (keys, shapes) differ from the model's is
      a `CheckpointError` naming each difference;
    - a restore that leaves no epoch to train logs a warning with the
      checkpoint's epoch;
    - *this callback's* checkpoints are those whose manifest holds its name
      pattern (the last component of `filepath`, e.g. `ckpt-{epoch:04d}`):
      checkpoints of another callback, of `save_trackables` or of another tool
      in the same directory are neither restored nor pruned by it. A later
      run with the same filepath continues the same series (that is what
      resuming means), like Keras' `BackupAndRestore` with the same
      `backup_dir`; give a new run its own directory or name to keep both.

    Args:
        filepath: Either a directory (a path ending in `/`, or an existing
            directory that is not itself a checkpoint): checkpoints are named
            `ckpt-{epoch:04d}` in it (`ckpt-{epoch:04d}-{batch:06d}` when
            saving every N batches); or a path whose last component names the
            checkpoints and may hold format fields, such as
            `"ckpts/ckpt-{epoch:02d}-{val_loss:.2f}"`. A name without fields
            (`"ckpts/best"`) is replaced at every save. As for Keras'
            `ModelCheckpoint`, give each callback its own directory:
            `max_to_keep` and restoring consider every checkpoint in it.
        monitor: Metric for `save_best_only`, as in `ModelCheckpoint`.
        verbose: 0 (silent) or 1 (print a line per save).
        save_best_only: Save only when `monitor` improved. The best value is
            stored in the manifest and restored with the checkpoint.
        save_weights_only: Save the model's weights only (as the list
            `weights`), without the optimizer state.
        mode: `"auto"`, `"min"` or `"max"`, as in `ModelCheckpoint`.
        save_freq: `"epoch"`, or save every this many batches.
        initial_value_threshold: Initial "best" value of `monitor`.
        sharding_callback: A `tf.train.experimental.ShardingCallback`
            instance: `ShardByTaskPolicy()` (default), `MaxShardSizePolicy(
            max_shard_size=...)` or your own.
        max_to_keep: Keep this many newest checkpoints of this callback;
            `None` (the default, as Keras) keeps all.
        async_save: Write checkpoints in TensorFlow's background thread
            (`CheckpointOptions(enable_async=True)`); training continues once
            the values are copied. Pending saves finish at the end of `fit`.
        restore_on_start: Restore this callback's latest checkpoint when the
            first `fit` with it starts (default `False`, as Keras).
        durable: fsync each checkpoint before committing it, so it survives a
            power loss as well as a crash (slower: waits for the disk).

    Example:

    ```python
    import keras
    import numpy as np
    import tensorflow as tf
    import keras_elastic as ke

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((32, 4)), np.ones((32, 1))
    ckpt = ke.callbacks.ShardedModelCheckpoint(
        "/tmp/sharded/", max_to_keep=3, restore_on_start=True,
        sharding_callback=tf.train.experimental.MaxShardSizePolicy(
            max_shard_size=64 << 20))
    model.fit(x, y, epochs=4, callbacks=[ckpt], verbose=0)
    print(ckpt.last_save_info.num_shards, ckpt.last_save_info.latency_s)
    ```
    """

    def __init__(
        self,
        filepath: str,
        monitor: str = "val_loss",
        verbose: int = 0,
        save_best_only: bool = False,
        save_weights_only: bool = False,
        mode: str = "auto",
        save_freq: str | int = "epoch",
        initial_value_threshold: float | None = None,
        *,
        sharding_callback: tf.train.experimental.ShardingCallback | None = None,
        max_to_keep: int | None = None,
        async_save: bool = False,
        restore_on_start: bool = False,
        durable: bool = False,
    ) -> None:
        # keras.callbacks.ModelCheckpoint.__init__ insists on a .keras/.h5
        # filepath, so initialize its base and set ModelCheckpoint's state.
        super(keras.callbacks.ModelCheckpoint, self).__init__(
            monitor, mode, initial_value_threshold)
        if save_freq != "epoch" and not isinstance(save_freq, int):
            # What Keras accepts: "epoch" or an int (a save every that many
            # batches; 0 or less: every batch).
            raise ValueError(
                f"Unrecognized save_freq: {save_freq!r}. Expected save_freq are "
                "'epoch' or integer values (save every this many batches)")
        root, pattern = _split_filepath(os.fspath(filepath), save_freq)
        self.verbose = verbose
        self.directory = os.path.abspath(root)
        self.filepath = os.path.join(self.directory, pattern)
        self.name_pattern = pattern  # this callback's checkpoints (manifests)
        self.save_best_only = save_best_only
        self.save_weights_only = save_weights_only
        self.save_freq = save_freq
        self._batches_seen_since_last_saving = 0
        self._last_batch_seen = None
        self._current_epoch = 0
        self.sharding_callback = sharding_callback
        self.max_to_keep = max_to_keep
        self.async_save = async_save
        self.restore_on_start = restore_on_start
        self.durable = durable
        self.initial_epoch = 0
        self.restored_from: SaveInfo | None = None
        self._restore_attempted = False
        self._resume_pending = False
        self._writer: CheckpointWriter | None = None
        self._writer_key: tuple[int, int] | None = None
        self._ps_last_info: SaveInfo | None = None
        self._previous_initial_epoch: Any = None
        if sharding_callback is not None:  # Fail now, not at the first save.
            check_sharding_callback(sharding_callback)
        if max_to_keep is not None and (
                not isinstance(max_to_keep, int) or max_to_keep < 1):
            raise ValueError(
                f"max_to_keep must be a positive int or None, got {max_to_keep!r}")

    @property
    def last_save_info(self) -> SaveInfo | None:
        """`SaveInfo` of the last completed save (latency, shards, sizes...)."""
        if self._ps_last_info is not None:
            return self._ps_last_info
        return None if self._writer is None else self._writer.last_save_info

    def checkpoints(self) -> list[SaveInfo]:
        """This callback's complete checkpoints in its directory, oldest first
        (those whose manifest holds its name pattern)."""
        return [info for info in layout.list_checkpoints(self.directory)
                if self.owns(info)]

    def latest(self) -> SaveInfo | None:
        """This callback's newest intact checkpoint, or `None` if it has none.

        Newer checkpoints whose files do not verify (`checkpoint.verify`:
        a file missing, cut short or changed) are skipped, each logged with
        its faults; `NoIntactCheckpointError` (naming each) when every one is
        damaged."""
        return layout.pick_intact(self.checkpoints(), self.directory)

    def owns(self, info: SaveInfo) -> bool:
        """Whether checkpoint `info` was written by a callback with this one's
        name pattern."""
        pattern = info.extra.get("name_pattern")
        if self.name_pattern in _DIRECTORY_PATTERNS.values():
            # Saved by epoch or every N batches into a directory: one series.
            return pattern in _DIRECTORY_PATTERNS.values()
        return pattern == self.name_pattern

    def mark_restored(self, info: SaveInfo | None, initial_epoch: int,
                      epochs: int | None = None) -> None:
        """An elastic `fit` restored `info` itself (servers and master) and
        starts at `initial_epoch`: nothing is left for `on_train_begin` to do."""
        if info is not None and epochs is not None:
            _warn_if_nothing_left(info, initial_epoch, epochs)
        self._restore_attempted = True
        self._resume_pending = False
        self.initial_epoch, self.restored_from = initial_epoch, info
        if info is not None and self.save_best_only and (
                info.extra.get("monitor") == self.monitor
                and info.extra.get("best") is not None):
            self.best = info.extra["best"]

    def wait(self) -> SaveInfo | None:
        """Waits for a pending asynchronous save; returns `last_save_info`."""
        return None if self._writer is None else self._writer.wait()

    def restore(self, model: keras.Model | None = None) -> SaveInfo | None:
        """Restores the latest checkpoint of the directory into the model.

        Sets `initial_epoch` (0 when there is no checkpoint) and
        `restored_from`. With `save_best_only`, the saved best value of
        `monitor` is restored too.

        Args:
            model: The (built) model; default the model `fit` is training.

        Returns:
            The restored checkpoint's `SaveInfo`, or `None` if there is none.

        Example:

        ```python
        import keras
        import numpy as np
        import keras_elastic as ke

        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        x, y = np.ones((32, 4)), np.ones((32, 1))
        ckpt = ke.callbacks.ShardedModelCheckpoint("/tmp/sharded/",
                                                   restore_on_start=False)
        ckpt.restore(model)  # None the first time
        model.fit(x, y, epochs=4, initial_epoch=ckpt.initial_epoch,
                  callbacks=[ckpt], verbose=0)
        ```
        """
        model = model if model is not None else self.model
        if model is None:
            raise ValueError(
                "ShardedModelCheckpoint.restore() needs the model: pass it, or "
                "let fit() call it (restore_on_start=True)")
        if self._writer is not None:
            self._writer.wait()
        self._restore_attempted = True
        info = self.latest()
        if info is None:
            self.initial_epoch, self.restored_from = 0, None
            logging.info("No checkpoint in %s to restore; starting afresh",
                         self.directory)
            return None
        check_model_matches(model, info)
        info = restore_model(model, info.path)
        self.initial_epoch, self.restored_from = info.initial_epoch, info
        self._resume_pending = True
        best = info.extra.get("best")
        if (self.save_best_only and best is not None
                and info.extra.get("monitor") == self.monitor):
            self.best = best
        logging.info("Restored %s (epoch %s, step %s)", info.path, info.epoch,
                     info.step)
        if self.verbose > 0:
            print(f"Restored checkpoint {info.path}: resuming at epoch "
                  f"{self.initial_epoch + 1}")
        return info

    def on_train_begin(self, logs: dict | None = None) -> None:
        layout.remove_stale(self.directory)
        self._previous_initial_epoch = getattr(self.model, "_initial_epoch", None)
        if self.restore_on_start and not self._restore_attempted:
            self.restore()
        epochs = (self.params or {}).get("epochs")
        if (self._resume_pending and self.restored_from is not None
                and epochs is not None):
            _warn_if_nothing_left(self.restored_from, self.initial_epoch, epochs)
        if self._resume_pending and self.initial_epoch:
            # Only the first fit() after a restore resumes; later ones start
            # where Keras starts them.
            self._resume_pending = False
            if hasattr(self.model, "_initial_epoch"):
                self.model._initial_epoch = self.initial_epoch
            else:  # pragma: no cover - Keras versions without the hook
                logging.warning(
                    "This Keras cannot resume fit() from a callback: pass "
                    "initial_epoch=%d to fit()", self.initial_epoch)

    def on_train_end(self, logs: dict | None = None) -> None:
        try:
            self.wait()
        finally:
            if hasattr(self.model, "_initial_epoch"):
                self.model._initial_epoch = self._previous_initial_epoch

    def _get_writer(self) -> CheckpointWriter:
        model = self.model
        optimizer = getattr(model, "optimizer", None)
        key = (id(model), id(optimizer))
        if self._writer is None or self._writer_key != key:
            if self._writer is not None:
                self._writer.wait()
            trackables: dict[str, Any]
            if self.save_weights_only:
                # A Keras model tracks its optimizer: save the weights alone.
                trackables = {"weights": list(model.weights)}
            else:
                trackables = {"model": model}
                if optimizer is not None:
                    trackables["optimizer"] = optimizer
            self._writer = CheckpointWriter(
                self.directory, trackables, self.sharding_callback,
                max_to_keep=self.max_to_keep, async_save=self.async_save,
                durable=self.durable, select=self.owns)
            self._writer_key = key
        return self._writer

    def _save_model(self, epoch: int, batch: int | None, logs: dict) -> None:
        """Saves a checkpoint if due (Keras' `ModelCheckpoint` decides)."""
        filepath = self._get_file_path(epoch, batch, logs)
        if self.save_best_only and self.monitor_op is None:
            # Keras sets it at the first epoch end; a save every N batches
            # may come first.
            self._set_monitor_op()
        if not self._should_save_model(epoch, batch, logs, filepath):
            return
        optimizer = getattr(self.model, "optimizer", None)
        extra: dict[str, Any] = {
            "epoch": epoch + 1 if batch is None else epoch,
            "batch": 0 if batch is None else batch + 1,
            "step": (None if optimizer is None else
                     int(keras.ops.convert_to_numpy(optimizer.iterations))),
            "monitor": self.monitor,
            "best": _as_float(self.best),
            "name_pattern": self.name_pattern,
            SIGNATURE_KEY: model_signature(self.model),
        }
        cluster = _cluster_of(self.model)
        if cluster is not None:
            # An elastic job: the parameter servers hold the model and the
            # optimizer slots; one worker has every server save its share.
            from keras_elastic.worker.checkpoint_resume import (
                is_chief,
                save_parameter_servers,
            )

            if not is_chief(cluster):
                return
            info = save_parameter_servers(
                session_of(self.model).sync, cluster, self.directory,
                os.path.basename(filepath), self.sharding_callback, extra,
                max_to_keep=self.max_to_keep, select=self.owns)
            self._ps_last_info = info
            logging.info("Saved parameter-server checkpoint %s: %d parts, %d shards "
                         "of %s bytes; sharding callback '%s' took %.3f ms",
                         info.path, len(info.extra["parts"]), info.num_shards,
                         info.shard_sizes, info.description, info.latency_s * 1e3)
        else:
            info = self._get_writer().save(os.path.basename(filepath), extra)
        if self.verbose > 0 and info is not None:
            print(f"\nEpoch {epoch + 1}: saved {info.path} ({info.num_shards} "
                  f"shards, {sum(info.shard_sizes)} bytes)")


def _warn_if_nothing_left(info: SaveInfo, initial_epoch: int, epochs: int) -> None:
    """A restore that leaves `fit(epochs=...)` nothing to train says so."""
    if initial_epoch >= epochs:
        logging.warning(
            "ShardedModelCheckpoint restored %s, saved at epoch %s: fit(epochs=%d) "
            "has no epoch left to train, so this fit trains nothing. Pass a larger "
            "`epochs` to train on, or restore_on_start=False (or another "
            "checkpoint directory) to train afresh.", info.path, info.epoch, epochs)

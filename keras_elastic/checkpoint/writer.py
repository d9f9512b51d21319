"""Writes validated, sharded checkpoints of trackables, atomically.

This is the one place that writes checkpoints: `ShardedModelCheckpoint` uses
it for a Keras model and its optimizer, and a parameter server can use it for
its share of the variables (`save_trackables(dir, "ps-0", {"vars": module})`).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import tensorflow as tf
from absl import logging

from keras_elastic.checkpoint import integrity, layout
from keras_elastic.checkpoint.errors import CheckpointError
from keras_elastic.checkpoint.manifest import RESERVED_KEYS, SaveInfo, write_manifest
from keras_elastic.checkpoint.validation import (
    ValidatingShardingCallback,
    check_sharding_callback,
)

DEFAULT_PREFIX = "ckpt"
_FIELDS_FROM_EXTRA = ("epoch", "batch", "step")


def _shard_files(prefix: str) -> list[str]:
    pattern = re.compile(re.escape(os.path.basename(prefix))
                         + r"\.data-(\d{5})-of-(\d{5})$")
    files = [f for f in glob.glob(glob.escape(prefix) + ".data-*-of-*")
             if pattern.search(os.path.basename(f))]
    return sorted(files)


def _split_extra(extra: Mapping[str, Any] | None) -> tuple[dict, dict]:
    """Splits `extra_manifest` into SaveInfo fields and free-form extras."""
    fields: dict[str, Any] = {}
    free: dict[str, Any] = {}
    for key, value in (extra or {}).items():
        if not isinstance(key, str):
            raise CheckpointError(f"extra_manifest key {key!r} is not a string")
        if key in _FIELDS_FROM_EXTRA:
            if value is not None and not isinstance(value, int):
                raise CheckpointError(
                    f"extra_manifest[{key!r}] must be an int or None, got "
                    f"{type(value).__name__} {value!r}")
            fields[key] = value
            continue
        if key in RESERVED_KEYS:
            raise CheckpointError(
                f"extra_manifest key {key!r} is reserved by the checkpoint "
                f"manifest (reserved: {sorted(RESERVED_KEYS)})")
        try:
            json.dumps(value)
        except (TypeError, ValueError) as e:
            raise CheckpointError(
                f"extra_manifest[{key!r}] = {value!r} cannot be stored as "
                f"JSON: {e}") from e
        free[key] = value
    return fields, free


@dataclasses.dataclass
class _Pending:
    name: str
    temp_dir: str
    sequence: int
    created: float
    start: float
    fields: dict
    free: dict
    callback: ValidatingShardingCallback
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    info: SaveInfo | None = None
    error: BaseException | None = None


class CheckpointWriter:
    """Writes checkpoints of a fixed set of trackables into one directory.

    Each `save(name)` runs the sharding callback through
    `ValidatingShardingCallback` (a broken callback raises
    `ShardingCallbackError` before any data is written), writes
    `tf.train.Checkpoint(**trackables)` into a hidden temporary directory,
    adds `manifest.json` last and renames the directory to `directory/name`.
    A crash at any point leaves the previous checkpoints as they were.

    Args:
        directory: The checkpoints directory (created if missing).
        trackables: Objects to save, by name, as for `tf.train.Checkpoint`:
            e.g. `{"model": model, "optimizer": model.optimizer}`.
        sharding_callback: A `tf.train.experimental.ShardingCallback`
            instance; default `tf.train.experimental.ShardByTaskPolicy()`.
        max_to_keep: Keep at most this many checkpoints in `directory`
            (oldest deleted first); `None` keeps all.
        select: Which checkpoints of `directory` `max_to_keep` counts and
            prunes (default: all); e.g. those of one callback.
        async_save: Write the files in a background thread. `save` returns
            (`None`) once TensorFlow has read every variable and the shards
            are validated; training may then change the variables (TensorFlow
            copies a variable's buffer on write while a save still holds it).
            `wait()` returns the `SaveInfo`; the next `save` waits for the
            previous one. (TensorFlow's own `CheckpointOptions(enable_async=
            True)` fails from the second save of a Keras 3 model on: Keras'
            `Variable._copy_trackable_to_cpu` creates a `tf.Variable` inside
            TensorFlow's copy `tf.function` every time.)
        durable: Also flush every file to disk (fsync) before the checkpoint
            is committed, so that it survives a power loss, not only a crash
            of the process. Off by default, like TensorFlow's own saves: it
            makes a save wait for the disk.
        prefix: TensorFlow's file prefix inside each checkpoint directory.

    Example:

    ```python
    import tensorflow as tf
    from keras_elastic.checkpoint import CheckpointWriter

    v = tf.Variable(tf.range(10.0))
    writer = CheckpointWriter(
        "/tmp/writer-demo", {"v": v},
        tf.train.experimental.MaxShardSizePolicy(max_shard_size=16),
        max_to_keep=2)
    info = writer.save("step-1", {"step": 1})
    print(info.num_shards, info.shard_sizes)
    ```
    """

    def __init__(
        self,
        directory: str,
        trackables: Mapping[str, Any],
        sharding_callback: tf.train.experimental.ShardingCallback | None = None,
        *,
        max_to_keep: int | None = None,
        async_save: bool = False,
        durable: bool = False,
        prefix: str = DEFAULT_PREFIX,
        select: Callable[[SaveInfo], bool] | None = None,
    ) -> None:
        if not isinstance(trackables, Mapping) or not trackables:
            raise CheckpointError(
                "trackables must be a non-empty dict {name: trackable}, got "
                f"{trackables!r}")
        for key, value in trackables.items():
            if not isinstance(key, str) or not key.isidentifier():
                raise CheckpointError(
                    f"trackable name {key!r} must be a Python identifier")
            if value is None:
                raise CheckpointError(f"trackable {key!r} is None")
        if max_to_keep is not None and (
                not isinstance(max_to_keep, int) or max_to_keep < 1):
            raise CheckpointError(
                f"max_to_keep must be a positive int or None, got {max_to_keep!r}")
        layout.check_name(prefix)
        self._directory = os.path.abspath(directory)
        self._names = list(trackables)
        self._callback = check_sharding_callback(
            sharding_callback or tf.train.experimental.ShardByTaskPolicy())
        self._max_to_keep = max_to_keep
        self._select = select
        self._async = bool(async_save)
        self._durable = bool(durable)
        self._prefix = prefix
        self._checkpoint = tf.train.Checkpoint(**trackables)
        self._pending: _Pending | None = None
        self._thread: threading.Thread | None = None
        self._last_info: SaveInfo | None = None
        self._last_sequence = 0
        os.makedirs(self._directory, exist_ok=True)
        layout.remove_stale(self._directory)

    @property
    def directory(self) -> str:
        """The checkpoints directory (absolute)."""
        return self._directory

    @property
    def sharding_callback(self) -> tf.train.experimental.ShardingCallback:
        """The user's sharding callback (unwrapped)."""
        return self._callback

    @property
    def async_save(self) -> bool:
        """Whether saves are written by a background thread."""
        return self._async

    @property
    def last_save_info(self) -> SaveInfo | None:
        """The `SaveInfo` of the last completed save of this writer."""
        return self._last_info

    def save(self, name: str,
             extra_manifest: Mapping[str, Any] | None = None) -> SaveInfo | None:
        """Writes one checkpoint named `name`, replacing one of that name.

        Args:
            name: Directory name of the checkpoint inside `directory`.
            extra_manifest: Further manifest fields. `epoch`, `batch` and
                `step` (ints) fill the `SaveInfo` fields of those names; any
                other JSON-serializable entry lands in `SaveInfo.extra`.

        Returns:
            The `SaveInfo` of the new checkpoint, or `None` if `async_save`
            (see `wait()` and `last_save_info`).

        Raises:
            ShardingCallbackError: If the sharding callback's shards break a
                sharding rule (also for asynchronous saves: validation is done
                before `save` returns).
            CheckpointError: If `name` or `extra_manifest` is invalid, or the
                previous asynchronous save failed.
        """
        layout.check_name(name)
        fields, free = _split_extra(extra_manifest)
        self.wait()
        sequence = max(layout.next_sequence(self._directory),
                       self._last_sequence + 1)
        self._last_sequence = sequence
        temp_dir = layout.temp_dir_for(self._directory, name)
        os.makedirs(temp_dir)
        read_done = threading.Event()

        def after_call() -> None:
            # Inside a tf.function (several tasks) the callback runs while
            # tracing, before any value is read: then wait for the write.
            if tf.executing_eagerly():
                read_done.set()

        pending = _Pending(
            name=name, temp_dir=temp_dir, sequence=sequence, created=time.time(),
            start=time.perf_counter(), fields=fields, free=free,
            callback=ValidatingShardingCallback(self._callback,
                                                after_call=after_call))
        if not self._async:
            self._write(pending)
            if pending.error is not None:
                raise pending.error
            return pending.info

        def write_in_background() -> None:
            try:
                self._write(pending)
            finally:
                read_done.set()

        thread = threading.Thread(target=write_in_background, daemon=False,
                                  name=f"keras_elastic-checkpoint-{name}")
        self._pending, self._thread = pending, thread
        thread.start()
        # The saver reads every variable before it calls the sharding
        # callback; once the callback ran, training may change them.
        read_done.wait()
        if pending.callback.error is not None:
            self.wait()  # Raises the callback's error.
        return None

    def wait(self) -> SaveInfo | None:
        """Waits for the pending asynchronous save to be complete.

        Returns:
            The `SaveInfo` of the last completed save (or `None`).

        Raises:
            ShardingCallbackError: If the pending save's callback broke a rule
                (nothing was committed).
            Exception: Whatever stopped the pending save from being written.
        """
        pending, thread = self._pending, self._thread
        self._pending = self._thread = None
        if thread is not None:
            thread.join()
        if pending is not None and pending.error is not None:
            raise pending.error
        return self._last_info

    def _write(self, pending: _Pending) -> None:
        """Writes the data, then completes the save. Errors go to `pending`."""
        try:
            self._checkpoint.write(
                os.path.join(pending.temp_dir, self._prefix),
                options=tf.train.CheckpointOptions(
                    experimental_sharding_callback=pending.callback))
        except BaseException as e:
            shutil.rmtree(pending.temp_dir, ignore_errors=True)
            pending.error = e
            pending.done.set()
            if not isinstance(e, Exception):
                raise
            return
        self._finish(pending)

    def _finish(self, pending: _Pending) -> None:
        """Completes a written save: manifest, rename, prune. Never raises."""
        try:
            prefix = os.path.join(pending.temp_dir, self._prefix)
            files = _shard_files(prefix)
            if not os.path.exists(prefix + ".index") or not files:
                raise CheckpointError(
                    f"TensorFlow wrote no checkpoint files under {prefix}")
            layout_ = pending.callback.layout
            info = SaveInfo(
                path=os.path.join(self._directory, pending.name),
                name=pending.name,
                sequence=pending.sequence,
                created=pending.created,
                prefix=self._prefix,
                trackables=list(self._names),
                description=pending.callback.description,
                callback_class=(f"{type(self._callback).__module__}."
                                f"{type(self._callback).__qualname__}"),
                latency_s=pending.callback.callback_seconds,
                validation_s=pending.callback.validation_seconds,
                write_s=0.0,
                num_shards=len(files),
                shard_sizes=[os.path.getsize(f) for f in files],
                shard_tensors=[[k if not s else f"{k}[{s}]" for k, s in shard]
                               for shard in layout_],
                async_save=self._async,
                checksums=integrity.file_checksums(pending.temp_dir),
                extra=dict(pending.free),
                **pending.fields,
            )
            info.write_s = time.perf_counter() - pending.start
            write_manifest(pending.temp_dir, info, durable=self._durable)
            layout.commit(pending.temp_dir, info.path, durable=self._durable)
            pending.info = info
            self._last_info = info
            logging.info(
                "Saved checkpoint %s: %d shards of %s bytes (total %d); sharding "
                "callback %r took %.3f ms, validation %.3f ms; save took %.3f s",
                info.path, info.num_shards, info.shard_sizes,
                sum(info.shard_sizes), info.description, info.latency_s * 1e3,
                info.validation_s * 1e3, info.write_s)
            layout.prune(self._directory, self._max_to_keep, self._select)
        except BaseException as e:  # Kept for save()/wait(); see docstring.
            if pending.info is None:
                shutil.rmtree(pending.temp_dir, ignore_errors=True)
                logging.error("Checkpoint %s was not saved: %s", pending.name, e)
            pending.error = e
        finally:
            pending.done.set()


def save_trackables(
    directory: str,
    name: str,
    trackables: Mapping[str, Any],
    sharding_callback: tf.train.experimental.ShardingCallback | None = None,
    extra_manifest: Mapping[str, Any] | None = None,
    *,
    max_to_keep: int | None = None,
) -> SaveInfo:
    """Writes one validated, sharded checkpoint of `trackables`, atomically.

    The checkpoint appears as `directory/name` (with `manifest.json`) only
    once it is completely written; a checkpoint of the same name is replaced.

    Args:
        directory: The checkpoints directory.
        name: The new checkpoint's directory name.
        trackables: `{name: trackable}` as for `tf.train.Checkpoint`.
        sharding_callback: A `tf.train.experimental.ShardingCallback`
            instance; default `ShardByTaskPolicy()`.
        extra_manifest: Further manifest fields (`epoch`, `batch`, `step`
            and any JSON-serializable extras).
        max_to_keep: Prune `directory` to this many checkpoints afterwards.

    Returns:
        The new checkpoint's `SaveInfo`.

    Raises:
        ShardingCallbackError: If the callback's shards break a sharding rule;
            nothing is written then.

    Example:

    ```python
    import tensorflow as tf
    import keras_elastic as ke

    module = tf.Module()
    module.w = tf.Variable(tf.ones([4, 4]))
    info = ke.checkpoint.save_trackables(
        "/tmp/ps-ckpts", "ps-0", {"vars": module}, extra_manifest={"step": 7})
    print(info.path, info.step)
    ```
    """
    writer = CheckpointWriter(directory, trackables, sharding_callback,
                              max_to_keep=max_to_keep)
    return cast(SaveInfo, writer.save(name, extra_manifest))

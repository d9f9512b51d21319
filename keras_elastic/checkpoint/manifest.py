"""The manifest of a checkpoint: what was saved, how, and that it is complete.

Every checkpoint is a directory holding TensorFlow's files (`ckpt.index`,
`ckpt.data-*-of-*`) and `manifest.json`, written last and atomically. A
directory without a readable manifest is not a checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from typing import Any

from keras_elastic.checkpoint.errors import CheckpointError

MANIFEST_NAME = "manifest.json"
FORMAT = "keras_elastic.checkpoint"
VERSION = 1


@dataclasses.dataclass
class SaveInfo:
    """One complete checkpoint, as recorded in its `manifest.json`.

    Returned by a save and by `read_manifest`, `list_checkpoints` and
    `latest`. Manifest keys this version does not know are kept in `extra`,
    so newer writers (for example parameter-server saves that add the number
    of servers or the master's progress) stay readable.

    Attributes:
        path: The checkpoint directory (absolute).
        name: Its name inside the checkpoints directory.
        sequence: Save number within that directory; the highest is latest.
        created: Unix time at which the save started.
        prefix: TensorFlow file prefix inside `path` (`tf_prefix` joins them).
        trackables: Names of the saved objects, e.g. `["model", "optimizer"]`.
        description: The sharding callback's description.
        callback_class: The sharding callback's qualified class name.
        latency_s: Seconds spent in the sharding callback.
        validation_s: Seconds spent validating its shards.
        write_s: Seconds from the start of the save until it was complete.
        num_shards: Number of data files.
        shard_sizes: Size in bytes of each data file, in shard order.
        shard_tensors: For each shard, the tensors it holds, as
            `checkpoint_key` or `checkpoint_key[slice_spec]`.
        async_save: Whether the data was written by a background thread.
        epoch: Number of completed epochs, if the saver knew it.
        batch: Batches done in the epoch in progress (0 at an epoch's end).
        step: The optimizer's step count, if known.
        checksums: The CRC-32 of each file of the checkpoint, by name
            (`integrity.verify` checks them before a checkpoint is used).
        extra: Any further manifest fields.

    Example:

    ```python
    import keras_elastic as ke

    info = ke.checkpoint.latest("/tmp/ckpts")
    if info is not None:
        print(info.name, info.epoch, info.num_shards, info.shard_sizes)
    ```
    """

    path: str
    name: str
    sequence: int
    created: float
    prefix: str
    trackables: list[str]
    description: str
    callback_class: str
    latency_s: float
    validation_s: float
    write_s: float
    num_shards: int
    shard_sizes: list[int]
    shard_tensors: list[list[str]]
    async_save: bool = False
    epoch: int | None = None
    batch: int | None = None
    step: int | None = None
    checksums: dict[str, int] = dataclasses.field(default_factory=dict)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def tf_prefix(self) -> str:
        """The prefix to give `tf.train.Checkpoint.read` or `load_checkpoint`."""
        return os.path.join(self.path, self.prefix)

    @property
    def initial_epoch(self) -> int:
        """The `initial_epoch` for `model.fit` to resume from this checkpoint."""
        return int(self.epoch or 0)

    def to_json(self) -> dict[str, Any]:
        """The manifest as a JSON-ready dict (without `path`)."""
        data = {"format": FORMAT, "version": VERSION}
        for field in dataclasses.fields(self):
            if field.name not in ("path", "extra"):
                data[field.name] = getattr(self, field.name)
        data.update(self.extra)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], path: str) -> SaveInfo:
        """Builds a `SaveInfo` from a manifest dict read from `path`."""
        known = {f.name for f in dataclasses.fields(cls)} - {"path", "extra"}
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.name in known and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING
                   and f.name not in data]
        if data.get("format") != FORMAT or missing:
            raise CheckpointError(
                f"{os.path.join(path, MANIFEST_NAME)} is not a keras_elastic "
                f"checkpoint manifest (format={data.get('format')!r}, missing "
                f"fields {missing})")
        values = {k: v for k, v in data.items() if k in known}
        extra = {k: v for k, v in data.items()
                 if k not in known and k not in ("format", "version")}
        return cls(path=os.path.abspath(path), extra=extra, **values)


RESERVED_KEYS = frozenset(
    f.name for f in dataclasses.fields(SaveInfo)) | {"format", "version"}


def write_json_atomic(path: str, data: dict[str, Any], *,
                      durable: bool = False) -> None:
    """Writes `data` as JSON to `path` atomically (temporary file + rename).

    Readers see either the old file or the new one complete, also if the
    writer is killed. With `durable=True` the file and its directory are also
    flushed to disk (fsync), so this holds across a power loss too.

    Example:

    ```python
    from keras_elastic.checkpoint.manifest import write_json_atomic

    write_json_atomic("/tmp/progress.json", {"epoch": 3})
    ```
    """
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    if durable:
        fsync_directory(directory)


def fsync_directory(directory: str) -> None:
    """Flushes a directory's entries (renames, new files) to disk.

    Example:

    ```python
    from keras_elastic.checkpoint.manifest import fsync_directory

    fsync_directory("/tmp")
    ```
    """
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(directory: str, info: SaveInfo, *,
                   durable: bool = False) -> None:
    """Writes `info` as `directory/manifest.json`, atomically.

    `durable=True` flushes it to disk (see `write_json_atomic`).

    Example:

    ```python
    import keras_elastic as ke

    info = ke.checkpoint.latest("/tmp/ckpts")
    if info is not None:
        info.extra["note"] = "best so far"
        ke.checkpoint.write_manifest(info.path, info)
    ```
    """
    write_json_atomic(os.path.join(directory, MANIFEST_NAME), info.to_json(),
                      durable=durable)


def read_manifest(path: str) -> SaveInfo:
    """Reads the manifest of the checkpoint directory `path`.

    Args:
        path: A checkpoint directory (holding `manifest.json`).

    Returns:
        The checkpoint's `SaveInfo`.

    Raises:
        CheckpointError: If `path` has no manifest (an incomplete or foreign
            directory) or the manifest is unreadable.

    Example:

    ```python
    import keras_elastic as ke

    for info in ke.checkpoint.list_checkpoints("/tmp/ckpts"):
        print(ke.checkpoint.read_manifest(info.path).description)
    ```
    """
    file = os.path.join(path, MANIFEST_NAME)
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError as e:
        what = ("does not exist" if not os.path.exists(path) else
                f"has no {MANIFEST_NAME}, so it is not a complete checkpoint")
        raise CheckpointError(f"Checkpoint directory {path} {what}") from e
    except (OSError, ValueError) as e:
        raise CheckpointError(f"Cannot read checkpoint manifest {file}: {e}") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"Checkpoint manifest {file} is not a JSON object")
    return SaveInfo.from_json(data, path)

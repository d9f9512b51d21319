"""Where checkpoints live in a directory, and how they appear and disappear.

A checkpoints directory holds one sub-directory per complete checkpoint. A
save writes into a hidden temporary directory (`.tmp-<name>-<host>-<pid>-...`)
and renames it into place only once its manifest is written, so a reader
never sees a half-written checkpoint; replaced and pruned checkpoints are
first renamed to hidden names (`.old-*`, `.del-*`) and then deleted.
"""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from collections.abc import Callable

from absl import logging

from keras_elastic.checkpoint.errors import CheckpointError, NoIntactCheckpointError
from keras_elastic.checkpoint.manifest import (
    MANIFEST_NAME,
    SaveInfo,
    fsync_directory,
    read_manifest,
)
from keras_elastic.common.pids import pid_alive

TMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"
DEL_PREFIX = ".del-"


def check_name(name: str) -> str:
    """Returns `name` if it can name a checkpoint directory.

    Raises:
        CheckpointError: If `name` is empty, hidden, or not a single path
            component.

    Example:

    ```python
    from keras_elastic.checkpoint.layout import check_name

    check_name("ckpt-0003")
    ```
    """
    if (not name or name.startswith(".") or os.sep in name
            or (os.altsep and os.altsep in name)):
        raise CheckpointError(
            f"Checkpoint name {name!r} must be a single, non-hidden path "
            "component (no '/', not starting with '.')")
    return name


def temp_dir_for(directory: str, name: str) -> str:
    """A fresh hidden directory path to write checkpoint `name` into."""
    host = socket.gethostname().replace("-", "_")
    return os.path.join(
        directory,
        f"{TMP_PREFIX}{name}-{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, MANIFEST_NAME))


def _old_original_name(entry: str) -> str:
    """`.old-<name>-<hex8>` -> `<name>`."""
    return entry[len(OLD_PREFIX):].rsplit("-", 1)[0]


def list_checkpoints(directory: str) -> list[SaveInfo]:
    """Lists the complete checkpoints in `directory`, oldest first.

    Incomplete saves (hidden temporary directories, or directories without a
    manifest) are never listed. Order is by the manifest's `sequence`.

    Args:
        directory: A checkpoints directory (may not exist yet: then `[]`).

    Returns:
        The checkpoints' `SaveInfo`s, oldest first.

    Example:

    ```python
    import keras_elastic as ke

    for info in ke.checkpoint.list_checkpoints("/tmp/ckpts"):
        print(info.sequence, info.name, info.epoch)
    ```
    """
    if not os.path.isdir(directory):
        return []
    found: dict[str, SaveInfo] = {}
    rescued: dict[str, SaveInfo] = {}
    for entry in sorted(os.listdir(directory)):
        path = os.path.join(directory, entry)
        if not os.path.isdir(path) or not _complete(path):
            continue
        if entry.startswith(OLD_PREFIX):
            # A checkpoint being replaced when its writer died: still valid
            # as long as its replacement did not land.
            try:
                rescued[_old_original_name(entry)] = read_manifest(path)
            except CheckpointError as e:
                logging.warning("Skipping %s: %s", path, e)
            continue
        if entry.startswith("."):
            continue
        try:
            found[entry] = read_manifest(path)
        except CheckpointError as e:
            logging.warning("Skipping %s: %s", path, e)
    for name, info in rescued.items():
        found.setdefault(name, info)
    return sorted(found.values(), key=lambda i: (i.sequence, i.created, i.name))


def latest(directory: str) -> SaveInfo | None:
    """The most recent complete checkpoint in `directory`, or `None`.

    Example:

    ```python
    import keras_elastic as ke

    info = ke.checkpoint.latest("/tmp/ckpts")
    print(None if info is None else info.path)
    ```
    """
    checkpoints = list_checkpoints(directory)
    return checkpoints[-1] if checkpoints else None


def latest_intact(directory: str) -> SaveInfo | None:
    """The most recent checkpoint in `directory` whose files verify
    (`integrity.verify`), or `None` if there is no checkpoint at all. Newer
    checkpoints that do not verify are skipped, each logged with its faults.

    Raises:
        NoIntactCheckpointError: There are checkpoints, and none verifies;
            the message names each with its faults.

    Example:

    ```python
    import keras_elastic as ke

    info = ke.checkpoint.latest_intact("/tmp/ckpts")
    ```
    """
    return pick_intact(list_checkpoints(directory), directory)


def pick_intact(checkpoints: list[SaveInfo], where: str) -> SaveInfo | None:
    """`latest_intact` over the given `checkpoints` (of `where`)."""
    from keras_elastic.checkpoint import integrity

    info, skipped = integrity.newest_intact(checkpoints)
    for bad, faults in skipped:
        logging.warning("checkpoint %s is damaged, skipped: %s", bad.path,
                        "; ".join(faults))
    if info is None and checkpoints:
        raise NoIntactCheckpointError(
            f"no intact checkpoint in {where}: each of the {len(checkpoints)} is "
            f"damaged\n{integrity.describe_skipped(skipped)}")
    return info


def next_sequence(directory: str) -> int:
    """One more than the highest `sequence` of the checkpoints in `directory`."""
    checkpoints = list_checkpoints(directory)
    return checkpoints[-1].sequence + 1 if checkpoints else 1


def remove_stale(directory: str) -> list[str]:
    """Removes what dead savers left behind in `directory`.

    Temporary directories of saves by processes of this host that no longer
    run are deleted; so are half-deleted checkpoints (`.del-*`). A checkpoint
    that was being replaced (`.old-<name>-*`) is deleted if `<name>` is
    complete, and renamed back to `<name>` otherwise.

    Returns:
        The paths removed or renamed.

    Example:

    ```python
    from keras_elastic.checkpoint.layout import remove_stale

    print(remove_stale("/tmp/ckpts"))
    ```
    """
    if not os.path.isdir(directory):
        return []
    host = socket.gethostname().replace("-", "_")
    touched = []
    for entry in os.listdir(directory):
        path = os.path.join(directory, entry)
        if entry.startswith(TMP_PREFIX):
            parts = entry.rsplit("-", 3)
            if len(parts) != 4 or parts[1] != host or not parts[2].isdigit():
                continue
            if pid_alive(int(parts[2])):
                continue
            shutil.rmtree(path, ignore_errors=True)
            touched.append(path)
        elif entry.startswith(DEL_PREFIX):
            shutil.rmtree(path, ignore_errors=True)
            touched.append(path)
        elif entry.startswith(OLD_PREFIX):
            original = os.path.join(directory, _old_original_name(entry))
            if _complete(original) or not _complete(path):
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.exists(original):
                continue  # Should not happen: an incomplete dir took the name.
            else:
                os.rename(path, original)
            touched.append(path)
    for path in touched:
        logging.info("Removed the leftovers of an interrupted save: %s", path)
    return touched


def commit(temp_dir: str, final_dir: str, *, durable: bool = False) -> None:
    """Renames a fully written `temp_dir` to `final_dir`, replacing it.

    If `final_dir` exists it is first renamed to a hidden `.old-*` name (still
    listed as a checkpoint if the process dies right there), then deleted once
    the new checkpoint is in place. `durable=True` first flushes every file of
    `temp_dir` to disk and then the rename, so that a power loss cannot leave
    a manifest beside missing data.

    Example:

    ```python
    from keras_elastic.checkpoint.layout import commit

    # commit("/tmp/ckpts/.tmp-ckpt-1-host-123-abcd1234", "/tmp/ckpts/ckpt-1")
    ```
    """
    directory = os.path.dirname(final_dir)
    name = os.path.basename(final_dir)
    if durable:
        for entry in os.listdir(temp_dir):
            fd = os.open(os.path.join(temp_dir, entry), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_directory(temp_dir)
    old = None
    if os.path.lexists(final_dir):
        old = os.path.join(directory,
                           f"{OLD_PREFIX}{name}-{uuid.uuid4().hex[:8]}")
        os.rename(final_dir, old)
    os.rename(temp_dir, final_dir)
    if durable:
        fsync_directory(directory)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def delete_checkpoint(path: str) -> None:
    """Deletes a checkpoint directory so that no reader sees it half-deleted.

    Example:

    ```python
    import keras_elastic as ke

    for info in ke.checkpoint.list_checkpoints("/tmp/ckpts")[:-1]:
        ke.checkpoint.delete_checkpoint(info.path)
    ```
    """
    directory, name = os.path.split(os.path.abspath(path))
    trash = os.path.join(directory, f"{DEL_PREFIX}{name}-{uuid.uuid4().hex[:8]}")
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def prune(directory: str, max_to_keep: int | None,
          select: Callable[[SaveInfo], bool] | None = None) -> list[str]:
    """Deletes all but the `max_to_keep` newest checkpoints in `directory`
    (among those `select` accepts, if given: other checkpoints are left alone).

    Returns:
        The deleted checkpoint paths.

    Example:

    ```python
    from keras_elastic.checkpoint.layout import prune

    print(prune("/tmp/ckpts", max_to_keep=3))
    ```
    """
    if max_to_keep is None:
        return []
    everything = list_checkpoints(directory)
    checkpoints = [i for i in everything if select is None or select(i)]
    doomed = checkpoints[:max(0, len(checkpoints) - max_to_keep)]
    # An incremental checkpoint kept keeps its base chain (its tables' rows).
    by_name = {os.path.basename(os.path.normpath(i.path)): i for i in everything}
    needed: set[str] = set()
    for info in everything:
        if info in doomed:
            continue
        base = info.extra.get("table_base")
        while base and base not in needed:
            needed.add(base)
            base = by_name[base].extra.get("table_base") if base in by_name else None
    doomed = [i for i in doomed if os.path.basename(os.path.normpath(i.path))
              not in needed]
    for info in doomed:
        delete_checkpoint(info.path)
        logging.info("Deleted old checkpoint %s (max_to_keep=%d)", info.path,
                     max_to_keep)
    return [info.path for info in doomed]

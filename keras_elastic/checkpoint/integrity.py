"""Is a checkpoint intact? Checked before one is used, without TensorFlow.

Every save records in its manifest the CRC-32 of each file it wrote
(`checksums`, `writer.py`). `verify` re-reads the files and compares: a file
missing, cut short, or with one byte changed is named. A parameter-server
checkpoint is intact when its manifest is and every server's part is.
`newest_intact` is what a recovery, `--resume`, `keras-elastic train
--checkpoint_dir` and `restore_on_start` use: the newest checkpoint that
verifies, and each newer one skipped with its faults.

A checkpoint written before checksums were recorded is checked for its
files and their sizes only.

Example:

>>> import tensorflow as tf
>>> from keras_elastic.checkpoint import CheckpointWriter, integrity, layout
>>> writer = CheckpointWriter("ckpts", {"v": tf.Variable(tf.range(10.0))})
>>> for name in ("ckpt-0003", "ckpt-0004"):
...     _ = writer.save(name)
>>> with open("ckpts/ckpt-0004/ckpt.data-00000-of-00001", "r+b") as f:
...     _ = f.seek(3)
...     _ = f.write(b"?")                   # one byte changed on disk
>>> info, skipped = integrity.newest_intact(layout.list_checkpoints("ckpts"))
>>> info.name
'ckpt-0003'
>>> [(s.name, faults) for s, faults in skipped]
[('ckpt-0004', ["ckpt.data-00000-of-00001: CRC-32 ... differs from the
manifest's ... (the file changed after it was written)"])]
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable

from keras_elastic.checkpoint.errors import CheckpointError
from keras_elastic.checkpoint.manifest import MANIFEST_NAME, SaveInfo, read_manifest

_CHUNK = 1 << 22


def crc32_of(path: str) -> int:
    """The CRC-32 of a file's bytes."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def file_checksums(directory: str) -> dict[str, int]:
    """{file name: CRC-32} of the files of a checkpoint directory being
    written (its manifest aside; sub-directories are other parts)."""
    return {name: crc32_of(os.path.join(directory, name))
            for name in sorted(os.listdir(directory))
            if name != MANIFEST_NAME and os.path.isfile(os.path.join(directory, name))}


def _verify_files(info: SaveInfo) -> list[str]:
    faults = []
    if info.checksums:
        expected = info.checksums
    else:  # an older manifest: the data files and their sizes only
        prefix = os.path.basename(info.prefix) if info.prefix else "ckpt"
        expected = {f"{prefix}.data-{i:05d}-of-{info.num_shards:05d}": None
                    for i in range(info.num_shards)}
    sizes = dict(zip(sorted(n for n in expected if ".data-" in n), info.shard_sizes))
    for name, crc in expected.items():
        path = os.path.join(info.path, name)
        if not os.path.isfile(path):
            faults.append(f"{name} is missing")
            continue
        size = os.path.getsize(path)
        if name in sizes and size != sizes[name]:
            faults.append(f"{name} has {size} bytes, the manifest says {sizes[name]}")
        elif crc is not None and (actual := crc32_of(path)) != crc:
            faults.append(f"{name}: CRC-32 {actual:08x} differs from the manifest's "
                          f"{crc:08x} (the file changed after it was written)")
    return faults


def verify(info: SaveInfo) -> list[str]:
    """The faults of a checkpoint ([] if it is intact): its files, and for a
    parameter-server checkpoint every server's part."""
    parts = info.extra.get("parts")
    if not parts:
        return _verify_files(info)
    faults = _verify_base(info)
    for part in parts:
        path = os.path.join(info.path, part)
        try:
            part_info = read_manifest(path)
        except (CheckpointError, OSError, ValueError) as e:
            faults.append(f"{part}: {e}")
            continue
        faults += [f"{part}/{fault}" for fault in _verify_files(part_info)]
    return faults


def _verify_base(info: SaveInfo) -> list[str]:
    """An incremental checkpoint's faults of its base chain (each link named):
    its embedding rows are only complete with every link."""
    name = info.extra.get("table_base")
    if not name:
        return []
    path = os.path.join(os.path.dirname(os.path.normpath(info.path)), name)
    try:
        base = read_manifest(path)
    except (CheckpointError, OSError, ValueError) as e:
        return [f"its tables' base checkpoint {name} cannot be read: {e}"]
    return [f"base {name}: {fault}" for fault in verify(base)]


def newest_intact(infos: Iterable[SaveInfo]
                  ) -> tuple[SaveInfo | None, list[tuple[SaveInfo, list[str]]]]:
    """The newest of `infos` that verifies (None if none does), and each
    newer one skipped with its faults."""
    skipped = []
    for info in sorted(infos, key=lambda i: i.sequence, reverse=True):
        faults = verify(info)
        if not faults:
            return info, skipped
        skipped.append((info, faults))
    return None, skipped


def describe_skipped(skipped: list[tuple[SaveInfo, list[str]]]) -> str:
    """One line per checkpoint skipped: its path and its faults."""
    return "\n".join(f"  {info.path}: {'; '.join(faults)}" for info, faults in skipped)

"""Writes that fail for a reason the user can fix: said in one line.

A full disk, a quota, a read-only filesystem or a missing permission must
not end a role in a Python traceback. `describe_write_error` turns such an
error into one line: the path, what the error means, and the space left
there, e.g.

    cannot write /jobs/j1/ledger.json: No space left on device (0 B free on /jobs)

Example:

>>> import errno
>>> error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
>>> describe_write_error("/", error).startswith("cannot write /: No space left")
True
>>> is_disk_condition(error)
True
"""

from __future__ import annotations

import errno
import os

# Conditions of the filesystem, not bugs: the user can fix them.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES,
                         errno.EPERM, errno.EFBIG, errno.EMFILE})
_DISK_WORDS = ("No space left on device", "Disk quota exceeded",
               "Read-only file system", "Permission denied", "File too large")


def is_disk_condition(error: BaseException) -> bool:
    """A full disk, a quota, a read-only filesystem, a permission (also as
    TensorFlow words it in its own errors)."""
    if isinstance(error, OSError) and error.errno in DISK_ERRNOS:
        return True
    text = str(error)
    return any(word in text for word in _DISK_WORDS)


def human_bytes(n: int) -> str:
    """
    >>> human_bytes(1536)
    '1.5 KB'
    """
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # not reached


def free_space(path: str) -> tuple[int, str] | None:
    """(bytes free, mount point) of the filesystem holding `path` (or its
    nearest existing parent); None if unknown."""
    probe = os.path.realpath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        stats = os.statvfs(probe)
    except OSError:
        return None
    mount = probe
    while not os.path.ismount(mount) and os.path.dirname(mount) != mount:
        mount = os.path.dirname(mount)
    return stats.f_bavail * stats.f_frsize, mount


def describe_write_error(path: str, error: BaseException) -> str:
    """One line: the path, what went wrong, the space left there."""
    if isinstance(error, OSError) and error.errno is not None:
        meaning = os.strerror(error.errno)
    else:
        meaning = next((w for w in _DISK_WORDS if w in str(error)),
                       str(error).strip().splitlines()[0] if str(error).strip()
                       else type(error).__name__)
    free = free_space(path)
    where = f" ({human_bytes(free[0])} free on {free[1]})" if free else ""
    return f"cannot write {path}: {meaning}{where}"

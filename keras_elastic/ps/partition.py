"""Which parameter server owns a variable: a stable hash of its name.

Stable across processes and Python versions (CRC-32, not `hash()`), so every
worker and every restart agrees without talking to anybody.

Example:

>>> ps_for("dense/kernel", 2) in (0, 1)
True
"""

from __future__ import annotations

import zlib

ASSIGN_PREFIX = "="  # chunk names of non-trainable values in a push


def ps_for(name: str, num_ps: int) -> int:
    """Index of the parameter server that owns variable `name`."""
    if num_ps <= 0:
        raise ValueError(f"num_ps must be positive, got {num_ps}")
    return zlib.crc32(name.encode("utf-8")) % num_ps


def partition(names: list[str], num_ps: int) -> list[list[str]]:
    """Splits `names` into one list per parameter server, order kept."""
    parts: list[list[str]] = [[] for _ in range(num_ps)]
    for name in names:
        parts[ps_for(name, num_ps)].append(name)
    return parts

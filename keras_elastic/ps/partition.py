"""Which parameter server owns a variable: a stable hash of its name.

Stable across processes and Python versions (CRC-32, not `hash()`), so every
worker and every restart agrees without talking to anybody.

Example:

>>> ps_for("dense/kernel", 2) in (0, 1)
True
"""

from __future__ import annotations

import zlib

import numpy as np

ASSIGN_PREFIX = "="  # chunk names of non-trainable values in a push
# Chunk names of the values a push's non-trainable values were computed from
# (the variable at the step's start): the server merges the change into a value
# another worker changed meanwhile (`ParameterStore.push`'s `bases`).
BASE_PREFIX = "~"
# Chunk names of embedding rows in a push: "@table/ids" (int64) and
# "@table/grads" (one row per id).
SPARSE_PREFIX = "@"
# Init chunk names of the optimizer's state (a worker whose optimizer already
# trained: `ke.wrap(keras.models.load_model(path))`), by server-side path.
OPTIMIZER_STATE_PREFIX = "%"


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


def row_owner(ids: np.ndarray, num_ps: int) -> np.ndarray:
    """Index of the parameter server owning each embedding row id: a stable
    mix of the id (splitmix64), so neighbouring ids spread over the servers
    and a table restores onto any number of them.

    >>> row_owner(np.arange(6), 2).tolist()  # doctest: +SKIP
    [1, 0, 0, 1, 1, 0]
    """
    if num_ps <= 0:
        raise ValueError(f"num_ps must be positive, got {num_ps}")
    if num_ps == 1:
        return np.zeros(np.shape(ids), np.int64)
    with np.errstate(over="ignore"):
        z = np.asarray(ids, np.int64).astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(num_ps)).astype(np.int64)

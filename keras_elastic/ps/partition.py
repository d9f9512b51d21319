"""Which parameter server holds what: whole variables, slices, table rows.

A variable too small to split goes whole to the server a stable hash of its
name picks (`ps_for`: CRC-32, not `hash()`, so every worker and every restart
agrees without talking to anybody). The trainable variables of at least
`partition_bytes` are split into slices of their elements that fill the
servers up to equal bytes (`layout`): the way TensorFlow's
`MinSizePartitioner` keeps a model's large variables from making one "hot"
server, but balanced over the whole model, so that a model whose one Dense
kernel is most of its bytes still spreads evenly, with at most
`num_ps - 1` cuts more than whole variables. Slices are only made for
optimizers whose update is elementwise (`elementwise`), where updating the
slices apart equals updating the variable.

Example:

>>> ps_for("dense/kernel", 2) in (0, 1)
True
>>> pieces = layout([Spec("k", 1000, 4, True), Spec("b", 10, 4, True)], 2, 1024)
>>> [(p.server, p.begin, p.end) for p in pieces["k"]]
[(0, 0, 505), (1, 505, 1000)]
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from collections.abc import Sequence

import numpy as np

from keras_elastic.common.variable_slices import slice_name

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

    >>> row_owner(np.arange(6), 2).tolist()
    [1, 1, 0, 1, 0, 0]
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


# Trainable variables of at least this many bytes are split over the servers
# (with an elementwise optimizer and more than one server); the launcher's
# --ps_partition_bytes sets it for a job through this environment variable.
PARTITION_BYTES_ENV = "KERAS_ELASTIC_PS_PARTITION_BYTES"
DEFAULT_PARTITION_BYTES = 64 << 10

# Keras optimizers whose update of an element depends on that element's
# gradient and state only (a slice updated alone equals the same elements of
# the variable updated whole). Not: Adafactor (factored moments), Lamb and
# Muon (norms or matrices of the whole variable), LossScaleOptimizer (one
# finite check over every gradient).
_ELEMENTWISE = frozenset({"SGD", "Adam", "AdamW", "Adamax", "Nadam", "Adagrad",
                          "Adadelta", "RMSprop", "Ftrl", "Lion"})


def partition_bytes() -> int | None:
    """The job's threshold (`PARTITION_BYTES_ENV`, default
    `DEFAULT_PARTITION_BYTES`); None: variables are never split (0 or less)."""
    raw = os.environ.get(PARTITION_BYTES_ENV, "")
    try:
        value = int(raw) if raw else DEFAULT_PARTITION_BYTES
    except ValueError:
        raise ValueError(f"{PARTITION_BYTES_ENV}={raw!r} is not a number of bytes"
                         ) from None
    return value if value > 0 else None


def elementwise(optimizer_config: dict) -> bool:
    """Whether the optimizer `keras.optimizers.serialize` gave updates each
    element apart (then its variables may be split over servers).

    >>> elementwise({"class_name": "Adam", "config": {"clipnorm": None}})
    True
    >>> elementwise({"class_name": "SGD", "config": {"clipnorm": 1.0}})
    False
    """
    if not isinstance(optimizer_config, dict):
        return False
    config = optimizer_config.get("config") or {}
    return (optimizer_config.get("class_name") in _ELEMENTWISE
            and config.get("clipnorm") is None
            and config.get("global_clipnorm") is None)


@dataclasses.dataclass(frozen=True)
class Spec:
    """A variable as `layout` sees it: key, number of elements, bytes per
    element, and whether it may be split (trainable, of an elementwise
    optimizer)."""

    key: str
    size: int
    itemsize: int
    splittable: bool


@dataclasses.dataclass(frozen=True)
class Piece:
    """Elements [begin, end) of variable `key`, held by `server` as `name`
    (the key itself for a variable held whole)."""

    key: str
    name: str
    server: int
    begin: int
    end: int


def layout(specs: Sequence[Spec], num_ps: int, partition_bytes: int | None
           ) -> dict[str, list[Piece]]:
    """Where each variable of one model goes: {key: its pieces, in element
    order}. Variables not split go whole to `ps_for(key)`; the splittable ones
    of at least `partition_bytes` bytes are laid end to end (in the order of
    `specs`) and cut so that every server ends with the same bytes as far as
    the whole ones allow (water-filling). A pure function of its arguments:
    every worker computes the same layout.

    >>> pieces = layout([Spec("w", 8, 4, True)], 2, 16)
    >>> [p.name for p in pieces["w"]]
    ['w__slice_0_4_of_8', 'w__slice_4_8_of_8']
    """
    if num_ps <= 0:
        raise ValueError(f"num_ps must be positive, got {num_ps}")
    split = [s for s in specs if num_ps > 1 and partition_bytes is not None
             and s.splittable and s.size >= 2 and s.size * s.itemsize >= partition_bytes]
    chosen = {s.key for s in split}
    out: dict[str, list[Piece]] = {}
    held = [0] * num_ps
    for s in specs:
        if s.key not in chosen:
            server = ps_for(s.key, num_ps)
            held[server] += s.size * s.itemsize
            out[s.key] = [Piece(s.key, s.key, server, 0, s.size)]
    if not split:
        return out
    caps = _water_fill(held, sum(s.size * s.itemsize for s in split))
    bounds = np.cumsum(caps).tolist()  # byte offsets where each server's share ends
    offset = 0
    for s in split:
        nbytes = s.size * s.itemsize
        pieces = []
        start = 0
        for server, end_byte in enumerate(bounds):
            if start >= s.size:
                break
            if end_byte <= offset:
                continue
            end = min(s.size, max(start, round((end_byte - offset) / s.itemsize)))
            if server == num_ps - 1:
                end = s.size
            if end > start:
                pieces.append(Piece(s.key, slice_name(s.key, start, end, s.size),
                                    server, start, end))
                start = end
        out[s.key] = pieces
        offset += nbytes
    return {s.key: out[s.key] for s in specs}


def _water_fill(held: list[int], amount: int) -> list[int]:
    """Bytes to add to each server so that they end as even as `held` allows:
    the fullest ones get none, the others are filled to one level."""
    order = sorted(range(len(held)), key=lambda i: (held[i], i))
    level = 0.0
    for k in range(1, len(held) + 1):
        level = (amount + sum(held[i] for i in order[:k])) / k
        if k == len(held) or level <= held[order[k]]:
            break
    caps = [max(0, int(level - h)) for h in held]
    short = amount - sum(caps)  # what flooring left, to the emptiest servers
    for i in order:
        if short <= 0:
            break
        if level > held[i]:
            caps[i] += 1
            short -= 1
    caps[order[0]] += max(0, short)
    return caps

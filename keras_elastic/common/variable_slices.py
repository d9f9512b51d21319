"""Slices of a variable partitioned over parameter servers, by name.

A trainable variable large enough is split into contiguous ranges of its
elements (in C order), each a 1-D variable on one server (`ps/partition.py`
decides where). A slice is named after its variable and its range:

    KEY__slice_<begin>_<end>_of_<size>

so anything named after a variable (its optimizer's slots,
`{KEY}_momentum`, and the checkpoint names `v_...`, `o_...` made from both)
names the slice's share the same way, whatever the characters of `KEY` become
in those names. `assemble` rebuilds whole values from slices (a checkpoint
saved by N servers, read for M; a worker's pull), `cut` takes a slice out of a
whole value.

Example:

>>> name = slice_name("0003/dense/kernel", 0, 6, 12)
>>> name
'0003/dense/kernel__slice_0_6_of_12'
>>> parse(name + "_momentum")
SliceName(prefix='0003/dense/kernel', begin=0, end=6, size=12, suffix='_momentum')
>>> import numpy as np
>>> whole = assemble({name: np.zeros(6), slice_name("0003/dense/kernel", 6, 12, 12):
...                   np.ones(6)})
>>> whole["0003/dense/kernel"].tolist()
[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import numpy as np

MARK = "__slice_"
_PATTERN = re.compile(r"^(.*?)__slice_(\d+)_(\d+)_of_(\d+)(.*)$")


@dataclasses.dataclass(frozen=True)
class SliceName:
    """A parsed slice name: the whole variable's name is `prefix + suffix`."""

    prefix: str
    begin: int
    end: int
    size: int
    suffix: str

    @property
    def whole(self) -> str:
        return self.prefix + self.suffix


def slice_name(key: str, begin: int, end: int, size: int) -> str:
    """The name of elements [begin, end) of the `size` elements of `key`."""
    if not 0 <= begin < end <= size:
        raise ValueError(f"bad slice [{begin}, {end}) of {size} elements of '{key}'")
    return f"{key}{MARK}{begin}_{end}_of_{size}"


def parse(name: str) -> SliceName | None:
    """The slice `name` stands for, or None for a whole variable's name."""
    found = _PATTERN.match(name)
    if found is None:
        return None
    prefix, begin, end, size, suffix = found.groups()
    return SliceName(prefix, int(begin), int(end), int(size), suffix)


def _groups(names) -> dict[tuple[str, int], list[tuple[int, int, str]]]:
    """{(whole name, size): [(begin, end, slice name)], by begin} of the slice
    names among `names`."""
    groups: dict[tuple[str, int], list[tuple[int, int, str]]] = {}
    for name in names:
        found = parse(name)
        if found is not None:
            groups.setdefault((found.whole, found.size), []).append(
                (found.begin, found.end, name))
    for pieces in groups.values():
        pieces.sort()
    return groups


def assemble(values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The whole values (1-D, C order) of the variables whose slices
    `values` holds together, by whole name; a variable some of whose elements
    no slice holds is left out (`missing_slices` names them)."""
    out: dict[str, np.ndarray] = {}
    for (whole, size), pieces in _groups(values).items():
        if _covered(pieces, size):
            flat = np.empty(size, np.asarray(values[pieces[0][2]]).dtype)
            for begin, end, name in pieces:
                flat[begin:end] = np.reshape(values[name], -1)
            out[whole] = flat
    return out


def missing_slices(values: Mapping[str, np.ndarray]) -> list[str]:
    """Whole names of the variables whose slices in `values` leave elements
    uncovered (a checkpoint missing a part)."""
    return sorted(whole for (whole, size), pieces in _groups(values).items()
                  if not _covered(pieces, size))


def _covered(pieces: list[tuple[int, int, object]], size: int) -> bool:
    at = 0
    for begin, end, _ in pieces:
        if begin > at:
            return False
        at = max(at, end)
    return at >= size


def cut(whole: np.ndarray, name: str) -> np.ndarray:
    """The share of `whole` (any shape, C order) that slice `name` holds."""
    found = parse(name)
    if found is None:
        raise ValueError(f"'{name}' is not the name of a slice")
    flat = np.reshape(whole, -1)
    if flat.size != found.size:
        raise ValueError(f"slice '{name}' is of a variable of {found.size} elements, "
                         f"the value has {flat.size}")
    return flat[found.begin:found.end]


def value_of(values: Mapping[str, np.ndarray], name: str) -> np.ndarray | None:
    """`values[name]`, or for a slice name its share of the whole value in
    `values` (saved whole, or assembled from other slices), or None."""
    if name in values:
        return values[name]
    found = parse(name)
    if found is None or found.whole not in values:
        return None
    return cut(values[found.whole], name)

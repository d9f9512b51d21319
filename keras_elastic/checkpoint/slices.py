"""Tensor slice specs as boxes, for checking that slices cover a tensor.

A checkpoint slice spec (TensorFlow's `SaveSliceInfo.spec`) reads
`"<full shape> <start>,<length>:<start>,<length>..."`, for example
`"4 10 0,2:0,10"` (rows 0-1 of a 4x10 tensor); `-` stands for a whole
dimension and the empty string for the whole tensor.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Box:
    """The part of a tensor that one slice holds.

    Args:
        full_shape: Shape of the whole tensor.
        offset: Start of the slice in each dimension.
        shape: Length of the slice in each dimension.

    Example:

    ```python
    from keras_elastic.checkpoint.slices import parse_slice_spec

    box = parse_slice_spec("4 10 0,2:0,10", full_shape=(4, 10))
    print(box.volume)  # 20
    ```
    """

    full_shape: tuple[int, ...]
    offset: tuple[int, ...]
    shape: tuple[int, ...]

    @property
    def volume(self) -> int:
        """Number of elements in the slice."""
        return math.prod(self.shape)

    def overlap(self, other: Box) -> int:
        """Number of elements this slice shares with `other`."""
        total = 1
        for a0, al, b0, bl in zip(self.offset, self.shape, other.offset,
                                  other.shape, strict=True):
            length = min(a0 + al, b0 + bl) - max(a0, b0)
            if length <= 0:
                return 0
            total *= length
        return total

    def describe(self) -> str:
        """Human readable `[start:end, ...]` form of the slice."""
        if not self.full_shape:
            return "[] (scalar)"
        parts = [f"{o}:{o + s}" for o, s in zip(self.offset, self.shape,
                                                strict=True)]
        return "[" + ", ".join(parts) + f"] of shape {list(self.full_shape)}"


def parse_slice_spec(spec: str, full_shape: Sequence[int]) -> Box:
    """Parses a checkpoint slice spec into a `Box`.

    Args:
        spec: The slice spec; `""` means the whole tensor of shape
            `full_shape`.
        full_shape: The tensor's full shape, used when `spec` is empty.

    Returns:
        The `Box` the spec describes.

    Raises:
        ValueError: If the spec is malformed or the slice lies outside the
            full shape it declares.

    Example:

    ```python
    from keras_elastic.checkpoint.slices import parse_slice_spec

    print(parse_slice_spec("", full_shape=(3,)).shape)        # (3,)
    print(parse_slice_spec("6 3,3", full_shape=(6,)).offset)  # (3,)
    ```
    """
    spec = spec.strip()
    if not spec:
        full = tuple(int(d) for d in full_shape)
        return Box(full, (0,) * len(full), full)
    tokens = spec.split()
    if len(tokens) < 2:
        raise ValueError(
            f"slice spec {spec!r} has no full shape: expected '<full shape> "
            "<start>,<length>:...'")
    try:
        full = tuple(int(d) for d in tokens[:-1])
    except ValueError as e:
        raise ValueError(
            f"slice spec {spec!r}: the full shape {tokens[:-1]} is not a list "
            "of integers") from e
    dims = tokens[-1].split(":")
    if len(dims) != len(full):
        raise ValueError(
            f"slice spec {spec!r} gives {len(dims)} slice dimensions for a "
            f"tensor of rank {len(full)}")
    offset, shape = [], []
    for axis, (dim, size) in enumerate(zip(dims, full, strict=True)):
        if dim == "-":
            start, length = 0, size
        else:
            try:
                start_s, length_s = dim.split(",")
                start, length = int(start_s), int(length_s)
            except ValueError as e:
                raise ValueError(
                    f"slice spec {spec!r}: dimension {axis} is {dim!r}, "
                    "expected '<start>,<length>' or '-'") from e
        if start < 0 or length < 0 or start + length > size:
            raise ValueError(
                f"slice spec {spec!r}: dimension {axis} covers "
                f"[{start}, {start + length}), outside [0, {size})")
        offset.append(start)
        shape.append(length)
    return Box(full, tuple(offset), tuple(shape))


def first_overlap(boxes: Sequence[Box]) -> tuple[int, int] | None:
    """Returns the indices of two overlapping boxes, or `None`.

    Boxes are swept along their first dimension, so slices cut along one axis
    (what `MaxShardSizePolicy` produces) are checked in near-linear time.

    Example:

    ```python
    from keras_elastic.checkpoint.slices import first_overlap, parse_slice_spec

    a = parse_slice_spec("6 0,4", (6,))
    b = parse_slice_spec("6 3,3", (6,))
    print(first_overlap([a, b]))  # (0, 1)
    ```
    """
    if not boxes:
        return None
    if not boxes[0].full_shape:
        return (0, 1) if len(boxes) > 1 else None
    order = sorted(range(len(boxes)), key=lambda i: boxes[i].offset[0])
    active: list[int] = []
    for i in order:
        box = boxes[i]
        start = box.offset[0]
        active = [j for j in active
                  if boxes[j].offset[0] + boxes[j].shape[0] > start]
        for j in active:
            if box.volume and boxes[j].overlap(box):
                return (min(i, j), max(i, j))
        active.append(i)
    return None

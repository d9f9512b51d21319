"""Admission of embedding ids: how often an id was seen, in bounded memory.

A table created with `admit_after=k` gives an id a row only once it was seen
in k training batches (its lookups); `CountMinSketch` counts those sightings
for any number of ids in a fixed `depth x width` array of saturating 8-bit
counters (4 MiB by default, per table and server). Its estimate of an id's
count is never below the true count and exceeds it only where other ids
collide with it in every row: an id may be admitted a little early, never
late.

Example:

>>> sketch = CountMinSketch(width=1 << 10)
>>> sketch.add(np.array([3, 8])).tolist()
[1, 1]
>>> sketch.add(np.array([3])).tolist()
[2]
>>> sketch.estimate(np.array([3, 8, 9])).tolist()
[2, 1, 0]
"""

from __future__ import annotations

import numpy as np

_SEEDS = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
          0xD6E8FEB86659FD93)


class CountMinSketch:
    """Counts of int64 ids, `depth` (at most 4) rows of `width` (a power of
    two) 8-bit counters saturating at 255."""

    def __init__(self, width: int = 1 << 20, depth: int = 4) -> None:
        if width <= 0 or width & (width - 1):
            raise ValueError(f"width must be a power of two, got {width}")
        if not 1 <= depth <= len(_SEEDS):
            raise ValueError(f"depth must be in [1, {len(_SEEDS)}], got {depth}")
        self.counts = np.zeros((depth, width), np.uint8)

    @property
    def nbytes(self) -> int:
        return self.counts.nbytes

    def _cells(self, ids: np.ndarray) -> np.ndarray:
        """[depth, n] counter of each id in each row."""
        mask = np.uint64(self.counts.shape[1] - 1)
        keys = np.asarray(ids, np.int64).astype(np.uint64)
        out = np.empty((self.counts.shape[0], len(keys)), np.int64)
        with np.errstate(over="ignore"):
            for d in range(self.counts.shape[0]):
                z = (keys ^ np.uint64(_SEEDS[d])) * np.uint64(0xBF58476D1CE4E5B9)
                z = (z ^ (z >> np.uint64(31))) * np.uint64(0x94D049BB133111EB)
                out[d] = ((z ^ (z >> np.uint64(29))) & mask).astype(np.int64)
        return out

    def add(self, ids: np.ndarray) -> np.ndarray:
        """Counts one more sighting of each of `ids` (unique); returns their
        estimated counts after it."""
        cells = self._cells(ids)
        estimate = np.full(len(ids), 255, np.int64)
        for d, row in enumerate(cells):
            counts = self.counts[d]
            cells, added = np.unique(row, return_counts=True)  # ids may collide
            counts[cells] = np.minimum(255, counts[cells].astype(np.int64) + added)
            estimate = np.minimum(estimate, counts[row])
        return estimate

    def estimate(self, ids: np.ndarray) -> np.ndarray:
        """Estimated counts of `ids`, without counting."""
        cells = self._cells(ids)
        return np.min(np.stack([self.counts[d][row] for d, row in enumerate(cells)]),
                      axis=0).astype(np.int64) if len(ids) else np.zeros(0, np.int64)

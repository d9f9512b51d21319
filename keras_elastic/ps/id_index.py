"""Embedding ids to row numbers: a compact NumPy open-addressing hash table.

An embedding table on a server holds the rows of the ids it was asked for, in
contiguous arrays; `IdIndex` gives each id (int64 >= 0) its row. It keeps
the ids in row order (8 bytes a row: `ids`, which checkpoints export) and a
power-of-two table of row numbers (int32, -1 for an empty slot) probed
linearly from a hash of the id and kept at most 3/4 full: a slot names a row,
and the id is compared through `ids`, the way CPython's compact dict keeps
its entries apart from its index. So an id costs its 8 bytes plus 4 bytes a
slot (5.3 to 10.7 bytes an id), against about 100 bytes for a Python dict
entry and its int objects. Every operation works on a whole batch of ids at
once: each round of probing is a handful of NumPy calls over the ids still
unresolved, so the cost follows the batch's size at C speed, not Python's.

Chosen by measurement (`bench/bench_id_index.py`, 2 million random ids, 3
million Zipf lookups, this 2-core machine, 2026-11-27): lookups 29 million
ids/s against a Python dict's 3.4 and TensorFlow's `MutableHashTable`'s 10; a
step's 3,000 ids in 0.14 ms against the TF table's 0.31 (each call is a TF
op); 16.4 bytes an id, its id included. On an index of tens of millions of
ids, which the caches do not hold, each id costs two dependent memory reads
(its slot, its id) and lookups fall to about 5 million ids/s.
The TF tables would also keep the index in TF's allocator, apart from the rows
(NumPy arrays the row-wise optimizers update in place), and a `DenseHashTable`
reserves two key values.

Example:

>>> index = IdIndex()
>>> index.get(np.array([5, 9])).tolist()
[-1, -1]
>>> index.append(np.array([5, 9])).tolist()
[0, 1]
>>> index.get(np.array([9, 4, 5])).tolist()
[1, -1, 0]
>>> index.keep(np.array([False, True]))  # row 0 (id 5) removed
>>> index.ids.tolist(), index.get(np.array([9, 5])).tolist()
([9], [0, -1])
"""

from __future__ import annotations

import numpy as np

_EMPTY = -1
_MIN_SLOTS = 64
_MIN_ROWS = 16
_MAX_LOAD = 0.75


def _home(ids: np.ndarray, mask: int) -> np.ndarray:
    """The home slot of each id: a multiplicative (Fibonacci) mix of its bits,
    so neighbouring ids spread over the table."""
    with np.errstate(over="ignore"):
        mixed = ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return ((mixed ^ (mixed >> np.uint64(29))) & np.uint64(mask)).astype(np.int64)


class IdIndex:
    """Ids >= 0 in row order, found by id (see the module doc)."""

    def __init__(self) -> None:
        # Allocated at the first append: an index never used takes no memory.
        self._ids = np.zeros(0, np.int64)  # row -> id (capacity; `_count` used)
        self._slots = np.zeros(0, np.int32)  # slot -> row, _EMPTY
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def ids(self) -> np.ndarray:
        """The id of each row (a read-only view, row order)."""
        view = self._ids[:self._count]
        view.flags.writeable = False
        return view

    @property
    def nbytes(self) -> int:
        """Bytes of the rows' ids held and of the slot table."""
        return self._count * self._ids.itemsize + self._slots.nbytes

    def _find(self, ids: np.ndarray) -> np.ndarray:
        """The row of each id, -1 where it is not held."""
        mask = len(self._slots) - 1
        slots, keys = self._slots, self._ids
        pos = _home(ids, mask)
        # The first probe, over every id at once (most ids end there).
        at = slots.take(pos)
        empty = at == _EMPTY
        # (an empty slot's -1 reads the last id: masked by `empty`)
        hit = (keys.take(at) == ids) & ~empty
        rows = np.where(hit, at, -1).astype(np.int64)
        active = np.flatnonzero(~(hit | empty))
        while active.size:
            moved = (pos.take(active) + 1) & mask
            pos[active] = moved
            at = slots.take(moved)
            empty = at == _EMPTY
            hit = (keys.take(at) == ids.take(active)) & ~empty
            rows[active[hit]] = at[hit]
            active = active[~(hit | empty)]
        return rows

    def get(self, ids: np.ndarray) -> np.ndarray:
        """The row of each id (int64), -1 for ids not held."""
        ids = np.asarray(ids, np.int64)
        if not self._count or not ids.size:
            return np.full(len(ids), -1, np.int64)
        return self._find(ids)

    def append(self, ids: np.ndarray) -> np.ndarray:
        """Adds `ids` (unique, none held yet) as the next rows; returns them."""
        ids = np.asarray(ids, np.int64)
        start, end = self._count, self._count + len(ids)
        if not ids.size:
            return np.zeros(0, np.int64)
        if end > len(self._ids):
            # Grown by a quarter, as the table's rows (`EmbeddingTable._grow`).
            new = np.empty(max(end, len(self._ids) + len(self._ids) // 4, _MIN_ROWS),
                           np.int64)
            new[:start] = self._ids[:start]
            self._ids = new
        self._ids[start:end] = ids
        self._count = end
        if end > _MAX_LOAD * len(self._slots) or end - 1 > np.iinfo(self._slots.dtype).max:
            self._rehash()
        else:
            self._place(np.arange(start, end))
        return np.arange(start, end)

    def keep(self, keep: np.ndarray) -> None:
        """Removes the rows where `keep` [len(self)] is False; the others move
        down, in order (row r becomes the number of rows kept before it)."""
        kept = self._ids[:self._count][keep]
        self._count = len(kept)
        self._ids[:self._count] = kept
        self._rehash()

    def _place(self, rows: np.ndarray) -> None:
        """Writes `rows` into empty slots: each round, the rows whose slot is
        empty take it (one per slot: the first of the batch), the others probe
        on."""
        mask = len(self._slots) - 1
        slots = self._slots
        pos = _home(self._ids[rows], mask)
        active = np.arange(len(rows))
        while active.size:
            free = slots[pos[active]] == _EMPTY
            candidates = active[free]
            _, first = np.unique(pos[candidates], return_index=True)
            winners = candidates[first]
            slots[pos[winners]] = rows[winners]
            placed = np.zeros(len(rows), bool)
            placed[winners] = True
            active = active[~placed[active]]
            pos[active] = (pos[active] + 1) & mask

    def _rehash(self) -> None:
        """A slot table for the rows held, at most 3/4 and at least 3/8 full."""
        capacity = _MIN_SLOTS
        while self._count > _MAX_LOAD * capacity:
            capacity *= 2
        dtype = np.int32 if self._count <= np.iinfo(np.int32).max else np.int64
        self._slots = np.full(capacity, _EMPTY, dtype)
        self._place(np.arange(self._count))

"""Embedding ids to row numbers: a compact NumPy hash table of groups of slots.

An embedding table on a server holds the rows of the ids it was asked for, in
contiguous arrays; `IdIndex` gives each id (int64 >= 0) its row. It keeps
the ids in row order (8 bytes a row: `ids`, which checkpoints export) and a
table of slots in groups of 8, laid out as SwissTable (Abseil's
`flat_hash_map`) lays out its groups: each slot holds a row number (int32)
and a one-byte tag (8 bits of the id's hash; 0 for an empty slot), the 8
tags of a group in one 8-byte word. An id's hash picks its home group; the
id is in the first group of the run that starts there with a slot of its
tag whose row's id is the id, and the search stops at a group with an empty
slot. The table is kept at most 3/4 full, so almost every id is in its home
group: a lookup compares the group's 8 tags at once (bit operations on the
word), then reads one slot and one id, three memory reads whatever the load,
all of them one pass over the whole batch of ids (a handful of NumPy calls:
the cost follows the batch's size at C speed, not Python's). The few ids
elsewhere (another slot of the same tag, a later group) are searched after,
among themselves. An id costs its 8 bytes plus 5 bytes a slot (6.7 to 13.3
bytes an id).

Chosen by measurement (a server's share of the 100-million-id table of
`bench/bench_embedding.py`, 50 million rows, lookups of 16,000 distinct
uniform ids, this 2-core machine, 2026-11-27): 60 ns an id, where linear
probing of one slot at a time (this module's first layout, 4 bytes a slot)
took 180: at 3/4 full a third of the ids needed a second probe and the
longest runs over a hundred, each probe a round of NumPy calls over the ids
still unresolved. Groups of 16 (two words of tags) took 76: twice the bit
operations. At 2 million ids, which the caches partly hold, both layouts
look up 20-30 million ids/s (`bench/bench_id_index.py`, against a Python
dict and TensorFlow's `MutableHashTable`; each call of the TF table is a TF
op, and its memory is TF's allocator's, apart from the rows).

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

GROUP = 8  # slots a group (its tags: one 8-byte word)
_EMPTY = 0  # the tag of an empty slot
_MIN_GROUPS = 4
_MIN_ROWS = 16
_MAX_LOAD = 0.75
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / the golden ratio (Fibonacci hashing)
_ONES = np.uint64(0x0101010101010101)  # 1 in each byte
_HIGHS = np.uint64(0x8080808080808080)  # the top bit of each byte
# A group's 8 tags read as one word, slot k its byte k (of significance k,
# whatever the machine's byte order).
_WORD = np.dtype("<u8")


def _hash(ids: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """The home group (of 2^bits, bits >= 1: a table has at least
    `_MIN_GROUPS`) and the tag (1..255) of each id: the top `bits` bits of a
    multiplicative (Fibonacci) mix of the id, which spreads neighbouring ids
    over the table, and the 8 bits below them (not bits the group already
    holds: ids of one group would share their tags)."""
    with np.errstate(over="ignore"):
        mixed = ids.astype(np.uint64) * _GOLDEN
    group = (mixed >> np.uint64(64 - bits)).astype(np.int64)
    tag = (mixed >> np.uint64(56 - bits)).astype(np.uint8)
    np.maximum(tag, 1, out=tag)  # (0 is an empty slot's)
    return group, tag


def _zero_bytes(words: np.ndarray) -> np.ndarray:
    """Flags (the byte's top bit) of the zero bytes of uint64 `words`; the
    lowest flag is always a zero byte (a flag above a zero byte may be false:
    the subtraction's borrow)."""
    return (words - _ONES) & ~words & _HIGHS


def _first_flag(flags: np.ndarray) -> np.ndarray:
    """`_zero_bytes` of groups' tags (uint64) -> the slot (0..7) of the first
    flagged byte of each group (7 where none: check `flags != 0`)."""
    low = flags & (~flags + np.uint64(1))  # the lowest flag alone (0: none)
    # The number of bytes below it, plus one: bit 0 of each byte under the
    # flag (its own byte's included), summed into the top byte by a multiply.
    return ((((low - np.uint64(1)) & _ONES) * _ONES) >> np.uint64(56)).astype(np.int64) - 1


class IdIndex:
    """Ids >= 0 in row order, found by id (see the module doc)."""

    def __init__(self) -> None:
        # Allocated at the first append: an index never used takes no memory.
        self._ids = np.zeros(0, np.int64)  # row -> id (capacity; `_count` used)
        self._tags = np.zeros((0, GROUP), np.uint8)  # group -> its slots' tags
        self._slots = np.zeros(0, np.int32)  # group * GROUP + slot -> row
        self._bits = 0  # 2^bits groups
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
        return self._count * self._ids.itemsize + self._slots.nbytes + self._tags.nbytes

    def get(self, ids: np.ndarray) -> np.ndarray:
        """The row of each id (int64), -1 for ids not held."""
        ids = np.asarray(ids, np.int64)
        if not self._count or not ids.size:
            return np.full(len(ids), -1, np.int64)
        return self._find(ids)

    def _find(self, ids: np.ndarray) -> np.ndarray:
        """The row of each id, -1 where it is not held."""
        words = self._tags.view(_WORD).reshape(-1)  # a group's 8 tags
        group, tag = _hash(ids, self._bits)
        # Most ids are in their home group's slot of the first tag equal to
        # theirs: one pass over every id, no subsets.
        seen = words.take(group)
        flags = _zero_bytes(seen ^ (tag.astype(np.uint64) * _ONES))
        first = _first_flag(flags)
        at = self._slots.take(group * GROUP + first)
        hit = (flags != 0) & (self._ids.take(at) == ids)
        rows = np.where(hit, at, -1)
        missed = np.flatnonzero(~hit)
        if missed.size:
            rows[missed] = self._search(ids.take(missed), group.take(missed),
                                        tag.take(missed))
        return rows

    def _search(self, ids: np.ndarray, group: np.ndarray, tag: np.ndarray
                ) -> np.ndarray:
        """The rows of ids not in their home group's first slot of their tag:
        every slot of their tag, group after group, until a group with an
        empty slot (the last an id could be in)."""
        mask = len(self._tags) - 1
        rows = np.full(len(ids), -1, np.int64)
        asked = np.arange(len(ids))
        while asked.size:
            seen = self._tags.take(group, axis=0)
            which, slot = np.nonzero(seen == tag[:, None])
            at = self._slots.take(group.take(which) * GROUP + slot)
            hit = self._ids.take(at) == ids.take(asked.take(which))
            rows[asked.take(which[hit])] = at[hit]
            left = np.ones(len(asked), bool)
            left[which[hit]] = False
            left &= ~(seen == _EMPTY).any(axis=1)
            left = np.flatnonzero(left)
            asked, tag = asked.take(left), tag.take(left)
            group = (group.take(left) + 1) & mask
        return rows

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
        if end > _MAX_LOAD * self._tags.size or end - 1 > np.iinfo(self._slots.dtype).max:
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
        """Writes `rows` into empty slots: each into the first empty slot of
        its home group, or of the next group with one. The rows bound for one
        group go in turns (the first of each group, then the second, ...), so
        each turn writes at most one slot of a group."""
        mask = len(self._tags) - 1
        tags, slots = self._tags, self._slots
        words = tags.view(_WORD).reshape(-1)
        group, tag = _hash(self._ids[rows], self._bits)
        while rows.size:
            order = np.argsort(group, kind="stable")
            group, tag, rows = group[order], tag[order], rows[order]
            starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
            turn = np.arange(len(group)) - np.repeat(starts, np.diff(np.r_[starts,
                                                                           len(group)]))
            full = np.zeros(len(rows), bool)
            for t in range(int(turn.max()) + 1):
                now = np.flatnonzero(turn == t)
                flags = _zero_bytes(words.take(group.take(now)))
                fits = flags != 0
                full[now[~fits]] = True
                now, free = now[fits], _first_flag(flags[fits])
                home = group.take(now)
                tags[home, free] = tag.take(now)
                slots[home * GROUP + free] = rows.take(now)
            # The rows whose group filled up: on to the next group.
            group, tag, rows = (group[full] + 1) & mask, tag[full], rows[full]

    def _rehash(self) -> None:
        """A slot table for the rows held, at most 3/4 and at least 3/8 full."""
        groups = _MIN_GROUPS
        while self._count > _MAX_LOAD * groups * GROUP:
            groups *= 2
        dtype = np.int32 if self._count <= np.iinfo(np.int32).max else np.int64
        self._bits = groups.bit_length() - 1
        self._tags = np.zeros((groups, GROUP), np.uint8)
        # (zeros: an empty slot names row 0, a valid row for a read)
        self._slots = np.zeros(groups * GROUP, dtype)
        self._place(np.arange(self._count))

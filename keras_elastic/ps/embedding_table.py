"""The rows of one embedding table that one parameter server owns.

An `EmbeddingTable` holds only the rows of the ids it was asked for: an
`IdIndex` (a vectorized NumPy hash table, `ps/id_index.py`) from id to row of
contiguous NumPy arrays (the values, and one array per optimizer
slot) that grow by a quarter when full. A bounded table of 50 million ids
of which a few thousand were touched therefore takes a few hundred kilobytes,
not gigabytes. A row is created the first time its id is looked up or gets a
gradient, from `row_init.initial_rows` (a pure function of the initializer
config, seed, id and dim: the same rows whatever the number of servers), its
slots from the optimizer's initial values.

Admission and eviction (`admit_after`, `max_rows`, `ttl_versions`, from the
layer's keywords): with `admit_after=k` an id gets a row only once k training
lookups asked for it (counted by a `CountMinSketch`, bounded memory); until
then its lookups answer the initializer's row (not kept) and its gradients are
dropped. Evaluation and prediction lookups (`create=False`) never make rows
nor count. Each row remembers the server version at which training last used
it (looked it up or updated it): rows not used in the last `ttl_versions`
versions are removed, and past `max_rows` rows (this server's share) the
least recently used are removed down to 95% of it. A removed row is gone with
its slots (and from the next checkpoint); if its id comes back it starts
again from the initializer (after admission again).

`apply_gradients` sums the gradients of duplicate ids, then updates the rows
of the unique ids with a `SparseOptimizer` (row-wise; see
`ps/sparse_optimizers.py` for how that compares with Keras' dense update).
`export` and `load` move rows and slots out and in: for checkpoints, and for
moving rows between servers when their number changes.

NumPy only. Not thread-safe: the caller (the parameter store) holds a lock.

Example:

>>> import numpy as np
>>> from keras_elastic.ps.sparse_optimizers import sparse_optimizer_from_config
>>> table = EmbeddingTable(
...     "user", 4, input_dim=1000, initializer_config="uniform",
...     optimizer=sparse_optimizer_from_config({"class_name": "SGD", "config": {}}))
>>> rows = table.lookup(np.array([3, 7, 3]))
>>> rows.shape, len(table)
((3, 4), 2)
>>> table.apply_gradients(np.array([3, 3]), np.ones((2, 4), "float32"), step=1,
...                       learning_rate=0.5)
>>> bool(np.allclose(table.lookup(np.array([3]))[0], rows[0] - 1.0))
True
>>> ids, values, slots = table.export()
>>> ids.tolist(), values.shape, slots
([3, 7], (2, 4), {})
"""

from __future__ import annotations

import numbers

import numpy as np

from keras_elastic.common import errors
from keras_elastic.ps.admission import CountMinSketch
from keras_elastic.ps.id_index import IdIndex
from keras_elastic.ps.row_init import initial_rows
from keras_elastic.ps.sparse_optimizers import SparseOptimizer

_MIN_CAPACITY = 16
# Ids of removed rows remembered for the next incremental checkpoint, at most.
_MAX_REMOVALS_KEPT = 10_000_000
_INT64_MAX = np.iinfo(np.int64).max


class EmbeddingTable:
    """The rows (and optimizer slots) of table `name` that this server holds.

    `dim`: row width; `input_dim`: number of ids of a bounded table (ids must
    be in [0, input_dim)), None for an unbounded one (any id >= 0);
    `initializer_config`: a Keras initializer config or name (see
    `row_init`); `optimizer`: the row-wise optimizer, None for a table that
    is only looked up (`apply_gradients` then raises).
    """

    def __init__(self, name: str, dim: int, dtype: str | np.dtype = "float32",
                 input_dim: int | None = None,
                 initializer_config: dict | str = "uniform",
                 optimizer: SparseOptimizer | None = None,
                 admit_after: int = 0, max_rows: int | None = None,
                 ttl_versions: int | None = None) -> None:
        if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or dim <= 0:
            raise ValueError(f"embedding table {name!r}: dim must be a positive "
                             f"integer, got {dim!r}")
        if input_dim is not None and (isinstance(input_dim, bool)
                                      or not isinstance(input_dim, numbers.Integral)
                                      or input_dim <= 0):
            raise ValueError(f"embedding table {name!r}: input_dim must be a positive "
                             f"integer or None, got {input_dim!r}")
        try:
            dtype = np.dtype(dtype)
        except TypeError as e:
            raise ValueError(f"embedding table {name!r}: bad dtype {dtype!r}") from e
        if dtype.kind != "f":
            raise ValueError(f"embedding table {name!r}: dtype must be a float type, "
                             f"got {dtype}")
        if optimizer is not None and not isinstance(optimizer, SparseOptimizer):
            raise ValueError(f"embedding table {name!r}: optimizer must be a "
                             f"SparseOptimizer, got {type(optimizer).__name__}")
        try:  # refuse an unsupported initializer now, not at the first lookup
            initial_rows(initializer_config, np.zeros(0, np.int64), int(dim), dtype)
        except ValueError as e:
            raise ValueError(f"embedding table {name!r}: {e}") from e
        for what, value, least in (("admit_after", admit_after, 0),
                                   ("max_rows", max_rows, 1),
                                   ("ttl_versions", ttl_versions, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(
                    value, numbers.Integral) or value < least):
                raise ValueError(f"embedding table {name!r}: {what} must be an integer "
                                 f">= {least}{' or None' if least else ''}, got {value!r}")
        self.name = name
        self.dim = int(dim)
        # Admission (an id's row is made once it was seen in admit_after
        # training lookups) and eviction (at most max_rows rows here; rows not
        # updated in ttl_versions versions removed): see the module doc.
        self.admit_after = int(admit_after or 0)
        self.max_rows = None if max_rows is None else int(max_rows)
        self.ttl_versions = None if ttl_versions is None else int(ttl_versions)
        self._sketch = CountMinSketch() if self.admit_after > 1 else None
        self._evicting = self.max_rows is not None or self.ttl_versions is not None
        self._ttl_checked = 0  # the version of the last TTL sweep
        self.clock = 0  # the server's model version, set before each call
        self.stats = {"admitted": 0, "evicted": 0, "dropped": 0}
        self.dtype = dtype
        self.input_dim = None if input_dim is None else int(input_dim)
        self.initializer_config = initializer_config
        self.optimizer = optimizer
        self.slot_names: tuple[str, ...] = optimizer.slot_names if optimizer else ()
        self._index = IdIndex()  # the ids, in row order (`_index.ids`)
        self._size = 0
        self._values = np.zeros((0, self.dim), dtype)
        self._slots = {s: np.zeros((0, self.dim), dtype) for s in self.slot_names}
        # The version each row was last used at, for eviction, and (for
        # incremental checkpoints) the number of its last change: both kept
        # modulo 2**32 (4 bytes a row) and compared as differences, which
        # stay right however long the job runs (`_age`, `export_since`).
        self._touched = np.zeros(0, np.uint32)
        # `seq` counts the calls that change rows; `_removed` holds the
        # (seq, ids) of rows removed (see `export_since`).
        self.seq = 0
        self._changed = np.zeros(0, np.uint32)
        self._removed: list[tuple[int, np.ndarray]] = []
        self._removals_forgotten = 0  # removals up to this seq were dropped

    def __repr__(self) -> str:
        bound = "unbounded" if self.input_dim is None else f"input_dim={self.input_dim}"
        return (f"EmbeddingTable({self.name!r}, dim={self.dim}, {self.dtype}, {bound}, "
                f"{len(self)} rows)")

    def __len__(self) -> int:
        """Number of rows held."""
        return self._size

    @property
    def nbytes(self) -> int:
        """Bytes of the rows held (values, slots, ids, last change, last
        use), of the id index's slots and of the admission sketch: the
        memory the table occupies. The arrays' free capacity (up to a fifth
        after a growth) is allocated but never written, so the operating
        system backs it with no memory until rows fill it.

        >>> EmbeddingTable("t", 8, input_dim=10**9).nbytes
        0
        """
        per_row = (self._values.itemsize * self.dim * (1 + len(self.slot_names))
                   + self._changed.itemsize
                   + (self._touched.itemsize if self._evicting else 0))
        return (self._size * per_row + self._index.nbytes
                + (self._sketch.nbytes if self._sketch is not None else 0))

    @property
    def capacity(self) -> int:
        """Rows the arrays have room for before they grow again.

        >>> EmbeddingTable("t", 8).capacity
        0
        """
        return len(self._values)

    def counters(self) -> dict[str, int]:
        """rows held, rows admitted (made) and evicted so far, gradient rows
        dropped (of ids not admitted), bytes: what a server's status says."""
        return {"rows": len(self), **self.stats, "bytes": self.nbytes}

    def check_ids(self, ids: np.ndarray) -> None:
        """Raises ValueError naming the table and the first bad id: ids must
        be a 1-D integer array of ids >= 0 (and < input_dim when bounded).

        >>> EmbeddingTable("user", 2, input_dim=10).check_ids(np.array([1, 10]))
        Traceback (most recent call last):
        ...
        ValueError: embedding table 'user': id 10 (position 1) is out of range: \
the table has input_dim 10 (ids 0 to 9)
        """
        self._ids_of(ids)

    def _ids_of(self, ids: np.ndarray) -> np.ndarray:
        """`ids` checked, as int64."""
        ids = np.asarray(ids)
        if ids.ndim != 1:
            raise ValueError(f"embedding table {self.name!r}: ids must be a 1-D array, "
                             f"got shape {ids.shape}")
        if ids.dtype.kind not in "iu":
            if ids.size == 0 and ids.dtype.kind == "f":
                ids = ids.astype(np.int64)  # np.array([]) is float64
            else:
                raise ValueError(f"embedding table {self.name!r}: ids must be "
                                 f"integers, got dtype {ids.dtype}")
        if ids.dtype == np.int64 and ids.size:
            # (the common case in two reductions and no temporary array: a
            # lookup's ids are checked by the server, its store and its table)
            if ids.min() >= 0 and (self.input_dim is None or ids.max() < self.input_dim):
                return ids
        bad = ids < 0 if ids.dtype.kind == "i" else np.zeros(ids.shape, bool)
        if ids.dtype.kind == "u":
            bad |= ids > _INT64_MAX
        if self.input_dim is not None:
            bad |= ids >= self.input_dim
        if bad.any():
            position = int(np.argmax(bad))
            bad_id = int(ids[position])
            if bad_id < 0:
                why = "is negative"
            elif self.input_dim is not None:
                why = (f"is out of range: the table has input_dim {self.input_dim} "
                       f"(ids 0 to {self.input_dim - 1})")
            else:
                why = "does not fit in int64"
            raise ValueError(f"embedding table {self.name!r}: id {bad_id} (position "
                             f"{position}) {why}")
        return ids.astype(np.int64, copy=False)

    def _grow(self, needed: int) -> None:
        """Makes room for `needed` rows in all."""
        capacity = len(self._values)
        if needed <= capacity:
            return
        # Grown by a quarter (not doubled): at most 25% of a large table's
        # arrays are free after a growth, for a few more copies as it grows.
        new_capacity = max(needed, capacity + capacity // 4, _MIN_CAPACITY)
        if self.input_dim is not None:
            new_capacity = max(needed, min(new_capacity, self.input_dim))

        def grown(array: np.ndarray) -> np.ndarray:
            new = np.empty((new_capacity,) + array.shape[1:], array.dtype)
            new[:self._size] = array[:self._size]
            return new

        self._values = grown(self._values)
        self._slots = {s: grown(a) for s, a in self._slots.items()}
        if self._evicting:  # (4 bytes a row, only where rows are evicted)
            self._touched = grown(self._touched)
        self._changed = grown(self._changed)

    def _add(self, new_ids: np.ndarray, values: np.ndarray,
             slots: dict[str, np.ndarray]) -> None:
        """Appends rows for `new_ids` (unique, not held yet)."""
        start, end = self._size, self._size + len(new_ids)
        self._grow(end)
        self._values[start:end] = values
        for slot in self.slot_names:
            self._slots[slot][start:end] = slots[slot]
        if self._evicting:
            self._touched[start:end] = self._clock32()
        self._changed[start:end] = self._next_seq32()
        self._index.append(new_ids)
        self._size = end

    def _rows_of(self, unique_ids: np.ndarray, create: bool = True,
                 seen: bool = False, rows: np.ndarray | None = None) -> np.ndarray:
        """Row indices of `unique_ids` (checked, unique), -1 for ids without a
        row. `create`: rows are made for the missing ids that are admitted;
        `seen`: a training lookup, which counts a sighting of each missing id
        (admission)."""
        rows = self._index.get(unique_ids) if rows is None else rows
        missing = rows < 0
        if create and missing.any():
            if self._sketch is not None:
                counts = (self._sketch.add(unique_ids[missing]) if seen
                          else self._sketch.estimate(unique_ids[missing]))
                missing[np.flatnonzero(missing)[counts < self.admit_after]] = False
        if create and missing.any():
            new_ids = unique_ids[missing]
            n = len(new_ids)
            self.stats["admitted"] += n
            slots = (self.optimizer.initial_slots(n, self.dim, self.dtype)
                     if self.optimizer is not None else {})
            start = self._size
            self._add(new_ids, initial_rows(self.initializer_config, new_ids, self.dim,
                                            self.dtype), slots)
            rows[missing] = np.arange(start, start + n)
        return rows

    def lookup(self, ids: np.ndarray, create: bool = True) -> np.ndarray:
        """The rows of `ids` (int array [n]): a new array [n, dim]. A training
        lookup (`create`) makes the rows of the admitted ids this table does
        not hold yet; the others (and every id an evaluation or prediction
        lookup, `create=False`, does not find) get the row they would start
        from, the initializer's, made for the answer and not kept.

        >>> table = EmbeddingTable("t", 2, initializer_config="ones")
        >>> table.lookup(np.array([5, 5])).tolist()
        [[1.0, 1.0], [1.0, 1.0]]
        >>> table.lookup(np.array([6]), create=False).tolist(), len(table)
        ([[1.0, 1.0]], 1)
        """
        ids = self._ids_of(ids)
        rows = self._index.get(ids)
        if len(rows) and rows.min() >= 0:
            # Every id held (a table's steady state): no row to make, no
            # sighting to count (admission counts ids without a row), so no
            # sort of the ids either.
            out = np.take(self._values, rows, axis=0)
            if create and self._evicting:  # a training lookup: its rows are in use
                self._touched[rows] = self._clock32()
                self._evict()
            return out
        unique, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        # (`rows[first]`: the index's answer for each unique id, a new array)
        rows = self._rows_of(unique, create=create, seen=create,
                             rows=rows[first])  # may grow arrays
        held = rows >= 0
        if held.all():
            out = np.take(self._values, rows[inverse], axis=0)
        else:
            found = np.empty((len(unique), self.dim), self.dtype)
            found[held] = self._values[rows[held]]
            found[~held] = initial_rows(self.initializer_config, unique[~held],
                                        self.dim, self.dtype)
            out = found[inverse]
        if create and self._evicting:  # a training lookup: its rows are in use
            self._touched[rows[held]] = self._clock32()
            self._evict()
        return out

    def apply_gradients(self, ids: np.ndarray, grads: np.ndarray, step: int,
                        learning_rate: float) -> None:
        """Updates the rows of `ids` [n] with `grads` [n, dim] (one gradient row
        per occurrence; duplicate ids' gradients are summed). `step` is the
        1-based number of the update, `learning_rate` the current one.

        >>> from keras_elastic.ps.sparse_optimizers import sparse_optimizer_from_config
        >>> sgd = sparse_optimizer_from_config({"class_name": "SGD", "config": {}})
        >>> table = EmbeddingTable("t", 1, initializer_config="zeros", optimizer=sgd)
        >>> table.apply_gradients(np.array([4, 4]), np.array([[1.0], [2.0]]), 1, 0.1)
        >>> table.lookup(np.array([4])).tolist()
        [[-0.30000001192092896]]
        """
        if self.optimizer is None:
            raise errors.ServerStateError(
                f"embedding table {self.name!r} has no optimizer: it cannot apply "
                "gradients")
        ids = self._ids_of(ids)
        grads = np.asarray(grads)
        if grads.shape != (len(ids), self.dim):
            raise ValueError(f"embedding table {self.name!r}: gradients have shape "
                             f"{grads.shape}, expected {(len(ids), self.dim)} for "
                             f"{len(ids)} ids of dim {self.dim}")
        if grads.dtype.kind not in "fiu":
            raise ValueError(f"embedding table {self.name!r}: gradients must be "
                             f"numbers, got dtype {grads.dtype}")
        if not len(ids):
            return
        unique, inverse = np.unique(ids, return_inverse=True)
        if len(unique) == len(ids):
            summed = np.empty((len(ids), self.dim), self.dtype)
            summed[inverse] = grads
        else:
            summed = np.zeros((len(unique), self.dim), self.dtype)
            np.add.at(summed, inverse, grads.astype(self.dtype, copy=False))
        rows = self._rows_of(unique)  # made for admitted ids (not yet held)
        admitted = rows >= 0
        if not admitted.all():  # ids not admitted: their gradients are dropped
            self.stats["dropped"] += int((~admitted).sum())
            rows, summed = rows[admitted], summed[admitted]
        values = self._values[rows]
        slots = {s: a[rows] for s, a in self._slots.items()}
        self.optimizer.apply(values, slots, summed, step, learning_rate)
        self._values[rows] = values
        for slot, array in slots.items():
            self._slots[slot][rows] = array
        self._changed[rows] = self._next_seq32()
        if self._evicting:
            self._touched[rows] = self._clock32()
            self._evict()

    def _evict(self) -> None:
        """Removes the rows past `max_rows` (the least recently updated first,
        down to 95% of it: eviction is batched) and those not updated in the
        last `ttl_versions` versions (checked every ttl/8 versions)."""
        size = self._size
        doomed = np.zeros(size, bool)
        if self.ttl_versions is not None and (
                self.clock - self._ttl_checked >= max(1, self.ttl_versions // 8)):
            self._ttl_checked = self.clock
            doomed |= self._age() > self.ttl_versions
        if self.max_rows is not None and size - int(doomed.sum()) > self.max_rows:
            # Keep the 95% most recently used (expired rows count as oldest).
            gone = size - max(1, int(self.max_rows * 0.95))
            age = np.where(doomed, np.uint32(0xFFFFFFFF), self._age())
            doomed[np.argpartition(-age.astype(np.int64), gone - 1)[:gone]] = True
        if doomed.any():
            self._remove(doomed)

    def _remove(self, doomed: np.ndarray) -> None:
        """Drops the rows `doomed` marks (and their slots and index entries),
        moving the others down; the index is rebuilt (vectorized)."""
        keep = ~doomed
        n = int(keep.sum())
        self._removed.append((self._next_seq(), self._index.ids[doomed].copy()))
        if sum(len(ids) for _, ids in self._removed) > _MAX_REMOVALS_KEPT:
            # No incremental checkpoint for long (full ones only): forget
            # them; a delta against an older base is refused (`export_since`).
            self._removals_forgotten = self._removed[-1][0]
            self._removed = []
        self._changed[:n] = self._changed[:self._size][keep]
        self._values[:n] = self._values[:self._size][keep]
        for array in self._slots.values():
            array[:n] = array[:self._size][keep]
        if self._evicting:
            self._touched[:n] = self._touched[:self._size][keep]
        self.stats["evicted"] += self._size - n
        self._size = n
        self._index.keep(keep)

    def export(self) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """All rows held: (ids sorted [n] int64, values [n, dim], {slot: [n, dim]}),
        copies.

        >>> table = EmbeddingTable("t", 2, initializer_config="zeros")
        >>> _ = table.lookup(np.array([9, 2]))
        >>> table.export()[0].tolist()
        [2, 9]
        """
        ids = self._index.ids
        order = np.argsort(ids, kind="stable")
        return (ids[order], self._values[order],
                {s: a[order] for s, a in self._slots.items()})

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _next_seq32(self) -> np.uint32:
        """The next seq, modulo 2**32 (as `_changed` keeps it)."""
        return np.uint32(self._next_seq() & 0xFFFFFFFF)

    def _clock32(self) -> np.uint32:
        """The clock, modulo 2**32 (as `_touched` keeps it)."""
        return np.uint32(self.clock & 0xFFFFFFFF)

    def _age(self) -> np.ndarray:
        """Versions since each row was last used (uint32: modular arithmetic
        gives the right age across the wrap of the 32-bit clock)."""
        return self._clock32() - self._touched[:self._size]

    def export_since(self, seq: int) -> tuple[np.ndarray, np.ndarray,
                                              dict[str, np.ndarray], np.ndarray]:
        """What changed after change number `seq` (a previous export's
        `self.seq`): (ids sorted, values, {slot: rows}, removed ids), copies
        of the changed rows only (an incremental checkpoint). Forgets the
        removals at or before `seq` (later exports start after it).

        >>> table = EmbeddingTable("t", 1, initializer_config="zeros")
        >>> _ = table.lookup(np.array([1, 2]))
        >>> mark = table.seq
        >>> _ = table.lookup(np.array([3]))
        >>> ids, values, slots, removed = table.export_since(mark)
        >>> ids.tolist(), removed.tolist()
        ([3], [])
        """
        if seq < self._removals_forgotten:
            raise ValueError(f"embedding table {self.name!r}: the rows removed since "
                             "the base checkpoint are no longer known: a full "
                             "checkpoint is needed")
        # Changed after `seq`: at most `self.seq - seq` changes ago (modulo
        # 2**32, so the counter's wrap does not matter; a row last changed
        # 2**32 changes before may be counted changed: a harmless extra row).
        span = self.seq - seq
        if span >= 2**32:
            changed = np.arange(self._size)
        else:
            after = self._changed[:self._size] - np.uint32(seq & 0xFFFFFFFF)
            changed = np.flatnonzero((after >= 1) & (after <= max(span, 0)))
        ids = self._index.ids
        order = changed[np.argsort(ids[changed], kind="stable")]
        self._removed = [(s, gone) for s, gone in self._removed if s > seq]
        removed = (np.unique(np.concatenate([gone for _, gone in self._removed]))
                   if self._removed else np.zeros(0, np.int64))
        return (ids[order], self._values[order],
                {s: a[order] for s, a in self._slots.items()}, removed)

    def load(self, ids: np.ndarray, values: np.ndarray,
             slots: dict[str, np.ndarray]) -> None:
        """Adds rows (as given by `export`), replacing the rows of ids already
        held. `slots` must have exactly this table's optimizer slots.

        >>> table = EmbeddingTable("t", 2)
        >>> table.load(np.array([1]), np.ones((1, 2)), {})
        >>> table.lookup(np.array([1])).tolist()
        [[1.0, 1.0]]
        >>> table.load(np.array([2]), np.ones((1, 3)), {})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: embedding table 't': cannot load values of shape (1, 3) ...
        """
        ids = self._ids_of(ids)
        n = len(ids)
        if len(np.unique(ids)) != n:
            unique, counts = np.unique(ids, return_counts=True)
            raise ValueError(f"embedding table {self.name!r}: cannot load id "
                             f"{int(unique[np.argmax(counts > 1)])} twice")
        if not isinstance(slots, dict) or set(slots) != set(self.slot_names):
            given = sorted(slots) if isinstance(slots, dict) else type(slots).__name__
            raise ValueError(f"embedding table {self.name!r}: cannot load slots "
                             f"{given}: its optimizer has slots "
                             f"{sorted(self.slot_names)}")
        arrays = {"values": values, **{f"slot {s!r}": a for s, a in slots.items()}}
        checked = {}
        for what, array in arrays.items():
            array = np.asarray(array)
            if array.shape != (n, self.dim) or array.dtype.kind not in "fiu":
                raise ValueError(f"embedding table {self.name!r}: cannot load {what} of "
                                 f"shape {array.shape} and dtype {array.dtype}: expected "
                                 f"{(n, self.dim)} floats for {n} ids of dim {self.dim}")
            checked[what] = array.astype(self.dtype, copy=False)
        values = checked["values"]
        slots = {s: checked[f"slot {s!r}"] for s in self.slot_names}
        rows = self._index.get(ids)
        held = rows >= 0
        self._values[rows[held]] = values[held]
        for slot in self.slot_names:
            self._slots[slot][rows[held]] = slots[slot][held]
        self._changed[rows[held]] = self._next_seq32()
        new = ~held
        if new.any():
            self._add(ids[new], values[new], {s: a[new] for s, a in slots.items()})

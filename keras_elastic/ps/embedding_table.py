"""The rows of one embedding table that one parameter server owns.

An `EmbeddingTable` holds only the rows of the ids it was asked for: an
`IdIndex` (a vectorized NumPy hash table, `ps/id_index.py`) from id to row of
contiguous NumPy arrays (the values, and one array per optimizer
slot) that double their capacity when full. A bounded table of 50 million ids
of which a few thousand were touched therefore takes a few hundred kilobytes,
not gigabytes. A row is created the first time its id is looked up or gets a
gradient, from `row_init.initial_rows` (a pure function of the initializer
config, seed, id and dim: the same rows whatever the number of servers), its
slots from the optimizer's initial values.

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
from keras_elastic.ps.id_index import IdIndex
from keras_elastic.ps.row_init import initial_rows
from keras_elastic.ps.sparse_optimizers import SparseOptimizer

_MIN_CAPACITY = 16
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
                 optimizer: SparseOptimizer | None = None) -> None:
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
        self.name = name
        self.dim = int(dim)
        self.dtype = dtype
        self.input_dim = None if input_dim is None else int(input_dim)
        self.initializer_config = initializer_config
        self.optimizer = optimizer
        self.slot_names: tuple[str, ...] = optimizer.slot_names if optimizer else ()
        self._index = IdIndex()
        self._size = 0
        self._ids = np.zeros(0, np.int64)
        self._values = np.zeros((0, self.dim), dtype)
        self._slots = {s: np.zeros((0, self.dim), dtype) for s in self.slot_names}

    def __repr__(self) -> str:
        bound = "unbounded" if self.input_dim is None else f"input_dim={self.input_dim}"
        return (f"EmbeddingTable({self.name!r}, dim={self.dim}, {self.dtype}, {bound}, "
                f"{len(self)} rows)")

    def __len__(self) -> int:
        """Number of rows held."""
        return self._size

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays allocated for rows, slots and ids (capacity).

        >>> EmbeddingTable("t", 8, input_dim=10**9).nbytes
        0
        """
        return (self._values.nbytes + self._ids.nbytes + self._index.nbytes
                + sum(a.nbytes for a in self._slots.values()))

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
        capacity = len(self._ids)
        if needed <= capacity:
            return
        new_capacity = max(needed, 2 * capacity, _MIN_CAPACITY)
        if self.input_dim is not None:
            new_capacity = max(needed, min(new_capacity, self.input_dim))

        def grown(array: np.ndarray) -> np.ndarray:
            new = np.empty((new_capacity,) + array.shape[1:], array.dtype)
            new[:self._size] = array[:self._size]
            return new

        self._ids = grown(self._ids)
        self._values = grown(self._values)
        self._slots = {s: grown(a) for s, a in self._slots.items()}

    def _add(self, new_ids: np.ndarray, values: np.ndarray,
             slots: dict[str, np.ndarray]) -> None:
        """Appends rows for `new_ids` (unique, not held yet)."""
        start, end = self._size, self._size + len(new_ids)
        self._grow(end)
        self._ids[start:end] = new_ids
        self._values[start:end] = values
        for slot in self.slot_names:
            self._slots[slot][start:end] = slots[slot]
        self._index.insert(new_ids, np.arange(start, end))
        self._size = end

    def _rows_of(self, unique_ids: np.ndarray) -> np.ndarray:
        """Row indices of `unique_ids` (checked, unique), creating missing rows."""
        rows = self._index.get(unique_ids)
        missing = rows < 0
        if missing.any():
            new_ids = unique_ids[missing]
            n = len(new_ids)
            slots = (self.optimizer.initial_slots(n, self.dim, self.dtype)
                     if self.optimizer is not None else {})
            start = self._size
            self._add(new_ids, initial_rows(self.initializer_config, new_ids, self.dim,
                                            self.dtype), slots)
            rows[missing] = np.arange(start, start + n)
        return rows

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """The rows of `ids` (int array [n]): a new array [n, dim]. Creates the
        rows this table does not hold yet.

        >>> table = EmbeddingTable("t", 2, initializer_config="ones")
        >>> table.lookup(np.array([5, 5])).tolist()
        [[1.0, 1.0], [1.0, 1.0]]
        """
        ids = self._ids_of(ids)
        unique, inverse = np.unique(ids, return_inverse=True)
        rows = self._rows_of(unique)  # may grow (replace) self._values
        return self._values[rows[inverse]]

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
        rows = self._rows_of(unique)
        values = self._values[rows]
        slots = {s: a[rows] for s, a in self._slots.items()}
        self.optimizer.apply(values, slots, summed, step, learning_rate)
        self._values[rows] = values
        for slot, array in slots.items():
            self._slots[slot][rows] = array

    def export(self) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """All rows held: (ids sorted [n] int64, values [n, dim], {slot: [n, dim]}),
        copies.

        >>> table = EmbeddingTable("t", 2, initializer_config="zeros")
        >>> _ = table.lookup(np.array([9, 2]))
        >>> table.export()[0].tolist()
        [2, 9]
        """
        order = np.argsort(self._ids[:self._size], kind="stable")
        return (self._ids[order], self._values[order],
                {s: a[order] for s, a in self._slots.items()})

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
        new = ~held
        if new.any():
            self._add(ids[new], values[new], {s: a[new] for s, a in slots.items()})

"""The rows of a model's server-side embedding tables, looked up for its steps.

A `ke.layers.Embedding` keeps its table on the parameter servers
(ps/embedding_table.py): a step needs the rows of its batch's ids. Where the
model's inputs determine the ids (a functional or sequential model calling
the layer once), `TableLookups.prefetch` looks every such table up in one
exchange before the forward pass; with the pipelined exchange the next
batch's rows are looked up while this step computes (`look_ahead`). Other
tables are looked up by their layer (`rows_of`). The step's gradient rows go
to the servers with its update (`sum_rows`: one entry per table).

Example:

>>> import keras
>>> import keras_elastic as ke
>>> inputs = keras.Input((2,), dtype="int64")
>>> outputs = ke.layers.Embedding(1000, 4)(inputs)
>>> sorted(embedding_tables(keras.Model(inputs, outputs)))
['0/4']
"""

from __future__ import annotations

import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_elastic.common import keras_compat
from keras_elastic.layers.embedding import Embedding


class TableLookups:
    """The table lookups of one model's steps. `sync`: the `ModelSync` that
    holds it (its servers, tables, exchange and timer)."""

    def __init__(self, sync: Any) -> None:
        self.sync = sync
        self._ids_model = None  # (model -> ids of each table, layers), or False
        self._ids_fn = None  # the unique ids of each such table, compiled
        # The lookup ahead of the batch whose step runs now (`look_ahead`),
        # set by the train function before the step; None: none.
        self.rows_ahead: tuple[list[np.ndarray], object] | None = None
        self.reset()
        for name, layer in sync.tables.items():
            layer.connect(name, lambda ids, create=True, name=name: self.rows_of(
                name, ids, create))

    def reset(self) -> None:
        """A new `fit`: its counts start at 0 (the steps that looked their
        tables up in one exchange, and of them those that took rows looked up
        ahead: logged at the end of a fit)."""
        self.steps = 0
        self.steps_ahead = 0

    def prefetch(self, x) -> dict | None:
        """In the train step, before the forward pass: the rows of every table
        whose ids the model's inputs determine (a functional or sequential
        model calling the layer once), looked up in one exchange with the
        servers (one call per server for all tables). None if there is none;
        other tables are looked up by their layer."""
        found = self._table_inputs()
        if not found:
            return None
        ids_model, layers = found
        uniques = _unique_ids(ids_model, x)
        rows = tf.py_function(
            lambda *u: self.rows_of_all(layers, u), uniques,
            Tout=[layer.compute_dtype for layer in layers])
        for r, layer in zip(rows, layers):
            r.set_shape([None, layer.output_dim])
        return {layer: (u, r) for layer, u, r in zip(layers, uniques, rows)}

    def _table_inputs(self):
        """(model -> ids of each table, those layers) or False: see `_ids_model`."""
        if self._ids_model is None:
            self._ids_model = _ids_model(self.sync.model, list(self.sync.tables.values()))
        return self._ids_model

    def look_ahead(self, data) -> tuple[list[np.ndarray], object] | None:
        """The lookup of the rows of the *next* batch (`data`, as the pipeline
        gives it), started now on the pipeline's thread behind the push in
        flight, so that it travels while this step computes (pipelined
        exchange only). Returns what that batch's step takes the rows from
        (set it as `rows_ahead` before the step), or None.

        Its rows hold the updates the step's dense values hold: the push in
        flight (the previous step's) is applied first, this step's push goes
        after it; so the pipelined exchange's staleness (at most one of the
        worker's own updates) holds for rows too. A step whose ids differ
        (elements given back and dropped, a replay) looks its rows up itself.
        """
        if not (self.sync.pipelined and self.sync.tables) or self.sync.replaying:
            return None
        found = self._table_inputs()
        if not found:
            return None
        ids_model, layers = found
        if isinstance(data, tuple) and len(data) == 1:
            data = data[0]  # as the step takes it
        x = keras_compat.unpack_x_y_sample_weight(data)[0]
        if self._ids_fn is None:
            self._ids_fn = tf.function(lambda x: _unique_ids(ids_model, x),
                                       reduce_retracing=True)
        uniques = [u.numpy() for u in self._ids_fn(x)]
        try:
            for layer, u in zip(layers, uniques):
                layer.check_ids(u)
        except ValueError:
            return None  # the step's own lookup names the bad id
        ids = {layer.table_name: u for layer, u in zip(layers, uniques) if u.size}
        return uniques, self.sync.exchanger.pipeline.then(
            lambda: self.sync.ps.lookup(ids))

    def _take_rows_ahead(self, layers: list[Embedding], ids: dict[str, np.ndarray]
                         ) -> dict[str, np.ndarray] | None:
        """The rows looked up ahead for this step, if its ids are theirs."""
        if self.sync.replaying or self.rows_ahead is None:
            return None
        (uniques, future), self.rows_ahead = self.rows_ahead, None
        if not all(np.array_equal(u, ids[layer.table_name])
                   for layer, u in zip(layers, uniques)):
            return None
        try:
            return future.result()
        except Exception:  # (the step's own lookup raises it again, if it lasts)
            return None

    def rows_of_all(self, layers: list[Embedding], uniques) -> list[np.ndarray]:
        """Rows of several tables' unique ids, in one exchange (or from the
        lookup ahead of this step's batch, `look_ahead`)."""
        ids = {}
        for layer, u in zip(layers, uniques):
            ids[layer.table_name] = u.numpy()
            layer.check_ids(ids[layer.table_name])
        start = time.perf_counter()
        rows = self._take_rows_ahead(layers, ids)
        self.steps += 1
        if rows is None:
            rows = self.sync.ps.lookup({t: v for t, v in ids.items() if v.size})
        else:
            self.steps_ahead += 1
        self.sync.timer.add("lookup", time.perf_counter() - start)
        return [rows.get(layer.table_name, np.zeros((0, layer.output_dim),
                                                    layer.compute_dtype))
                for layer in layers]

    def rows_of(self, table: str, ids: np.ndarray, create: bool = True) -> np.ndarray:
        """Rows of embedding table `table` for unique `ids`, from the servers
        (`create`: a training lookup, which makes admitted ids' rows)."""
        start = time.perf_counter()
        rows = self.sync.ps.lookup({table: ids}, create=create)[table]
        self.sync.timer.add("lookup", time.perf_counter() - start)
        return rows


def embedding_tables(model: keras.Model, namespace: str = "") -> dict[str, Embedding]:
    """The model's `ke.layers.Embedding` layers by table name: their position
    among them, stable across processes that build the same model (like the
    variable keys), in the model's namespace (`common/variable_keys.py`)."""
    tables = {}
    layers = [layer for layer in keras_compat.all_layers(model, include_self=False)
              if isinstance(layer, Embedding)]
    for k, layer in enumerate(layers):
        tables[f"{namespace}{k}/{layer.output_dim}"] = layer
    return tables


def _unique_ids(ids_model: keras.Model, x) -> list[tf.Tensor]:
    """The unique ids (int64, in order of first appearance) of each table's
    input, from the model's inputs `x`."""
    ids = ids_model(x)
    ids = list(ids) if isinstance(ids, (list, tuple)) else [ids]
    return [tf.unique(tf.reshape(tf.cast(t, tf.int64), [-1]))[0] for t in ids]


def _ids_model(model: keras.Model, layers: list[Embedding]):
    """(a model from `model`'s inputs to the ids of each layer, those layers),
    for the layers called once on tensors derived from the model's inputs; or
    False if there is none (a subclassed model, shared layers)."""
    eligible, outputs = [], []
    for layer in layers:
        try:
            outputs.append(layer.input)
        except (AttributeError, ValueError):
            continue  # not called in a graph of layers, or called more than once
        eligible.append(layer)
    if not eligible:
        return False
    try:
        return keras.Model(model.input, outputs), eligible
    except (AttributeError, ValueError, TypeError):
        return False


def sum_rows(tables: list[str], tensors) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{table: (unique ids, gradient rows summed per id)} from the train step's
    (ids, rows) pairs, one per lookup (a table looked up twice in a step, e.g.
    shared by two inputs, gets one entry)."""
    parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for k, table in enumerate(tables):
        ids, rows = tensors[2 * k].numpy(), tensors[2 * k + 1].numpy()
        parts.setdefault(table, []).append((ids, rows))
    sparse = {}
    for table, pairs in parts.items():
        if len(pairs) == 1:
            sparse[table] = pairs[0]
            continue
        ids = np.concatenate([i for i, _ in pairs])
        rows = np.concatenate([r for _, r in pairs])
        unique, index = np.unique(ids, return_inverse=True)
        summed = np.zeros((len(unique), rows.shape[1]), rows.dtype)
        np.add.at(summed, index, rows)
        sparse[table] = (unique, summed)
    return sparse

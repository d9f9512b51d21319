"""`ke.layers.Embedding`: an embedding table that lives on the parameter servers.

Same arguments and call semantics as `keras.layers.Embedding` (masking
included), but no table exists on the worker: each call looks up the rows of
the unique ids of its input from the servers (every server holds the rows of
the ids it owns, `ps.partition.row_owner`; rows are created on first use with
the layer's initializer, the same row for an id whatever the number of
servers). In the elastic train step the gradient of the loss with respect to
those rows, summed per unique id, is pushed with the dense gradients and
applied on the servers by a row-wise optimizer (`ps/sparse_optimizers.py`).

`input_dim=None` allows any id in [0, 2**63): rows exist only for ids seen.

Example:

```python
import keras
import keras_elastic as ke

ids = keras.Input((26,), dtype="int64")
x = ke.layers.Embedding(10_000_000, 16)(ids)      # 640 MB: on the servers
x = keras.layers.Flatten()(x)
model = ke.Model(ids, keras.layers.Dense(1, activation="sigmoid")(x))
model.compile(optimizer="adagrad", loss="binary_crossentropy")
```
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_elastic.common import keras_compat

_UNSUPPORTED = ("embeddings_regularizer", "embeddings_constraint", "weights",
                "lora_rank")


# Called as `hook(layer) -> bool` by a layer looked up before it was connected:
# the worker's sessions register one that connects the elastic model holding
# the layer (worker/session.py; a layer imports no cluster code).
UNCONNECTED_HOOKS: list = []


class Embedding(keras.layers.Layer):
    """Turns non-negative integer ids into dense vectors of size `output_dim`,
    from a table held by the parameter servers.

    Args:
        input_dim: size of the vocabulary (ids are in [0, input_dim)), or None
            for any non-negative int64 id.
        output_dim: size of the vectors.
        embeddings_initializer: how a row is made on first use: "uniform" (the
            Keras default), "normal", "truncated_normal", "zeros", "ones", or
            the matching `keras.initializers` objects (and `Constant`).
        mask_zero: whether id 0 is padding to be masked, as in Keras.
        admit_after: an id gets a trainable row only once it was seen in this
            many training batches (counted per server in a count-min sketch
            of 4 MiB); until then its lookups give the initializer's row for
            it (not kept) and its gradients are dropped. 0 or 1: every id at
            once (the default).
        max_rows: at most this many rows over all servers (each holds its
            share); past it the least recently used rows (looked up or
            updated in training) are removed, down to 95%. None: no bound.
        ttl_versions: rows that training did not use during the last this
            many model versions of their server are removed. None: never.
            A removed row comes back from the initializer (after admission)
            if its id is seen again; evaluation and prediction never make
            rows, nor count for admission.

    Example:

    >>> layer = Embedding(1000, 8, mask_zero=True)
    >>> layer.compute_output_shape((None, 5))
    (None, 5, 8)
    """

    def __init__(self, input_dim: int | None, output_dim: int,
                 embeddings_initializer: Any = "uniform", mask_zero: bool = False,
                 admit_after: int | None = None, max_rows: int | None = None,
                 ttl_versions: int | None = None, **kwargs) -> None:
        given = [k for k in _UNSUPPORTED if kwargs.get(k) is not None]
        if given:
            raise ValueError(
                f"ke.layers.Embedding does not support {given}: its rows live on the "
                "parameter servers and are updated there by the optimizer. Use "
                "keras.layers.Embedding for this layer.")
        for k in _UNSUPPORTED:
            kwargs.pop(k, None)
        kwargs.pop("input_length", None)  # accepted and ignored, as by Keras
        super().__init__(**kwargs)
        if input_dim is not None and int(input_dim) <= 0:
            raise ValueError(f"ke.layers.Embedding '{self.name}': input_dim must be "
                             f"positive or None, got {input_dim}")
        if int(output_dim) <= 0:
            raise ValueError(f"ke.layers.Embedding '{self.name}': output_dim must be "
                             f"positive, got {output_dim}")
        for what, value, least in (("admit_after", admit_after, 0),
                                   ("max_rows", max_rows, 1),
                                   ("ttl_versions", ttl_versions, 1)):
            if value is not None and (isinstance(value, bool) or int(value) != value
                                      or value < least):
                raise ValueError(f"ke.layers.Embedding '{self.name}': {what} must be an "
                                 f"integer >= {least} or None, got {value!r}")
        self.admit_after = int(admit_after or 0)
        self.max_rows = None if max_rows is None else int(max_rows)
        self.ttl_versions = None if ttl_versions is None else int(ttl_versions)
        self.input_dim = None if input_dim is None else int(input_dim)
        self.output_dim = int(output_dim)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.mask_zero = bool(mask_zero)
        self.supports_masking = self.mask_zero
        self.autocast = False
        # Set when the model is connected to the cluster (worker/model_sync.py).
        self.table_name: str | None = None
        self._rows_of: Callable[[np.ndarray], np.ndarray] | None = None
        self.built = True

    def connect(self, table_name: str,
                rows_of: Callable[[np.ndarray], np.ndarray]) -> None:
        """Names this layer's table and gives it `rows_of(unique int64 ids) ->
        rows` (the parameter servers' lookup); done by `ModelSync`."""
        self.table_name = table_name
        self._rows_of = rows_of

    # -- the table ---------------------------------------------------------
    def table_spec(self) -> dict:
        """What the parameter servers need to hold this layer's table."""
        return {"dim": self.output_dim, "dtype": str(np.dtype(self.compute_dtype)),
                "input_dim": self.input_dim,
                "initializer": keras.initializers.serialize(
                    self.embeddings_initializer),
                "admit_after": self.admit_after, "max_rows": self.max_rows,
                "ttl_versions": self.ttl_versions}

    def check_ids(self, ids: np.ndarray) -> None:
        """ValueError naming this layer and the first id out of its range."""
        bad = np.flatnonzero(ids < 0) if self.input_dim is None else np.flatnonzero(
            (ids < 0) | (ids >= self.input_dim))
        if bad.size:
            where = ("non-negative" if self.input_dim is None
                     else f"in [0, {self.input_dim})")
            raise ValueError(f"ke.layers.Embedding '{self.name}': id {int(ids[bad[0]])} "
                             f"is out of range: ids must be {where}")

    def _lookup(self, unique_ids: tf.Tensor, create: bool = False) -> np.ndarray:
        ids = unique_ids.numpy()
        self.check_ids(ids)
        if self._rows_of is None:
            # Called before its model's first fit, evaluate or predict (a
            # restored model serving `model(x)`): its model connects now.
            for hook in UNCONNECTED_HOOKS:
                if hook(self):
                    break
        if self._rows_of is None:
            raise RuntimeError(
                f"ke.layers.Embedding '{self.name}' is not connected to parameter "
                "servers: use it in a ke.Model, ke.Sequential or ke.wrap(model), "
                "and call fit, evaluate or predict (the table exists only there)")
        if not ids.size:
            return np.zeros((0, self.output_dim), self.compute_dtype)
        return self._rows_of(ids, create)

    # -- Keras layer API ---------------------------------------------------
    def call(self, inputs):
        inputs = tf.convert_to_tensor(inputs)
        if inputs.dtype.is_floating and getattr(self, "cast_float_ids", False):
            inputs = tf.cast(inputs, tf.int64)  # as keras.layers.Embedding does
        if not inputs.dtype.is_integer:
            raise TypeError(
                f"ke.layers.Embedding '{self.name}': ids must be integers, got a "
                f"{inputs.dtype.name} tensor; cast or hash them to int64 first (e.g. "
                "keras.layers.Hashing or tf.cast)")
        from keras_elastic.common import step_context

        if _STEP.lookups is None and step_context.current() is not None:
            raise ValueError(
                f"ke.layers.Embedding '{self.name}' is called in a train_step of the "
                "model's own: its rows live on the parameter servers and are not "
                "variables, so the step's GradientTape cannot give their gradient. "
                "Use Keras' default train_step (do not override it), or keep this "
                "table on the workers with keras.layers.Embedding.")
        ids = tf.cast(inputs, tf.int64)
        unique, index = tf.unique(tf.reshape(ids, [-1]))
        prefetched = _prefetched(self)
        if prefetched is None:
            # In the elastic train step (a layer whose ids the inputs do not
            # give) the lookup makes rows; in evaluation and prediction not.
            create = _STEP.lookups is not None
            rows = tf.py_function(lambda u: self._lookup(u, create), [unique],
                                  Tout=self.compute_dtype)
        else:  # looked up with every other table of the step, in one exchange
            fetched_ids, rows = prefetched
            check = tf.debugging.assert_equal(
                unique, fetched_ids, message=f"ke.layers.Embedding '{self.name}': the "
                "ids of the step's lookup differ from the ids of the forward pass")
            with tf.control_dependencies([check]):
                rows = tf.identity(rows)
        rows.set_shape([None, self.output_dim])
        _watch(self, unique, rows)
        out = tf.reshape(tf.gather(rows, index),
                         tf.concat([tf.shape(ids), [self.output_dim]], 0))
        out.set_shape(ids.shape.concatenate([self.output_dim]))
        return out

    def compute_mask(self, inputs, mask=None):
        if not self.mask_zero:
            return None
        return keras.ops.not_equal(inputs, 0)

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.output_dim)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update({
            "input_dim": self.input_dim, "output_dim": self.output_dim,
            "embeddings_initializer": keras.initializers.serialize(
                self.embeddings_initializer),
            "mask_zero": self.mask_zero, "admit_after": self.admit_after,
            "max_rows": self.max_rows, "ttl_versions": self.ttl_versions})
        return config


# -- the train step's view of the lookups --------------------------------
class _Step(threading.local):
    lookups: list | None = None
    tape: tf.GradientTape | None = None
    prefetched: dict | None = None


_STEP = _Step()


@contextlib.contextmanager
def embedding_step(tape: tf.GradientTape, prefetched: dict | None = None):
    """Within it, every `Embedding` call has `tape` watch its looked-up rows
    and lists `(layer, unique_ids, rows)`: the train step takes the gradient
    with respect to those rows and pushes it. `prefetched`: {layer: (unique
    ids, rows)} the step already looked up (all tables at once); a layer's
    first call in the step uses them instead of a lookup of its own.

    >>> with tf.GradientTape() as tape, embedding_step(tape) as lookups:
    ...     pass
    >>> lookups
    []
    """
    previous = _STEP.lookups, _STEP.tape, _STEP.prefetched
    _STEP.lookups, _STEP.tape = [], tape
    _STEP.prefetched = {id(layer): v for layer, v in (prefetched or {}).items()}
    try:
        yield _STEP.lookups
    finally:
        _STEP.lookups, _STEP.tape, _STEP.prefetched = previous


def _prefetched(layer: Embedding):
    if not _STEP.prefetched:
        return None
    return _STEP.prefetched.pop(id(layer), None)


def _watch(layer: Embedding, unique: tf.Tensor, rows: tf.Tensor) -> None:
    if _STEP.lookups is not None:
        _STEP.tape.watch(rows)
        _STEP.lookups.append((layer, unique, rows))


_OPTIONS = ("admit_after", "max_rows", "ttl_versions")


def convert_embeddings(model: keras.Model, min_rows: int = 0,
                       options: dict | None = None) -> int:
    """Replaces, in place, each `keras.layers.Embedding` of `model` with at least
    `min_rows` rows by an `Embedding` of the same configuration whose table
    lives on the parameter servers. The rows of the converted tables start
    from the layer's initializer on the servers (the model's local table is
    dropped). Returns how many layers were converted.

    `options`: the admission and eviction keywords of `Embedding`
    (`admit_after`, `max_rows`, `ttl_versions`) for every converted layer
    (`{"admit_after": 2}`), or per layer name (`{"user_id": {...}}`).

    Works on models whose layers are called through their `call` (functional,
    sequential and subclassed): the converted layer object keeps its place
    and name, only its class and state change.

    >>> model = keras.Sequential([keras.Input((3,), dtype="int64"),
    ...                           keras.layers.Embedding(100, 4)])
    >>> convert_embeddings(model)
    1
    >>> type(model.layers[0]).__name__
    'Embedding'
    >>> model.layers[0].table_name is None
    True
    """
    options = dict(options or {})
    per_layer = {k: v for k, v in options.items() if isinstance(v, dict)}
    common = {k: v for k, v in options.items() if not isinstance(v, dict)}
    unknown = sorted(set(common) - set(_OPTIONS))
    for given in per_layer.values():
        unknown += sorted(set(given) - set(_OPTIONS))
    if unknown:
        raise ValueError(f"ps_embedding_options: unknown option(s) {unknown}; the "
                         f"options are {list(_OPTIONS)}, for every converted layer or "
                         "keyed by layer name")
    converted = 0
    for layer in keras_compat.all_layers(model, include_self=False):
        if type(layer) is not keras.layers.Embedding:
            continue
        if layer.input_dim < min_rows:
            continue
        if getattr(layer, "lora_enabled", False) or layer.embeddings_regularizer \
                or layer.embeddings_constraint:
            raise ValueError(
                f"cannot move embedding '{layer.name}' to the parameter servers: it "
                "has a regularizer, a constraint or LoRA; leave it local (raise "
                "ps_embeddings_above) or remove them")
        input_dim, output_dim = layer.input_dim, layer.output_dim
        initializer, mask_zero = layer.embeddings_initializer, layer.mask_zero
        # Drop the local table (the servers hold it) and make the layer ours.
        table = layer.__dict__.get("_embeddings")
        if table is not None:
            keras_compat.untrack(layer, table)
            del layer.__dict__["_embeddings"]
        layer.__class__ = Embedding
        layer.input_dim, layer.output_dim = input_dim, output_dim
        layer.embeddings_initializer, layer.mask_zero = initializer, mask_zero
        layer.supports_masking = mask_zero
        layer.autocast = False
        layer.table_name, layer._rows_of = None, None
        # A drop-in for the Keras layer: ids as Keras takes them (floats cast).
        layer.cast_float_ids = True
        chosen = {**common, **per_layer.get(layer.name, {})}
        layer.admit_after = int(chosen.get("admit_after") or 0)
        layer.max_rows = chosen.get("max_rows")
        layer.ttl_versions = chosen.get("ttl_versions")
        layer.built = True
        converted += 1
    return converted

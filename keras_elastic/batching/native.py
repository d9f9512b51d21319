"""Compiles per-component canned reducers into one native batching pass.

The pass is at most three tf.data ops over the whole element:

1. a per-element `map` that encodes the components that need it (only if
   some component does);
2. one `Dataset.batch`, `Dataset.padded_batch` or `Dataset.ragged_batch`
   over the whole element;
3. a per-batch `map` that decodes the components that need it (only if
   some component does).

So when every component maps onto the native op unchanged, the pipeline is
exactly that op. A mix such as padded dense + sparse + ragged + dense
components is one `Dataset.ragged_batch` (whose only per-element work is
one encoding op per variable-shape dense part) and one per-batch `map`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from keras_elastic.batching.plan import (
    BATCH,
    MODES,
    OP_NAMES,
    RAGGED,
    Infeasible,
    Plan,
)
from keras_elastic.batching.structure import Path

Leaf = tuple[Path, Any, Any]  # (path, spec, canned reducer)


def map_element(dataset: tf.data.Dataset, fn: Callable[[Any], Any],
                parallel: bool = False) -> tf.data.Dataset:
    """`dataset.map(fn)` where `fn` takes the element as one argument.

    With `parallel`, elements are mapped concurrently but kept in order.
    tf.data only parallelizes stateless maps by itself, and the run-time
    checks (`Assert`) make ours stateful; asking explicitly keeps a per-batch
    decode off the consumer's critical path.
    """
    kwargs = ({"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": True}
              if parallel else {})
    if type(dataset.element_spec) is tuple:  # Dataset.map unpacks plain tuples
        return dataset.map(lambda *parts: fn(parts), **kwargs)
    return dataset.map(fn, **kwargs)


def _plans(leaves: list[Leaf], mode: str, mapped: bool) -> list[Plan]:
    return [reducer.plan(spec, path, mode, mapped) for path, spec, reducer in leaves]


def cost(mode: str, plans: list[Plan]) -> tuple[int, bool]:
    """How much a mode costs beyond its native op: `(per-element, per-batch)`.

    Per-element work dominates. An encode map (codecs, wrapping) counts 2;
    `Dataset.ragged_batch` counts 1 for its own per-element map, which runs
    one encoding op per variable-shape dense part. A per-batch decode map
    comes second.
    """
    encode = any(p.encode is not None for p in plans)
    per_element = (2 if encode else 0) + (1 if mode == RAGGED else 0)
    return per_element, any(p.decode is not None for p in plans)


def choose(leaves: list[Leaf]) -> tuple[str, bool, list[Plan]]:
    """Picks the native op needing the least extra work (see `cost`).

    Returns:
      `(mode, mapped, plans)`: the op (`BATCH`, `PADDED` or `RAGGED`), whether a
      per-element encode map runs, and one `Plan` per leaf.

    Raises:
      ValueError: if no single op can batch all the components together.
    """
    options = []
    reasons = {}
    for rank, mode in enumerate(MODES):
        try:
            plans = _plans(leaves, mode, mapped=False)
        except Infeasible as error:
            reasons[mode] = str(error)
            continue
        options.append((cost(mode, plans), rank, mode))
    if not options:
        why = "; ".join(f"with {OP_NAMES[mode]}, {reasons[mode]}" for mode in MODES)
        raise ValueError(
            f"these components cannot be batched together in one pass: {why}.")
    mode = min(options)[2]
    plans = _plans(leaves, mode, mapped=False)
    mapped = any(p.encode is not None for p in plans)
    if mapped:
        plans = _plans(leaves, mode, mapped=True)
    return mode, mapped, plans


def set_batch_dim(value: Any, batch_size: int) -> Any:
    """Sets the static batch size of a batch (for drop_remainder).

    As `Dataset.batch(..., drop_remainder=True)` does, for dense, sparse and
    ragged batches alike, so that every path gives the same element_spec.
    """
    if isinstance(value, tf.Tensor) and value.shape.rank:
        value.set_shape(tf.TensorShape([batch_size]).concatenate(value.shape[1:]))
    elif isinstance(value, tf.SparseTensor) and value.shape.rank:
        value.set_shape(tf.TensorShape([batch_size]).concatenate(value.shape[1:]))
    elif isinstance(value, tf.RaggedTensor) and value.shape[0] is None:
        if value.uniform_row_length is not None:
            return tf.RaggedTensor.from_uniform_row_length(
                value.values, value.uniform_row_length, nrows=batch_size,
                validate=False)
        splits = tf.ensure_shape(value.row_splits, [batch_size + 1])
        value = tf.RaggedTensor.from_row_splits(value.values, splits, validate=False)
    return value


def batch_leaves(dataset: tf.data.Dataset, leaves: list[Leaf], batch_size: Any,
                 drop_remainder: bool) -> tf.data.Dataset:
    """Batches `dataset`, whose flattened element has one entry per leaf.

    Args:
      dataset: the dataset to batch.
      leaves: `(path, spec, reducer)` for each leaf of the element, in
        `tf.nest.flatten` order.
      batch_size: the number of elements per batch.
      drop_remainder: whether to drop a last, smaller batch.

    Returns:
      The batched dataset, with the element's structure.
    """
    element_spec = dataset.element_spec
    mode, mapped, plans = choose(leaves)

    if mapped:
        def encode(element: Any) -> tuple[Any, ...]:
            flat = tf.nest.flatten(element)
            return tuple(v if p.encode is None else p.encode(v)
                         for p, v in zip(plans, flat, strict=True))

        dataset = map_element(dataset, encode, parallel=True)

    if mode == BATCH:
        dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    elif mode == RAGGED:
        dataset = dataset.ragged_batch(batch_size, drop_remainder=drop_remainder)
    else:
        shapes = [p.padded_shapes for p in plans]
        values = [p.padding_values for p in plans]
        if mapped:
            shapes, values = tuple(shapes), tuple(values)
        else:
            shapes = tf.nest.pack_sequence_as(element_spec, shapes)
            values = tf.nest.pack_sequence_as(element_spec, values)
        dataset = dataset.padded_batch(batch_size, padded_shapes=shapes,
                                       padding_values=values,
                                       drop_remainder=drop_remainder)

    if mapped or any(p.decode is not None for p in plans):
        static_size = batch_size if drop_remainder and isinstance(batch_size,
                                                                  int) else None

        def decode(batched: Any) -> Any:
            flat = list(batched) if mapped else tf.nest.flatten(batched)
            outs = [b if p.decode is None else p.decode(b)
                    for p, b in zip(plans, flat, strict=True)]
            if static_size is not None:
                outs = [set_batch_dim(o, static_size) for o in outs]
            return tf.nest.pack_sequence_as(element_spec, outs)

        dataset = map_element(dataset, decode, parallel=True)
    return dataset

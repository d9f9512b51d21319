"""Keras' `fit` arguments on data, with Keras' meaning, for elastic data.

Keras turns `validation_split` into the *last* fraction of the arrays (before
any shuffling) and `class_weight` into per-sample weights. An elastic `fit`
does the same, on NumPy arrays before they become an `ElasticDataset`, and
on an `ElasticDataset`'s elements after its `dataset_fn`.

Example:

>>> import numpy as np
>>> (x, y), (vx, vy) = split_validation((np.arange(10), np.arange(10)), 0.2)
>>> vx.tolist()
[8, 9]
>>> sample_weights_for(np.array([0, 1, 1]), {1: 3.0}).tolist()
[1.0, 3.0, 3.0]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf


class NotArrays(TypeError):
    """Data Keras reads as arrays, with a leaf keras-elastic cannot hand out
    in tasks (a sparse or ragged tensor)."""


def as_arrays(x: Any, y: Any = None, sample_weight: Any = None) -> tuple | None:
    """`(x, y, sample_weight)` as NumPy arrays when Keras reads them as arrays
    (its array adapter: NumPy, tf.Tensor, pandas, whatever `np.asarray`
    converts; a Python list is a nest, as a tuple), else None (a dataset, a
    generator, a `PyDataset`: Keras' own loop). `NotArrays` names a leaf that
    has no dense NumPy form (a `tf.SparseTensor`, `tf.RaggedTensor`, a SciPy
    sparse matrix).

    >>> x, y, sw = as_arrays([np.zeros((4, 2)), tf.ones((4, 3))], tf.zeros(4))
    >>> type(x).__name__, x[1].dtype.name, type(y).__name__, sw
    ('tuple', 'float32', 'ndarray', None)
    """
    import keras

    from keras_elastic.common import keras_compat

    if x is None or not keras_compat.can_convert_arrays((x, y, sample_weight)):
        return None
    nest = keras.tree.lists_to_tuples((x, y, sample_weight))
    leaves = []
    for path, leaf in keras.tree.flatten_with_path(nest):
        if leaf is None and len(path) > 1:
            raise NotArrays(f"{_place(path)} is None (an optional input left out), "
                            "which keras_elastic cannot hand out in tasks: give an "
                            "array for it (e.g. zeros), or leave it out of x")
        leaves.append(_as_array(leaf, _place(path)))
    return tuple(keras.tree.pack_sequence_as(nest, leaves))


def _place(path: tuple) -> str:
    """`x`, `y[1]`, `x['age']`: a leaf's place in `(x, y, sample_weight)`."""
    name = ("x", "y", "sample_weight")[path[0]]
    return name + "".join(f"[{p!r}]" for p in path[1:])


def _as_array(leaf: Any, path: str) -> np.ndarray | None:
    if leaf is None or isinstance(leaf, np.ndarray):
        return leaf
    kind = f"{type(leaf).__module__.split('.')[0]}.{type(leaf).__name__}"
    if isinstance(leaf, (tf.SparseTensor, tf.RaggedTensor)) or (
            type(leaf).__module__.startswith("scipy.sparse")):
        raise NotArrays(f"{path} is a {kind}, which keras_elastic cannot hand out in "
                        "tasks: give a dense array (e.g. .toarray() or .to_tensor()), "
                        "or an ElasticDataset whose dataset_fn makes it")
    if hasattr(leaf, "to_numpy"):  # pandas
        leaf = leaf.to_numpy()
    elif isinstance(leaf, tf.Tensor) or hasattr(leaf, "numpy"):
        leaf = leaf.numpy()
    array = np.asarray(leaf)
    if array.dtype == object:
        raise NotArrays(f"{path} is a {kind} of Python objects (NumPy reads it as "
                        "dtype object): give numbers or strings of one type")
    return array


def split_validation(arrays: Any, validation_split: float) -> tuple[Any, Any]:
    """`(training, validation)`: the validation arrays are the last
    `validation_split` of every array (`None` leaves stay `None`), as Keras'
    `fit(validation_split=...)` takes them."""
    leaves = [a for a in tf.nest.flatten(arrays) if a is not None]
    if not leaves:
        return arrays, arrays
    n = int(leaves[0].shape[0])
    split_at = int(math.floor(n * (1.0 - validation_split)))
    if split_at == 0 or split_at == n:
        raise ValueError(
            f"Training data contains {n} samples, which is not sufficient to split "
            f"it into a validation and training set as specified by "
            f"`validation_split={validation_split}`. Either provide more data, or a "
            "different value for the `validation_split` argument.")
    def cut(lo: int, hi: int):
        return lambda a: None if a is None else a[lo:hi]

    return (tf.nest.map_structure(cut(0, split_at), arrays),
            tf.nest.map_structure(cut(split_at, n), arrays))


def _class_ids(y: np.ndarray) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim > 1:
        y = np.argmax(y, axis=-1) if y.shape[-1] != 1 else np.squeeze(y, axis=-1)
    return np.round(y).astype(np.int64)


def sample_weights_for(y: np.ndarray, class_weight: dict) -> np.ndarray:
    """Per-sample weights from `class_weight` ({class id: weight}; other
    classes weigh 1.0), as Keras makes them from arrays."""
    weights = np.ones(len(y), np.float32)
    ids = _class_ids(y)
    for i, w in class_weight.items():
        weights[ids == int(i)] = w
    return weights


def check_class_weight(class_weight: Any, sample_weight: Any, y: Any) -> None:
    """Keras' refusals: both class and sample weights, several outputs."""
    if not isinstance(class_weight, dict):
        raise ValueError(f"`class_weight` must be a dict {{class id: weight}}, got "
                         f"{type(class_weight).__name__}")
    if sample_weight is not None:
        raise ValueError("You cannot `class_weight` and `sample_weight` at the same "
                         "time.")
    if tf.nest.is_nested(y):
        raise ValueError("`class_weight` is only supported for Models with a single "
                         "output.")


def class_weight_map(class_weight: dict) -> Callable:
    """A `tf.data` map over unbatched `(x, y)` elements that adds Keras'
    class weight as the sample weight: `(x, y, weight)`."""
    table = tf.constant([float(class_weight.get(c, 1.0))
                         for c in range(max(int(k) for k in class_weight) + 1)],
                        tf.float32)

    def add_weight(*element):
        if len(element) != 2:
            raise ValueError("`class_weight` needs elements (x, y) without sample "
                             "weights: You cannot `class_weight` and `sample_weight` "
                             "at the same time.")
        x, y = element
        if tf.nest.is_nested(y):
            raise ValueError("`class_weight` is only supported for Models with a "
                             "single output.")
        y = tf.convert_to_tensor(y)
        if y.shape.rank and y.shape[-1] not in (None, 1):
            ids = tf.argmax(y, axis=-1, output_type=tf.int32)
        else:
            ids = tf.cast(tf.round(tf.reshape(y, [-1])[0] if y.shape.rank else y),
                          tf.int32)
        inside = tf.logical_and(ids >= 0, ids < tf.shape(table)[0])
        weight = tf.where(inside, tf.gather(table, tf.clip_by_value(
            ids, 0, tf.shape(table)[0] - 1)), 1.0)
        return x, y, weight

    return add_weight

"""Fingerprints of the elements `dataset_fn` produces, to check replays.

A task that is trained again after a failure (its worker died, a parameter
server rolled back) is *replayed*: `dataset_fn` runs again on the same records,
and the elements whose gradients are already applied are skipped by position.
That is only right if `dataset_fn` gives the same elements in the same order.
Each element gets a 64-bit fingerprint of its content (computed in the input
pipeline, before batching, so padding does not matter); the parameter servers
keep the sum of the fingerprints of the elements applied per task, and a replay
compares it with the elements it skips.

Example:

>>> import tensorflow as tf
>>> a = element_fingerprint((tf.constant([1.0, 2.0]), tf.constant(3)))
>>> b = element_fingerprint((tf.constant([2.0, 1.0]), tf.constant(3)))
>>> bool(a != b)
True
>>> int(range_fingerprint([0, 1], [5, 6])) == int(range_fingerprint([1, 0], [6, 5]))
True
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

_BUCKETS = 2 ** 62

# The fingerprints run inside the input pipeline's traced functions; they are
# plain TensorFlow calls, so AutoGraph need not convert them (a conversion is
# about 0.1 s of a worker's start each; `do_not_convert` also stops it from
# converting the helpers they call).
_plain = tf.autograph.experimental.do_not_convert


def _rows(t: tf.Tensor) -> tf.Tensor:
    """FarmHash of each row's bytes (axis 0) of a dense tensor, as int64."""
    return tf.bitcast(tf.fingerprint(t), tf.int64)


def _serialized(t: tf.Tensor) -> tf.Tensor:
    """FarmHash of the serialized tensor (dtype, shape and bytes)."""
    return tf.strings.to_hash_bucket_fast(tf.io.serialize_tensor(t), _BUCKETS)


def _combine(hashes: list[tf.Tensor]) -> tf.Tensor:
    if len(hashes) == 1:
        return hashes[0]
    # Order matters: weigh each hash by its position (int64 arithmetic wraps).
    return tf.add_n([h * (2 * i + 1) for i, h in enumerate(hashes)])


def is_dense(spec) -> bool:
    """Every component of an element spec is a dense tensor: fingerprints can
    then be computed per batch (`batch_fingerprints`)."""
    return all(isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(spec))


@_plain
def batch_fingerprints(batch) -> tf.Tensor:
    """`[B]` int64: the fingerprint of each element of a batch of dense
    components, equal to `element_fingerprint` of that element (one FarmHash
    pass over the batch's bytes: about 2 microseconds per element of 12 KB)."""
    return _combine([_rows(tf.convert_to_tensor(t)) for t in tf.nest.flatten(batch)])


def _leaf_hashes(value) -> list[tf.Tensor]:
    if isinstance(value, tf.SparseTensor):
        return [_serialized(value.indices), _serialized(value.values),
                _serialized(value.dense_shape)]
    if isinstance(value, tf.RaggedTensor):
        return [_serialized(value.flat_values)] + [
            _serialized(s) for s in value.nested_row_splits]
    return [_rows(tf.expand_dims(tf.convert_to_tensor(value), 0))[0]]


@_plain
def element_fingerprint(element) -> tf.Tensor:
    """An int64 scalar that changes when any component of `element` does."""
    return _combine([h for leaf in tf.nest.flatten(element) for h in _leaf_hashes(leaf)])


def mix(positions: np.ndarray, fingerprints: np.ndarray) -> np.ndarray:
    """Per element: its fingerprint mixed with its position in the task (uint64)."""
    x = np.asarray(fingerprints).astype(np.uint64) ^ (
        np.asarray(positions).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def range_fingerprint(positions: Sequence[int] | np.ndarray,
                      fingerprints: Sequence[int] | np.ndarray) -> int:
    """Fingerprint of a set of elements of one task: order-free, so the sums
    of disjoint ranges add up (mod 2**64)."""
    with np.errstate(over="ignore"):
        return int(np.sum(mix(positions, fingerprints), dtype=np.uint64))

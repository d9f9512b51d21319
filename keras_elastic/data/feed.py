"""A `tf.data.Dataset` fed by a Python generator, without `GeneratorDataset`.

`tf.data.Dataset.from_generator` builds a `GeneratorDataset` op, and since
TensorFlow 2.16 the first construction of that op in a process calls
`mallopt(M_MMAP_THRESHOLD, 128 KiB)` (`ApplyPython311MemoryPatch` in
`generator_dataset_op.cc`). That turns off glibc's dynamic mmap threshold for
the whole process, for good: from then on every tensor buffer above 128 KiB
that does not fit a free heap chunk is a fresh `mmap` and, when freed, a
`munmap`. A training step of a small CNN then maps and unmaps megabytes per
op; every page is faulted in and zeroed by the kernel again. Measured on the
CIFAR-10 bench (2 cores): 4,000 mmap + 4,000 munmap calls and 4.5 M page
faults in 20 s of training, 37% of the worker's CPU time in the kernel, and a
worker 25-35% slower than the same step in a process that never built a
`GeneratorDataset`.

`generator_dataset` gives the same dataset (one `generator()` call per
iterator, elements in order, the same element spec) from a `tf.numpy_function`
over a counter, so the process keeps glibc's defaults.

Example:

>>> import numpy as np
>>> def gen():
...     yield np.int64(1), np.arange(3, dtype=np.float32)
...     yield np.int64(2), np.arange(2, dtype=np.float32)
>>> ds = generator_dataset(gen, (tf.TensorSpec([], tf.int64),
...                              tf.TensorSpec([None], tf.float32)))
>>> [(int(a), b.tolist()) for a, b in ds.as_numpy_iterator()]
[(1, [0.0, 1.0, 2.0]), (2, [0.0, 1.0])]
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

_keys = itertools.count()
_lock = threading.Lock()


def generator_dataset(generator: Callable[[], Iterator[Any]],
                      output_signature: Any) -> tf.data.Dataset:
    """The elements `generator()` yields, as `from_generator` would give them.

    Each iterator over the dataset calls `generator()` once and pulls from it
    in order. A generator runs to its end or stays open until the dataset is
    garbage-collected (an iterator dropped early does not close it at once, as
    `from_generator`'s finalizer would).

    Args:
      generator: a callable returning an iterator of elements.
      output_signature: a nest of `tf.TensorSpec` (dense components only),
        the structure and specs of one element.

    Returns:
      A `tf.data.Dataset` whose `element_spec` is `output_signature`.
    """
    specs = tf.nest.flatten(output_signature)
    for spec in specs:
        if not isinstance(spec, tf.TensorSpec):
            raise TypeError(f"generator_dataset takes tf.TensorSpec components only, "
                            f"got {spec!r}")
    dtypes = [s.dtype for s in specs]
    empty = [_placeholder(s) for s in specs]
    live: dict[int, Iterator[Any]] = {}

    def start() -> np.int64:
        with _lock:
            key = next(_keys)
        live[key] = iter(generator())
        return np.int64(key)

    def pull(key: np.int64) -> list[Any]:
        it = live.get(int(key))
        if it is None:
            return [np.bool_(False)] + empty
        try:
            element = next(it)
        except StopIteration:
            live.pop(int(key), None)
            return [np.bool_(False)] + empty
        except BaseException:
            live.pop(int(key), None)
            raise
        values = tf.nest.flatten(element)
        if len(values) != len(specs):
            live.pop(int(key), None)
            raise ValueError(f"the generator yielded {len(values)} components; "
                             f"expected {len(specs)} ({output_signature})")
        # Copies, always: TensorFlow takes an aligned array a numpy_function
        # returns without copying and, owning the only tensor reference, may
        # reuse its buffer for an op's output in place (a view of the user's
        # arrays would be written over: seen as sample weights divided by the
        # batch size in a later epoch).
        return [np.bool_(True)] + [
            np.array(v, dtype=object if s.dtype == tf.string else s.dtype.as_numpy_dtype,
                     copy=True)
            for v, s in zip(values, specs, strict=True)]

    # The functions tf.data traces here are plain TensorFlow calls: AutoGraph
    # need not convert them (about 0.1 s of a worker's start each).
    plain = tf.autograph.experimental.do_not_convert

    @plain
    def step(k):
        out = tf.numpy_function(pull, [k], [tf.bool] + dtypes, stateful=True)
        return out[0], tuple(tf.ensure_shape(t, s.shape)
                             for t, s in zip(out[1:], specs, strict=True))

    @plain
    def elements(key: tf.Tensor) -> tf.data.Dataset:
        return (tf.data.Dataset.from_tensors(key).repeat().map(step)
                .take_while(plain(lambda ok, values: ok))
                .map(plain(lambda ok, values: tf.nest.pack_sequence_as(
                    output_signature, list(values)))))

    keys = tf.data.Dataset.from_tensors(np.int64(0)).map(
        plain(lambda _: tf.numpy_function(start, [], tf.int64, stateful=True)))
    return keys.flat_map(elements)


def _placeholder(spec: tf.TensorSpec) -> np.ndarray:
    """A value of `spec`'s dtype for the end-of-stream marker (never yielded)."""
    shape = [0] if spec.shape.rank is None else [
        0 if d is None else d for d in spec.shape.as_list()]
    if spec.dtype == tf.string:
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, spec.dtype.as_numpy_dtype)

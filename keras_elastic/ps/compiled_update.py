"""The compiled code of a parameter server's update, and reads of its variables.

One push is one call into TensorFlow (`compile_update`): the non-trainable
values assigned (merged with another worker's change where a base came),
then the optimizer's update, then every variable read back for the reply. A
model with 14 BatchNormalization statistics spent 70% of its server's push
time in an eager read, a compare and an eager assign per statistic (the
CIFAR-10 bench model: 9 of the server's 14 ms per push) before it was one
call. The reads (`snapshot`, `compile_read_all`) and the tensors fed
(`as_tensor`) avoid copies: see each.

Example:

>>> import keras
>>> import numpy as np
>>> w = keras.Variable(np.ones(2, "float32"), name="w")
>>> optimizer = keras.optimizers.SGD(learning_rate=0.5)
>>> optimizer.build([w])
>>> update = compile_update({"w": w}, optimizer, ("w",))
>>> [v.numpy().tolist() for v in update([as_tensor(np.ones(2, "float32"))])]
[[0.5, 0.5]]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import keras
import numpy as np
import tensorflow as tf

from keras_elastic.common import keras_compat
from keras_elastic.common.tensor_codec import empty_aligned


def compile_update(variables: Mapping[str, keras.Variable],
                   optimizer: keras.optimizers.Optimizer | None,
                   names: tuple[str, ...],
                   assigned: tuple[tuple[str, bool], ...] = ()) -> Callable:
    """The compiled update of one kind of push: the non-trainable values
    `assigned` ((name, whether a base came): with a base, a value another
    push changed meanwhile takes this push's change instead of its value),
    then `names` updated by `optimizer` (None: assign only). With an
    optimizer it returns every variable's value after the update (in
    `variables`' order), read as `compile_read_all` reads them, so the reply
    needs no second call into TensorFlow. Called with one list: the
    gradients in the order of `names`, then the values in the order of
    `assigned`, then the bases of the assigned names that have one."""
    updated = [variables[n] for n in names]
    targets = [(handle(variables[n]), based) for n, based in assigned]
    handles = [handle(v) for v in variables.values()]

    @tf.function(autograph=False)
    def apply(grads, assigns, bases):
        bases = iter(bases)
        for (target, based), value in zip(targets, assigns):
            if based:
                base = next(bases)
                current = target.read_value()
                value = tf.where(tf.reduce_all(tf.equal(current, base)),
                                 value, current + (value - base))
            target.assign(value)
        if optimizer is None:
            return []
        optimizer.apply(grads, updated)
        # (after the update: reads of a resource follow its writes)
        return [h.read_value() for h in handles]

    def spec(name):
        v = variables[name]
        return tf.TensorSpec(tuple(v.shape), v.dtype)

    # Called as a concrete function, with the flat list of its tensors: a
    # tf.function's own dispatch (matching its arguments' types on every
    # call) took 3 ms of a small push, the concrete function's check of each
    # tensor against its spec 1.2 ms of a push of 50 tensors; the tensors'
    # shapes and dtypes are the variables' (`ParameterStore.check_tensor`).
    return keras_compat.flat_call(apply.get_concrete_function(
        [spec(n) for n in names], [spec(n) for n, _ in assigned],
        [spec(n) for n, based in assigned if based]))


def compile_read_all(variables: list[keras.Variable]) -> Callable[[], list]:
    """One compiled call reading every variable of `variables` (a model of
    100 variables: about 3 ms instead of 23 ms of eager reads per reply);
    turn its tensors into arrays with `read_only`."""
    handles = [handle(v) for v in variables]

    @tf.function(autograph=False)
    def read():
        return [h.read_value() for h in handles]

    return read


def snapshot(variable) -> np.ndarray:
    """The variable's current value, read-only, without a copy: what the
    servicer serializes. The array shares the variable's buffer; TensorFlow
    copies the buffer before a later update writes it while the array holds
    it (copy-on-write), so the array keeps this value.

    >>> v = keras.Variable(np.ones(3, "float32"))
    >>> snap = snapshot(v)
    >>> v.assign_add(np.ones(3, "float32"))  # doctest: +ELLIPSIS
    <...>
    >>> snap.tolist(), snap.flags.writeable
    ([1.0, 1.0, 1.0], False)
    """
    tensor = handle(variable)
    read = getattr(tensor, "read_value", None)
    return read_only(read() if read is not None else tensor)


def handle(variable):
    """The TensorFlow variable behind a `keras.Variable` (itself otherwise:
    a `tf.Variable`'s `value` is a method)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def read_only(tensor) -> np.ndarray:
    """`tensor` as a read-only array, its buffer shared where NumPy can."""
    value = np.asarray(tensor)
    if value.flags.writeable:  # (a copy was made: a scalar, another backend)
        value.flags.writeable = False
    return value


# dtypes TensorFlow takes from NumPy through DLPack (see `as_tensor`).
_DLPACK_DTYPES = frozenset(np.dtype(t) for t in (
    "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8"))


def as_tensor(array: np.ndarray) -> tf.Tensor:
    """`array` as a TensorFlow tensor, without a copy where TensorFlow can use
    its buffer (writable, C-contiguous and 64-byte aligned, as
    `tensor_codec.ChunkAssembler` assembles a tensor received in several
    chunks: DLPack), else copied once into an aligned buffer handed over the
    same way (a read-only view of a received message, as a small push's
    tensors are). The array must not change while the tensor lives.

    (`tf.convert_to_tensor` of an array copies it, then copies it again when
    the copy is not 64-byte aligned: 1.13 ms for 4 MB against 0.43 ms, 34 us
    against 8 us for 4 KB.)

    >>> a = np.arange(4, dtype="float32")
    >>> as_tensor(a).numpy().tolist()
    [0.0, 1.0, 2.0, 3.0]
    >>> a.flags.writeable = False  # e.g. a view of the request's bytes
    >>> as_tensor(a).numpy().tolist()
    [0.0, 1.0, 2.0, 3.0]
    """
    if not array.size or array.dtype not in _DLPACK_DTYPES:
        return tf.convert_to_tensor(array)
    if not (array.flags.writeable and array.flags.c_contiguous
            and array.ctypes.data % 64 == 0):
        array = _aligned_copy(array)
    return tf.experimental.dlpack.from_dlpack(array.__dlpack__())


def _aligned_copy(array: np.ndarray) -> np.ndarray:
    """A C-contiguous, writable, 64-byte aligned copy of `array`."""
    out = empty_aligned(array.nbytes).view(array.dtype).reshape(array.shape)
    np.copyto(out, array)
    return out

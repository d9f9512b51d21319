"""TensorFlow functions on symbolic Keras tensors, as Keras 2 allowed them.

ElasticDL's model-zoo modules were written for Keras 2 (tf.keras), where a
functional model may call TensorFlow functions on its symbolic tensors:
`tf.reshape(x, (-1,))`, `tf.sigmoid(logits)`, or `tf.keras.backend.sum(x,
axis=1)`; Keras 2 turned each call into a layer (`TFOpLambda`). Keras 3
refuses them ("A KerasTensor cannot be used as input to a TensorFlow
function"), so such a module could not build its model unchanged.

`enable()` registers a TensorFlow op dispatcher that does what Keras 2 did: a
TensorFlow function that fails because a Keras 3 `KerasTensor` is among its
arguments is applied as a `TFOpLayer`, a Keras layer calling that function,
and returns the layer's symbolic output. Calls on real tensors never reach the
dispatcher. The layer saves to a `.keras` file by the function's TensorFlow
API name (`math.reduce_sum`), with its other arguments in the model's config.
`keras-elastic train | evaluate | predict --model_def=...` enables it before
the module builds its model.

Example:

>>> import keras
>>> import tensorflow as tf
>>> enable()
>>> inputs = keras.Input((3,))
>>> outputs = tf.sigmoid(tf.reshape(inputs, (-1, 3, 1)))
>>> model = keras.Model(inputs, outputs)
>>> [type(layer).__name__ for layer in model.layers[1:]]
['TFOpLayer', 'TFOpLayer']
>>> model(tf.zeros((2, 3))).shape
TensorShape([2, 3, 1])
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

_lock = threading.Lock()
_enabled = False


def api_name(function: Callable) -> str | None:
    """The TensorFlow API name of `function` (`"math.reduce_sum"` for
    `tf.reduce_sum`), or None if it has none.

    Example:

    >>> api_name(tf.reduce_sum)
    'math.reduce_sum'
    """
    undecorated = _undecorated(function)
    attributes = getattr(undecorated, "__dict__", {})
    # (TensorFlow 2 functions may call TensorFlow 1 ones, which are what
    # fails on a symbolic tensor: tf.gather calls tf.compat.v1.gather.)
    names = [*attributes.get("_tf_api_names", ()),
             *("compat.v1." + n for n in attributes.get("_tf_api_names_v1", ()))]
    return next((n for n in names if (found := _resolve(n)) is not None
                 and _undecorated(found) is undecorated), None)


def _undecorated(function: Any) -> Any:
    """The function under TensorFlow's decorators (dispatch, deprecation)."""
    return tf.__internal__.decorator.unwrap(function)[1]


def _resolve(name: str) -> Callable | None:
    try:
        return functools.reduce(getattr, name.split("."), tf)
    except AttributeError:
        return None


class _Input:
    """Where the i-th tensor input of a `TFOpLayer` goes in its call."""

    def __init__(self, index: int) -> None:
        self.index = index


@keras.saving.register_keras_serializable(package="keras_elastic")
class TFOpLayer(keras.layers.Layer):
    """A layer calling one TensorFlow function (Keras 2's `TFOpLambda`).

    Args:
      function: the TensorFlow API name of the function (`"math.reduce_sum"`)
        or the function itself.
      arguments: `(args, kwargs)` of the function: the layer's inputs (a
        list of tensors) go where `_Input(i)` markers are; None: the inputs
        are the arguments.

    Example:

    >>> import numpy as np
    >>> layer = TFOpLayer("math.reduce_sum", ((_Input(0),), {"axis": 1}))
    >>> layer([np.ones((2, 3), "float32")]).numpy()
    array([3., 3.], dtype=float32)
    """

    def __init__(self, function: str | Callable, arguments: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if callable(function):
            self.function = function
            self.function_name = api_name(function)
        else:
            self.function = _resolve(function)
            self.function_name = function
            if not callable(self.function):
                raise ValueError(f"TFOpLayer: tf.{function} is not a TensorFlow "
                                 "function of this TensorFlow version")
        if arguments is not None and not isinstance(arguments, tuple):
            arguments = _decode(arguments)
        self.arguments = arguments

    def call(self, inputs: Any) -> Any:
        if self.arguments is None:
            return self.function(*inputs)
        args, kwargs = tf.nest.map_structure(
            lambda v: inputs[v.index] if isinstance(v, _Input) else v, self.arguments)
        return self.function(*args, **kwargs)

    def compute_output_spec(self, inputs: Any) -> Any:
        try:
            return super().compute_output_spec(inputs)
        except Exception:
            # Keras marks `0.5 * x` sparse (its multiply takes a Python
            # number, which has no `sparse`, for a sparse operand), so a
            # dense function fails on the SparseTensor placeholder Keras then
            # makes: try again with such inputs dense, as they are at run time.
            if not any(getattr(t, "sparse", False) for t in inputs):
                raise
            return super().compute_output_spec([
                keras.KerasTensor(t.shape, t.dtype) if getattr(t, "sparse", False)
                else t for t in inputs])

    def get_config(self) -> dict:
        if self.function_name is None:
            raise NotImplementedError(
                f"layer '{self.name}' calls {self.function!r}, which has no "
                "TensorFlow API name, so it cannot be saved in a .keras file: "
                "save a checkpoint, or use keras.ops or a Keras layer for it")
        return {**super().get_config(), "function": self.function_name,
                "arguments": None if self.arguments is None else _encode(
                    self.arguments, self.name)}


def _encode(value: Any, layer: str) -> Any:
    """`value` (a TFOpLayer's arguments) as JSON-compatible config."""
    if isinstance(value, _Input):
        return {"__input__": value.index}
    if isinstance(value, tf.DType):
        return {"__dtype__": value.name}
    if isinstance(value, tf.TensorShape):
        value = value.as_list()
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, layer) for v in value]}
    if isinstance(value, list):
        return [_encode(v, layer) for v in value]
    if isinstance(value, dict):
        return {"__dict__": {str(k): _encode(v, layer) for k, v in value.items()}}
    if isinstance(value, np.ndarray):
        return {"__array__": value.tolist(), "dtype": value.dtype.name}
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise NotImplementedError(
        f"layer '{layer}' calls a TensorFlow function with an argument of type "
        f"{type(value).__name__} ({value!r}), which a .keras file cannot hold: "
        "save a checkpoint, or use keras.ops or a Keras layer for it")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if "__input__" in value:
            return _Input(value["__input__"])
        if "__array__" in value:
            return np.array(value["__array__"], value["dtype"])
        if "__dtype__" in value:
            return tf.as_dtype(value["__dtype__"])
        if "__tuple__" in value:
            return tuple(_decode(v) for v in value["__tuple__"])
        if "__dict__" in value:
            return {k: _decode(v) for k, v in value["__dict__"].items()}
    return value


class _Dispatcher(tf.__internal__.dispatch.GlobalOpDispatcher):
    """Applies a TensorFlow function called on Keras 3 symbolic tensors as a
    `TFOpLayer` (called by TensorFlow only after the function raised)."""

    def handle(self, op: Callable, args: tuple, kwargs: dict) -> Any:
        inputs: list = []

        def mark(value: Any) -> Any:
            if isinstance(value, keras.KerasTensor):
                inputs.append(value)
                return _Input(len(inputs) - 1)
            return value

        try:
            arguments = tf.nest.map_structure(mark, (tuple(args), dict(kwargs)))
        except (TypeError, ValueError):  # not a structure tf.nest reads: as before
            return self.NOT_SUPPORTED
        if not inputs:
            return self.NOT_SUPPORTED
        return TFOpLayer(op, arguments)(inputs)


def enable() -> None:
    """Lets TensorFlow functions take symbolic Keras tensors in this process
    (each call becomes a `TFOpLayer`); calling it again does nothing."""
    global _enabled
    with _lock:
        if not _enabled:
            _Dispatcher().register()
            _enabled = True

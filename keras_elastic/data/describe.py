"""Short descriptions of the user's calls, for the errors that quote them.

The master refuses a worker whose dataset differs from the job's and quotes
the call that registered the job's dataset and this worker's (see
`DatasetSpec.mismatch_error`): arrays appear as `dtype[shape]`, other
arguments with `repr`, the arguments left at Keras' defaults not at all.

Example:

>>> import numpy as np
>>> x, y = np.zeros((60000, 28, 28, 1), np.float32), np.zeros(60000, np.uint8)
>>> print(describe_call("fit", x, y=y, batch_size=128, epochs=15, shuffle=True,
...                     validation_split=0.1, callbacks=None))
fit(x: float32[60000, 28, 28, 1], y: uint8[60000], batch_size=128, epochs=15, \
validation_split=0.1)
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

# A description longer than this is cut (it travels in every registration).
MAX_CHARS = 400


def describe_call(method: str, x: Any = None, /, **kwargs: Any) -> str:
    """`method(x: ..., name=value, ...)`: a one-line summary of a call.

    Args:
        method: the method called (`"fit"`, `"evaluate"`, `"predict"`).
        x: what the user passed first: arrays (a nest of them), an
            `ElasticDataset`, a `tf.data.Dataset`, file patterns; omitted
            when None.
        **kwargs: the other arguments, in the order to show them. None
            values and values equal to the default of `keras.Model.<method>`
            are left out; arrays are shown as `name: dtype[shape]`, other
            objects by type name, plain values with `repr`.

    Returns:
        The description, at most `MAX_CHARS` characters.

    Example:

    >>> import numpy as np
    >>> describe_call("evaluate", {"age": np.zeros(8), "id": np.arange(8)},
    ...               y=np.zeros((8, 1), np.float32), batch_size=None, steps=2)
    "evaluate(x: {'age': float64[8], 'id': int64[8]}, y: float32[8, 1], steps=2)"
    """
    defaults = _keras_defaults(method)
    parts = []
    if x is not None:  # arrays as `x: ...`, a dataset or files as they are
        parts.append(_argument("x", x) if _holds_arrays(x) else summarize(x))
    for name, value in kwargs.items():
        if value is None or (name in defaults and _same(defaults[name], value)):
            continue
        parts.append(_argument(name, value))
    text = f"{method}({', '.join(parts)})"
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS - 4] + "...)"


def describe_compile(model: Any, optimizers: dict[str, Any]) -> str:
    """The model as compiled, for the check that every worker of a job
    compiled it the same way: each optimizer (`optimizers`: {group: optimizer},
    "" the model's own) with its settings but not its learning rate (the
    servers' rate is the job's, taken by every worker), the loss, metrics
    and loss weights given to `compile`, and which weights are trainable
    (a count and a short hash of which).

    >>> import keras
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(keras.optimizers.SGD(0.1, momentum=0.5), loss="mse",
    ...               metrics=["mae"])
    >>> print(describe_compile(model, {"": model.optimizer}))
    compile(optimizer=SGD(ema_momentum=0.99, momentum=0.5, nesterov=False, \
use_ema=False), loss='mse', metrics=['mae']); trainable 2 of 2 weights (#...)
    """
    import zlib

    parts = []
    for group, optimizer in sorted(optimizers.items()):
        config = optimizer.get_config()
        settings = ", ".join(f"{k}={summarize(v)}" for k, v in sorted(config.items())
                             if k not in ("name", "learning_rate") and v is not None)
        parts.append(f"{group or 'optimizer'}={type(optimizer).__name__}({settings})")
    compiled = getattr(getattr(model, "_compile_config", None), "config", None) or {}
    for name in ("loss", "loss_weights", "metrics", "weighted_metrics"):
        if compiled.get(name) is not None:
            parts.append(f"{name}={summarize(compiled[name])}")
    weights = list(model.weights)
    trainable = "".join("1" if w.trainable and model.trainable else "0" for w in weights)
    return (f"compile({', '.join(parts)}); trainable {trainable.count('1')} of "
            f"{len(weights)} weights (#{zlib.crc32(trainable.encode()):08x})")


def summarize(value: Any) -> str:
    """A short text for one argument: `float32[60000, 784]` for an array, a
    nest of those for a nest of arrays, `repr` for a plain value.

    >>> import numpy as np
    >>> summarize((np.zeros((2, 3), np.float32), [1, 2]))
    '(float32[2, 3], [1, 2])'
    """
    if _is_array(value):
        dtype = getattr(value.dtype, "name", None) or str(value.dtype)
        dims = ", ".join("?" if d is None else str(d) for d in tuple(value.shape))
        return f"{dtype}[{dims}]"
    if hasattr(value, "registration") and hasattr(value, "source"):  # ElasticDataset
        return (f"ElasticDataset({getattr(value, 'name', '?')!r}: "
                f"{value.source.describe()}, batch_size={value.batch_size})")
    if type(value).__module__.startswith("tensorflow") and "Dataset" in type(
            value).__name__:
        return "tf.data.Dataset"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {summarize(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(summarize(v) for v in value)
        if isinstance(value, list):
            return f"[{inner}]"
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return repr(value)
    if callable(value) and hasattr(value, "__qualname__"):
        return value.__qualname__
    return type(value).__name__


def _argument(name: str, value: Any) -> str:
    if _holds_arrays(value):
        return f"{name}: {summarize(value)}"
    return f"{name}={summarize(value)}"


def _is_array(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(
        value, type)


def _holds_arrays(value: Any) -> bool:
    if _is_array(value):
        return True
    if isinstance(value, dict):
        return bool(value) and any(_holds_arrays(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return bool(value) and any(_holds_arrays(v) for v in value)
    return False


def _same(default: Any, value: Any) -> bool:
    plain = (bool, int, float, str)
    if not isinstance(value, plain) or not isinstance(default, plain):
        return False
    return type(default) is type(value) and default == value


@functools.cache
def _keras_defaults(method: str) -> dict[str, Any]:
    """The default values of `keras.Model.<method>`'s arguments ({} if
    Keras or the method is not there)."""
    try:
        import keras

        signature = inspect.signature(getattr(keras.Model, method))
    except (ImportError, AttributeError, TypeError, ValueError):
        return {}
    return {name: p.default for name, p in signature.parameters.items()
            if p.default is not inspect.Parameter.empty}

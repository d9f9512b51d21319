"""Stable names of a Keras model's variables across processes.

A variable's key is its position among the model's weights (trainable first,
then non-trainable) and its short name, e.g. `0003/kernel`: unlike Keras'
paths (`dense_7/kernel`), it does not depend on how many layers the process
created before. Keys decide which parameter server owns a variable and name
it in parameter-server checkpoints.

A process may train several models on one cluster (a script that builds a
model per experiment, keras.io's guides): the k-th model a process connects
gets the namespace `m<k>/` (none for the first), prefixed to its keys and to
its optimizer groups on the servers, so models never share variables. Every
worker makes the same calls, hence numbers its models the same way.

Example:

>>> import keras
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> variable_keys(model)
['0000/kernel', '0001/bias']
>>> variable_keys(model, namespace(2))
['m2/0000/kernel', 'm2/0001/bias']
>>> namespace_of('m2/0000/kernel'), namespace_of('0000/kernel')
('m2/', '')
"""

from __future__ import annotations

import re

_NAMESPACE = re.compile(r"^m\d+/")


def model_variables(model) -> list:
    """`model.trainable_weights + model.non_trainable_weights`."""
    return list(model.trainable_weights) + list(model.non_trainable_weights)


def variable_keys(model, prefix: str = "") -> list[str]:
    """Keys of `model_variables(model)`, in the same order, in namespace
    `prefix` (see `namespace`)."""
    return [f"{prefix}{i:04d}/{v.name}" for i, v in enumerate(model_variables(model))]


def namespace(k: int) -> str:
    """The namespace of the k-th model a process connects ("" for the first)."""
    return "" if k == 0 else f"m{k}/"


def namespace_of(key: str) -> str:
    """The namespace of a variable key ("" or "m<k>/")."""
    found = _NAMESPACE.match(key)
    return found.group(0) if found else ""

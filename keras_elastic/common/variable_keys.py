"""Stable names of a Keras model's variables across processes.

A variable's key is its position among the model's weights (trainable first,
then non-trainable) and its short name, e.g. `0003/kernel`: unlike Keras'
paths (`dense_7/kernel`), it does not depend on how many layers the process
created before. Keys decide which parameter server owns a variable and name
it in parameter-server checkpoints.

Example:

>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> variable_keys(model)
['0000/kernel', '0001/bias']
"""

from __future__ import annotations


def model_variables(model) -> list:
    """`model.trainable_weights + model.non_trainable_weights`."""
    return list(model.trainable_weights) + list(model.non_trainable_weights)


def variable_keys(model) -> list[str]:
    """Keys of `model_variables(model)`, in the same order."""
    return [f"{i:04d}/{v.name}" for i, v in enumerate(model_variables(model))]

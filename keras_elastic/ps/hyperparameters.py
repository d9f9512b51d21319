"""Optimizer hyperparameters that follow the workers' changes to the servers.

The parameter servers apply a Keras optimizer built from the first worker's
config; each worker keeps its own copy of that optimizer, which its callbacks
change (`keras.callbacks.LearningRateScheduler`, `ReduceLROnPlateau`, a
`model.optimizer.learning_rate = ...` of your own). The servers are the source
of truth: a worker sends a hyperparameter with its next push when its value
differs from what that server is known to hold (`ps/client.py`), and adopts the
servers' values when it connects (`worker/hyperparameters.py`).

What can change: the learning rate, which Keras keeps in a variable read by
the compiled update at every step, unless it is a `LearningRateSchedule`
(evaluated on the servers at their iteration count, and not settable, as in
Keras). The optimizer's other hyperparameters (`weight_decay`, `beta_1`,
`momentum`, ...) are plain Python numbers that Keras bakes into the compiled
update when it is traced: a worker refuses a change to them with an error
naming the attribute.

Example:

>>> import keras
>>> optimizer = keras.optimizers.SGD(0.1)
>>> check_hyperparameters({"learning_rate": 0.05}, optimizer)
{'learning_rate': 0.05}
>>> set_hyperparameters({"learning_rate": 0.05}, optimizer)
>>> round(current_hyperparameters(optimizer)["learning_rate"], 6)
0.05
>>> check_hyperparameters({"beta_1": 0.5}, optimizer)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: unknown optimizer hyperparameter 'beta_1': ...
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import keras
import numpy as np

# Hyperparameters a push may set.
SETTABLE = ("learning_rate",)


def rate_owner(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """The optimizer holding the learning rate (a `LossScaleOptimizer`'s inner
    one)."""
    inner = getattr(optimizer, "inner_optimizer", None)
    return inner if isinstance(inner, keras.optimizers.Optimizer) else optimizer


def learning_rate_variable(optimizer: keras.optimizers.Optimizer
                           ) -> keras.Variable | None:
    """The variable holding `optimizer`'s learning rate; None if the rate is a
    `LearningRateSchedule` (or another callable).

    >>> learning_rate_variable(keras.optimizers.SGD(0.1)).name
    'learning_rate'
    >>> schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    >>> learning_rate_variable(keras.optimizers.SGD(schedule)) is None
    True
    """
    rate = getattr(rate_owner(optimizer), "_learning_rate", None)
    return rate if isinstance(rate, keras.Variable) else None


def describe_schedule(optimizer: keras.optimizers.Optimizer) -> str:
    rate = getattr(rate_owner(optimizer), "_learning_rate", None)
    return type(rate).__name__


def current_hyperparameters(optimizer: keras.optimizers.Optimizer) -> dict[str, float]:
    """The settable hyperparameters of `optimizer` now: {"learning_rate": v},
    or {} when the rate is a schedule."""
    variable = learning_rate_variable(optimizer)
    if variable is None:
        return {}
    return {"learning_rate": float(np.asarray(variable.numpy()))}


def check_hyperparameters(values: Mapping[str, float],
                          optimizer: keras.optimizers.Optimizer) -> dict[str, float]:
    """`values` checked for `optimizer`, as floats; ValueError naming what is
    wrong: an unknown name, a value that is not a finite number >= 0, a
    learning rate for an optimizer whose rate is a `LearningRateSchedule`."""
    checked = {}
    for name, value in values.items():
        if name not in SETTABLE:
            raise ValueError(
                f"unknown optimizer hyperparameter {name!r}: a push may set only "
                f"{list(SETTABLE)}; the optimizer's other hyperparameters are fixed "
                "when the parameter servers are initialized")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}={value!r} is not a number") from None
        if not math.isfinite(number) or number < 0:
            raise ValueError(f"{name}={number!r}: a learning rate must be a finite "
                             "number >= 0")
        if learning_rate_variable(optimizer) is None:
            raise ValueError(
                f"a worker set learning_rate={number!r}, but the parameter servers' "
                f"optimizer was created with a `LearningRateSchedule` "
                f"({describe_schedule(optimizer)}) as its `learning_rate`, which they "
                "evaluate at their iteration count, hence its learning rate is not "
                "settable (Keras refuses it too). If you need the learning rate to be "
                "settable, compile every worker with a float `learning_rate`; to "
                "keep the schedule, do not set the rate from a callback.")
        checked[name] = number
    return checked


def set_hyperparameters(values: Mapping[str, float],
                        optimizer: keras.optimizers.Optimizer) -> None:
    """Sets hyperparameters checked by `check_hyperparameters`."""
    for name, value in values.items():
        if name == "learning_rate":
            learning_rate_variable(optimizer).assign(value)

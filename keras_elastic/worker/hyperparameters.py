"""A worker's optimizer hyperparameters and the parameter servers' optimizer.

The servers apply the optimizer; the worker's copy is what its callbacks
change. `HyperparameterSync`

- takes the worker's learning rate at every push (read by the compiled train
  step and passed to the Python side of the push, a `tf.py_function`, with
  the gradients; a few microseconds) and hands it to the client, which sends
  it to each server not known to hold that value (`ps/client.py`): a
  `keras.callbacks.LearningRateScheduler` or `ReduceLROnPlateau` takes effect
  with the next push, on every server;
- refuses, with an error naming the attribute, a change of the optimizer's
  other hyperparameters (`weight_decay`, `beta_1`, `momentum`, ...): Keras
  keeps them as Python numbers baked into the compiled update, so the servers
  cannot follow them (plain Keras ignores such a change in a compiled `fit`
  too); also a learning rate replaced by a schedule, or another optimizer
  class compiled after the servers were initialized;
- adopts the servers' learning rate when the worker connects (a worker
  restarted after `ReduceLROnPlateau` lowered the rate continues with the
  lowered rate, and its logs show it) and at the start of each `fit`, unless
  the worker's own rate was changed since it last sent or adopted one (that
  change is then sent).

With a `LearningRateSchedule` the servers evaluate the schedule at their
iteration count; Keras itself refuses to set the rate of such an optimizer
(TypeError), on the worker as on the servers.

Example:

>>> import keras
>>> optimizer = keras.optimizers.SGD(0.1)
>>> sync = HyperparameterSync(lambda: optimizer)
>>> sync.adopt([{"learning_rate": 0.05}])   # the servers' rate, at connect
>>> round(float(optimizer.learning_rate), 6)
0.05
>>> optimizer.learning_rate = 0.01           # what a callback does
>>> {k: round(v, 6) for k, v in sync.wanted().items()}
{'learning_rate': 0.01}
>>> optimizer.momentum = 0.9
>>> sync.wanted()  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
keras_elastic.worker.hyperparameters.HyperparameterError: optimizer.momentum ...
"""

from __future__ import annotations

from collections.abc import Callable

import keras
from absl import logging

from keras_elastic.common import errors
from keras_elastic.ps.hyperparameters import (
    SETTABLE,
    current_hyperparameters,
    learning_rate_variable,
)

_SCALARS = (bool, int, float, str, type(None))


class HyperparameterError(errors.JobError, ValueError):
    """A change of the worker's optimizer the parameter servers cannot follow."""


class HyperparameterSync:
    """Follows the hyperparameters of `optimizer_of()` (the model's optimizer:
    read at each push, so a model compiled again is seen)."""

    def __init__(self, optimizer_of: Callable[[], keras.optimizers.Optimizer]
                 ) -> None:
        self.optimizer_of = optimizer_of
        optimizer = optimizer_of()
        self._class = type(optimizer)
        self._scalars = _scalar_attributes(optimizer)
        self._rate_is_variable = learning_rate_variable(optimizer) is not None
        # The values last sent or adopted: a worker's own change since is kept.
        self.synced: dict[str, float] | None = None
        # The refusal raised in the train step (fit raises it as it is).
        self.error: HyperparameterError | None = None

    def wanted(self, traced: keras.Variable | None = None,
               rate: float | None = None) -> dict[str, float]:
        """The worker's settable hyperparameters, to send (the client sends only
        what differs from a server's); raises HyperparameterError for a change
        the servers cannot follow. `rate`: the value of the learning-rate
        variable `traced`, read by the train step (an eager read of a variable
        costs 0.1 ms); used if that is still the optimizer's."""
        optimizer = self.check()
        if (rate is not None and traced is not None
                and learning_rate_variable(optimizer) is traced):
            values = {"learning_rate": rate}
        else:
            values = current_hyperparameters(optimizer)
        if self._rate_is_variable and not values:
            self._refuse(
                "optimizer.learning_rate was replaced by a LearningRateSchedule (or "
                "a callable) after the parameter servers were initialized with a "
                "float learning rate, which they keep. Compile with the schedule "
                "before the first fit (the servers then evaluate it at their "
                "iteration count), or set float learning rates from a callback.")
        self.synced = values
        return values

    def check(self) -> keras.optimizers.Optimizer:
        """Raises HyperparameterError if the optimizer's class or one of its
        fixed hyperparameters changed (a few attribute reads); returns the
        optimizer."""
        self.error = None
        optimizer = self.optimizer_of()
        if type(optimizer) is not self._class:
            self._refuse(
                f"the model was compiled again with {type(optimizer).__name__} after "
                f"the parameter servers were initialized with {self._class.__name__}:"
                " the servers keep their optimizer for the whole job. Compile with "
                "the optimizer you want before the first fit (a new job), or change "
                "only its learning rate.")
        for name, value in self._scalars.items():
            now = getattr(optimizer, name, value)
            if now != value and not (now is None and value is None):
                self._refuse(
                    f"optimizer.{name} changed on this worker ({value!r} -> {now!r}) "
                    "after the parameter servers were initialized: the servers apply "
                    f"the optimizer, and only its {' and '.join(SETTABLE)} follows the "
                    "workers' changes (e.g. keras.callbacks.LearningRateScheduler or "
                    f"ReduceLROnPlateau). Keras bakes {name} into the compiled update "
                    "as a constant, so a compiled Keras fit ignores such a change too. "
                    f"Build the optimizer with the {name} you want before the first "
                    "fit, or schedule the learning rate instead.")
        return optimizer

    def _refuse(self, message: str) -> None:
        self.error = HyperparameterError(message)
        raise self.error

    def adopt(self, servers: list[dict[str, float]]) -> None:
        """Takes the servers' learning rate (`servers`: each server's settable
        hyperparameters, from a pull) into the worker's optimizer, unless the
        worker changed its own since it last sent or adopted one."""
        optimizer = self.optimizer_of()
        variable = learning_rate_variable(optimizer)
        theirs = next((s["learning_rate"] for s in servers if "learning_rate" in s),
                      None)
        if variable is None or theirs is None:
            return
        mine = current_hyperparameters(optimizer)
        if self.synced is not None and mine != self.synced:
            return  # changed here since: sent with the next push
        if mine.get("learning_rate") != theirs:
            logging.info("keras_elastic: the parameter servers' learning rate is %g "
                         "(this worker's optimizer had %g): taking theirs", theirs,
                         mine.get("learning_rate"))
            variable.assign(theirs)
        self.synced = current_hyperparameters(optimizer)


def _scalar_attributes(optimizer: keras.optimizers.Optimizer) -> dict[str, object]:
    """The optimizer's scalar hyperparameters other than the learning rate
    (those of its config that are attributes), with their values now."""
    try:
        config = optimizer.get_config()
    except (NotImplementedError, TypeError, ValueError):
        return {}
    scalars = {}
    for name, value in config.items():
        if name in ("name", "learning_rate") or not isinstance(value, _SCALARS):
            continue
        try:
            now = getattr(optimizer, name)
        except AttributeError:
            continue
        if isinstance(now, _SCALARS):
            scalars[name] = now
    return scalars

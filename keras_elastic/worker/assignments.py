"""The values a script assigns to a model's weights, noticed for the servers.

In plain Keras a weight is the model's variable: `model.set_weights(...)`,
`model.load_weights(...)`, `variable.assign(...)` change what the next step,
`evaluate` or `save` uses. An elastic model's weights live on the parameter
servers and the model holds copies, which `fit` refreshes from the servers;
an assignment to a copy alone would be overwritten by the next refresh
(`keras.callbacks.EarlyStopping(restore_best_weights=True)` restoring the
best epoch, then `fit` taking the servers' last values), silently.

An `AssignmentWatch` notices them: each watched variable's `assign`,
`assign_add` and `assign_sub` (the seam every Keras way of setting a weight
goes through), called eagerly, adds the variable's key to `pending`. Calls
inside a traced function (the train step's own updates) are not
assignments. keras-elastic's own copies from the servers assign through
`assign_quietly`, which is not noticed. The worker then sends the pending
values to the servers (`ModelSync.publish_assignments`): before its next
step, or at the start of the next phase (`fit`, `evaluate`, `predict`), or
when `fit` ends.

Example:

>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> watch = AssignmentWatch(model.weights, ["k", "b"])
>>> model.set_weights([w * 0 for w in model.get_weights()])
>>> sorted(watch.pending)
['b', 'k']
>>> sorted(watch.take())
['b', 'k']
>>> watch.close()
"""

from __future__ import annotations

import types
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

_WATCH = "_ke_watch"
_METHODS = ("assign", "assign_add", "assign_sub")


def assign_quietly(variable, value) -> None:
    """Keras' `variable.assign(value)`, not noticed as the script's."""
    type(variable).assign(variable, value)


def _noticing(method: str):
    def hooked(self, value):
        watch = self.__dict__.get(_WATCH)
        if watch is not None and tf.executing_eagerly():
            watch.pending.add(watch.key_of[id(self)])
        return getattr(type(self), method)(self, value)

    hooked.__name__ = method
    return hooked


class AssignmentWatch:
    """Notices eager assignments to `variables` (named by `keys`)."""

    def __init__(self, variables: Sequence, keys: Sequence[str]) -> None:
        self.variables = list(variables)
        self.key_of = {id(v): k for v, k in zip(self.variables, keys)}
        self.pending: set[str] = set()
        for variable in self.variables:
            object.__setattr__(variable, _WATCH, self)
            for method in _METHODS:
                object.__setattr__(variable, method,
                                   types.MethodType(_noticing(method), variable))

    def take(self) -> dict[str, np.ndarray]:
        """The current values of the variables assigned since the last take
        (or discard), by key; forgets them."""
        pending, self.pending = self.pending, set()
        return {self.key_of[id(v)]: np.asarray(keras.ops.convert_to_numpy(v.value))
                for v in self.variables if self.key_of[id(v)] in pending}

    def discard(self) -> None:
        """Forgets the assignments noticed so far."""
        self.pending = set()

    def close(self) -> None:
        """Stops watching (the model was linked anew)."""
        for variable in self.variables:
            if variable.__dict__.get(_WATCH) is self:
                for name in (_WATCH, *_METHODS):
                    variable.__dict__.pop(name, None)

"""Keeps a worker's Keras model in step with the parameter servers.

Each variable of the model gets a key that is stable across processes (its
position among the model's weights and its short name, not the layer names
Keras numbers per process), which decides its parameter server. `exchange` is
what the compiled train step calls (through `tf.py_function`): it pushes the
gradients and the non-trainable values, and returns the newest value of every
variable.
"""

from __future__ import annotations

import time

import keras
import numpy as np

from keras_elastic.common.timing import PhaseTimer
from keras_elastic.common.variable_keys import model_variables, variable_keys
from keras_elastic.ps.client import PSClient


class ModelSync:
    """The link between one model and the parameter servers."""

    def __init__(self, model: keras.Model, ps: PSClient, timer: PhaseTimer) -> None:
        self.model = model
        self.ps = ps
        self.timer = timer
        self.trainable = list(model.trainable_weights)
        self.non_trainable = list(model.non_trainable_weights)
        self.variables = model_variables(model)
        self.keys = variable_keys(model)
        self.trainable_keys = self.keys[:len(self.trainable)]
        self.non_trainable_keys = self.keys[len(self.trainable):]
        self._values: dict[str, np.ndarray] = {}
        self.grad_keys: list[str] = []  # set when the train step is traced
        self.t_data = 0.0

    def initialize(self, restore_from: str = "") -> None:
        """Initializes the PS with this model (first worker wins; it has the
        servers load the checkpoint `restore_from`, if any) and loads the PS's
        values into the model."""
        optimizer = self.model.optimizer
        if optimizer is None:
            raise ValueError("the model must be compiled (with an optimizer) before "
                             "training on the elastic cluster: call model.compile().")
        config = keras.optimizers.serialize(optimizer)
        values = {k: (np.asarray(keras.ops.convert_to_numpy(v.value)), v.trainable)
                  for k, v in zip(self.keys, self.variables)}
        self._values = self.ps.init(values, _jsonable(config), restore_from)
        self.assign_all()

    def pull(self) -> None:
        """Loads the newest values from the parameter servers into the model."""
        self._values.update(self.ps.pull())
        self.assign_all()

    def assign_all(self) -> None:
        for key, variable in zip(self.keys, self.variables):
            if key in self._values:
                variable.assign(self._values[key])

    # -- called from the compiled train step ------------------------------
    def mark_data(self, _seq) -> np.int64:
        """The batch has arrived (the step's input is ready)."""
        self.t_data = time.perf_counter()
        return np.int64(0)

    def exchange(self, *tensors) -> list[np.ndarray]:
        """Pushes gradients + non-trainable values; returns every variable's value."""
        t_grads = time.perf_counter()
        if self.t_data:
            self.timer.add("compute", t_grads - self.t_data)
        n = len(self.grad_keys)
        grads = {k: t.numpy() for k, t in zip(self.grad_keys, tensors[:n])}
        assigns = {k: t.numpy() for k, t in zip(self.non_trainable_keys, tensors[n:])}
        new = self.ps.push(grads, assigns)
        t_pushed = time.perf_counter()
        self.timer.add("push", t_pushed - t_grads)
        self._values.update(new)
        out = [self._values[k] for k in self.keys]
        self.timer.add("pull", time.perf_counter() - t_pushed)
        return out


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value

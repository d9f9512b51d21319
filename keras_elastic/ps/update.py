"""One update for the parameter servers, as one value from the step to the store.

A worker's train step makes an `Update` (worker/model_sync.py, from what an
optimizer's apply hands over); `PSClient.send` splits it by server and sends
each server its part; the server's servicer reads its part back into an
`Update` and `ParameterStore.push` checks it (ps/update_checks.py) and
applies it. The same object the whole way: what a push is, is said once here.

Example:

>>> import numpy as np
>>> update = Update(grads={"w": np.ones(2, "float32")},
...                 hyperparameters={"learning_rate": 0.1})
>>> update.trains, update.without_training().trains
(True, False)
>>> Update(assigns={"bn/mean": np.zeros(2, "float32")}).trains
False
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# Rows of one embedding table in an update: (unique int64 ids, gradient rows).
Rows = tuple[np.ndarray, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Update:
    """What one push carries.

    - `grads`: {variable key: gradient} of the trainable variables updated;
    - `assigns`: {key: value} of non-trainable variables (a layer's moving
      statistics), or with `assignment`, of any variable the worker's script
      set (`set_weights`, a callback restoring weights): then the update
      carries values only, and the servers' model version goes up by one;
    - `bases`: {key: the value `assigns[key]` was computed from}; a server
      whose value changed meanwhile (another worker's push) adds the change
      `assigns[key] - bases[key]` instead of overwriting it;
    - `rows`: gradient rows of embedding tables, {table: (ids, rows)};
    - `ranges`: the elements of each task the gradients contain (the task
      log's word decides whether the update is applied: ps/task_log.py);
    - `hyperparameters`: the worker's optimizer hyperparameters
      ({"learning_rate": v}), set before the gradients are applied;
    - `optimizer`: the optimizer group that applies the gradients ("": the
      model's own); another group's updates carry `optimizer_spec`, (config
      JSON, keys of the variables it updates), from which a server makes it;
    - `phase`: the sync points the worker passed (worker/session.py); the
      first change of `hyperparameters` in a phase keeps the values from
      before it (`ParameterStore.phase_start`).
    """

    grads: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    assigns: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    bases: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    rows: Mapping[str, Rows] = dataclasses.field(default_factory=dict)
    ranges: Sequence[Any] = ()
    hyperparameters: Mapping[str, float] = dataclasses.field(default_factory=dict)
    optimizer: str = ""
    optimizer_spec: tuple[str, tuple[str, ...]] | None = None
    assignment: bool = False
    phase: int = 0

    @property
    def trains(self) -> bool:
        """It carries gradients (dense or rows): applying it twice would count
        its data twice."""
        return bool(self.grads or self.rows)

    def without_training(self) -> Update:
        """The same update without its gradients (every element of its batch
        belongs to a task given back: only its values still go)."""
        return dataclasses.replace(self, grads={}, rows={})

"""The elastic train step being traced, as the optimizers inside it see it.

Keras' `fit` calls the model's train function, which calls `train_step(data)`:
Keras' own step, or the user's (a `keras.Model` subclass may override it, as
in keras.io's "customizing what happens in fit()" guide). keras_elastic never
replaces that step. Its train function (`worker/train_function.py`) takes each
batch from the task-fed pipeline as `(tags, data)`, gives `data` to
`train_step` unchanged, and traces the step inside a `StepContext` holding the
`tags` (each element's task, position and fingerprint). Every optimizer of the
model is hooked (`worker/remote_optimizer.py`): its `apply` inside a step
context pushes the gradients, named with the batch's task ranges, to the
parameter servers and assigns the new values; outside one it is Keras' own.

So the task accounting that makes updates exactly-once travels beside the
batch, never inside the user's data, and any step gets it.

Each optimizer apply in a step is one *update* with a name that every worker
gives it the same way: the optimizer's group (`""` for the model's own
optimizer, else the attribute that holds it, e.g. `"d_optimizer"`), plus
`"#k"` for its k-th apply in the same step. The servers log each update's
ranges apart (`ps/task_log.py`).

Example:

>>> ctx = StepContext(runtime=None, tags=None)
>>> [ctx.update_name(""), ctx.update_name("g_optimizer"), ctx.update_name("")]
['', 'g_optimizer', '#1']
>>> current() is None
True
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any


class StepContext:
    """What one trace of the elastic train step knows."""

    def __init__(self, runtime: Any, tags: Any, allowed: Any = None) -> None:
        self.runtime = runtime   # the model's TrainFunction
        self.tags = tags         # [n, 3] int64: seq, position, fingerprint
        # [updates] bool: whether each update of the step may be applied, as
        # the task log said before the step (a store in this process; see
        # `ModelSync.local_allow`).
        self.allowed = allowed
        self._applies: dict[str, int] = {}
        # Gradients of embedding-table rows the built-in step computed, pushed
        # with the model optimizer's first update: [(table, ids, rows)].
        self.row_grads: list = []
        # The model's non-trainable values as the next update found them (at
        # the step's start, then after each update's assign): what the
        # update's non-trainable values are computed from. See
        # `ParameterStore.push`'s `bases`.
        self.bases: list | None = None

    def update_name(self, group: str) -> str:
        """The name of the next apply of optimizer group `group` in this step."""
        k = self._applies.get(group, 0)
        self._applies[group] = k + 1
        return group if k == 0 else f"{group}#{k}"

    @property
    def num_updates(self) -> int:
        """The updates traced so far: the index of the next one."""
        return sum(self._applies.values())

    def take_row_grads(self) -> list:
        rows, self.row_grads = self.row_grads, []
        return rows


class _Local(threading.local):
    context: StepContext | None = None


_LOCAL = _Local()


def current() -> StepContext | None:
    """The step context being traced on this thread, if any."""
    return _LOCAL.context


@contextlib.contextmanager
def stepping(runtime: Any, tags: Any, allowed: Any = None):
    """Traces a train step inside a `StepContext` for `runtime` and `tags`."""
    previous = _LOCAL.context
    _LOCAL.context = context = StepContext(runtime, tags, allowed)
    try:
        yield context
    finally:
        _LOCAL.context = previous

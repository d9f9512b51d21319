"""The per-task loop of evaluation and prediction.

Both run a compiled step over this worker's tasks of a round, batch by batch
(a batch never straddles two tasks: `ElasticDataset.build(per_task=True)`),
and do something once a task's batches are over: evaluation reports the
task's metric states, prediction writes the task's outputs. Tasks whose
records `dataset_fn` filtered out entirely have no batch at all; they are
handed to `on_empty` in order, so that each is reported (and, in prediction,
gets its empty part).

Example:

```python
run_per_task(dataset, stream,
             on_batch=lambda step, batch: step_fn(batch),
             on_task_end=lambda seq: stream.report_one(seq),
             on_empty=stream.report_through)
```
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keras_elastic.common import faults
from keras_elastic.dataset import ElasticDataset
from keras_elastic.worker.task_stream import TaskStream


def run_per_task(dataset: ElasticDataset, stream: TaskStream,
                 on_batch: Callable[[int, Any], None],
                 on_task_end: Callable[[int], None],
                 on_empty: Callable[[int | None], None]) -> int:
    """Runs `on_batch(step, batch)` on every batch of the stream's current
    round, `on_task_end(seq)` when the batches of the task `seq` are over,
    and `on_empty(before)` for the tasks without batches before task
    `before` (None: all that are left, at the end). Returns the number of
    batches."""
    current: int | None = None
    step = 0

    def finish(before: int | None) -> None:
        nonlocal current
        if current is not None:
            faults.reached("task_end")  # (a fault point: common/faults.py)
            on_task_end(current)
            current = None
        on_empty(before)

    for seq, batch in dataset.build(stream.generator, per_task=True):
        seq = int(seq)
        if seq != current:
            finish(before=seq)
            current = seq
        on_batch(step, batch)
        step += 1
    finish(before=None)
    return step


class BatchHooks:
    """A callback list's batch hooks (`kind`: "test" or "predict") called as
    Keras calls them with the model's `steps_per_execution` n: once per n
    steps, `on_{kind}_batch_begin(first step)` before them and
    `on_{kind}_batch_end(first step + n - 1, the last step's logs)` after.

    >>> calls = []
    >>> class Log:
    ...     def on_test_batch_begin(self, step): calls.append(("begin", step))
    ...     def on_test_batch_end(self, step, logs): calls.append(("end", step))
    >>> hooks = BatchHooks(Log(), "test", 3)
    >>> for step in range(4):
    ...     hooks.before(step); hooks.after(step, {})
    >>> hooks.close(); calls
    [('begin', 0), ('end', 2), ('begin', 3), ('end', 5)]
    """

    def __init__(self, callbacks: Any, kind: str, steps_per_execution: int = 1) -> None:
        self._begin = getattr(callbacks, f"on_{kind}_batch_begin")
        self._end = getattr(callbacks, f"on_{kind}_batch_end")
        self._every = max(1, int(steps_per_execution or 1))
        self._first: int | None = None
        self._logs: Any = None

    def before(self, step: int) -> None:
        if self._first is None:
            self._first = step
            self._begin(step)

    def after(self, step: int, logs: Any) -> None:
        self._logs = logs
        if step - self._first + 1 >= self._every:
            self.close()

    def close(self) -> None:
        """Ends the steps begun (the data ran out before n of them)."""
        if self._first is not None:
            first, self._first = self._first, None
            self._end(first + self._every - 1, self._logs)


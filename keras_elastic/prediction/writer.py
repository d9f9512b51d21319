"""The prediction writer interface and its NumPy implementation."""

from __future__ import annotations

import abc
import dataclasses
import glob
import json
import os
import tempfile
from typing import Any

import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class TaskRange:
    """The input records whose outputs one `write` call receives."""

    task_id: int
    shard: str
    start: int
    end: int


class PredictionWriter(abc.ABC):
    """Receives the outputs of each finished prediction task.

    `write` is called once per task, on the worker that ran it, before the task
    is reported done. It may be called again for the same task (the task was
    run again after its worker was lost): the new call must *replace* what the
    earlier one wrote, and a write must never be visible half-done. Tasks are
    numbered in input order (shard by shard, record by record).

    Example:

    ```python
    class PrintWriter(ke.prediction.PredictionWriter):
        def write(self, task, outputs):
            print(task.shard, task.start, task.end, outputs.shape)
    ```
    """

    @abc.abstractmethod
    def write(self, task: TaskRange, outputs: Any) -> None:
        """`outputs`: the model's predictions for the task's elements, batched
        along axis 0 (a nest of arrays, like `Model.predict` returns), or None
        if `dataset_fn` left no element of the task."""


_PART = "part-{:08d}.npz"


class NumpyWriter(PredictionWriter):
    """Writes `part-<task_id>.npz` files into `output_dir`, atomically.

    Example:

    >>> writer = NumpyWriter("preds")
    >>> writer.write(TaskRange(0, "a", 0, 2), np.zeros((2, 10)))
    >>> sorted(os.listdir("preds"))
    ['part-00000000.npz']
    """

    def __init__(self, output_dir: str) -> None:
        self.output_dir = output_dir
        os.makedirs(output_dir, exist_ok=True)

    def write(self, task: TaskRange, outputs: Any) -> None:
        arrays = {"__task__": np.array(json.dumps(dataclasses.asdict(task)))}
        if outputs is not None:
            flat = tf.nest.flatten(outputs)
            structure = tf.nest.map_structure(lambda _: 0, outputs)
            arrays["__structure__"] = np.array(json.dumps(structure))
            arrays.update({f"out_{i}": np.asarray(a) for i, a in enumerate(flat)})
        fd, tmp = tempfile.mkstemp(dir=self.output_dir, prefix=".tmp-", suffix=".npz")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **arrays)
            os.replace(tmp, os.path.join(self.output_dir, _PART.format(task.task_id)))
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise


def read_predictions(output_dir: str, num_tasks: int | None = None) -> Any:
    """Reads the parts a `NumpyWriter` wrote; returns outputs in input order.

    Raises `ValueError` naming the missing tasks if the parts do not cover
    every task (pass `num_tasks` to also check the last ones).
    """
    paths = sorted(glob.glob(os.path.join(output_dir, "part-*.npz")))
    if not paths:
        raise FileNotFoundError(f"no prediction parts (part-*.npz) in {output_dir}")
    parts = []
    for path in paths:
        with np.load(path) as data:
            task = json.loads(str(data["__task__"]))
            structure = (json.loads(str(data["__structure__"]))
                         if "__structure__" in data else None)
            flat = [data[f"out_{i}"] for i in range(
                len([k for k in data.files if k.startswith("out_")]))]
        parts.append((task["task_id"], structure, flat))
    ids = [p[0] for p in parts]
    expected = range(num_tasks if num_tasks is not None else max(ids) + 1)
    missing = sorted(set(expected) - set(ids))
    if missing:
        raise ValueError(f"prediction output in {output_dir} is incomplete: no part for "
                         f"task(s) {missing[:20]}")
    non_empty = [p for p in parts if p[1] is not None]
    if not non_empty:
        return None
    structure = non_empty[0][1]
    columns = zip(*[p[2] for p in non_empty])
    return tf.nest.pack_sequence_as(structure, [np.concatenate(c) for c in columns])

"""Elastic prediction: each task's outputs written exactly once.

The worker predicts batch by batch (batches never span tasks); when a task's
batches are over, its outputs go to the `PredictionWriter` and only then is the
task reported done. A worker lost before reporting leaves at most a part that
the task's next run replaces.
"""

from __future__ import annotations

import time

import keras
import numpy as np
import tensorflow as tf

from keras_elastic.dataset import ElasticDataset
from keras_elastic.prediction.writer import PredictionWriter, TaskRange
from keras_elastic.worker.per_task import BatchHooks, run_per_task
from keras_elastic.worker.task_stream import TaskStream


def _concat(outputs: list):
    if not outputs:
        return None
    return tf.nest.map_structure(lambda *a: np.concatenate(a), *outputs)


def predict_elastic(model: keras.Model, predict_step, dataset: ElasticDataset,
                    stream: TaskStream, writer: PredictionWriter | None, keep: bool,
                    callbacks=None, verbose=0):
    """Predicts this worker's tasks with `predict_step` (the model's compiled
    `predict_step`); returns its predictions if `keep`."""
    callback_list = keras.callbacks.CallbackList(
        callbacks, add_history=False, add_progbar=verbose != 0, model=model,
        verbose=verbose, epochs=1, steps=None)
    callback_list.on_predict_begin()
    kept: list = []
    outputs: list = []  # of the current task

    hooks = BatchHooks(callback_list, "predict", getattr(model, "steps_per_execution", 1))

    def on_batch(step: int, batch) -> None:
        hooks.before(step)
        out = tf.nest.map_structure(lambda t: t.numpy(), predict_step(batch))
        outputs.append(out)
        hooks.after(step, {"outputs": out})

    def on_task_end(seq: int) -> None:
        """The task's outputs written once (then reported)."""
        task = stream.task_of(seq)
        result = _concat(outputs)
        outputs.clear()
        if writer is not None and task is not None:
            writer.write(TaskRange(task.task_id, task.shard, task.start, task.end),
                         result)
        if keep and result is not None:
            kept.append(result)
        stream.report_one(seq)

    def on_empty(before: int | None) -> None:
        # Tasks with no element left by dataset_fn: an empty part each.
        for seq, task in stream.pending(before):
            if writer is not None:
                writer.write(TaskRange(task.task_id, task.shard, task.start, task.end),
                             None)
            stream.report_one(seq)

    start = time.perf_counter()
    run_per_task(dataset, stream, on_batch, on_task_end, on_empty)
    hooks.close()
    stream.timer.add("predict", time.perf_counter() - start)
    callback_list.on_predict_end()
    return _concat(kept) if keep else None

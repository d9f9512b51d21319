"""Exact distributed evaluation: metric states summed per task by the master.

Every worker evaluates the tasks it gets; batches never span tasks, so the
change of the model's metric variables over one task is that task's share.
It is sent to the master with the task's completion report, so a task counts
once even if its first worker died halfway. The master sums the shares of all
tasks of a round; every worker loads the same sums into its metric variables
and reads `result()`: the global value, equal to a single-process `evaluate`
over all the data.

Summing is right for metrics whose state variables add up over disjoint data
(totals, counts, confusion matrices, AUC buckets: every Keras metric). Keras
marks such variables `aggregation="sum"` (what it also relies on to combine
replicas); a metric with another aggregation gets a clear error.
"""

from __future__ import annotations

import time

import keras

from keras_elastic.common import faults, keras_compat
from keras_elastic.common.tensor_codec import encode_all
from keras_elastic.dataset import ElasticDataset
from keras_elastic.worker.metric_states import (  # noqa: F401 (re-exported)
    _leaf_metrics,
    assign_states,
    metric_variables,
    read_states,
)
from keras_elastic.worker.per_task import BatchHooks, run_per_task
from keras_elastic.worker.task_stream import TaskStream


def evaluate_elastic(model: keras.Model, eval_step, dataset: ElasticDataset,
                     stream: TaskStream, eval_round: int, callbacks=None,
                     verbose=0) -> dict[str, float]:
    """Evaluates this worker's share of round `eval_round` with `eval_step`
    (the model's compiled `test_step`); returns global logs."""
    variables = metric_variables(model)
    if isinstance(callbacks, keras.callbacks.CallbackList):  # (as Keras' evaluate)
        callback_list = callbacks
    else:
        callback_list = keras.callbacks.CallbackList(
            callbacks, add_history=False, add_progbar=verbose != 0, model=model,
            verbose=verbose, epochs=1, steps=None)
    stream.set_epoch(eval_round)
    callback_list.on_test_begin()  # (before the metrics' reset, as in Keras)
    model.reset_metrics()

    last_logs = None
    hooks = BatchHooks(callback_list, "test", getattr(model, "steps_per_execution", 1))

    def on_batch(step: int, batch) -> None:
        nonlocal last_logs
        hooks.before(step)
        last_logs = eval_step(batch)
        hooks.after(step, last_logs)

    def on_task_end(seq: int) -> None:
        """The task's metric states go with its report; the next task's
        batches start from zero."""
        states = read_states(variables)
        stream.report_one(seq, list(encode_all(states.items())))
        faults.reached("validation")
        model.reset_metrics()

    start = time.perf_counter()
    # Tasks whose records dataset_fn filtered out entirely: no states.
    run_per_task(dataset, stream, on_batch, on_task_end,
                 on_empty=stream.report_through)
    hooks.close()
    stream.timer.add("evaluate", time.perf_counter() - start)
    num_tasks, sums = stream.master.get_result(dataset.name, eval_round)
    assign_states(variables, sums)
    logs = keras_compat.metric_logs(model)
    if isinstance(last_logs, dict):
        # A test_step of the model's own whose logs are not its metrics' (more
        # keys, or nested: `{m.name: m.result() for m in self.metrics}` gives
        # `compile_metrics: {...}`): Keras returns the last step's logs,
        # flattened. Their values are this worker's last task's; each one
        # that is a metric's takes the job's result.
        step_logs = keras_compat.pythonify_logs(last_logs)
        if set(step_logs) != set(logs):
            logs = {k: logs[k] if k in logs else v for k, v in step_logs.items()}
    callback_list.on_test_end(logs)
    return logs

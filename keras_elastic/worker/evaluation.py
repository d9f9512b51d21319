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
import numpy as np

from keras_elastic.common import faults
from keras_elastic.common.tensor_codec import encode_all
from keras_elastic.dataset import ElasticDataset
from keras_elastic.worker.task_stream import TaskStream


def metric_variables(model: keras.Model) -> list[tuple[str, keras.Variable]]:
    """`(key, variable)` of every metric state of `model`, summable or not."""
    out = []
    for i, metric in enumerate(_leaf_metrics(model.metrics)):
        for j, variable in enumerate(metric.variables):
            aggregation = getattr(variable, "aggregation", "sum")
            if aggregation != "sum":
                raise ValueError(
                    f"metric '{metric.name}' ({type(metric).__name__}) has a state "
                    f"variable '{variable.name}' with aggregation='{aggregation}': "
                    "keras_elastic sums metric states over tasks and workers, which is "
                    "only right for additive states (aggregation='sum'). Compute this "
                    "metric from additive states, or evaluate it outside the cluster.")
            out.append((f"{i:03d}/{j:03d}/{variable.name}", variable))
    return out


def _leaf_metrics(metrics) -> list:
    """Metrics with their containers (Keras' CompileMetrics) opened up, so that
    errors name the user's metric."""
    out = []
    for metric in metrics:
        inner = getattr(metric, "metrics", None)
        if isinstance(inner, (list, tuple)) and inner and all(
                isinstance(m, keras.metrics.Metric) for m in inner):
            out.extend(_leaf_metrics(inner))
        else:
            out.append(metric)
    return out


def read_states(variables) -> dict[str, np.ndarray]:
    return {k: np.array(keras.ops.convert_to_numpy(v.value)) for k, v in variables}


def assign_states(variables, values: dict[str, np.ndarray]) -> None:
    for key, variable in variables:
        if key in values:
            variable.assign(values[key])
        else:  # no task of the round had elements: an untouched state
            variable.assign(np.zeros(variable.shape, variable.dtype))


class _TaskSwitcher:
    """Reports each task, with its metric states, when its batches are over."""

    def __init__(self, model: keras.Model, stream: TaskStream, variables) -> None:
        self.model = model
        self.stream = stream
        self.variables = variables
        self.current: int | None = None

    def batch_of(self, seq: int) -> None:
        if seq != self.current:
            self.flush(before=seq)
            self.current = seq

    def flush(self, before: int | None = None) -> None:
        """Reports the current task (with states) and any empty ones before."""
        if self.current is not None:
            states = read_states(self.variables)
            self.stream.report_one(self.current, list(encode_all(states.items())))
            faults.reached("validation")
            self.model.reset_metrics()
            self.current = None
        # Tasks whose records dataset_fn filtered out entirely: no states.
        self.stream.report_through(before)


def evaluate_elastic(model: keras.Model, eval_step, dataset: ElasticDataset,
                     stream: TaskStream, eval_round: int, callbacks=None,
                     verbose=0) -> dict[str, float]:
    """Evaluates this worker's share of round `eval_round` with `eval_step`
    (the model's compiled `test_step`); returns global logs."""
    variables = metric_variables(model)
    callback_list = keras.callbacks.CallbackList(
        callbacks, add_history=False, add_progbar=verbose != 0, model=model,
        verbose=verbose, epochs=1, steps=None)
    stream.set_epoch(eval_round)
    model.reset_metrics()
    callback_list.on_test_begin()
    switcher = _TaskSwitcher(model, stream, variables)
    step = 0
    start = time.perf_counter()
    for seq, batch in dataset.build(stream.generator, per_task=True):
        switcher.batch_of(int(seq))
        callback_list.on_test_batch_begin(step)
        logs = eval_step(batch)
        callback_list.on_test_batch_end(step, logs)
        step += 1
    switcher.flush()
    stream.timer.add("evaluate", time.perf_counter() - start)
    num_tasks, sums = stream.master.get_result(dataset.name, eval_round)
    assign_states(variables, sums)
    logs = {k: float(v) for k, v in model.get_metrics_result().items()}
    callback_list.on_test_end(logs)
    return logs

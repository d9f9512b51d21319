"""A model's metric states as the job sums them over tasks and workers.

Evaluation reports each task's states and the master sums them; training
reports each worker's share of the epoch's states with its task reports
(`task_reporter.JobMetrics`). Both name the states the same way here.
"""

from __future__ import annotations

import keras
import numpy as np


def state_variables(model: keras.Model):
    """`(key, variable, metric)` of every metric state of `model`; the keys
    are the same on every worker (the master sums states by key)."""
    for i, metric in enumerate(_leaf_metrics(model.metrics)):
        for j, variable in enumerate(metric.variables):
            yield f"{i:03d}/{j:03d}/{variable.name}", variable, metric


def is_additive(variable) -> bool:
    """Whether a metric state adds up over disjoint data (aggregation "sum")."""
    return getattr(variable, "aggregation", "sum") == "sum"


def metric_variables(model: keras.Model) -> list[tuple[str, keras.Variable]]:
    """`(key, variable)` of every metric state of `model`; a state that is not
    additive is an error naming its metric."""
    out = []
    for key, variable, metric in state_variables(model):
        if not is_additive(variable):
            raise ValueError(
                f"metric '{metric.name}' ({type(metric).__name__}) has a state "
                f"variable '{variable.name}' with aggregation='{variable.aggregation}': "
                "keras_elastic sums metric states over tasks and workers, which is "
                "only right for additive states (aggregation='sum'). Compute this "
                "metric from additive states, or evaluate it outside the cluster.")
        out.append((key, variable))
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



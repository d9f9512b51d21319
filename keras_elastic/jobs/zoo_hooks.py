"""ElasticDL model-zoo hooks, made into a Keras model for the elastic jobs.

An ElasticDL model-zoo module defines, beside `custom_model()`:

- `loss(labels, predictions)`: called with the labels as `dataset_fn` gives
  them (not cast) and all of the model's outputs (a dict for a model with
  named outputs); ElasticDL's older `loss(output, labels)` is told by its
  parameter names;
- `optimizer()`: a Keras optimizer;
- `dataset_fn(dataset, mode, metadata)` or `feed(...)`, which may shuffle
  within a task: its random ops get a fixed seed (the same elements in the
  same order for the same records, as exactly-once replays need; `--shuffle`
  gives a different order each epoch);
- `eval_metrics_fn()`: `{name: fn(labels, predictions)}` with per-example
  functions (made into exact mean metrics: totals and counts, summed over
  batches, tasks and workers), Keras metrics (e.g. `AUC()`), or
  `{output_name: {name: ...}}` per output;
- `callbacks()`, `learning_rate_scheduler(model_version)` (or ElasticDL's
  `LearningRateScheduler(schedule)` callback), applied on the parameter
  servers keyed on their model version;
- `PredictionOutputsProcessor`, whose `process(predictions, worker_id)` gets
  the outputs of each prediction task.

May import TensorFlow (workers only).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf
from absl import logging

from keras_elastic.common import keras_compat
from keras_elastic.prediction.writer import PredictionWriter, TaskRange

# The seed of random ops in an ElasticDL dataset_fn (see seeded()).
DATASET_SEED = 20240613
# Most pieces of a tabulated learning-rate schedule.
MAX_SCHEDULE_PIECES = 1000


# -- dataset_fn -------------------------------------------------------------
class Metadata:
    """ElasticDL's data-reader metadata (TFRecord records have no columns)."""

    column_names = None
    column_dtypes = None


def positional_arity(fn: Callable) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 2
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return 3
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


@contextlib.contextmanager
def seeded(seed: int = DATASET_SEED):
    """Gives random ops created inside (e.g. an unseeded `Dataset.shuffle`)
    the same seeds on every run; restores the global seed after."""
    from tensorflow.python.eager import context
    from tensorflow.python.framework import ops

    eager = tf.executing_eagerly()
    old = context.global_seed() if eager else ops.get_default_graph().seed
    tf.random.set_seed(seed)
    try:
        yield
    finally:
        tf.random.set_seed(old)


def elastic_dataset_fn(fn: Callable) -> Callable:
    """`dataset_fn(records, mode)` for ElasticDataset from the module's
    function, run with fixed seeds (ElasticDL's modules shuffle without a
    seed; a replayed task needs the same order): ElasticDL's 3-argument
    `dataset_fn(dataset, mode, metadata)` / `feed` also gets a `Metadata`,
    the 2-argument form of ElasticDL's first model zoo does not."""
    three = positional_arity(fn) >= 3
    metadata = Metadata()

    def dataset_fn(records, mode):
        with seeded():
            return fn(records, mode, metadata) if three else fn(records, mode)

    return _named_like(dataset_fn, fn)


def _named_like(wrapper: Callable, fn: Callable) -> Callable:
    """`wrapper` under `fn`'s name, so errors about the dataset_fn name the
    module's function (not `functools.wraps`: its `__wrapped__` would give
    `wrapper` the signature of `fn`, whose arity ElasticDataset reads)."""
    wrapper.__qualname__ = getattr(fn, "__qualname__", "dataset_fn")
    wrapper.__module__ = getattr(fn, "__module__", None)
    return wrapper


def keras2_single_input(fn: Callable, model: keras.Model) -> Callable:
    """`fn` (a `dataset_fn(records, mode)`), its features given as Keras 2
    gave them to a model of one input: a dict of one entry, whatever its key,
    is that entry's value (ElasticDL's deepfm names its feature "feature" and
    its `Input` nothing; Keras 3 matches a dict's keys to the inputs' names).
    Unchanged for models of other inputs and keys that name the input."""
    names = [layer.name for layer in getattr(model, "layers", [])
             if isinstance(layer, keras.layers.InputLayer)]
    if len(names) != 1:
        return fn

    def dataset_fn(records, mode):
        out = fn(records, mode)
        spec = out.element_spec
        features = spec[0] if isinstance(spec, tuple) else spec
        if not (isinstance(features, dict) and len(features) == 1
                and names[0] not in features):
            return out
        key = next(iter(features))
        if isinstance(spec, tuple):
            return out.map(tf.autograph.experimental.do_not_convert(
                lambda f, *rest: (f[key], *rest)))
        return out.map(tf.autograph.experimental.do_not_convert(lambda f: f[key]))

    return _named_like(dataset_fn, fn)


# -- metrics ----------------------------------------------------------------
class PerExampleMean(keras.metrics.Metric):
    """The exact mean of a per-example function over all examples seen.

    `fn(labels, predictions)` returns one value per example (any shape with
    the batch first: each element counts once; booleans count as 0/1) or a
    scalar, taken as the mean over the batch. The states are a total and a
    count (float64, `aggregation="sum"`): summed over batches, tasks and
    workers they give the mean over the whole dataset, whatever the batches.

    Example:

    >>> m = PerExampleMean("accuracy", lambda y, p: tf.equal(y, p))
    >>> m.update_state(tf.constant([1, 2, 3]), tf.constant([1, 2, 0]))
    >>> round(float(m.result()), 4)
    0.6667
    """

    def __init__(self, name: str, fn: Callable, **kwargs) -> None:
        super().__init__(name=name, **kwargs)
        self.fn = fn
        self.total = self.add_variable((), "zeros", dtype="float64", name="total",
                                        aggregation="sum")
        self.count = self.add_variable((), "zeros", dtype="float64", name="count",
                                        aggregation="sum")

    def update_state(self, y_true, y_pred, sample_weight=None):
        values = tf.cast(self.fn(y_true, y_pred), tf.float64)
        batch = tf.shape(tf.nest.flatten(y_pred)[0])[0]
        if values.shape.rank == 0:  # a batch mean
            weights = (tf.cast(batch, tf.float64) if sample_weight is None else
                       tf.reduce_sum(tf.cast(sample_weight, tf.float64)))
            self.total.assign_add(values * weights)
            self.count.assign_add(weights)
            return
        if sample_weight is None:
            weights = tf.ones_like(values)
        else:
            w = tf.cast(tf.reshape(sample_weight, [-1]), tf.float64)
            w = tf.reshape(w, tf.concat([tf.shape(w), tf.ones(
                [tf.rank(values) - 1], tf.int32)], 0))
            weights = tf.broadcast_to(w, tf.shape(values))
        self.total.assign_add(tf.reduce_sum(values * weights))
        self.count.assign_add(tf.reduce_sum(weights))

    def result(self):
        return tf.cast(tf.math.divide_no_nan(self.total, self.count), tf.float32)

    def get_config(self):
        return {"name": self.name}


def _metric(name: str, value: Any) -> keras.metrics.Metric:
    if isinstance(value, keras.metrics.Metric):
        with contextlib.suppress(AttributeError):
            value.name = name
        return value
    if callable(value):
        return PerExampleMean(name, value)
    raise TypeError(f"eval_metrics_fn(): '{name}' is a {type(value).__name__}; "
                    "expected a function(labels, predictions) or a Keras metric")


def eval_metrics(spec: Any, output_names: list[str] | None) -> list[tuple[str | None,
                                                                           Any]]:
    """`(output name or None, metric)` from what `eval_metrics_fn()` returned:
    `{name: fn or metric}`, or `{output: {name: fn or metric}}`."""
    if spec is None:
        return []
    if not isinstance(spec, dict):
        raise TypeError("eval_metrics_fn() must return a dict {name: "
                        f"function(labels, predictions)}}, got {type(spec).__name__}")
    pairs: list[tuple[str | None, Any]] = []
    for key, value in spec.items():
        if isinstance(value, dict):
            if output_names is not None and key not in output_names:
                raise ValueError(f"eval_metrics_fn(): '{key}' is not an output of the "
                                 f"model (outputs: {output_names})")
            pairs.extend((key, _metric(f"{key}_{name}", v)) for name, v in value.items())
        else:
            pairs.append((None, _metric(key, value)))
    return pairs


# -- loss --------------------------------------------------------------------
def _reduce(loss: tf.Tensor, weights: tf.Tensor | None) -> tf.Tensor:
    loss = tf.cast(loss, tf.float32)
    if loss.shape.rank == 0:
        return loss
    per_example = tf.reduce_mean(
        tf.reshape(loss, [tf.shape(loss)[0], -1]), axis=1)
    if weights is None:
        return tf.reduce_mean(per_example)
    return tf.math.divide_no_nan(tf.reduce_sum(per_example * weights),
                                 tf.reduce_sum(weights))


def zoo_loss(loss_fn: Callable, y, y_pred, sample_weight) -> tf.Tensor:
    """`loss_fn(labels, predictions)` on the elements with a weight > 0 (the
    elastic train step weighs out elements of tasks given up), reduced to a
    scalar (a per-example loss: the weighted mean)."""
    if sample_weight is None:
        return _reduce(loss_fn(y, y_pred), None)
    weights = tf.reshape(tf.cast(tf.nest.flatten(sample_weight)[0], tf.float32), [-1])
    keep = weights > 0

    def kept():
        def mask(t):
            return tf.boolean_mask(t, keep)

        return _reduce(loss_fn(tf.nest.map_structure(mask, y),
                               tf.nest.map_structure(mask, y_pred)), mask(weights))

    def none_kept():  # a zero loss that still depends on the outputs
        return tf.add_n([0.0 * tf.reduce_sum(tf.cast(t, tf.float32))
                         for t in tf.nest.flatten(y_pred)])

    return tf.cond(tf.reduce_any(keep), kept, none_kept)


# ElasticDL's first model zoo wrote `loss(output, labels)`; it later became
# `loss(labels, predictions)`. A loss whose parameters are named in the older
# order gets its arguments in that order.
_OUTPUT_NAMES = ("output", "outputs", "predictions", "prediction", "logits", "y_pred")
_LABEL_NAMES = ("labels", "label", "y_true")


def labels_first(loss_fn: Callable) -> Callable:
    """`loss_fn` as a function of `(labels, predictions)`: ElasticDL's older
    `loss(output, labels)` (told by its parameter names) swapped.

    Example:

    >>> def loss(output, labels):
    ...     return output - labels
    >>> labels_first(loss)(1, 10)
    9
    """
    try:
        names = [p.name for p in inspect.signature(loss_fn).parameters.values()][:2]
    except (TypeError, ValueError):
        return loss_fn
    if len(names) == 2 and names[0] in _OUTPUT_NAMES and names[1] in _LABEL_NAMES:
        return lambda labels, predictions: loss_fn(predictions, labels)
    return loss_fn


def zoo_model(model: keras.Model, loss_fn: Callable | None,
              metrics: list[tuple[str | None, Any]]) -> keras.Model:
    """Gives `model` (in place, as `ke.wrap` does) ElasticDL's loss and
    metrics: `compute_loss` calls `loss_fn(labels, predictions)` with the
    labels as given and all outputs (`loss(output, labels)`, ElasticDL's
    older order, is told by its parameter names); `compute_metrics` updates
    `metrics`."""
    base = type(model)
    if loss_fn is not None:
        loss_fn = labels_first(loss_fn)

    class ZooModel(base):
        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None,
                         training=True):
            if loss_fn is None:
                return super().compute_loss(x, y, y_pred, sample_weight, training)
            total = zoo_loss(loss_fn, y, y_pred, sample_weight)
            for extra in self.losses:  # regularization
                total = total + tf.cast(extra, total.dtype)
            return total

        def compute_metrics(self, x, y, y_pred, sample_weight=None):
            for output, metric in self.__dict__["_zoo_metrics"]:
                metric.update_state(y, y_pred if output is None else y_pred[output],
                                    sample_weight=sample_weight)
            return self.get_metrics_result()

        @property
        def metrics(self):
            return list(super().metrics) + [
                m for _, m in self.__dict__.get("_zoo_metrics", [])]

    ZooModel.__name__ = ZooModel.__qualname__ = base.__name__
    ZooModel.__module__ = base.__module__
    object.__setattr__(model, "_zoo_metrics", list(metrics))
    model.__class__ = ZooModel
    return model


def output_names(model: keras.Model) -> list[str] | None:
    outputs = getattr(model, "_outputs_struct", None)
    if isinstance(outputs, dict):
        return list(outputs)
    return None


# -- learning rate ------------------------------------------------------------
def tabulate_schedule(schedule: Callable[[int], Any], max_version: int) -> Any:
    """`schedule(model_version)` for versions 0..max_version as a Keras
    `PiecewiseConstantDecay` (or a float if constant), which the parameter
    servers evaluate at their own version (the optimizer's iteration count);
    beyond `max_version` the last value holds."""
    values = [float(schedule(v)) for v in range(max_version + 1)]
    boundaries, pieces = [], [values[0]]
    for v in range(1, len(values)):
        if values[v] != values[v - 1]:
            boundaries.append(v - 1)
            pieces.append(values[v])
    if not boundaries:
        return values[0]
    if len(pieces) > MAX_SCHEDULE_PIECES:
        raise ValueError(
            f"learning_rate_scheduler changes the learning rate {len(boundaries)} times "
            f"in the job's first {max_version} model versions; keras-elastic applies it "
            f"on the parameter servers as a piecewise-constant schedule of at most "
            f"{MAX_SCHEDULE_PIECES} pieces. Return a keras.optimizers.schedules."
            "LearningRateSchedule from optimizer() instead (e.g. ExponentialDecay).")
    return keras.optimizers.schedules.PiecewiseConstantDecay(boundaries, pieces)


def describe_rate(rate: Any) -> str:
    if isinstance(rate, keras.optimizers.schedules.PiecewiseConstantDecay):
        return (f"values {rate.values} after model versions {rate.boundaries} "
                "(PiecewiseConstantDecay)")
    return f"a constant {rate} (its value over the job's model versions)"


def with_learning_rate(optimizer: keras.optimizers.Optimizer,
                       learning_rate: Any) -> keras.optimizers.Optimizer:
    """A new optimizer like `optimizer` with `learning_rate` (a float or a
    schedule)."""
    if isinstance(keras_compat.optimizer_learning_rate(optimizer),
                  keras.optimizers.schedules.LearningRateSchedule):
        logging.warning("learning_rate_scheduler replaces the learning-rate schedule "
                        "of optimizer()")
    config = dict(optimizer.get_config())
    config["learning_rate"] = learning_rate
    return type(optimizer).from_config(config)


def max_model_versions(dataset, num_epochs: int) -> int:
    """An upper bound of the model versions of a training job: a version per
    batch, a partial batch at most per task."""
    tasks = records = 0
    for _, n in dataset.source.shards():
        records += n
        tasks += -(-n // dataset.records_per_task)
    return num_epochs * (-(-records // dataset.batch_size) + tasks)


# -- prediction ---------------------------------------------------------------
class ProcessorWriter(PredictionWriter):
    """Hands each prediction task's outputs to ElasticDL's
    `PredictionOutputsProcessor.process(predictions, worker_id)` (as tensors),
    then to `inner` (the `--output` writer), if any."""

    def __init__(self, processor: Any, worker_id: int,
                 inner: PredictionWriter | None = None) -> None:
        self.processor = processor
        self.worker_id = worker_id
        self.inner = inner

    def write(self, task: TaskRange, outputs: Any) -> None:
        if outputs is not None:
            self.processor.process(tf.nest.map_structure(tf.convert_to_tensor, outputs),
                                   self.worker_id)
        if self.inner is not None:
            self.inner.write(task, outputs)

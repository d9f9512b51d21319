"""The one seam between keras-elastic and Keras' private API.

Everything keras-elastic needs from Keras beyond its public API goes through
this module: the `keras.src` imports, the private methods of models and
layers it calls, and the override of the TensorFlow trainer's epoch iterator.
A new Keras release can only break keras-elastic here, and
`check_keras_version()` (called when `keras_elastic` is imported) says at once
when the installed Keras is one this seam was not checked against.

Checked against: Keras `KERAS_CHECKED` (the versions CI installs; setup.py
accepts exactly these minor releases).

May import: Keras and TensorFlow only (`keras_elastic.common` is the lowest
layer).

Example:

>>> from keras_elastic.common import keras_compat
>>> keras_compat.unpack_x_y_sample_weight(("x", "y"))
('x', 'y', None)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import keras
import tensorflow as tf
from keras.src import backend as _backend
from keras.src.backend.tensorflow import trainer as _tf_trainer
from keras.src.models.functional import Functional
from keras.src.models.model import functional_init_arguments
from keras.src.trainers.data_adapters import data_adapter_utils as _adapter_utils
from keras.src.trainers.trainer import Trainer
from keras.src.utils import file_utils
from keras.src.utils.naming import auto_name

from keras_elastic.common import errors

# The minor releases of Keras (and of TensorFlow, its backend) this module was
# checked against: CI's. setup.py accepts exactly these.
KERAS_CHECKED = ("3.15",)
TENSORFLOW_CHECKED = ("2.21",)
# Set to 1 to run with a Keras release this module was not checked against.
UNCHECKED_ENV = "KERAS_ELASTIC_ALLOW_UNCHECKED_KERAS"

__all__ = [
    "Functional", "KERAS_CHECKED", "SegmentedIterator", "Trainer", "all_layers",
    "auto_name", "build_from_input_spec", "call_has_training_arg", "can_convert_arrays",
    "check_keras_version", "compiled_loss", "compiled_metrics", "compute_loss",
    "distribution_strategy",
    "elastic_epochs", "file_utils", "flat_call", "flatten_metrics_in_order",
    "functional_init_arguments", "metric_logs", "pythonify_logs",
    "reset_fit_state", "loss_tracker", "optimizer_learning_rate", "route_saving",
    "symbolic_build",
    "unpack_x_y_sample_weight", "untrack", "uses_keras_train_step",
]


class UnsupportedKerasError(errors.JobError, ImportError):
    """The installed Keras is a release keras-elastic was not checked against."""


def check_keras_version(version: str | None = None,
                        tensorflow_version: str | None = None) -> None:
    """Raises `UnsupportedKerasError` unless `version` (the installed Keras by
    default) and `tensorflow_version` (the installed TensorFlow) are minor
    releases in `KERAS_CHECKED` and `TENSORFLOW_CHECKED`, or the environment
    sets `KERAS_ELASTIC_ALLOW_UNCHECKED_KERAS=1`.

    >>> check_keras_version("3.15.1", "2.21.0")
    >>> check_keras_version("2.15.0", "2.21.0")
    Traceback (most recent call last):
    ...
    keras_elastic.common.keras_compat.UnsupportedKerasError: keras-elastic ...
    """
    if os.environ.get(UNCHECKED_ENV) == "1":
        return
    for package, found, checked in (
            ("keras", version or keras.__version__, KERAS_CHECKED),
            ("tensorflow", tensorflow_version or tf.__version__, TENSORFLOW_CHECKED)):
        if ".".join(found.split(".")[:2]) in checked:
            continue
        raise UnsupportedKerasError(
            f"keras-elastic was checked against Keras {', '.join(KERAS_CHECKED)} on "
            f"TensorFlow {', '.join(TENSORFLOW_CHECKED)} and found {package} "
            f"{found}: install a checked release (pip install '{package}>="
            f"{checked[0]},<{_next_minor(checked[-1])}'), or set {UNCHECKED_ENV}=1 "
            "to try this one at your own risk (keras-elastic uses Keras' private "
            "API in keras_elastic/common/keras_compat.py only)")


def _next_minor(minor: str) -> str:
    major, number = minor.split(".")
    return f"{major}.{int(number) + 1}"


check_keras_version()


# -- data -----------------------------------------------------------------
def unpack_x_y_sample_weight(data: Any) -> tuple[Any, Any, Any]:
    """Keras' reading of a batch: `x`, `(x,)`, `(x, y)` or `(x, y, sw)`."""
    return _adapter_utils.unpack_x_y_sample_weight(data)


def can_convert_arrays(arrays: Any) -> bool:
    """Whether Keras reads `arrays` (a nest) as arrays (its `ArrayDataAdapter`:
    NumPy, tensors, pandas, anything with `__array__`; lists are nests), not
    as a dataset, generator or `PyDataset`."""
    from keras.src.trainers.data_adapters import array_data_adapter

    return array_data_adapter.can_convert_arrays(arrays)


# -- models and layers ----------------------------------------------------
def uses_keras_train_step(model: keras.Model) -> bool:
    """Whether `model` trains with Keras' own `train_step` (not its own)."""
    keras_step = _tf_trainer.TensorFlowTrainer.train_step
    return getattr(type(model), "train_step", None) is keras_step


def all_layers(model: keras.layers.Layer, include_self: bool = True) -> list:
    """Every layer of `model`, nested ones included."""
    return list(model._flatten_layers(include_self=include_self))


def build_from_input_spec(model: keras.Model, x_spec: Any) -> None:
    """Builds a model's layers from the spec of its inputs, without data."""
    _backend.compute_output_spec(model, tf.nest.map_structure(
        lambda s: keras.KerasTensor(s.shape, s.dtype.name), x_spec))


def symbolic_build(model: keras.Model, data_spec: Any) -> None:
    """Builds a model, its compiled loss and metrics from a batch's spec (as
    Keras' `fit` does from its first batch), without data."""
    model._symbolic_build(data_batch=data_spec)


def compiled_loss(model: keras.Model) -> Any:
    """The model's compiled loss container (None without one)."""
    return getattr(model, "_compile_loss", None)


def compiled_metrics(model: keras.Model) -> Any:
    """The model's compiled metrics container (None without one)."""
    return getattr(model, "_compile_metrics", None)


def compute_loss(model: keras.Model, x: Any, y: Any, y_pred: Any,
                 sample_weight: Any) -> Any:
    """The loss Keras' default train step computes (compiled and added)."""
    return model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                               training=True)


def loss_tracker(model: keras.Model) -> keras.metrics.Metric:
    """The metric behind the `loss` of Keras' logs."""
    return model._loss_tracker


def pythonify_logs(logs: dict) -> dict:
    """Logs as Keras' `evaluate` returns them: plain floats where a value is
    a scalar, arrays kept (an `F1Score` per class), nested dicts flattened."""
    from keras.src.utils.python_utils import pythonify_logs as keras_pythonify

    return keras_pythonify(logs)


def metric_logs(model: keras.Model) -> dict:
    """The model's metric results as Keras' `evaluate` returns them
    (`pythonify_logs`)."""
    return pythonify_logs(model.get_metrics_result())


def flatten_metrics_in_order(model: keras.Model, logs: dict) -> Any:
    """`evaluate`'s return without `return_dict`: the one value, or the values
    in the order of the model's metrics (Keras' own ordering)."""
    return model._flatten_metrics_in_order(logs)


def moving_averages(optimizer: Any) -> list[tuple[Any, Any]]:
    """(variable, its moving average) of each variable an optimizer with
    `use_ema=True` (or the optimizer a `LossScaleOptimizer` wraps) trains;
    [] for one without, or not yet built."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if not getattr(inner, "use_ema", False) or not getattr(inner, "built", False):
        return []
    averages = inner._model_variables_moving_average
    return [(v, averages[inner._get_variable_index(v)])
            for v in inner._trainable_variables]


def distribution_strategy(model: keras.Model) -> Any:
    """The `tf.distribute` strategy the model was built in (its variables are
    the strategy's), or None for the default one."""
    strategy = getattr(model, "_distribute_strategy", None)
    if strategy is None and tf.distribute.has_strategy():
        strategy = tf.distribute.get_strategy()
    return strategy


def call_has_training_arg(model: keras.Model) -> bool:
    """Whether the model's `call` takes a `training` argument."""
    return bool(model._call_has_training_arg)


def reset_fit_state(model: keras.Model) -> None:
    """Forgets the train function and initial epoch of a previous `fit`."""
    model.train_function = None
    model._initial_epoch = None


def untrack(layer: keras.layers.Layer, variable: Any) -> None:
    """Removes `variable` from what `layer` tracks (its weights)."""
    layer._tracker.untrack(variable)


def optimizer_learning_rate(optimizer: keras.optimizers.Optimizer) -> Any:
    """What the optimizer was given as its learning rate (a float, a variable
    or a `LearningRateSchedule`), not its current value."""
    return optimizer._learning_rate


def flat_call(function: Any) -> Callable[[list], Any]:
    """A caller of a `tf.function`'s concrete function that takes the flat
    list of its tensor arguments (in its signature's order) and skips the
    match of each argument against its `TensorSpec` (TensorFlow's private
    `ConcreteFunction._call_flat`; the public call where it is missing). For
    tensors known to fit the signature: the check costs 25 us a tensor (a
    push of 50 tensors: 1.2 ms of Python per call).

    >>> import tensorflow as tf
    >>> f = tf.function(lambda xs: [x * 2 for x in xs]).get_concrete_function(
    ...     [tf.TensorSpec((), tf.float32)])
    >>> [float(t) for t in flat_call(f)([tf.constant(1.0)])]
    [2.0]
    """
    call_flat = getattr(function, "_call_flat", None)
    if call_flat is None or getattr(function, "captured_inputs", None) is None:
        return lambda tensors: function(*_unflatten(function, tensors))
    return lambda tensors: call_flat(list(tensors), function.captured_inputs)


def _unflatten(function: Any, tensors: list) -> list:
    """`tensors` in the structure of `function`'s positional arguments."""
    import tensorflow as tf

    return tf.nest.pack_sequence_as(function.structured_input_signature[0],
                                    list(tensors))


# -- saving ---------------------------------------------------------------
_SAVING_NAMES = ("save_model", "save_weights")


def route_saving(route: Callable) -> None:
    """Routes Keras' saving of a model to a file (`Model.save`,
    `Model.save_weights`, `keras.saving.save_model`, `keras.models.save_model`,
    `keras.saving.save_weights`) through `route(save, model, filepath, *args,
    **kwargs)`, where `save` is Keras' own function (`saving_api.save_model`
    or `save_weights`). Once per process; later calls change nothing."""
    import keras.models
    import keras.saving
    from keras.src.saving import saving_api

    if getattr(saving_api, "_ke_routed", False):
        return
    for name in _SAVING_NAMES:
        original = getattr(saving_api, name)

        def routed(model, filepath, *args, _original=original, **kwargs):
            return route(_original, model, filepath, *args, **kwargs)

        routed.__name__ = routed.__qualname__ = name
        routed.__doc__ = original.__doc__
        routed.__wrapped__ = original
        for module in (saving_api, keras.saving, keras.models):
            if getattr(module, name, None) is original:
                setattr(module, name, routed)
    saving_api._ke_routed = True


# -- the epoch iterator ---------------------------------------------------
class SegmentedIterator:
    """The iterator of one epoch made of one or more segments.

    Keras remembers the number of batches of the first epoch of a dataset of
    unknown size and stops every later epoch after that many. An elastic
    worker's epochs differ in length (it gets however many tasks it gets),
    and a training stream may end a *segment* of an epoch (it must not block
    on the master while tasks it holds sit in a partial batch): the pipeline
    runs out, the tasks are reported, and the epoch goes on over a new
    iterator of the same pipeline. `next_segment()` asks `on_end` (the
    stream's `end_segment`) whether the epoch goes on; if so it starts a new
    iterator over the pipeline. The elastic train function takes batches
    from it with `next()`, which switches segments when one runs out.

    `peek()` takes the next batch ahead and holds it for `next()`: the epoch
    loop peeks before each step, so that Keras calls a batch's
    `on_train_batch_begin` only for a batch that exists (as it does for
    data of known size), never once more at the epoch's end.
    """

    def __init__(self, dataset: Any, on_end: Callable[[], bool]) -> None:
        self._dataset = dataset
        self._on_end = on_end
        self.current = iter(dataset)
        self._held: tuple[Any] | None = None

    def next_segment(self) -> bool:
        if not self._on_end():
            return False
        self.current = iter(self._dataset)
        return True

    def peek(self, segment_only: bool = False) -> Any:
        """The next batch, held for `next()`; None at the end of the epoch
        (with `segment_only`: of the current segment, which is not ended)."""
        while self._held is None:
            try:
                self._held = (next(self.current),)
            except (StopIteration, tf.errors.OutOfRangeError):
                if segment_only or not self.next_segment():
                    return None
        return self._held[0]

    def __iter__(self) -> Iterator:
        return self

    def __next__(self) -> Any:
        if self.peek() is None:
            raise StopIteration
        (value,), self._held = self._held, None
        return value


class _ElasticEpochIterator(_tf_trainer.TFEpochIterator):
    """Keras' TF epoch iterator that never remembers an epoch's length, and
    runs a segmented pipeline's epoch until its stream ends."""

    # {id(tf.data.Dataset): on_end} of the training pipelines made of segments.
    segmented: dict[int, Callable[[], bool]] = {}
    # ids of the validation data that the model's own `evaluate` runs (an
    # elastic validation): Keras' fit makes an epoch iterator of it to cache,
    # which is never iterated.
    evaluated_by_model: frozenset[int] = frozenset()

    def __init__(self, *args, **kwargs):
        if "x" in kwargs and id(kwargs["x"]) in self.evaluated_by_model:
            self.data_adapter = None
            self._current_iterator = None
            return
        super().__init__(*args, **kwargs)

    def _on_end(self) -> Callable[[], bool] | None:
        dataset = getattr(self.data_adapter, "_dataset", None)
        return self.segmented.get(id(dataset)) if dataset is not None else None

    def _enumerate_iterator(self):
        on_end = self._on_end()
        if on_end is None:  # (an elastic training epoch's length is the master's)
            yield from super()._enumerate_iterator()
            return
        self.data_adapter.on_epoch_begin()
        iterator = SegmentedIterator(self._get_iterator(), on_end)
        step = -self.steps_per_execution
        while iterator.peek() is not None:  # (a step only for a batch that is there)
            step += self.steps_per_execution
            self._steps_seen = step + self.steps_per_execution
            yield step, step + self.steps_per_execution - 1, iterator
        self._current_iterator = None
        self.data_adapter.on_epoch_end()

    @contextlib.contextmanager
    def catch_stop_iteration(self):
        try:
            yield
            self.tf_sync()
        except (StopIteration, tf.errors.OutOfRangeError):
            self._current_iterator = None
            self._num_batches = None
            self.data_adapter.on_epoch_end()


@contextlib.contextmanager
def elastic_epochs(segmented: dict[int, Callable[[], bool]] | None = None,
                   evaluated_by_model: Any = ()):
    """Within this context, Keras' fit/evaluate/predict iterate epochs whose
    length the master decides (see `_ElasticEpochIterator`).

    `segmented`: `{id(pipeline): on_end}` for training pipelines whose epochs
    may be made of segments (the model's train function must take batches
    with `next()`: see `worker/train_function.py`).
    `evaluated_by_model`: validation data that `fit` hands to the model's own
    `evaluate` (Keras makes no iterator of it).
    """
    original = _tf_trainer.TFEpochIterator
    iterator_class = type("ElasticEpochIterator", (_ElasticEpochIterator,),
                          {"segmented": dict(segmented or {}),
                           "evaluated_by_model": frozenset(
                               id(v) for v in evaluated_by_model)})
    _tf_trainer.TFEpochIterator = iterator_class
    try:
        yield
    finally:
        _tf_trainer.TFEpochIterator = original

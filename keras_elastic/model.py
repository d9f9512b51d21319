"""Keras models whose `fit`, `evaluate` and `predict` use the elastic cluster.

`ke.wrap(model)` makes any Keras model (functional, sequential, subclassed,
with its own `train_step`, `test_step`, `predict_step` and `compile`)
elastic *in place*: the model keeps its class, layers, weights and compile
state; it gets an elastic runtime and its `compile`, `fit`, `evaluate`,
`predict` and `make_train_function` route through the cluster. Because its
class does not change, whatever Keras saves of it (`model.save`,
`keras.callbacks.ModelCheckpoint`, `keras.saving.save_model`) is the plain
model, which `keras.models.load_model` loads in a process that never imports
keras_elastic. `ke.Model` and `ke.Sequential` build wrapped Keras models (and
`ke.Model` can be subclassed like `keras.Model`).

Given an `ElasticDataset` or NumPy arrays (which become one), `fit`:

1. registers the dataset with the master and starts at the epoch the job is in
   (a worker joining a running job, or relaunched, continues there); each
   `fit` call is a new phase of the job (every worker makes the same calls);
2. builds the model from the dataset's spec (without consuming data) and
   initializes the parameter servers with its variables and optimizer (the
   first worker wins; everybody then loads the servers' values);
3. runs Keras' own training loop over the task-fed dataset with the model's
   own `train_step`; every optimizer apply in it pushes its gradients to the
   parameter servers, named with the batch's tasks, and takes the new values
   back (`worker/remote_optimizer.py`, `worker/train_function.py`), and a
   callback reports trained tasks to the master.

The parameter servers apply the optimizers. A learning rate set on a
worker's optimizer (`keras.callbacks.LearningRateScheduler`,
`ReduceLROnPlateau`, your own callback) goes to them with the next push; a
worker takes the servers' learning rate when it connects. Other optimizer
hyperparameters are fixed for the job: changing one raises an error naming it
(see `keras_elastic/worker/hyperparameters.py`).

Example:

```python
import keras
import keras_elastic as ke

inputs = keras.Input((64,))
outputs = keras.layers.Dense(10, activation="softmax")(inputs)
model = ke.wrap(keras.Model(inputs, outputs))
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
model.fit(x, y, batch_size=32, epochs=3, validation_split=0.1)
```
"""

from __future__ import annotations

import functools
import types
from typing import Any

import keras
import tensorflow as tf
from absl import logging

from keras_elastic._backend import check_tensorflow_backend
from keras_elastic.common import keras_compat
from keras_elastic.data import keras_arguments
from keras_elastic.data.describe import describe_call
from keras_elastic.dataset import ElasticDataset
from keras_elastic.layers.embedding import Embedding, convert_embeddings
from keras_elastic.worker.cluster import get_cluster
from keras_elastic.worker.exchange import MODES as EXCHANGES
from keras_elastic.worker.file_callbacks import JobCallbacks
from keras_elastic.worker.saving import route_saving
from keras_elastic.worker.session import session_of, start_session

check_tensorflow_backend()
route_saving()  # a launched job's saves: the chief writes the file


def is_elastic(model: Any) -> bool:
    """Whether `model` was made elastic (`ke.wrap`, `ke.Model`, `ke.Sequential`).

    >>> is_elastic(keras.Sequential())
    False
    """
    return session_of(model) is not None


def is_trainer(model: Any) -> bool:
    """Whether `model` is something Keras trains: a `keras.Model`, or a layer
    with Keras' `Trainer` (the way Keras' own tests build small models,
    `class ExampleModel(Trainer, layers.Dense)`).

    >>> is_trainer(keras.Sequential()), is_trainer(keras.layers.Dense(1))
    (True, False)
    """
    return isinstance(model, keras.Model) or (
        isinstance(model, keras_compat.Trainer)
        and isinstance(model, keras.layers.Layer))


def _plain(model, method: str):
    """The model class's own `method` (Keras', or the user's override)."""
    return functools.partial(getattr(type(model), method), model)


# -- the methods an elastic model gets ------------------------------------
def _compile(self, *args, exchange: str | None = None, **kwargs) -> None:
    """Keras' `compile` (or the model's own), plus how the train step
    exchanges with the parameter servers.

    `exchange`: `"sync"` (the default) pushes each update and waits for the
    new values before the step goes on: with one worker the updates are
    exactly Keras'. `"pipelined"` sends step k's push while step k+1
    computes, which uses the newest values that have arrived (one update of
    its own behind at most, on top of asynchronous SGD's staleness): faster
    when the push is a noticeable part of the step (large models, slow
    networks), with the same exactly-once task accounting. See
    `keras_elastic/worker/push_pipeline.py`.

    Example:

    ```python
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  exchange="pipelined")
    ```
    """
    _plain(self, "compile")(*args, **kwargs)
    session = session_of(self)
    session.compiled()
    if exchange is not None:
        session.exchange = _check_exchange(exchange)
    session.jit_compile = bool(getattr(self, "jit_compile", False))
    _no_jit_with_server_tables(self)


def _make_train_function(self, force: bool = False):
    runtime = session_of(self).runtime
    if runtime is not None:  # an elastic fit: Keras' loop calls the runtime
        self.train_function = runtime
        return runtime
    return _plain(self, "make_train_function")(force)


def _fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto",
         callbacks=None, validation_split=0.0, validation_data=None, shuffle=True,
         class_weight=None, sample_weight=None, initial_epoch=0, steps_per_epoch=None,
         validation_steps=None, validation_batch_size=None, validation_freq=1,
         **kwargs):
    """Keras' `fit` on the elastic cluster (see the module doc)."""
    keras_fit = _plain(self, "fit")
    # Keras' debugging caps (keras.config.set_max_epochs, ...), as its fit
    # applies them: the job's epochs and steps are what Keras' loop runs.
    epochs = _capped(epochs, keras.config.max_epochs())
    max_steps = keras.config.max_steps_per_epoch()
    if max_steps:
        steps_per_epoch = _capped(steps_per_epoch, max_steps)
        validation_steps = _capped(validation_steps, max_steps)
    arrays, why_not = _arrays(x, y, sample_weight)
    if arrays is None and not isinstance(x, ElasticDataset):
        return _fit_not_elastic(
            self, keras_fit, x, y, why_not, batch_size=batch_size, epochs=epochs,
            verbose=verbose, callbacks=callbacks, validation_split=validation_split,
            validation_data=validation_data, shuffle=shuffle,
            class_weight=class_weight, sample_weight=sample_weight,
            initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch,
            validation_steps=validation_steps,
            validation_batch_size=validation_batch_size,
            validation_freq=validation_freq, **kwargs)
    if getattr(self, "optimizer", None) is None:
        raise ValueError("compile the model (with an optimizer) before fit: "
                         "model.compile(optimizer=..., loss=...)")
    strategy = keras_compat.distribution_strategy(self)
    if strategy is not None:
        raise ValueError(
            f"{type(self).__name__} was built in a {type(strategy).__name__} scope: "
            "keras_elastic distributes training over its workers and parameter "
            "servers itself, so it cannot train a model whose variables a "
            "tf.distribute strategy holds. Build the model outside the strategy's "
            "scope (one device per worker process; run more workers instead).")
    cluster = get_cluster()
    if isinstance(x, ElasticDataset):
        if x.mode != "training":
            raise ValueError(f"fit() needs an ElasticDataset in 'training' mode; "
                             f"'{x.name}' is in '{x.mode}' mode.")
        if validation_split:
            raise ValueError("`validation_split` is only supported for NumPy arrays "
                             "(as in Keras): give an ElasticDataset in 'evaluation' "
                             "mode as validation_data instead.")
        dataset = x
        if class_weight is not None:
            dataset = dataset.with_class_weight(class_weight)
    else:
        x, y, sample_weight = arrays
        if validation_split and validation_data is None:
            arrays, validation_data = keras_arguments.split_validation(
                arrays, validation_split)
        x_, y_, sw_ = arrays
        if class_weight is not None:
            keras_arguments.check_class_weight(class_weight, sw_, y_)
            sw_ = keras_arguments.sample_weights_for(y_, class_weight)
        dataset = ElasticDataset(_pack(x_, y_, sw_), batch_size=batch_size or 32,
                                 name="fit_arrays", shuffle=bool(shuffle))
    validation = _validation_dataset(validation_data, validation_batch_size or (
        batch_size if not isinstance(x, ElasticDataset) else None))
    phase = _phase(cluster, dataset.name)
    dataset = _renamed(dataset, dataset.name + phase)
    if isinstance(validation, ElasticDataset):
        if validation.mode != "evaluation":
            raise ValueError("validation_data must be an ElasticDataset in 'evaluation' "
                             f"mode; '{validation.name}' is in '{validation.mode}' "
                             "mode.")
        validation = _renamed(validation, validation.name + phase)
        if validation.name == dataset.name:
            raise ValueError(f"the training and validation datasets are both named "
                             f"'{dataset.name}': give them different names.")
    # ModelCheckpoint, CSVLogger, BackupAndRestore: the chief writes the real
    # paths, the other workers temporary ones (worker/file_callbacks.py).
    job_callbacks = JobCallbacks(self, callbacks, cluster, fit_name=dataset.name)
    call = describe_call(
        "fit", x, y=y, batch_size=batch_size, epochs=epochs,
        validation_split=validation_split, shuffle=shuffle, class_weight=class_weight,
        sample_weight=sample_weight, initial_epoch=initial_epoch,
        steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
        validation_freq=validation_freq)
    return session_of(self).fit(
        keras_fit, dataset, validation, epochs=epochs, verbose=verbose,
        job_callbacks=job_callbacks, call=call,
        initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch,
        validation_steps=validation_steps, validation_freq=validation_freq, **kwargs)


def _evaluate(self, x=None, y=None, batch_size=None, verbose="auto",
              sample_weight=None, steps=None, callbacks=None, return_dict=False,
              **kwargs):
    """Keras' `evaluate`; on an `ElasticDataset` or NumPy arrays, exact over
    the whole data, each worker evaluating some of its tasks."""
    session = session_of(self)
    if kwargs.pop("_use_cached_eval_dataset", False) and session.training and (
            isinstance(x, ElasticDataset)):
        # The validation of an elastic fit, called by Keras' fit loop.
        logs = session.validate(x, steps=steps, callbacks=callbacks)
        return logs if return_dict else _logs_as_keras_returns(self, logs)
    arrays, _ = _arrays(x, y, sample_weight)
    if (arrays is None and not isinstance(x, ElasticDataset)) or session.training:
        # Keras' own validation inside an elastic fit, or other data.
        return _plain(self, "evaluate")(
            x, y, batch_size=batch_size, verbose=verbose, sample_weight=sample_weight,
            steps=steps, callbacks=callbacks, return_dict=return_dict, **kwargs)
    if isinstance(x, ElasticDataset):
        dataset = x
    else:
        x, y, sample_weight = arrays
        dataset = ElasticDataset(_pack(x, y, sample_weight), batch_size=batch_size or 32,
                                 mode="evaluation", name="evaluate_arrays")
        dataset = _renamed(dataset, dataset.name + _phase(get_cluster(), dataset.name))
    steps = _capped(steps, keras.config.max_steps_per_epoch())
    if steps is not None:  # as Keras: the first `steps` batches
        dataset = _renamed(dataset.take(int(steps)), f"{dataset.name}.take{int(steps)}")
    logs = session.evaluate_round(
        dataset, callbacks=callbacks, verbose=1 if verbose == "auto" else verbose,
        call=describe_call("evaluate", x, y=y, batch_size=batch_size,
                           sample_weight=sample_weight, steps=steps))
    return logs if return_dict else _logs_as_keras_returns(self, logs)


def _capped(value: int | None, cap: int | None) -> int | None:
    """`value` at most `cap` (None: no cap; a None value is capped to it).

    >>> _capped(None, 3), _capped(5, 3), _capped(2, 3), _capped(2, None)
    (3, 3, 2, 2)
    """
    if not cap:
        return value
    return cap if value is None else min(value, cap)


def _logs_as_keras_returns(model, logs: dict[str, float]):
    """`evaluate`'s return without `return_dict`, as Keras': the one value,
    or the values in the order of the model's metrics."""
    return keras_compat.flatten_metrics_in_order(model, logs)


def _predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None,
             **kwargs):
    """Keras' `predict`; on an `ElasticDataset` in 'prediction' mode, each task's
    outputs written once (see `ElasticDataset(output_dir=...)`)."""
    session = session_of(self)
    if not isinstance(x, ElasticDataset):
        if not session.training:
            session.connect_for_tables(x)  # server tables: connect, as fit does
            session.pull()  # the servers' newest values
        return _plain(self, "predict")(x, batch_size=batch_size, verbose=verbose,
                                       steps=steps, callbacks=callbacks, **kwargs)
    if x.mode != "prediction":
        raise ValueError(f"predict() needs an ElasticDataset in 'prediction' mode; "
                         f"'{x.name}' is in '{x.mode}' mode.")
    if steps is not None:
        raise ValueError("steps cannot be set with an ElasticDataset")
    return session.predict(x, describe_call("predict", x, batch_size=batch_size),
                           callbacks=callbacks,
                           verbose=1 if verbose == "auto" else verbose)


_METHODS = {"compile": _compile, "make_train_function": _make_train_function,
            "fit": _fit, "evaluate": _evaluate, "predict": _predict}


def _install(model: keras.Model) -> keras.Model:
    """Gives `model` its elastic runtime and methods (idempotent)."""
    if is_elastic(model):
        return model
    session = start_session(model)
    for name, method in _METHODS.items():
        object.__setattr__(model, name, types.MethodType(method, model))
    if getattr(model, "compiled", False):
        session.jit_compile = bool(getattr(model, "jit_compile", False))
    _no_jit_with_server_tables(model)
    return model


def _no_jit_with_server_tables(model) -> None:
    """A model whose forward pass looks up rows on the servers (a
    `tf.py_function`) cannot be XLA-compiled by Keras' own functions."""
    if getattr(model, "jit_compile", False) and any(
            isinstance(layer, Embedding)
            for layer in keras_compat.all_layers(model, include_self=False)):
        model.jit_compile = False


# -- fit's parts ------------------------------------------------------------
def _arrays(x, y, sample_weight) -> tuple[tuple | None, str]:
    """`((x, y, sample_weight) as NumPy arrays, "")` for data Keras reads as
    arrays (lists as tuples; tensors, pandas: see
    `keras_arguments.as_arrays`), else `(None, why not)` (an `ElasticDataset`:
    `(None, "")`)."""
    if isinstance(x, ElasticDataset):
        return None, ""
    try:
        arrays = keras_arguments.as_arrays(x, y, sample_weight)
    except keras_arguments.NotArrays as e:
        return None, str(e)
    return arrays, "" if arrays is not None else f"x is a {_kind(x)}"


def _kind(value) -> str:
    """`tf.data.Dataset`, `generator`, `keras.utils.PyDataset`, ...: what a
    user would call the type of `value`."""
    if isinstance(value, tf.data.Dataset):
        return "tf.data.Dataset"
    if isinstance(value, keras.utils.PyDataset):
        return "keras.utils.PyDataset"
    return type(value).__name__


def _pack(x, y, sample_weight) -> tuple:
    """The elements Keras' train step gets from arrays: `(x,)`, `(x, y)` or
    `(x, y, sample_weight)`."""
    if y is None and sample_weight is None:
        return (x,)
    return (x, y) if sample_weight is None else (x, y, sample_weight)


def _fit_not_elastic(model, keras_fit, x, y, why_not: str, **kwargs):
    """`fit` on data keras_elastic cannot hand out in tasks (a `tf.data.Dataset`,
    a generator, a `keras.utils.PyDataset`, a sparse tensor; `why_not` says
    which): Keras' own `fit` on an embedded cluster; an error in a launched
    job."""
    cluster = get_cluster()
    if not cluster.embedded:
        raise TypeError(
            f"fit() in a multi-worker job: {why_not}, which every worker would train "
            "on all of. Give fit arrays (NumPy, tensors, pandas: each worker builds "
            "the same ones) or a ke.ElasticDataset (files, arrays or a prepared "
            "TFDS split; its dataset_fn maps each task's records to elements, e.g. "
            "ke.ElasticDataset((x, y), dataset_fn=lambda ds: ds.map(...), "
            "batch_size=64)): the master then hands out its records in tasks.")
    logging.warning(
        "keras_elastic: fit() got data it cannot hand out in tasks (%s): training "
        "with Keras' own loop in this process (an embedded cluster; in a launched "
        "job this is an error).", why_not)
    session = session_of(model)
    session.pull()
    history = keras_fit(x, y, **kwargs)
    session.push_local_values()  # the servers hold what this process trained
    return history


def _validation_dataset(validation_data, batch_size) -> Any:
    """`validation_data` as fit uses it: an `ElasticDataset` in evaluation mode
    for NumPy arrays (exact, shared by the workers), else as given (Keras'
    own validation)."""
    if validation_data is None or isinstance(validation_data, ElasticDataset):
        return validation_data
    if isinstance(validation_data, (tuple, list)):
        arrays, _ = _arrays(*keras_compat.unpack_x_y_sample_weight(
            tuple(validation_data)))
        if arrays is not None:
            return ElasticDataset(_pack(*arrays), batch_size=batch_size or 32,
                                  mode="evaluation", name="fit_validation")
    return validation_data


def _phase(cluster, name: str) -> str:
    """The suffix of the k-th call on dataset `name` in this process: "" for
    the first, "@2", "@3", ... (every worker makes the same calls)."""
    calls = cluster.__dict__.setdefault("_ke_phases", {})
    k = calls.get(name, 0) + 1
    calls[name] = k
    return "" if k == 1 else f"@{k}"


def _renamed(dataset: ElasticDataset, name: str) -> ElasticDataset:
    return dataset.renamed(name)


def _check_exchange(exchange: str) -> str:
    if exchange not in EXCHANGES:
        raise ValueError(f"exchange={exchange!r}: choose one of {list(EXCHANGES)} "
                         "('sync' waits for each push; 'pipelined' overlaps it "
                         "with the next step)")
    return exchange


# -- the public API -----------------------------------------------------------
def wrap(model: keras.Model, ps_embeddings_above: int | None = None,
         exchange: str | None = None,
         ps_embedding_options: dict | None = None) -> keras.Model:
    """Makes an existing Keras model train on the elastic cluster, in place.

    Works for functional, sequential and subclassed models, with Keras'
    train step or the model's own (`train_step`, `test_step`,
    `predict_step`, its own `compile` signature, several optimizers); the
    model keeps its class, layers, weights and compile state, so what Keras
    saves of it loads without keras_elastic.

    `ps_embeddings_above`: every `keras.layers.Embedding` with at least this
    many rows becomes a `ke.layers.Embedding`, whose table lives on the
    parameter servers (partitioned by id, rows looked up and updated per
    batch) instead of on each worker; its rows start from the layer's
    initializer on the servers. None (the default) converts none; 0 all.
    `ps_embedding_options`: their admission and eviction keywords (those of
    `ke.layers.Embedding`: `admit_after`, `max_rows`, `ttl_versions`), for
    all (`{"admit_after": 3}`) or per layer name (`{"user": {...}}`).

    `exchange`: `"sync"` (default) or `"pipelined"`, as in `compile`
    (which may also set it).

    Example:

    ```python
    model = keras.applications.MobileNetV3Small(weights=None)
    model = ke.wrap(model)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.save("model.keras")    # a plain MobileNetV3Small file
    ```
    """
    if not is_trainer(model):
        raise TypeError(f"ke.wrap expects a keras.Model (or a Keras layer with "
                        f"Keras' Trainer), got {type(model).__name__}")
    if ps_embeddings_above is not None:
        convert_embeddings(model, ps_embeddings_above, ps_embedding_options)
    elif ps_embedding_options:
        raise ValueError("ps_embedding_options needs ps_embeddings_above (which "
                         "keras.layers.Embedding layers go to the servers)")
    if exchange is not None:
        exchange = _check_exchange(exchange)
    _install(model)
    if exchange is not None:
        session_of(model).exchange = exchange
    return model


class _ElasticMeta(type):
    """`isinstance(m, ke.Model)` / `ke.Sequential`: any elastic Keras model
    (resp. sequential one), as `ke.wrap` makes them without changing their
    class."""

    def __instancecheck__(cls, instance):
        if type.__instancecheck__(cls, instance):
            return True
        plain = cls.__dict__.get("_ke_plain")
        return plain is not None and is_elastic(instance) and isinstance(instance, plain)


class Model(keras.Model, metaclass=_ElasticMeta):
    """A `keras.Model` that trains on the elastic cluster.

    `ke.Model(inputs, outputs)` is a functional `keras.Model` made elastic
    (`ke.wrap`); a subclass of `ke.Model` is a subclassed Keras model made
    elastic when constructed (its own `train_step`, `compile`, ... included).

    Example:

    ```python
    inputs = keras.Input((8,))
    model = ke.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    model.fit(ke.ElasticDataset((x, y), batch_size=16), epochs=2)
    ```
    """

    _ke_plain = keras.Model

    # Keras turns a `keras.Model` subclass called with (inputs, outputs) into
    # a functional one by rewriting the `__bases__` of every class up to
    # `keras.Model`: done to `ke.Model`, that would make every later subclass
    # of `ke.Model` functional (`super().__init__()` then fails for want of
    # inputs). A subclass of `ke.Model` used functionally is rebased on
    # `_FunctionalModel` instead.
    def __new__(cls, *args, **kwargs):
        if cls is Model and keras_compat.functional_init_arguments(args, kwargs):
            if len(args) < 3 and kwargs.get("name") is None:
                kwargs["name"] = keras_compat.auto_name("model")
            return wrap(keras.Model(*args, **kwargs))
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, *args, **kwargs):
        if not keras_compat.functional_init_arguments(args, kwargs):
            super().__init__(*args, **kwargs)
        else:
            if type(self) is Model:  # Model.__new__(Model), then __init__
                self.__class__ = _FunctionalModel
            elif not isinstance(self, keras_compat.Functional):
                _inject_functional_model(type(self))
            keras_compat.Trainer.__init__(self)
            if len(args) < 3 and kwargs.get("name") is None:
                kwargs["name"] = keras_compat.auto_name("model")  # not "_functional_model"
            keras_compat.Functional.__init__(self, *args, **kwargs)
        _install(self)

    def __call__(self, *args, **kwargs):
        # A model with server tables called eagerly on data before any fit,
        # evaluate or predict (a restored model serving): built from the
        # data's spec and connected first, as predict does.
        session = session_of(self)
        if (session is not None and not session.connected and args
                and tf.executing_eagerly()
                and not any(isinstance(a, keras.KerasTensor)
                            for a in tf.nest.flatten(args[0]))):
            session.connect_for_tables(args[0])
        return super().__call__(*args, **kwargs)


class _FunctionalModel(Model, keras_compat.Functional):
    """The base of a `ke.Model` subclass used functionally."""


def _inject_functional_model(cls: type) -> type:
    """Keras' `inject_functional_model_class`, stopping at `ke.Model`."""
    if cls is Model:
        return _FunctionalModel
    if cls is object or not issubclass(cls, Model):
        return cls
    cls.__bases__ = tuple(_inject_functional_model(b) for b in cls.__bases__)
    return cls


class Sequential(keras.Sequential, metaclass=_ElasticMeta):
    """A `keras.Sequential` that trains on the elastic cluster (a
    `keras.Sequential` made elastic by `ke.wrap`).

    Example:

    ```python
    model = ke.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, batch_size=16, epochs=2)   # arrays become an ElasticDataset
    ```
    """

    _ke_plain = keras.Sequential

    def __new__(cls, *args, **kwargs):
        if cls is Sequential:
            return wrap(keras.Sequential(*args, **kwargs))
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _install(self)

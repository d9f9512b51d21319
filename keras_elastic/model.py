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

import copy
import functools
import gc
import types
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from keras_elastic._backend import check_tensorflow_backend
from keras_elastic.checkpoint import ps_layout
from keras_elastic.common import keras_compat
from keras_elastic.common.variable_keys import namespace
from keras_elastic.data import keras_arguments
from keras_elastic.data.describe import describe_call
from keras_elastic.dataset import ElasticDataset
from keras_elastic.layers.embedding import Embedding, convert_embeddings
from keras_elastic.worker import remote_optimizer
from keras_elastic.worker.cluster import get_cluster
from keras_elastic.worker.file_callbacks import JobCallbacks
from keras_elastic.worker.model_sync import EXCHANGES, ModelSync
from keras_elastic.worker.ps_checkpoint import resume_info
from keras_elastic.worker.task_reporter import TaskReporter
from keras_elastic.worker.task_stream import TaskStream
from keras_elastic.worker.tensorboard import per_worker as per_worker_tensorboard
from keras_elastic.worker.train_function import TrainFunction

check_tensorflow_backend()


class _ElasticState:
    """A model's elastic runtime, kept out of Keras' attribute tracking."""

    def __init__(self) -> None:
        self.sync: ModelSync | None = None
        self.runtime: TrainFunction | None = None   # during an elastic fit
        self.jit_compile = False
        self.eval_step = None        # compiled test_step / predict_step
        self.predict_step = None
        self.eval_rounds: dict[str, int] = {}  # dataset -> next standalone round
        # A parameter-server checkpoint the servers load when the model first
        # connects to them (set by ke.checkpoint.restore_model).
        self.restore_from = ""
        self.exchange = "sync"       # see compile(exchange=...)


def is_elastic(model: Any) -> bool:
    """Whether `model` was made elastic (`ke.wrap`, `ke.Model`, `ke.Sequential`).

    >>> is_elastic(keras.Sequential())
    False
    """
    return isinstance(getattr(model, "__dict__", None), dict) and (
        "_ke_state" in model.__dict__)


def _state(model) -> _ElasticState:
    return model.__dict__["_ke_state"]


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
    state = _state(self)
    if exchange is not None:
        state.exchange = _check_exchange(exchange)
    state.jit_compile = bool(getattr(self, "jit_compile", False))
    _no_jit_with_server_tables(self)


def _make_train_function(self, force: bool = False):
    runtime = _state(self).runtime
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
    if not _is_elastic_data(x, y, sample_weight):
        return _fit_not_elastic(
            self, keras_fit, x, y, batch_size=batch_size, epochs=epochs,
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
        arrays = (x, y, sample_weight)
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
    jc = JobCallbacks(self, callbacks, cluster)
    callbacks = jc.callbacks
    checkpoint_callback, resume = resume_info(callbacks)
    call = describe_call(
        "fit", x, y=y, batch_size=batch_size, epochs=epochs,
        validation_split=validation_split, shuffle=shuffle, class_weight=class_weight,
        sample_weight=sample_weight, initial_epoch=initial_epoch,
        steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
        validation_freq=validation_freq)
    request = dataset.registration(
        epochs, records_per_epoch=(steps_per_epoch or 0) * dataset.batch_size,
        call=call)
    restore_from = _resume_request(request, resume)
    if jc.resume_epoch and not request.resume:  # a BackupAndRestore backup
        request.resume, request.resume_epoch = True, jc.resume_epoch
    if initial_epoch and not request.resume:
        request.resume, request.resume_epoch = True, int(initial_epoch)
    registered = cluster.master.register_dataset(request)
    dataset.registered(registered)
    start_epoch = max(initial_epoch, registered.epoch)
    local = resume if resume is not None and not restore_from else None
    sync = _prepare(self, dataset, restore_from=restore_from, local_restore=local,
                    resume=resume, adopt=True, before_init=jc.restore_weights)
    if checkpoint_callback is not None:
        checkpoint_callback.mark_restored(resume, start_epoch, epochs)
    stream = TaskStream(cluster.master, dataset.name, dataset.source,
                        cluster.timer, start_epoch=start_epoch,
                        shuffle_records=dataset.shuffle, seed=dataset.seed)
    tf_dataset = dataset.build(stream.generator)
    runtime = TrainFunction(self, sync, stream, tf_dataset.element_spec)
    _exactly_once(self, dataset, sync, stream, runtime)
    stream.segmented = True
    validate = None
    keras_validation = None
    if isinstance(validation, ElasticDataset):
        # Keras evaluates the first `validation_steps` batches each time.
        rounds = validation.take(validation_steps) if validation_steps else validation

        def validate(epoch: int) -> dict[str, float] | None:
            if not _should_eval(epoch, validation_freq):
                return None
            logs = evaluate_round(self, rounds, eval_round=epoch,
                                  after=dataset.name, call=call)
            return {f"val_{k}": v for k, v in logs.items()}
    else:
        keras_validation = validation
    callbacks = per_worker_tensorboard(callbacks, cluster, validate is not None)
    reporter = TaskReporter(stream, lambda: runtime.trained_seq, sync, validate)
    state = _state(self)
    if start_epoch >= epochs:
        logging.info("keras_elastic: the job is already past epoch %d", epochs)
    state.runtime = runtime
    self.train_function = None
    self._initial_epoch = None
    try:
        with keras_compat.elastic_epochs(segmented={id(tf_dataset): stream.end_segment}):
            history = keras_fit(
                tf_dataset, epochs=epochs, verbose=verbose,
                callbacks=[reporter] + list(callbacks or []),
                validation_data=keras_validation, validation_freq=validation_freq,
                validation_steps=validation_steps, initial_epoch=start_epoch,
                shuffle=False, **kwargs)
    except tf.errors.OpError as e:
        if stream.error is not None:
            raise stream.error from None
        refused = next((s.error for s in sync.hyperparameter_syncs.values()
                        if s.error is not None), None)
        if refused:  # an optimizer change the servers cannot follow
            sync.drop_push()
            raise refused from None
        raise e
    except BaseException:
        sync.drop_push()
        raise
    finally:
        state.runtime = None
        self.train_function = None
        stream.stop()
        jc.close()  # this worker's temporary files, also when fit failed
        del tf_dataset
        gc.collect()  # free the epoch's tf.data iterators now, not at exit
    # A learning rate set after the last push (e.g. by ReduceLROnPlateau at
    # the last epoch's end) still reaches the servers: what they hold is
    # what a worker connecting next takes.
    sync.send_hyperparameters()
    if not self.stop_training:
        # Other workers may still be training their last tasks: wait for
        # the job's last epoch to complete, then take the final model.
        cluster.master.wait_for_epoch(dataset.name, epochs)
    sync.pull()
    sync.pull_optimizer_state()  # what Keras saves of the model next
    return history


def _evaluate(self, x=None, y=None, batch_size=None, verbose="auto",
              sample_weight=None, steps=None, callbacks=None, return_dict=False,
              **kwargs):
    """Keras' `evaluate`; on an `ElasticDataset` or NumPy arrays, exact over
    the whole data, each worker evaluating some of its tasks."""
    if not _is_elastic_data(x, y, sample_weight) or _state(self).runtime is not None:
        # Keras' own validation inside an elastic fit, or other data.
        return _plain(self, "evaluate")(
            x, y, batch_size=batch_size, verbose=verbose, sample_weight=sample_weight,
            steps=steps, callbacks=callbacks, return_dict=return_dict, **kwargs)
    if isinstance(x, ElasticDataset):
        dataset = x
    else:
        dataset = ElasticDataset(_pack(x, y, sample_weight), batch_size=batch_size or 32,
                                 mode="evaluation", name="evaluate_arrays")
        dataset = _renamed(dataset, dataset.name + _phase(get_cluster(), dataset.name))
    if steps is not None:  # as Keras: the first `steps` batches
        dataset = _renamed(dataset.take(int(steps)), f"{dataset.name}.take{int(steps)}")
    logs = evaluate_round(
        self, dataset, callbacks=callbacks, verbose=1 if verbose == "auto" else verbose,
        call=describe_call("evaluate", x, y=y, batch_size=batch_size,
                           sample_weight=sample_weight, steps=steps))
    if return_dict:
        return logs
    values = list(logs.values())
    return values[0] if len(values) == 1 else values


def _predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None,
             **kwargs):
    """Keras' `predict`; on an `ElasticDataset` in 'prediction' mode, each task's
    outputs written once (see `ElasticDataset(output_dir=...)`)."""
    from keras_elastic.prediction.writer import NumpyWriter
    from keras_elastic.worker.prediction import predict_elastic

    if not isinstance(x, ElasticDataset):
        if _state(self).sync is not None and _state(self).runtime is None:
            _state(self).sync.pull()  # the servers' newest values
        return _plain(self, "predict")(x, batch_size=batch_size, verbose=verbose,
                                       steps=steps, callbacks=callbacks, **kwargs)
    if x.mode != "prediction":
        raise ValueError(f"predict() needs an ElasticDataset in 'prediction' mode; "
                         f"'{x.name}' is in '{x.mode}' mode.")
    if steps is not None:
        raise ValueError("steps cannot be set with an ElasticDataset")
    cluster = get_cluster()
    x.registered(cluster.master.register_dataset(x.registration(
        num_epochs=0, call=describe_call("predict", x, batch_size=batch_size))))
    state = _state(self)
    prediction_round = state.eval_rounds.get(x.name, 0)  # as in evaluate()
    state.eval_rounds[x.name] = prediction_round + 1
    _prepare(self, x)
    writer = x.output_writer or (NumpyWriter(x.output_dir) if x.output_dir else None)
    stream = TaskStream(cluster.master, x.name, x.source, cluster.timer,
                        start_epoch=prediction_round)
    stream.set_epoch(prediction_round)
    with keras_compat.elastic_epochs():
        return predict_elastic(self, x, stream, writer, keep=writer is None,
                               callbacks=callbacks,
                               verbose=1 if verbose == "auto" else verbose)


_METHODS = {"compile": _compile, "make_train_function": _make_train_function,
            "fit": _fit, "evaluate": _evaluate, "predict": _predict}


def _install(model: keras.Model) -> keras.Model:
    """Gives `model` its elastic runtime and methods (idempotent)."""
    if is_elastic(model):
        return model
    state = _ElasticState()
    object.__setattr__(model, "_ke_state", state)
    object.__setattr__(model, "_ke", state)
    for name, method in _METHODS.items():
        object.__setattr__(model, name, types.MethodType(method, model))
    if getattr(model, "compiled", False):
        state.jit_compile = bool(getattr(model, "jit_compile", False))
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
def _is_elastic_data(x, y, sample_weight) -> bool:
    """An `ElasticDataset`, or NumPy arrays (a nest of them)."""
    if isinstance(x, ElasticDataset):
        return True
    leaves = tf.nest.flatten((x, y, sample_weight))
    return x is not None and all(a is None or isinstance(a, np.ndarray) for a in leaves)


def _pack(x, y, sample_weight) -> tuple:
    """The elements Keras' train step gets from arrays: `(x,)`, `(x, y)` or
    `(x, y, sample_weight)`."""
    if y is None and sample_weight is None:
        return (x,)
    return (x, y) if sample_weight is None else (x, y, sample_weight)


def _fit_not_elastic(model, keras_fit, x, y, **kwargs):
    """`fit` on data keras_elastic cannot hand out in tasks (a `tf.data.Dataset`,
    a generator, a `keras.utils.PyDataset`, tensors): Keras' own `fit` on an
    embedded cluster; an error in a launched job."""
    cluster = get_cluster()
    if not cluster.embedded:
        raise TypeError(
            f"fit() got {type(x).__name__} in a multi-worker job: every worker would "
            "train on all of it. Give fit NumPy arrays (each worker builds the same "
            "ones) or a ke.ElasticDataset (files, arrays or a prepared TFDS split; "
            "its dataset_fn maps each task's records to elements, e.g. "
            "ke.ElasticDataset((x, y), dataset_fn=lambda ds: ds.map(...), "
            "batch_size=64)): the master then hands out its records in tasks.")
    logging.warning(
        "keras_elastic: fit() got %s, not an ElasticDataset or NumPy arrays: training "
        "with Keras' own loop in this process (an embedded cluster; in a launched "
        "job this is an error).", type(x).__name__)
    state = _state(model)
    if state.sync is not None:
        state.sync.pull()
    history = keras_fit(x, y, **kwargs)
    if state.sync is not None:  # the servers hold what this process trained
        state.sync.push_values()
    return history


def _validation_dataset(validation_data, batch_size) -> Any:
    """`validation_data` as fit uses it: an `ElasticDataset` in evaluation mode
    for NumPy arrays (exact, shared by the workers), else as given (Keras'
    own validation)."""
    if validation_data is None or isinstance(validation_data, ElasticDataset):
        return validation_data
    if isinstance(validation_data, (tuple, list)) and all(
            a is None or isinstance(a, np.ndarray)
            for a in tf.nest.flatten(tuple(validation_data))):
        x, y, sw = keras_compat.unpack_x_y_sample_weight(tuple(validation_data))
        return ElasticDataset(_pack(x, y, sw), batch_size=batch_size or 32,
                              mode="evaluation", name="fit_validation")
    return validation_data


def _phase(cluster, name: str) -> str:
    """The suffix of the k-th call on dataset `name` in this process: "" for
    the first, "@2", "@3", ... (every worker makes the same calls)."""
    calls = cluster.__dict__.setdefault("_ke_phases", {})
    k = calls.get(name, 0) + 1
    calls[name] = k
    return "" if k == 1 else f"@{k}"


def _next_namespace(cluster) -> str:
    """The namespace of the next model this process connects: a script may
    train several models (keras.io's guides build one per section); each
    keeps its own variables on the servers (common/variable_keys.py)."""
    k = cluster.__dict__.get("_ke_models", 0)
    cluster.__dict__["_ke_models"] = k + 1
    return namespace(k)


def _renamed(dataset: ElasticDataset, name: str) -> ElasticDataset:
    if dataset.name == name:
        return dataset
    out = copy.copy(dataset)
    out.name = name
    return out


def _prepare(model, dataset: ElasticDataset, restore_from: str = "",
             local_restore=None, resume=None, adopt: bool = False,
             before_init: Callable[[keras.Model], None] | None = None) -> ModelSync:
    """Builds the model from the dataset spec and syncs it with the PS.

    `restore_from`: a parameter-server checkpoint the servers load when they
    initialize. `local_restore`: a plain checkpoint loaded into this model
    first (whose values then initialize the servers). `adopt` (the start of
    a `fit`): take the servers' learning rate into the optimizer unless it
    was changed here since (a first connection always takes it).
    `before_init(model)`: called once the model is built, before the local
    restore and the servers' initialization (a `BackupAndRestore` backup's
    weights: see worker/file_callbacks.py).
    """
    cluster = get_cluster()
    state = _state(model)
    unbuilt = not all(layer.built for layer in keras_compat.all_layers(model))
    metrics = keras_compat.compiled_metrics(model)
    metrics_unbuilt = metrics is not None and not metrics.built
    loss = keras_compat.compiled_loss(model)
    loss_unbuilt = loss is not None and not loss.built
    if dataset.mode != "prediction" and _keras_steps_with_loss(model):
        dataset.require_labels()
    try:
        if dataset.mode == "prediction" or not uses_compiled_loss(model):
            if unbuilt:  # build the layers only
                x, _, _ = keras_compat.unpack_x_y_sample_weight(
                    dataset.batched_spec)
                keras_compat.build_from_input_spec(model, x)
        elif unbuilt or metrics_unbuilt or loss_unbuilt:
            # Build from the spec: Keras would otherwise take a batch from the
            # dataset, i.e. a task from the master, and drop it.
            keras_compat.symbolic_build(model, dataset.batched_spec)
    except (NotImplementedError, RuntimeError) as e:
        # A model without a call() of its own (a GAN whose train_step calls
        # its sub-models): fine if its layers, hence its weights, exist.
        unbuilt = [layer.name for layer in keras_compat.all_layers(
            model, include_self=False) if not layer.built]
        if unbuilt:
            raise ValueError(
                f"keras_elastic could not build {type(model).__name__} from the data "
                f"({type(e).__name__}: {e}) and its layers {unbuilt[:5]} have no "
                "weights yet. The parameter servers need every weight before "
                "training starts: build the model first (call it on a batch, or "
                "model.build(input_shape), or build its sub-models).") from e
    if resume is not None:
        # The checkpoint a ShardedModelCheckpoint resumes from must be of
        # this model: an error naming the difference, before any restore.
        from keras_elastic.checkpoint.signature import check_model_matches

        check_model_matches(model, resume)
    if before_init is not None:
        before_init(model)
    if local_restore is not None:
        from keras_elastic.checkpoint import restore_model

        restore_model(model, local_restore.path)
    if state.sync is None or state.sync.ps is not cluster.ps:
        state.sync = ModelSync(model, cluster.ps, cluster.timer,
                               namespace=_next_namespace(cluster),
                               local_store=cluster.local_store())
        state.sync.exchange_mode = state.exchange
        state.sync.initialize(restore_from or state.restore_from)
        state.restore_from = ""
    else:
        state.sync.pull()
        if adopt:
            state.sync.adopt_hyperparameters()
    remote_optimizer.attach(model, state.sync)
    state.sync.exchange_mode = state.exchange
    return state.sync


def uses_compiled_loss(model) -> bool:
    """Whether Keras' default steps (and their compiled loss) are in use."""
    return keras_compat.uses_keras_train_step(model) or \
        keras_compat.compiled_loss(model) is not None


def _keras_steps_with_loss(model) -> bool:
    """Whether Keras' own steps compute a compiled loss (which needs labels)."""
    return keras_compat.uses_keras_train_step(model) and \
        keras_compat.compiled_loss(model) is not None


def evaluate_round(model, dataset: ElasticDataset, eval_round: int | None = None,
                   after: str = "", callbacks=None, verbose=0,
                   call: str = "") -> dict[str, float]:
    """Evaluates round `eval_round` of `dataset` (an `ElasticDataset` in
    evaluation mode) with this worker taking part; returns the job's logs.
    None: the next round of this model (its k-th evaluate is round k).
    `after`: a training dataset whose epoch `eval_round` must end first.
    `call`: the user's call, quoted if workers differ."""
    from keras_elastic.worker.evaluation import evaluate_elastic

    if dataset.mode != "evaluation":
        raise ValueError(f"evaluate() needs an ElasticDataset in 'evaluation' "
                         f"mode; '{dataset.name}' is in '{dataset.mode}' mode.")
    if getattr(model, "compiled", False) is False:
        raise ValueError("compile the model (loss and metrics) before evaluate: "
                         "model.compile(loss=..., metrics=[...])")
    cluster = get_cluster()
    request = dataset.registration(num_epochs=0, call=call)
    request.after_dataset = after
    dataset.registered(cluster.master.register_dataset(request))
    state = _state(model)
    if eval_round is None:
        # The k-th evaluate() of every worker process is round k: a worker
        # relaunched (or joining) after round k ended gets its result at once
        # instead of starting a round nobody else takes part in.
        eval_round = state.eval_rounds.get(dataset.name, 0)
        state.eval_rounds[dataset.name] = eval_round + 1
    if after:
        # Wait for the training epoch's end before pulling the model: every
        # worker then evaluates the same weights.
        cluster.master.wait_for_epoch(after, eval_round + 1)
    _prepare(model, dataset)  # builds if needed; loads the newest model
    stream = TaskStream(cluster.master, dataset.name, dataset.source, cluster.timer,
                        start_epoch=eval_round)
    with keras_compat.elastic_epochs():
        return evaluate_elastic(model, dataset, stream, eval_round,
                                callbacks=callbacks, verbose=verbose)


def _exactly_once(model, dataset: ElasticDataset, sync: ModelSync,
                  stream: TaskStream, runtime: TrainFunction) -> None:
    """Links the training stream and the model's PS link for exactly-once
    updates: claims, replays, abandoned tasks, flushes (see worker/replay.py)."""
    from keras_elastic.worker.replay import Replayer

    dataset.check_deterministic()
    sync.stream = stream
    replayer = Replayer(model, dataset, sync, runtime)
    stream.claimer = sync.claim
    sync.completed_seq = -1  # the new stream's seqs start at 0

    def replay(task_replay) -> bool:
        sync.flush()  # the push in flight first (pipelined exchange)
        return replayer.run(task_replay)

    def flush() -> None:
        sync.flush()
        sync.ps.flush()

    stream.replayer = replay
    stream.flusher = flush


def _resume_request(request, resume) -> str:
    """Adds the resume point of checkpoint `resume` (or None) to a dataset
    registration; returns the parameter-server checkpoint to restore ("")."""
    if resume is None:
        return ""
    if not ps_layout.is_ps_checkpoint(resume):  # a plain Keras checkpoint
        request.resume = True
        request.resume_epoch = resume.initial_epoch
        return ""
    # The servers load it as they initialize; the master skips the tasks it
    # records as done (a resume mid-epoch).
    progress = (resume.extra.get("progress") or {}).get(request.dataset)
    if progress is not None:
        request.resume = True
        request.resume_epoch = progress["epoch"]
        request.resume_done.extend(progress["done_task_ids"])
        # The done ids name tasks of that size (a new job may choose another).
        request.resume_records_per_task = progress.get("records_per_task", 0)
    return resume.path


def _should_eval(epoch: int, validation_freq) -> bool:
    if isinstance(validation_freq, int):
        return (epoch + 1) % validation_freq == 0
    return epoch + 1 in validation_freq


def _check_exchange(exchange: str) -> str:
    if exchange not in EXCHANGES:
        raise ValueError(f"exchange={exchange!r}: choose one of {list(EXCHANGES)} "
                         "('sync' waits for each push; 'pipelined' overlaps it "
                         "with the next step)")
    return exchange


# -- the public API -----------------------------------------------------------
def wrap(model: keras.Model, ps_embeddings_above: int | None = None,
         exchange: str | None = None) -> keras.Model:
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
    if not isinstance(model, keras.Model):
        raise TypeError(f"ke.wrap expects a keras.Model, got {type(model).__name__}")
    if ps_embeddings_above is not None:
        convert_embeddings(model, ps_embeddings_above)
    if exchange is not None:
        exchange = _check_exchange(exchange)
    _install(model)
    if exchange is not None:
        _state(model).exchange = exchange
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

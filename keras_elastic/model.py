"""Keras models whose `fit` trains on the elastic cluster.

`ke.Model` and `ke.Sequential` are drop-in replacements for `keras.Model` and
`keras.Sequential`; `ke.wrap(model)` turns any built or unbuilt Keras model
(functional, sequential, subclassed) into one. Given an `ElasticDataset` (or
NumPy arrays, which become one), `fit`:

1. registers the dataset with the master and starts at the epoch the job is in
   (a worker joining a running job, or relaunched, continues there);
2. builds the model from the dataset's spec (without consuming data) and
   initializes the parameter servers with its variables and optimizer (the
   first worker wins; everybody then loads the servers' values);
3. runs Keras' own training loop over the task-fed dataset; the train step
   computes gradients in the compiled graph and exchanges them with the
   parameter servers, and a callback reports trained tasks to the master.

The parameter servers apply the optimizer. A learning rate set on the
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
model = ke.Model(inputs, outputs)
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
model.fit(ke.ElasticDataset((x, y), batch_size=32), epochs=3)
```
"""

from __future__ import annotations

import gc
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from absl import logging
from keras.src.models.functional import Functional
from keras.src.models.model import functional_init_arguments
from keras.src.trainers.data_adapters import data_adapter_utils
from keras.src.trainers.trainer import Trainer
from keras.src.utils.naming import auto_name

from keras_elastic._backend import check_tensorflow_backend
from keras_elastic.checkpoint import ps_layout
from keras_elastic.dataset import ElasticDataset
from keras_elastic.layers.embedding import convert_embeddings, embedding_step
from keras_elastic.worker.cluster import get_cluster
from keras_elastic.worker.epoch_iterator import elastic_epochs, segmented_function
from keras_elastic.worker.model_sync import EXCHANGES, ModelSync, training_loss
from keras_elastic.worker.ps_checkpoint import resume_info
from keras_elastic.worker.task_reporter import TaskReporter
from keras_elastic.worker.task_stream import TaskStream
from keras_elastic.worker.tensorboard import per_worker as per_worker_tensorboard

check_tensorflow_backend()


class _ElasticState:
    """Per-model state kept out of Keras' attribute tracking."""

    def __init__(self) -> None:
        self.trained_seq = tf.Variable(-1, dtype=tf.int64, trainable=False,
                                       name="ke_trained_seq")
        self.sync: ModelSync | None = None
        self.tagged = False          # the traced step expects (seq, batch)
        self.traced_tagged = None    # what the cached train function expects
        self.jit_compile = False
        self.eval_step = None        # compiled test_step / predict_step
        self.predict_step = None
        self.eval_rounds: dict[str, int] = {}  # dataset -> next standalone round
        # A parameter-server checkpoint the servers load when the model first
        # connects to them (set by ke.checkpoint.restore_model).
        self.restore_from = ""
        self.exchange = "sync"       # see compile(exchange=...)


class ElasticTrainerMixin:
    """Overrides `fit` and `train_step` of a Keras model class."""

    @property
    def _ke(self) -> _ElasticState:
        state = self.__dict__.get("_ke_state")
        if state is None:
            state = _ElasticState()
            object.__setattr__(self, "_ke_state", state)
        return state

    @property
    def serving_class(self) -> type:
        """The plain Keras class under this elastic one (what exports save)."""
        return next(c for c in type(self).__mro__[1:]
                    if not issubclass(c, ElasticTrainerMixin))

    def compile(self, *args, jit_compile: Any = "auto", exchange: str | None = None,
                **kwargs) -> None:
        """Keras' `compile`, plus how the train step exchanges with the
        parameter servers.

        `exchange`: `"sync"` (the default) pushes each step's gradients and
        waits for the new values before the next step: with one worker the
        updates are exactly Keras'. `"pipelined"` sends step k's push while
        step k+1 computes, which uses the newest values that have arrived
        (one update of its own behind at most, on top of asynchronous SGD's
        staleness): faster when the push is a noticeable part of the step
        (large models, slow networks), with the same exactly-once task
        accounting. See `keras_elastic/worker/push_pipeline.py`.

        Example:

        ```python
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      exchange="pipelined")
        ```
        """
        super().compile(*args, jit_compile=jit_compile, **kwargs)
        if exchange is not None:
            self._ke.exchange = _check_exchange(exchange)
        # The step calls the parameter servers through tf.py_function, which XLA
        # cannot compile; gradients are computed in a separate compiled function
        # that keeps the user's jit_compile choice.
        self._ke.jit_compile = bool(self.jit_compile)
        self.jit_compile = False

    # -- the train step ---------------------------------------------------
    def train_step(self, data):
        state = self._ke
        if not state.tagged:
            return super().train_step(data)
        tags, data = data
        seq = tags[:, 0]
        sync = state.sync
        # Records when the batch is available (for the input-wait/compute split)
        # and weighs out elements of tasks this worker abandoned.
        live = tf.py_function(sync.mark_data, [seq], Tout=tf.float32)
        live.set_shape(seq.shape)
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        with tf.control_dependencies([live]):
            x = tf.nest.map_structure(tf.identity, x)
        # The rows of every table, looked up in one exchange (when the ids
        # follow from the inputs), before the forward pass.
        prefetched = sync.prefetch(x) if sync.tables else None
        with tf.GradientTape() as tape, embedding_step(tape, prefetched) as lookups:
            y_pred, loss = training_loss(self, x, y, _weigh(sample_weight, live))
            self._loss_tracker.update_state(
                loss, sample_weight=tf.shape(
                    next(i for i in tf.nest.flatten(x) if i is not None))[0])
            if self.optimizer is not None:
                loss = self.optimizer.scale_loss(loss)
        trainable = sync.trainable
        grads = tape.gradient(loss, trainable + [rows for _, _, rows in lookups])
        pairs = [(k, g) for k, g in zip(sync.trainable_keys, grads) if g is not None]
        sync.grad_keys = [k for k, _ in pairs]
        # Embedding tables: the unique ids looked up and the gradient of their
        # rows (tf.gather's IndexedSlices, summed per unique id by the dense
        # conversion), pushed with the dense gradients.
        row_grads = [(layer.table_name, ids, g) for (layer, ids, _), g in zip(
            lookups, grads[len(trainable):]) if g is not None]
        sync.grad_tables = [name for name, _, _ in row_grads]
        inputs = [tags] + [tf.convert_to_tensor(g) for _, g in pairs] + [
            v.value for v in sync.non_trainable] + [
            t for _, ids, g in row_grads for t in (ids, tf.convert_to_tensor(g))]
        # The optimizer's learning rate, read in the step (an eager read per
        # push costs 0.1 ms): a callback's change goes to the servers with it.
        sync.rate_variable = sync.learning_rate_variable()
        if sync.rate_variable is not None:
            inputs.append(tf.convert_to_tensor(sync.rate_variable.value))
        new_values = tf.py_function(sync.exchange, inputs,
                                    Tout=[v.dtype for v in sync.variables])
        for variable, value in zip(sync.variables, new_values):
            value.set_shape(variable.shape)
            variable.assign(value)
        state.trained_seq.assign(tf.reduce_max(seq))
        if self.optimizer is not None:
            self.optimizer.iterations.assign_add(1)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    # -- fit --------------------------------------------------------------
    def _ke_as_dataset(self, x, y, batch_size, sample_weight, shuffle) -> Any:
        if isinstance(x, ElasticDataset):
            return x
        arrays = (x, y) if sample_weight is None else (x, y, sample_weight)
        leaves = tf.nest.flatten(arrays)
        if x is not None and all(isinstance(a, np.ndarray) for a in leaves):
            return ElasticDataset(arrays, batch_size=batch_size or 32,
                                  name="fit_arrays", shuffle=bool(shuffle))
        return None

    def _ke_prepare(self, dataset: ElasticDataset, restore_from: str = "",
                    local_restore=None, resume=None, adopt: bool = False) -> ModelSync:
        """Builds the model from the dataset spec and syncs it with the PS.

        `restore_from`: a parameter-server checkpoint the servers load when they
        initialize. `local_restore`: a plain checkpoint loaded into this model
        first (whose values then initialize the servers). `adopt` (the start of
        a `fit`): take the servers' learning rate into the optimizer unless it
        was changed here since (a first connection always takes it).
        """
        cluster = get_cluster()
        state = self._ke
        unbuilt = not all(layer.built for layer in self._flatten_layers())
        metrics_unbuilt = (self._compile_metrics is not None
                           and not self._compile_metrics.built)
        loss_unbuilt = self._compile_loss is not None and not self._compile_loss.built
        if dataset.mode == "prediction":
            if unbuilt:  # no labels: build the layers only
                x, _, _ = data_adapter_utils.unpack_x_y_sample_weight(
                    dataset.batched_spec)
                keras.src.backend.compute_output_spec(self, tf.nest.map_structure(
                    lambda s: keras.KerasTensor(s.shape, s.dtype.name), x))
        elif unbuilt or metrics_unbuilt or loss_unbuilt:
            # Build from the spec: Keras would otherwise take a batch from the
            # dataset, i.e. a task from the master, and drop it.
            self._symbolic_build(data_batch=dataset.batched_spec)
        if resume is not None:
            # The checkpoint a ShardedModelCheckpoint resumes from must be of
            # this model: an error naming the difference, before any restore.
            from keras_elastic.checkpoint.signature import check_model_matches

            check_model_matches(self, resume)
        if local_restore is not None:
            from keras_elastic.checkpoint import restore_model

            restore_model(self, local_restore.path)
        if state.sync is None or state.sync.ps is not cluster.ps:
            state.sync = ModelSync(self, cluster.ps, cluster.timer)
            state.sync.initialize(restore_from or state.restore_from)
            state.restore_from = ""
        else:
            state.sync.pull()
            if adopt:
                state.sync.adopt_hyperparameters()
        state.sync.exchange_mode = state.exchange
        return state.sync

    def make_train_function(self, force=False):
        function = super().make_train_function(force)
        # An elastic epoch may be made of segments (see worker/epoch_iterator).
        self.train_function = segmented_function(self.train_function)
        return function if function is None else self.train_function

    def _ke_set_tagged(self, tagged: bool) -> None:
        state = self._ke
        state.tagged = tagged
        if state.traced_tagged is not None and state.traced_tagged != tagged:
            self.train_function = None
            self.make_train_function(force=True)
        state.traced_tagged = tagged

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto",
            callbacks=None, validation_split=0.0, validation_data=None, shuffle=True,
            class_weight=None, sample_weight=None, initial_epoch=0,
            steps_per_epoch=None, validation_freq=1, **kwargs):
        dataset = self._ke_as_dataset(x, y, batch_size, sample_weight, shuffle)
        if dataset is None:
            logging.warning(
                "keras_elastic: fit() got %s, not an ElasticDataset or NumPy arrays: "
                "training locally, without the cluster.", type(x).__name__)
            self._ke_set_tagged(False)
            return super().fit(
                x, y, batch_size=batch_size, epochs=epochs, verbose=verbose,
                callbacks=callbacks, validation_split=validation_split,
                validation_data=validation_data, shuffle=shuffle,
                class_weight=class_weight, sample_weight=sample_weight,
                initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch,
                validation_freq=validation_freq, **kwargs)
        _check_fit_arguments(self, dataset, validation_data, steps_per_epoch,
                             validation_split, class_weight)
        elastic_validation = isinstance(validation_data, ElasticDataset)
        cluster = get_cluster()
        checkpoint_callback, resume = resume_info(callbacks)
        request = dataset.registration(epochs)
        restore_from = _resume_request(request, resume)
        registered = cluster.master.register_dataset(request)
        start_epoch = max(initial_epoch, registered.epoch)
        local = resume if resume is not None and not restore_from else None
        sync = self._ke_prepare(dataset, restore_from=restore_from, local_restore=local,
                                resume=resume, adopt=True)
        if checkpoint_callback is not None:
            checkpoint_callback.mark_restored(resume, start_epoch, epochs)
        stream = TaskStream(cluster.master, dataset.name, dataset.source,
                            cluster.timer, start_epoch=start_epoch,
                            shuffle_records=dataset.shuffle, seed=dataset.seed)
        _exactly_once(self, dataset, sync, stream)
        tf_dataset = dataset.build(stream.generator)
        stream.segmented = True
        validate = None
        if elastic_validation:
            def validate(epoch: int) -> dict[str, float] | None:
                if not _should_eval(epoch, validation_freq):
                    return None
                logs = self._ke_evaluate(validation_data, eval_round=epoch,
                                         after=dataset.name)
                return {f"val_{k}": v for k, v in logs.items()}
        callbacks = per_worker_tensorboard(callbacks, cluster, elastic_validation)
        reporter = TaskReporter(stream, self._ke.trained_seq, sync, validate)
        self._ke_set_tagged(True)
        if start_epoch >= epochs:
            logging.info("keras_elastic: the job is already past epoch %d", epochs)
        try:
            with elastic_epochs(segmented={id(tf_dataset): stream.end_segment}):
                history = super().fit(
                    tf_dataset, epochs=epochs, verbose=verbose,
                    callbacks=[reporter] + list(callbacks or []),
                    validation_data=None if elastic_validation else validation_data,
                    validation_freq=validation_freq, initial_epoch=start_epoch,
                    shuffle=False,
                    **kwargs)
        except tf.errors.OpError as e:
            if stream.error is not None:
                raise stream.error from None
            refused = sync.hyperparameters and sync.hyperparameters.error
            if refused:  # an optimizer change the servers cannot follow
                sync.drop_push()
                raise refused from None
            raise e
        except BaseException:
            sync.drop_push()
            raise
        finally:
            stream.stop()
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
        return history


    # -- evaluate ---------------------------------------------------------
    def _ke_evaluate(self, dataset: ElasticDataset, eval_round: int | None = None,
                     after: str = "", callbacks=None, verbose=0) -> dict[str, float]:
        from keras_elastic.worker.evaluation import evaluate_elastic

        if dataset.mode != "evaluation":
            raise ValueError(f"evaluate() needs an ElasticDataset in 'evaluation' "
                             f"mode; '{dataset.name}' is in '{dataset.mode}' mode.")
        if getattr(self, "compiled", False) is False:
            raise ValueError("compile the model (loss and metrics) before evaluate: "
                             "model.compile(loss=..., metrics=[...])")
        cluster = get_cluster()
        request = dataset.registration(num_epochs=0)
        request.after_dataset = after
        cluster.master.register_dataset(request)
        state = self._ke
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
        self._ke_prepare(dataset)  # builds if needed; loads the newest model
        stream = TaskStream(cluster.master, dataset.name, dataset.source, cluster.timer,
                            start_epoch=eval_round)
        with elastic_epochs():
            return evaluate_elastic(self, dataset, stream, eval_round,
                                    callbacks=callbacks, verbose=verbose)

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto",
                 sample_weight=None, steps=None, callbacks=None, return_dict=False,
                 **kwargs):
        if not isinstance(x, ElasticDataset):
            # Only train_step reads the tag: Keras' own validation inside an
            # elastic fit must not retrace the elastic train function.
            return super().evaluate(x, y, batch_size=batch_size, verbose=verbose,
                                    sample_weight=sample_weight, steps=steps,
                                    callbacks=callbacks, return_dict=return_dict,
                                    **kwargs)
        if steps is not None:
            raise ValueError("steps cannot be set with an ElasticDataset: evaluation "
                             "covers the whole dataset once.")
        logs = self._ke_evaluate(x, callbacks=callbacks,
                                 verbose=1 if verbose == "auto" else verbose)
        if return_dict:
            return logs
        values = list(logs.values())
        return values[0] if len(values) == 1 else values

    # -- predict ----------------------------------------------------------
    def predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None,
                **kwargs):
        from keras_elastic.prediction.writer import NumpyWriter
        from keras_elastic.worker.prediction import predict_elastic

        if not isinstance(x, ElasticDataset):
            return super().predict(x, batch_size=batch_size, verbose=verbose,
                                   steps=steps, callbacks=callbacks, **kwargs)
        if x.mode != "prediction":
            raise ValueError(f"predict() needs an ElasticDataset in 'prediction' mode; "
                             f"'{x.name}' is in '{x.mode}' mode.")
        if steps is not None:
            raise ValueError("steps cannot be set with an ElasticDataset")
        cluster = get_cluster()
        cluster.master.register_dataset(x.registration(num_epochs=0))
        state = self._ke
        prediction_round = state.eval_rounds.get(x.name, 0)  # as in evaluate()
        state.eval_rounds[x.name] = prediction_round + 1
        self._ke_prepare(x)
        writer = x.output_writer or (NumpyWriter(x.output_dir) if x.output_dir else None)
        stream = TaskStream(cluster.master, x.name, x.source, cluster.timer,
                            start_epoch=prediction_round)
        stream.set_epoch(prediction_round)
        with elastic_epochs():
            return predict_elastic(self, x, stream, writer, keep=writer is None,
                                   callbacks=callbacks,
                                   verbose=1 if verbose == "auto" else verbose)


def _weigh(sample_weight, live: tf.Tensor):
    """Sample weights times `live` (one weight per element of the batch)."""
    if sample_weight is None:
        return live

    def times(w):
        w = tf.convert_to_tensor(w)
        shape = tf.concat([tf.shape(live), tf.ones([tf.rank(w) - 1], tf.int32)], 0)
        return w * tf.cast(tf.reshape(live, shape), w.dtype)

    return tf.nest.map_structure(times, sample_weight)


def _check_fit_arguments(model, dataset: ElasticDataset, validation_data,
                         steps_per_epoch, validation_split, class_weight) -> None:
    """Errors for `fit` arguments that do not apply to an ElasticDataset."""
    if getattr(model, "optimizer", None) is None:
        raise ValueError("compile the model (with an optimizer) before fit: "
                         "model.compile(optimizer=..., loss=...)")
    if dataset.mode != "training":
        raise ValueError(f"fit() needs an ElasticDataset in 'training' mode; "
                         f"'{dataset.name}' is in '{dataset.mode}' mode.")
    if steps_per_epoch is not None:
        raise ValueError("steps_per_epoch cannot be set with an ElasticDataset: an "
                         "epoch is one pass over the data, decided by the master.")
    if validation_split:
        raise ValueError("validation_split is not supported with an "
                         "ElasticDataset: pass validation_data instead.")
    if class_weight is not None:
        raise ValueError("class_weight is not supported with an ElasticDataset: "
                         "return sample weights from dataset_fn instead.")
    if isinstance(validation_data, ElasticDataset):
        if validation_data.mode != "evaluation":
            raise ValueError("validation_data must be an ElasticDataset in 'evaluation' "
                             f"mode; '{validation_data.name}' is in "
                             f"'{validation_data.mode}' mode.")
        if validation_data.name == dataset.name:
            raise ValueError(f"the training and validation datasets are both named "
                             f"'{dataset.name}': give them different names.")


def _exactly_once(model, dataset: ElasticDataset, sync: ModelSync,
                  stream: TaskStream) -> None:
    """Links the training stream and the model's PS link for exactly-once
    updates: claims, replays, abandoned tasks, flushes (see worker/replay.py)."""
    from keras_elastic.worker.replay import Replayer

    dataset.check_deterministic()
    sync.stream = stream
    replayer = Replayer(model, dataset, sync)
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
    return resume.path


def _should_eval(epoch: int, validation_freq) -> bool:
    if isinstance(validation_freq, int):
        return (epoch + 1) % validation_freq == 0
    return epoch + 1 in validation_freq


class Model(ElasticTrainerMixin, keras.Model):
    """A `keras.Model` that trains on the elastic cluster.

    Example:

    ```python
    inputs = keras.Input((8,))
    model = ke.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    model.fit(ke.ElasticDataset((x, y), batch_size=16), epochs=2)
    ```
    """

    # Keras turns a `keras.Model` subclass called with (inputs, outputs) into
    # a functional one by rewriting the `__bases__` of every class up to
    # `keras.Model`: done to `ke.Model`, that would make every later subclass
    # of `ke.Model` functional (`super().__init__()` then fails for want of
    # inputs). As Keras does for `keras.Model`, `ke.Model(inputs, outputs)`
    # builds an instance of a functional subclass instead, and a subclass of
    # `ke.Model` used functionally is rebased on that subclass.
    def __new__(cls, *args, **kwargs):
        if cls is Model and functional_init_arguments(args, kwargs):
            return _FunctionalModel.__new__(_FunctionalModel, *args, **kwargs)
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, *args, **kwargs):
        if not functional_init_arguments(args, kwargs):
            super().__init__(*args, **kwargs)
            return
        if type(self) is Model:  # made by Model.__new__(Model) without arguments
            self.__class__ = _FunctionalModel
        elif not isinstance(self, Functional):
            _inject_functional_model(type(self))
        Trainer.__init__(self)
        if len(args) < 3 and kwargs.get("name") is None:
            kwargs["name"] = auto_name("model")   # as before: not "_functional_model"
        Functional.__init__(self, *args, **kwargs)


class _FunctionalModel(Model, Functional):
    """`ke.Model(inputs, outputs)`: a functional `ke.Model`."""


def _inject_functional_model(cls: type) -> type:
    """Keras' `inject_functional_model_class`, stopping at `ke.Model`."""
    if cls is Model:
        return _FunctionalModel
    if cls is object or not issubclass(cls, Model):
        return cls
    cls.__bases__ = tuple(_inject_functional_model(b) for b in cls.__bases__)
    return cls


class Sequential(ElasticTrainerMixin, keras.Sequential):
    """A `keras.Sequential` that trains on the elastic cluster.

    Example:

    ```python
    model = ke.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, batch_size=16, epochs=2)   # arrays become an ElasticDataset
    ```
    """


_WRAPPED: dict[type, type] = {}


def _check_exchange(exchange: str) -> str:
    if exchange not in EXCHANGES:
        raise ValueError(f"exchange={exchange!r}: choose one of {list(EXCHANGES)} "
                         "('sync' waits for each push; 'pipelined' overlaps it "
                         "with the next step)")
    return exchange


def wrap(model: keras.Model, ps_embeddings_above: int | None = None,
         exchange: str | None = None) -> keras.Model:
    """Makes an existing Keras model train on the elastic cluster, in place.

    Works for functional, sequential and subclassed models; the model keeps
    its class (as a base), layers, weights and compile state.

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
    ```
    """
    if not isinstance(model, keras.Model):
        raise TypeError(f"ke.wrap expects a keras.Model, got {type(model).__name__}")
    if ps_embeddings_above is not None:
        convert_embeddings(model, ps_embeddings_above)
    if exchange is not None:
        exchange = _check_exchange(exchange)
    if isinstance(model, ElasticTrainerMixin):
        if exchange is not None:
            model._ke.exchange = exchange
        return model
    cls = type(model)
    elastic_cls = _WRAPPED.get(cls)
    if elastic_cls is None:
        elastic_cls = type(f"Elastic{cls.__name__}", (ElasticTrainerMixin, cls),
                           {"__module__": cls.__module__})
        _WRAPPED[cls] = elastic_cls
    model.__class__ = elastic_cls
    if exchange is not None:
        model._ke.exchange = exchange
    if getattr(model, "compiled", False):
        model._ke.jit_compile = bool(model.jit_compile)
        model.jit_compile = False
    return model

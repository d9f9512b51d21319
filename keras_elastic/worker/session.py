"""A model's elastic session: the one owner of its elastic state.

Every elastic model (`ke.wrap`, `ke.Model`, `ke.Sequential`) has one
`ElasticSession`, made when the model becomes elastic and found with
`session_of(model)`. It holds everything keras-elastic keeps for the model
between calls (the link to the parameter servers, the compiled steps, the
evaluation rounds, a restore requested before the model connected) and runs
the elastic parts of `fit`, `evaluate` and `predict`:

- `connect(dataset)`: builds the model from the dataset's spec and links it
  to the parameter servers (`ModelSync`);
- `fit(dataset, ...)`: registers the dataset, wires the training stream to
  the model for exactly-once updates (`TrainingHooks`, given to the stream
  when it is made), and runs Keras' own loop over the task-fed pipeline;
- `evaluate_round(dataset, ...)` and `predict(dataset, ...)`.

`keras_elastic/model.py` is the Keras glue (what arguments mean, which
methods an elastic model gets) and delegates here. Callbacks and checkpoint
code use the session's public methods (`model_version`, `restore`,
`push_local_values`, `connected`), never its attributes.

Example:

```python
model = ke.wrap(model)
session = session_of(model)
model.fit(train, epochs=2)
print(session.model_version())   # the servers' version of the model
```
"""

from __future__ import annotations

import dataclasses
import gc
import weakref
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf
from absl import logging

from keras_elastic.checkpoint import ps_layout
from keras_elastic.common import faults, keras_compat
from keras_elastic.common.variable_keys import namespace
from keras_elastic.data.describe import describe_compile
from keras_elastic.dataset import ElasticDataset
from keras_elastic.layers import embedding as embedding_module
from keras_elastic.layers.embedding import Embedding
from keras_elastic.worker import chief, remote_optimizer
from keras_elastic.worker.checkpoint_resume import resume_info
from keras_elastic.worker.cluster import get_cluster, is_chief
from keras_elastic.worker.model_sync import ModelSync
from keras_elastic.worker.task_reporter import JobMetrics, TaskReporter
from keras_elastic.worker.task_stream import TaskStream
from keras_elastic.worker.tensorboard import per_worker as per_worker_tensorboard
from keras_elastic.worker.train_function import TrainFunction

_ATTRIBUTE = "_ke_session"


def _restore_servers(model: Any, path: str) -> None:
    """`ke.checkpoint.restore_model` of a parameter-server checkpoint into an
    elastic model: its servers take the whole checkpoint too."""
    session = session_of(model)
    if session is not None:
        session.restore(path)


ps_layout.RESTORE_LISTENERS.append(_restore_servers)


def session_of(model: Any) -> ElasticSession | None:
    """The elastic session of `model`, or None for a model that is not
    elastic.

    >>> session_of(keras.Sequential()) is None
    True
    """
    attributes = getattr(model, "__dict__", None)
    return attributes.get(_ATTRIBUTE) if isinstance(attributes, dict) else None


def start_session(model: keras.Model) -> ElasticSession:
    """Gives `model` its session (kept out of Keras' attribute tracking);
    the existing one if it has one."""
    session = session_of(model)
    if session is None:
        session = ElasticSession(model)
        object.__setattr__(model, _ATTRIBUTE, session)
        _ELASTIC_MODELS.add(model)
    return session


# Every elastic model of the process (weakly): where a `ke.layers.Embedding`
# called before its model connected finds that model (`_connect_owner`).
_ELASTIC_MODELS: weakref.WeakSet = weakref.WeakSet()


def _connect_owner(layer: Embedding) -> bool:
    """Connects the elastic model `layer` belongs to (its first call, on
    arrays or tensors, came before any fit, evaluate or predict); False if no
    elastic model holds it."""
    for model in list(_ELASTIC_MODELS):
        if any(candidate is layer
               for candidate in keras_compat.all_layers(model, include_self=False)):
            session_of(model).connect_for_tables()
            return True
    return False


embedding_module.UNCONNECTED_HOOKS.append(_connect_owner)


class ElasticSession:
    """A model's elastic state, and the elastic parts of its fit, evaluate and
    predict (see the module doc)."""

    def __init__(self, model: keras.Model) -> None:
        self.model = model
        self.sync: ModelSync | None = None
        self.runtime: TrainFunction | None = None   # during an elastic fit
        self.jit_compile = False
        self.exchange = "sync"       # see compile(exchange=...)
        self._eval_step = None       # compiled test_step / predict_step
        self._predict_step = None
        self._fit: _Fit | None = None  # the running elastic fit
        self._rounds: dict[str, int] = {}  # dataset -> next standalone round
        # A parameter-server checkpoint the servers load when the model first
        # connects to them (set by ke.checkpoint.restore_model).
        self._restore_from = ""
        # A built model without ke.layers.Embedding (`connect_for_tables`).
        self._without_tables = False

    # -- what callbacks and checkpoint code ask ---------------------------
    @property
    def connected(self) -> bool:
        """Whether the model is linked to the parameter servers."""
        return self.sync is not None

    @property
    def training(self) -> bool:
        """Whether an elastic `fit` of the model is running."""
        return self.runtime is not None

    def model_version(self) -> int:
        """The servers' version of the model (pushes applied)."""
        if self.sync is None:
            raise ValueError("the model is not connected to parameter servers: "
                             "call fit, evaluate or predict on an ElasticDataset")
        return self.sync.model_version()

    def restore(self, path: str) -> None:
        """The servers take the parameter-server checkpoint at `path`: at once
        (and the model their values) if connected, else when it connects."""
        if self.sync is None:
            self._restore_from = path
        else:
            self.sync.ps.restore_all(path)
            self.sync.pull()
            if self.sync.watch is not None:
                self.sync.watch.discard()  # (the values just restored, not new ones)

    def pull(self) -> None:
        """The model takes the servers' newest values (if connected)."""
        if self.sync is not None:
            self.sync.pull()

    def push_local_values(self) -> None:
        """The servers take the model's values (a model trained or restored
        outside the cluster, in this process: an embedded cluster only)."""
        if self.sync is not None and self.sync.ps is get_cluster().ps:
            self.sync.push_values()

    def compile_description(self) -> str:
        """The model as compiled (`describe_compile`): every worker's must be
        the job's."""
        return describe_compile(self.model, remote_optimizer.optimizers_of(self.model))

    def compiled(self) -> None:
        """The model was compiled (again): its steps are traced anew, with the
        new loss and metrics (Keras' compile drops its own functions too)."""
        self._eval_step = self._predict_step = None

    def eval_step(self) -> Callable:
        """The model's `test_step`, compiled once."""
        if self._eval_step is None:
            self._eval_step = tf.function(self.model.test_step,
                                          jit_compile=self.jit_compile,
                                          reduce_retracing=True)
        return self._eval_step

    def predict_step(self) -> Callable:
        """The model's `predict_step`, compiled once."""
        if self._predict_step is None:
            self._predict_step = tf.function(self.model.predict_step,
                                             jit_compile=self.jit_compile,
                                             reduce_retracing=True)
        return self._predict_step

    def next_round(self, dataset: str) -> int:
        """The k-th standalone evaluate (or predict) of `dataset` in this
        process is round k: a worker relaunched (or joining) after round k
        ended gets its result at once instead of starting a round nobody
        else takes part in."""
        k = self._rounds.get(dataset, 0)
        self._rounds[dataset] = k + 1
        return k

    # -- connecting -------------------------------------------------------
    def connect(self, dataset: ElasticDataset, restore_from: str = "",
                local_restore=None, resume=None, adopt: bool = False,
                before_init: Callable[[keras.Model], None] | None = None) -> ModelSync:
        """Builds the model from the dataset spec and syncs it with the PS.

        `restore_from`: a parameter-server checkpoint the servers load when
        they initialize. `local_restore`: a plain checkpoint loaded into this
        model first (whose values then initialize the servers). `adopt` (the
        start of a `fit` whose job is not past the epoch this worker starts
        at): take the servers' learning rate into the optimizer unless it
        was changed here since (a worker that joins a job that lowered it in
        an earlier phase trains on with the lowered rate). A worker that
        comes to a fit late keeps its own: it runs every epoch's callbacks
        (the epochs already over end at once, with the job's metrics), so its
        `ReduceLROnPlateau` lowers the rate as the others' did; taken from
        the servers first, it was lowered twice. `before_init(model)`: called
        once the model is built, before the local restore and the servers'
        initialization (a `BackupAndRestore` backup's weights: see
        worker/file_callbacks.py).
        """
        model = self.model
        cluster = get_cluster()
        _build(model, dataset)
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
        reached = self._sync_point(cluster, "start a fit, evaluate or predict call "
                                   "as this worker did")
        # A follower of a live chief takes the rates the servers had when the
        # phase began: the chief may have changed them in it already. The
        # chief (also one that took over, or a worker whose chief finished
        # its script: the phase is its own) takes those of now.
        follower = adopt and chief.follows_live_chief(cluster)
        if follower:
            faults.reached("follower_sync")
        if self.sync is None or self.sync.ps is not cluster.ps:
            self._link(cluster, restore_from, adopt, at_phase_start=follower)
        elif self.sync.outdated():
            self._relink(cluster)
        else:
            self.sync.pull()
            if adopt:
                self.sync.adopt_hyperparameters(at_phase_start=follower)
        reached()
        remote_optimizer.attach(model, self.sync)
        self.sync.exchange_mode = self.exchange
        return self.sync

    def _sync_point(self, cluster, what: str) -> Callable[[], None]:
        """A point where every worker takes the job's weights: the start of a
        phase (a fit, an evaluation round, a predict) and the end of a fit.
        What the script assigned to the weights since the last one reaches
        the servers first, the chief's (worker/assignments.py: its
        assignment is the job's); every other worker forgets its own and
        waits until the chief has passed the point, so that it takes the
        same values. The chief sends an assignment only once every other
        worker has passed the previous point (took its values). Returns what
        to call once this worker has taken the point's values.

        Every worker passes the same points in the same order (it runs the
        same script): the n-th point is the mark `("sync", n)`.
        """
        point = _next_sync_point(cluster)
        sync = self.sync
        if cluster.embedded:
            if sync is not None:
                sync.publish_assignments(chief=True)
            return lambda: None
        if is_chief(cluster) or chief.wait_for_chief(
                cluster, "sync", point, what=what):
            if sync is not None and sync.watch is not None and sync.watch.pending:
                chief.wait_for_workers(cluster, "sync", point - 1,
                                       what="take the weights of the last phase")
                sync.publish_assignments(chief=True)
        elif sync is not None and sync.watch is not None:
            sync.watch.discard()
        return lambda: chief.reach(cluster, "sync", point)

    def _abandon_sync_point(self, cluster) -> None:
        """This worker's fit raised before the sync point of its end (a
        callback's error, TerminateOnNaN(raise_error=True) on the batches it
        trained): the point is passed without taking values, so that every
        worker still counts the same points, and its mark is reached, so
        that no other worker waits for it (a script that catches the error
        goes on in step with the others)."""
        point = _next_sync_point(cluster)
        if not cluster.embedded:
            chief.reach(cluster, "sync", point)

    def _link(self, cluster, restore_from: str = "", adopt: bool = False,
              at_phase_start: bool = False) -> None:
        """A `ModelSync` of the (built) model with the cluster's servers,
        which it initializes (first worker wins) and takes its values from."""
        self.sync = ModelSync(self.model, cluster.ps, cluster.timer,
                              namespace=_next_namespace(cluster),
                              local_store=cluster.local_store(),
                              chief=lambda: is_chief(cluster))
        self.sync.exchange_mode = self.exchange
        self.sync.initialize(restore_from or self._restore_from, adopt,
                             at_phase_start=at_phase_start)
        self._restore_from = ""

    def _relink(self, cluster) -> None:
        """The model changed what its servers were given (`ModelSync.outdated`:
        compiled with another optimizer, a layer's `trainable` changed): the
        servers take it anew, as Keras' compile starts a new optimizer. A
        store in this process holds the model's own variables again; remote
        servers get the model in a new namespace, initialized from its
        values now (the last phase's, with the chief's assignments: the
        first worker to link wins, and every other worker waited for the
        chief)."""
        old = self.sync
        if old.tables:
            raise ValueError(
                f"{type(self.model).__name__} has ke.layers.Embedding tables on the "
                "parameter servers and was compiled again with another optimizer, or "
                "a layer's trainable flag changed, after it trained: keras_elastic "
                "cannot move its tables' rows to a new optimizer. Compile it (and set "
                "trainable) once, before its first fit.")
        if old.shared:
            old.flush()
            old.reshare()
            return
        old.close()
        self._link(cluster)

    def connect_for_tables(self, x=None) -> None:
        """Connects a model with `ke.layers.Embedding` tables (their rows live
        on the servers) before its first `predict`, `evaluate` or call on
        arrays or tensors `x`, as `fit` would: built from `x`'s spec if
        needed, on the embedded cluster or the job's. A model without server
        tables, or already connected, is left as it is (it predicts with its
        own weights, as Keras does)."""
        model = self.model
        if self.sync is not None or self._without_tables:
            return
        if not any(isinstance(layer, Embedding)
                   for layer in keras_compat.all_layers(model, include_self=False)):
            # Known for good once built (an eager call asks at every call).
            self._without_tables = bool(getattr(model, "built", False))
            return
        if x is not None and not all(layer.built
                                     for layer in keras_compat.all_layers(model)):
            keras_compat.build_from_input_spec(model, tf.nest.map_structure(
                lambda a: tf.TensorSpec((None, *a.shape[1:]), a.dtype),
                tf.nest.map_structure(tf.convert_to_tensor, x)))
        unbuilt = [layer.name for layer in keras_compat.all_layers(model)
                   if not layer.built]
        if unbuilt:
            raise ValueError(
                f"{type(model).__name__} has ke.layers.Embedding tables on the "
                f"parameter servers but its layers {unbuilt[:5]} are not built: build "
                "it (model.build(input_shape), or call predict on arrays) before "
                "calling it, so that every weight exists when the servers take it")
        if getattr(model, "optimizer", None) is None:
            raise ValueError(
                f"{type(model).__name__} has ke.layers.Embedding tables on the "
                "parameter servers, which need the model compiled (its optimizer "
                "updates the rows): call model.compile(...) before predict or "
                "evaluate")
        self._link(get_cluster())
        remote_optimizer.attach(model, self.sync)

    # -- fit ----------------------------------------------------------------
    def fit(self, keras_fit: Callable, dataset: ElasticDataset,
            validation: Any, *, epochs: int, verbose: Any,
            job_callbacks: Any, call: str, initial_epoch: int = 0,
            steps_per_epoch: int | None = None, validation_steps: int | None = None,
            validation_freq: Any = 1, **kwargs) -> keras.callbacks.History:
        """Trains on `dataset` (registered under its phase's name) with Keras'
        own loop `keras_fit`. `validation`: an `ElasticDataset` in evaluation
        mode (exact, shared by the workers), Keras' own validation data, or
        None. `job_callbacks`: the script's callbacks as this worker runs
        them (`worker/file_callbacks.JobCallbacks`); `call`: the user's call,
        quoted if workers differ."""
        model, cluster = self.model, get_cluster()
        callbacks = job_callbacks.callbacks
        checkpoint_callback, resume = resume_info(callbacks)
        request = dataset.registration(
            epochs, records_per_epoch=_steps_taken(model, steps_per_epoch)
            * dataset.batch_size, call=call, model=self.compile_description())
        restore_from = _resume_request(request, resume)
        if job_callbacks.resume_epoch and not request.resume:  # a BackupAndRestore
            request.resume, request.resume_epoch = True, job_callbacks.resume_epoch
        if initial_epoch and not request.resume:
            request.resume, request.resume_epoch = True, int(initial_epoch)
        registered = cluster.master.register_dataset(request)
        dataset.registered(registered)
        # From the user's first epoch, not the job's current one: a worker that
        # comes to this fit late (the others trained its first epochs while
        # it evaluated or predicted, or it joined the job since) ends each
        # epoch already over at once, with the job's metrics, so every
        # worker's History and callbacks (EarlyStopping, ReduceLROnPlateau)
        # see the same epochs. Only a resumed dataset starts later: the
        # epochs before its resume have no result here.
        start_epoch = max(initial_epoch, registered.first_epoch)
        if min(registered.epoch, epochs) > start_epoch:
            logging.info("keras_elastic: dataset '%s' is %s; this worker ends epochs "
                         "%d-%d at once, with the job's metrics", dataset.name,
                         f"at epoch {registered.epoch + 1}" if registered.epoch < epochs
                         else "done", start_epoch + 1, min(registered.epoch, epochs))
        local = resume if resume is not None and not restore_from else None
        sync = self.connect(dataset, restore_from=restore_from, local_restore=local,
                            resume=resume, adopt=registered.epoch <= start_epoch,
                            before_init=job_callbacks.restore_weights)
        if checkpoint_callback is not None:
            checkpoint_callback.mark_restored(resume, start_epoch, epochs)
        dataset.check_deterministic()
        job_metrics = JobMetrics()
        hooks = TrainingHooks(self, dataset, job_metrics)
        stream = TaskStream(cluster.master, dataset.name, dataset.source,
                            cluster.timer, start_epoch=start_epoch,
                            shuffle_records=dataset.shuffle, seed=dataset.seed,
                            hooks=hooks, segmented=True)
        tf_dataset = dataset.build(stream.generator)
        runtime = TrainFunction(model, sync, stream, tf_dataset.element_spec)
        sync.begin_training(stream)
        # An ElasticDataset as validation_data goes to Keras' own loop as it
        # is: Keras calls the model's evaluate with the fit's callbacks at each
        # epoch's end (its hooks, validation_freq, validation_steps, the val_
        # logs), and the model's evaluate runs the round (`validate`).
        elastic_validation = isinstance(validation, ElasticDataset)
        callbacks = per_worker_tensorboard(callbacks, cluster, elastic_validation)
        reporter = TaskReporter(stream, lambda: runtime.trained_seq, sync, job_metrics)
        if start_epoch >= epochs:
            logging.info("keras_elastic: the job is already past epoch %d", epochs)
        self.runtime = runtime
        self._fit = _Fit(dataset.name, call, reporter)
        keras_compat.reset_fit_state(model)
        try:
            with keras_compat.elastic_epochs(
                    segmented={id(tf_dataset): stream.end_segment},
                    evaluated_by_model=[validation] if elastic_validation else ()):
                history = keras_fit(
                    tf_dataset, epochs=epochs, verbose=verbose,
                    callbacks=[reporter] + _callback_items(callbacks),
                    validation_data=validation, validation_freq=validation_freq,
                    validation_steps=validation_steps, initial_epoch=start_epoch,
                    shuffle=False, **kwargs)
        except tf.errors.OpError as e:
            # The push in flight (pipelined exchange: the step before the one
            # that failed) ends before `fit` raises, whatever its outcome, so
            # no update of this fit reaches the servers after it returned.
            sync.drop_push()
            self._abandon_sync_point(cluster)
            if stream.error is not None:
                raise stream.error from None
            refused = next((s.error for s in sync.hyperparameter_syncs.values()
                            if s.error is not None), None)
            if refused:  # an optimizer change the servers cannot follow
                raise refused from None
            raise e
        except BaseException:
            sync.drop_push()
            self._abandon_sync_point(cluster)
            raise
        finally:
            self.runtime = None
            self._fit = None
            model.train_function = None
            stream.stop()
            job_callbacks.close()  # this worker's temporary files, also on failure
            del tf_dataset
            gc.collect()  # free the epoch's tf.data iterators now, not at exit
        # A learning rate set after the last push (e.g. by ReduceLROnPlateau at
        # the last epoch's end) still reaches the servers: what they hold is
        # what a worker connecting next takes.
        sync.send_hyperparameters()
        if not model.stop_training:
            # Other workers may still be training their last tasks: wait for
            # the job's last epoch to complete, then take the final model.
            cluster.master.wait_for_epoch(dataset.name, epochs)
        else:
            reporter.give_back_unfinished()
        # What the script assigned to the weights during the fit (a callback
        # restoring the best epoch's: EarlyStopping(restore_best_weights=True))
        # reaches the servers, the chief's: every worker returns from fit with
        # the same final weights.
        if sync.uses_moving_averages():
            # Keras' fit ends with the weights' moving averages in the model
            # (use_ema=True): the servers' (its own finalize took this
            # worker's stale copies), which the chief's assignment makes the
            # job's weights.
            sync.pull_optimizer_state()
            sync.finalize_moving_averages()
        reached = self._sync_point(cluster, "end the fit as this worker did")
        sync.pull()
        reached()
        sync.pull_optimizer_state()  # what Keras saves of the model next
        if sync.pipelined and sync.lookups.steps:
            logging.info("keras_elastic: the rows of %d of %d steps were looked up "
                         "ahead (while the step before computed)",
                         sync.lookups.steps_ahead, sync.lookups.steps)
        faults.reached("fit_end")
        return history

    # -- evaluate and predict -----------------------------------------------
    def validate(self, dataset: ElasticDataset, steps: int | None = None,
                 callbacks=None) -> dict[str, float]:
        """The validation of the running `fit` at the end of its current
        epoch, as Keras' loop asks for it (the model's `evaluate`, given the
        fit's callbacks): round `epoch` of `dataset` once the job's epoch is
        over (this worker's tasks of it are reported first), the first
        `steps` batches if set."""
        fit = self._fit
        if fit is None:
            raise RuntimeError("validate() is called by Keras' fit loop only")
        if steps:  # as Keras: the first `steps` batches, each time
            dataset = dataset.take(int(steps))
        epoch = fit.reporter.epoch
        if self.model.stop_training:
            # Stopped in the middle of the epoch (TerminateOnNaN, a callback):
            # the job's epoch is not over, so its round (which waits for the
            # epoch's end) cannot start. Keras validates the model as it is:
            # a round of its own, which the workers that stopped share. The
            # tasks it holds go back to the others first (they wait on them).
            fit.reporter.give_back_unfinished()
            return self.evaluate_round(dataset.renamed(f"{dataset.name}#stopped@{epoch}"),
                                       eval_round=0, callbacks=callbacks, call=fit.call)
        fit.reporter.end_training_epoch()
        return self.evaluate_round(dataset, eval_round=epoch, after=fit.dataset,
                                   callbacks=callbacks, call=fit.call)

    def evaluate_round(self, dataset: ElasticDataset, eval_round: int | None = None,
                       after: str = "", callbacks=None, verbose=0,
                       call: str = "") -> dict[str, float]:
        """Evaluates round `eval_round` of `dataset` (an `ElasticDataset` in
        evaluation mode) with this worker taking part; returns the job's logs.
        None: the next round of this model (its k-th evaluate is round k).
        `after`: a training dataset whose epoch `eval_round` must end first.
        `call`: the user's call, quoted if workers differ."""
        from keras_elastic.worker.evaluation import evaluate_elastic

        model = self.model
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
        if eval_round is None:
            eval_round = self.next_round(dataset.name)
        if after:
            # Wait for the training epoch's end before pulling the model: every
            # worker then evaluates the same weights.
            cluster.master.wait_for_epoch(after, eval_round + 1)
        sync = self.connect(dataset)  # builds if needed; loads the newest model
        if sync.uses_moving_averages():
            # The weights' moving averages (use_ema=True) are the servers':
            # keras.callbacks.SwapEMAWeights swaps in the job's, not the ones
            # this worker pulled at an earlier epoch's end.
            sync.pull_optimizer_state()
        stream = TaskStream(cluster.master, dataset.name, dataset.source, cluster.timer,
                            start_epoch=eval_round)
        with keras_compat.elastic_epochs():
            return evaluate_elastic(model, self.eval_step(), dataset, stream,
                                    eval_round, callbacks=callbacks, verbose=verbose)

    def predict(self, dataset: ElasticDataset, call: str, callbacks=None,
                verbose=0):
        """Predicts this worker's tasks of `dataset` (an `ElasticDataset` in
        prediction mode): each task's outputs written once (its
        `output_dir` or `output_writer`), or kept and returned without one."""
        from keras_elastic.prediction.writer import NumpyWriter
        from keras_elastic.worker.prediction_loop import predict_elastic

        cluster = get_cluster()
        dataset.registered(cluster.master.register_dataset(dataset.registration(
            num_epochs=0, call=call)))
        prediction_round = self.next_round(dataset.name)  # as in evaluate()
        self.connect(dataset)
        writer = dataset.output_writer or (
            NumpyWriter(dataset.output_dir) if dataset.output_dir else None)
        stream = TaskStream(cluster.master, dataset.name, dataset.source, cluster.timer,
                            start_epoch=prediction_round)
        stream.set_epoch(prediction_round)
        with keras_compat.elastic_epochs():
            return predict_elastic(self.model, self.predict_step(), dataset, stream,
                                   writer, keep=writer is None, callbacks=callbacks,
                                   verbose=verbose)


class TrainingHooks:
    """What a training stream asks of the model it feeds, for exactly-once
    updates (`worker/task_stream.py` calls them; see worker/replay.py):
    claim a task on the servers, catch up a task some servers already hold
    part of, have buffered gradients applied before tasks are reported, and
    the metric states to send with a report."""

    def __init__(self, session: ElasticSession, dataset: ElasticDataset,
                 job_metrics: JobMetrics) -> None:
        self._session = session
        self._dataset = dataset
        self._job_metrics = job_metrics

    def claim(self, task) -> list | None:
        return self._session.sync.claim(task)

    def replay(self, replay) -> bool:
        """Runs on the training thread, between steps of the fit's train
        function (the session's runtime)."""
        from keras_elastic.worker.replay import Replayer

        session = self._session
        session.sync.flush()  # the push in flight first (pipelined exchange)
        return Replayer(session.model, self._dataset, session.sync, session.runtime,
                        session.sync.stream).run(replay)

    def flush(self) -> None:
        self._session.sync.flush()
        self._session.sync.ps.flush()

    def report_states(self) -> list | None:
        return self._job_metrics.report_states()


# -- helpers ------------------------------------------------------------------
def uses_compiled_loss(model: keras.Model) -> bool:
    """Whether Keras' default steps (and their compiled loss) are in use."""
    return keras_compat.uses_keras_train_step(model) or \
        keras_compat.compiled_loss(model) is not None


def _keras_steps_with_loss(model: keras.Model) -> bool:
    """Whether Keras' own steps compute a compiled loss (which needs labels)."""
    return keras_compat.uses_keras_train_step(model) and \
        keras_compat.compiled_loss(model) is not None


def _build(model: keras.Model, dataset: ElasticDataset) -> None:
    """Builds the model (and its compiled loss and metrics) from the dataset's
    spec, without taking data."""
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
                x, _, _ = keras_compat.unpack_x_y_sample_weight(dataset.batched_spec)
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


def _next_sync_point(cluster) -> int:
    """Counts the sync point this worker passes now (the n-th is mark
    `("sync", n)`); the pushes after it are of phase n (`PSClient.phase`:
    the servers keep their hyperparameters from before a phase's first
    change for the workers that start it late)."""
    point = cluster.__dict__.get("_ke_sync_points", 0) + 1
    cluster.__dict__["_ke_sync_points"] = cluster.ps.phase = point
    return point


def _next_namespace(cluster) -> str:
    """The namespace of the next model this process connects: a script may
    train several models (keras.io's guides build one per section); each
    keeps its own variables on the servers (common/variable_keys.py)."""
    k = cluster.__dict__.get("_ke_models", 0)
    cluster.__dict__["_ke_models"] = k + 1
    return namespace(k)


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


def _steps_taken(model: keras.Model, steps_per_epoch: int | None) -> int:
    """The batches an epoch of `steps_per_epoch` takes (0: the whole data):
    Keras' loop runs whole executions of `steps_per_execution` steps, so
    `steps_per_epoch=5` with 2 steps per execution takes 6 batches."""
    if not steps_per_epoch:
        return 0
    every = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
    return -(-int(steps_per_epoch) // every) * every


@dataclasses.dataclass
class _Fit:
    """The running elastic `fit` of a session: what its validation needs."""

    dataset: str         # the training dataset's registered name
    call: str            # the user's call, quoted if workers differ
    reporter: TaskReporter


def _callback_items(callbacks) -> list:
    """The callbacks given to `fit` as a list (a `keras.callbacks.CallbackList`
    gives its own)."""
    if isinstance(callbacks, keras.callbacks.CallbackList):
        return list(callbacks.callbacks)
    return list(callbacks or [])

"""Keeps a worker's Keras model in step with the parameter servers.

Each variable of the model gets a key that is stable across processes (its
position among the model's weights and its short name, not the layer names
Keras numbers per process), which decides its parameter server. `hand_over`
is what an optimizer's apply in the compiled train step calls (through
`tf.py_function`; see worker/remote_optimizer.py): the step's tensors become
one `Update` (ps/update.py: the gradients, the non-trainable values, the
optimizer's learning rate when the worker changed it), which the model's
exchange (worker/exchange.py) sends; it returns the newest value of every
variable.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Collection

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from keras_elastic.common import keras_compat
from keras_elastic.common.timing import PhaseTimer
from keras_elastic.common.variable_keys import model_variables, variable_keys
from keras_elastic.ps.client import PSClient
from keras_elastic.ps.hyperparameters import learning_rate_variable
from keras_elastic.ps.partition import elementwise, partition_bytes
from keras_elastic.ps.update import Update
from keras_elastic.worker.assignments import AssignmentWatch, assign_quietly
from keras_elastic.worker.exchange import Exchange, exchange_class
from keras_elastic.worker.hyperparameters import HyperparameterSync
from keras_elastic.worker.table_lookup import TableLookups, embedding_tables, sum_rows


class ModelSync:
    """The link between one model and the parameter servers."""

    def __init__(self, model: keras.Model, ps: PSClient, timer: PhaseTimer,
                 namespace: str = "", local_store=None,
                 chief: Callable[[], bool] = lambda: True) -> None:
        self.model = model
        self.ps = ps
        self.timer = timer
        # Whether this worker is the job's chief now (asked when the script
        # assigned weights: `publish_assignments`).
        self.chief = chief
        # The script's assignments to the model's weights (set_weights, a
        # callback restoring weights), noticed for the servers; None while
        # the servers hold the model's own variables (`shared`).
        self.watch: AssignmentWatch | None = None
        # The parameter server's store when it runs in this process (an
        # embedded cluster): it then holds this model's own variables and
        # optimizers (`ParameterStore.init_shared`), and the train step
        # applies its updates itself, the store keeping the task log
        # (`local_push`); nothing is copied or sent. None: over gRPC.
        self.local_store = local_store
        self.shared = False
        # The model's namespace on the servers ("" for the first model a
        # process connects, "m<k>/" after: common/variable_keys.py), and the
        # name of its own optimizer's group there.
        self.namespace = namespace
        self.main_group = namespace + "optimizer" if namespace else ""
        self._take_layout()
        self._values: dict[str, np.ndarray] = {}
        # update name -> the servers its pushes reach (noted when the step is
        # traced): who must hold each update's elements (worker/replay.py).
        self.updates: dict[str, frozenset[int]] = {}
        # update name -> the keys of its gradients; in the step's order.
        self.update_keys: dict[str, tuple[str, ...]] = {}
        self.tables = embedding_tables(model, namespace)
        # The rows of the model's server tables (worker/table_lookup.py).
        self.lookups = TableLookups(self)
        self.t_data = 0.0   # when the step's batch was ready (the step began)
        self._t_mark = 0.0  # the step's compute resumed (its start or last push)
        self.stream = None  # the training TaskStream (begin_training)
        # How the step's updates reach the servers (worker/exchange.py):
        # `model.compile(exchange=...)`'s mode, and whether the store is in
        # this process (`shared`), choose it (`exchanger`).
        self.exchange_mode = "sync"
        self._exchanger: Exchange | None = None
        # A replay's step runs (worker/replay.py): its pushes complete no task
        # of the pipeline (its task may be ahead of the batches trained).
        self.replaying = False
        # Each optimizer group's learning rate to the servers: "" is made by
        # initialize, the others at their first push.
        self.hyperparameter_syncs: dict[str, HyperparameterSync] = {}
        # The next step first takes what the servers changed (`refresh`): set
        # at the start of each epoch.
        self.refresh_due = False

    def _take_layout(self) -> None:
        """The model's variables as the servers hold them: trainable first,
        then non-trainable, keyed by position (common/variable_keys.py)."""
        model = self.model
        self.trainable = list(model.trainable_weights)
        self.non_trainable = list(model.non_trainable_weights)
        self.variables = model_variables(model)
        self.keys = variable_keys(model, self.namespace)
        self.trainable_keys = self.keys[:len(self.trainable)]
        self.non_trainable_keys = self.keys[len(self.trainable):]
        self._key_of = {id(v): k for k, v in zip(self.keys, self.variables)}
        # What the servers were initialized with (`outdated`).
        self._linked = self._identity()

    def reshare(self) -> None:
        """The model of a shared store (`shared`) changed what the store was
        given (`outdated`): the store takes its variables, under their keys
        now, and its optimizer anew (nothing to copy: they are the model's)."""
        optimizer = self.model.optimizer
        self._take_layout()
        self.updates.clear()
        self.update_keys.clear()
        self.hyperparameter_syncs = {self.main_group: HyperparameterSync(
            lambda: self.model.optimizer)}
        self.local_store.reshare(
            dict(zip(self.keys, self.variables)), optimizer,
            _jsonable(keras.optimizers.serialize(optimizer)),
            self.relative_names(optimizer), self.namespace)

    def _identity(self) -> tuple:
        """The variables, which of them are trainable, and the optimizers."""
        return (tuple(id(v) for v in model_variables(self.model)),
                tuple(v.trainable for v in model_variables(self.model)),
                tuple(sorted((g, id(o)) for g, o in self.optimizers().items())))

    def outdated(self) -> bool:
        """Whether the model changed what the servers were initialized with:
        a compile with another optimizer, a layer's `trainable` changed
        (keras.io's fine-tuning), weights added. The servers then need the
        model anew (`ElasticSession.connect` links it again)."""
        return self._identity() != self._linked

    def close(self) -> None:
        """This link is replaced by another (the model was linked anew)."""
        self.flush()
        if self.watch is not None:
            self.watch.close()
            self.watch = None

    @property
    def hyperparameters(self) -> HyperparameterSync | None:
        """The model optimizer's hyperparameter sync (None before initialize)."""
        return self.hyperparameter_syncs.get(self.main_group)

    def optimizers(self) -> dict[str, keras.optimizers.Optimizer]:
        """The model's optimizers by their group on the servers: the model's
        own is `main_group`, another one its attribute's name, in the
        model's namespace (see worker/remote_optimizer.py)."""
        from keras_elastic.worker.remote_optimizer import optimizers_of

        return {(self.namespace + attribute if attribute else self.main_group): o
                for attribute, o in optimizers_of(self.model).items()}

    def key_of(self, variable, group: str = "") -> str:
        """The key of a variable of the model; ValueError naming it (and the
        optimizer applying it) if it is not one."""
        key = self._key_of.get(id(variable))
        if key is None:
            raise ValueError(
                f"optimizer '{group or 'optimizer'}' was applied to variable "
                f"'{getattr(variable, 'path', variable)}', which is not a weight of "
                "the model: keras_elastic keeps the model's weights on the parameter "
                "servers, so an optimizer may update only those (track the layer "
                "that owns it as an attribute of the model)")
        return key

    def note_update(self, push) -> None:
        """An update of the step was traced: the servers its pushes reach."""
        servers = {i for k in push.grad_keys + tuple(self.non_trainable_keys)
                   for i in self.ps.servers_of(k)}
        if push.tables:
            servers = set(range(self.ps.num_ps))
        self.updates[push.update] = frozenset(servers)
        self.update_keys[push.update] = push.grad_keys

    def initialize(self, restore_from: str = "", adopt: bool = False,
                   at_phase_start: bool = False) -> None:
        """Initializes the PS with this model (first worker wins; it has the
        servers load the checkpoint `restore_from`, if any) and loads the PS's
        values into the model; `adopt`: and their learning rate, that of the
        phase's start if `at_phase_start` (see `adopt_hyperparameters`,
        `ElasticSession.connect`)."""
        optimizer = self.model.optimizer
        if optimizer is None:
            raise ValueError("the model must be compiled (with an optimizer) before "
                             "training on the elastic cluster: call model.compile().")
        config = keras.optimizers.serialize(optimizer)
        values = {k: (np.asarray(keras.ops.convert_to_numpy(v.value)), v.trainable)
                  for k, v in zip(self.keys, self.variables)}
        tables = {name: _jsonable(layer.table_spec())
                  for name, layer in self.tables.items()}
        if (self.local_store is not None and not tables
                and self.exchange_mode != "pipelined"):
            self._initialize_shared(optimizer, config, restore_from)
            return
        state = optimizer_state(optimizer, list(zip(self.trainable,
                                                    self.trainable_keys)))
        # Large variables are split over the servers only where every
        # optimizer of the model updates elementwise (a GAN's two included).
        split = all(elementwise(keras.optimizers.serialize(o))
                    for o in self.optimizers().values())
        self._values = self.ps.init(values, _jsonable(config), restore_from, tables,
                                    optimizer_state=state, namespace=self.namespace,
                                    partition_bytes=(partition_bytes()
                                                     if split else None))
        self.assign_all()
        self.watch = AssignmentWatch(self.variables, self.keys)
        self.hyperparameter_syncs[self.main_group] = HyperparameterSync(
            lambda: self.model.optimizer)
        if adopt:
            self.adopt_hyperparameters(at_phase_start)

    def _initialize_shared(self, optimizer, config, restore_from: str) -> None:
        """`initialize` with the store in this process: it takes this model's
        variables and optimizer themselves."""
        from keras_elastic.ps.checkpoint_part import restore_shard

        store = self.local_store
        store.init_shared(dict(zip(self.keys, self.variables)), optimizer,
                          _jsonable(config), self.relative_names(optimizer),
                          self.namespace)
        self.shared = True
        # Its fixed hyperparameters are checked before each step, as a push
        # would (worker/hyperparameters.py); the rate is the variable itself.
        self.hyperparameter_syncs[self.main_group] = HyperparameterSync(
            lambda: self.model.optimizer)
        if restore_from:
            restore_shard(store, 0, 1, restore_from)

    def relative_names(self, optimizer) -> dict[int, str]:
        """id(optimizer variable) -> its name on a server (see `server_name`)."""
        by_prefix = slot_prefixes(list(zip(self.trainable, self.trainable_keys)))
        return {id(v): server_name(v, by_prefix) for v in optimizer.variables}

    def model_version(self) -> int:
        """The model version (updates applied) of the servers, newest known
        to this worker: the shared store's own, else the last push replies'."""
        if self.shared:
            return int(self.local_store.version)
        return max(self.ps.versions)

    @property
    def exchanger(self) -> Exchange:
        """The exchange the step's updates take now (worker/exchange.py)."""
        kind = exchange_class(self.shared, self.exchange_mode)
        if type(self._exchanger) is not kind:
            if self._exchanger is not None:
                self._exchanger.finish()
            self._exchanger = kind(self)
        return self._exchanger

    @property
    def local(self) -> bool:
        """The train step applies its updates itself (a shared store; with
        it, exchange="pipelined" has no push to overlap)."""
        return self.exchanger.applies_in_step

    def local_allow(self, tags: np.ndarray) -> list[bool]:
        """Before a step whose updates the step applies itself (shared store):
        the task log's word on each of them (`InProcessExchange.allow`)."""
        return self.exchanger.allow(tags)

    def share_optimizer(self, group: str, optimizer, keys) -> None:
        """A group's optimizer seen at its first apply in the traced step:
        the shared store holds it (for checkpoints and status)."""
        with tf.init_scope():
            config = _jsonable(keras.optimizers.serialize(optimizer))
        self.local_store.share_optimizer(group, optimizer, config, list(keys),
                                         self.relative_names(optimizer))
        self.hyperparameter_syncs.setdefault(group, HyperparameterSync(lambda: optimizer))

    def hyperparameter_sync(self, push) -> HyperparameterSync | None:
        """The hyperparameter sync of the optimizer group `push.group`."""
        found = self.hyperparameter_syncs.get(push.group)
        if found is None and push.group:
            optimizer = self.optimizers().get(push.group)
            if optimizer is not None:
                found = self.hyperparameter_syncs[push.group] = HyperparameterSync(
                    lambda: optimizer)
        return found

    def send_hyperparameters(self) -> None:
        """Sends a learning rate changed after the last push (a callback at the
        end of the last epoch) to the servers not known to hold it, in an
        empty push (per optimizer group)."""
        if not self.hyperparameter_syncs or self.shared:
            return
        self.flush()
        for group, sync in list(self.hyperparameter_syncs.items()):
            wanted = sync.wanted()
            prefix = f"{group}/" if group else ""
            if any(known.get(prefix + k) != v for known in self.ps.server_hyperparameters
                   for k, v in wanted.items()):
                spec = self.group_specs.get(group)
                if group != self.main_group and spec is None:
                    continue  # never pushed: the servers have no such group yet
                self.take(self.ps.send(Update(hyperparameters=wanted,
                                              optimizer=group,
                                              optimizer_spec=spec)).values)

    @property
    def group_specs(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        """The specs of the optimizer groups other than "" pushed so far."""
        out = {}
        for group, optimizer in self.optimizers().items():
            link = optimizer.__dict__.get("_ke_remote")
            if group and link is not None and link.spec is not None:
                out[group] = link.spec
        return out

    def learning_rate_variable(self) -> keras.Variable | None:
        """The variable of the model's learning rate (None for a schedule)."""
        optimizer = self.model.optimizer
        return None if optimizer is None else learning_rate_variable(optimizer)

    def adopt_hyperparameters(self, at_phase_start: bool = False) -> None:
        """Takes the servers' learning rates (from the last pull) into the
        model's optimizers, unless this worker changed its own since it last
        sent or adopted one (see worker/hyperparameters.py). `at_phase_start`
        (a follower of a live chief): the rates the servers had when this
        worker's phase began, so that a worker that starts a fit after the
        chief's callbacks changed the rate in it (a LearningRateScheduler at
        epoch 1) changes it once itself, from the same value, not again."""
        servers = (self.ps.hyperparameters_at_phase_start() if at_phase_start
                   else self.ps.server_hyperparameters)
        for group, sync in self.hyperparameter_syncs.items():
            if not group:
                sync.adopt(servers)
                continue
            prefix = f"{group}/"
            sync.adopt([{k[len(prefix):]: v for k, v in known.items()
                         if k.startswith(prefix)}
                        for known in servers])

    def pull(self) -> None:
        """Loads the newest values from the parameter servers into the model."""
        if self.shared:
            self.flush()
            return  # the store holds the model's own variables
        self.exchanger.finish()
        self._values.update(self.ps.pull())
        self.assign_all()

    def refresh(self) -> None:
        """Takes the values the servers changed since this worker's last
        exchange (nothing is sent when none did). Before the first step of an
        epoch: while this worker ended the last one (validation, checkpoints,
        callbacks) or traced its step, the others may have trained on, and a
        gradient of the model as the last epoch left it would be that many
        updates late."""
        self.refresh_due = False
        if self.shared:
            return
        start = time.perf_counter()
        self.exchanger.finish()
        changed = self.ps.pull(changed_only=True)
        if changed:
            self._values.update(changed)
            self.assign_all(changed)
        self.timer.add("pull", time.perf_counter() - start)

    @property
    def pipelined(self) -> bool:
        """Pushes travel while the next step computes (not with a shared
        store: there is no push to overlap)."""
        return self.exchange_mode == "pipelined" and not self.shared

    @property
    def completed_seq(self) -> int | None:
        """Pipelined: the largest seq of a batch whose push returned."""
        return self.exchanger.completed_seq

    def flush(self) -> None:
        """Pipelined exchange: waits for the push in flight and loads its reply
        into the model (between steps: the epoch's end, before a replay)."""
        if self.exchanger.finish():
            self.assign_all()

    def drop_push(self) -> None:
        """Waits for the push in flight, ignoring its outcome (`fit` failed)."""
        self.exchanger.drop()

    def take_values(self, values: dict[str, np.ndarray]) -> None:
        """Values a reply brought: kept (the step or `assign_all` assigns them)."""
        self._values.update(values)

    def values_of_all(self) -> list[np.ndarray]:
        """The newest value held of each variable, in `keys`' order."""
        return [self._values[k] for k in self.keys]

    def pull_optimizer_state(self) -> None:
        """Loads the servers' optimizer state (slots, iterations) into the
        model's own optimizers (those it built), so that what Keras saves of
        the model (`model.save`, `ModelCheckpoint`, `BackupAndRestore`) holds
        the state the servers train with."""
        built = {g: o for g, o in self.optimizers().items()
                 if getattr(o, "built", False)}
        if not built or self.shared:
            return
        state = self.ps.pull_optimizer_state()
        by_prefix = slot_prefixes(list(zip(self.trainable, self.trainable_keys)))
        for group, optimizer in built.items():
            prefix = f"{group}/" if group else ""
            # The learning rate is the worker's callbacks' (sent with its
            # pushes, adopted at connect: worker/hyperparameters.py), not
            # state: taken from the servers here, a rate another worker set at
            # this epoch's end would be lowered again by this worker's
            # ReduceLROnPlateau (a rate lowered twice, found by Keras' test).
            rate = learning_rate_variable(optimizer)
            for variable in optimizer.variables:
                if variable is rate:
                    continue
                name = prefix + server_name(variable, by_prefix)
                value = state.get(name)
                if value is not None and np.size(value) == np.prod(variable.shape):
                    # (the slots of variables split over servers come flat)
                    variable.assign(np.reshape(value, variable.shape))

    def uses_moving_averages(self) -> bool:
        """Whether an optimizer of the model keeps moving averages of the
        weights (`use_ema=True`) that live in remote servers' optimizers (with
        a shared store they are the model's own, as in Keras)."""
        return not self.shared and any(
            keras_compat.moving_averages(o) for o in self.optimizers().values())

    def finalize_moving_averages(self) -> None:
        """Keras' end of `fit` with `use_ema=True`
        (`optimizer.finalize_variable_values`): the weights take their moving
        averages, here the servers' (`pull_optimizer_state` first), assigned
        as the script's (the chief's reach the servers at the fit's end)."""
        for optimizer in self.optimizers().values():
            for variable, average in keras_compat.moving_averages(optimizer):
                variable.assign(average)

    def push_values(self) -> None:
        """Makes the servers hold this model's current values (after Keras'
        own fit trained it in this process): every variable, assigned."""
        self.flush()
        if self.shared:
            return  # they are the store's
        values = {k: np.asarray(keras.ops.convert_to_numpy(v.value))
                  for k, v in zip(self.keys, self.variables)}
        self.take(self.ps.send(Update(assigns=values)).values)

    def take(self, values: dict[str, np.ndarray]) -> None:
        """New values from a push made outside the train step: into the model."""
        self._values.update(values)
        for key, variable in zip(self.keys, self.variables):
            if key in values:
                assign_quietly(variable, values[key])

    def publish_assignments(self, chief: bool | None = None) -> None:
        """The values the script assigned to the model's weights since the
        last publish (`watch`) go to the servers, if this worker is the chief
        (`chief`; None: ask; its assignment is the job's: every worker runs
        the same script, and the others' copies would be their own); the
        others forget theirs (their next pull or step takes the servers'
        values)."""
        if self.watch is None or not self.watch.pending:
            return
        if not (self.chief() if chief is None else chief):
            logging.info("keras_elastic: this worker is not the chief: its assignment "
                         "of %d weight(s) stays local (the chief's is the job's)",
                         len(self.watch.pending))
            self.watch.discard()
            return
        values = self.watch.take()
        self.flush()  # the push in flight first (pipelined exchange)
        reply = self.ps.send(Update(assigns=values, assignment=True))
        self._values.update(values)
        self.take(reply.values)

    def begin_training(self, stream) -> None:
        """A `fit` starts on the training stream `stream`: the tasks of its
        pushes (their ranges, those given back) are the stream's."""
        self.stream = stream
        self.exchanger.reset()  # (the new stream's seqs start at 0)
        self.lookups.reset()

    def claim(self, task):
        """Claims a task on every server (see `PSClient.claim`)."""
        return self.ps.claim(self.stream.dataset, task.epoch, task.task_id, task.lease)

    def assign_all(self, only: Collection[str] | None = None) -> None:
        """Assigns the values held for the model's variables (`only`: those
        whose keys it holds)."""
        for key, variable in zip(self.keys, self.variables):
            if key in self._values and (only is None or key in only):
                assign_quietly(variable, self._values[key])

    # -- the step -----------------------------------------------------------
    def prepare_step(self) -> None:
        """Before a step is allowed and logged (`local_allow`): the script's
        assignments since the last step go to the servers; with a shared
        store, the optimizers' fixed hyperparameters are checked (a push
        would be refused for a change; here nothing of the step may be
        logged first)."""
        if self.watch is not None and self.watch.pending:
            self.publish_assignments()  # (a callback's, since the last step)
        if self.shared:
            for sync in list(self.hyperparameter_syncs.values()):
                sync.check()

    def data_ready(self) -> None:
        """The step's batch came out of the pipeline: the input wait ends
        (what follows before the step computes, a refresh from the servers or
        the step's first trace, is not input)."""
        self.t_data = time.perf_counter()

    def begin_step(self) -> None:
        """The step begins computing (for the compute phase, and what the
        pipelined exchange knows was given back)."""
        self._t_mark = time.perf_counter()
        self.exchanger.begin_step()

    # -- called from the compiled train step ------------------------------
    @tf.autograph.experimental.do_not_convert
    def non_trainable_values(self) -> list:
        """Copies of the non-trainable variables' values, read where the
        step traces this (before the step's own updates, in the step's order):
        what the step's non-trainable updates start from."""
        return [tf.identity(v.value) for v in self.non_trainable]

    def hand_over(self, push, tags, *tensors) -> list[np.ndarray]:
        """The step hands over one update (what an optimizer's apply computed);
        returns every variable's value for the step to assign. `push` (a
        `remote_optimizer.Push`) says what `tensors` are: the gradients of
        `push.grad_keys`, the non-trainable values, the non-trainable values
        they were computed from (the step's `StepContext.bases`), the (ids,
        rows) of each table of `push.tables`, and the learning rate when
        `push.rate` is set. They become one `Update`, which the exchange
        (`exchanger`) sends.

        `tags`: `[seq, position, fingerprint]` of each element of the batch.
        """
        t_grads = time.perf_counter()
        if self._t_mark:
            self.timer.add("compute", t_grads - self._t_mark)
        update = self.update_of(push, tensors)
        out = self.exchanger.send(update, push.update, tags.numpy(), t_grads)
        self._t_mark = time.perf_counter()
        return out

    def update_of(self, push, tensors) -> Update:
        """The `Update` of the step's tensors (see `hand_over`), without its task
        ranges (the exchange adds them when it sends it)."""
        # The learning rate the worker's callbacks set (sent to the servers
        # that do not hold it yet, with this push), read in the step.
        if push.rate is not None:
            rate, tensors = float(tensors[-1]), tensors[:-1]
        else:
            rate = None
        hyperparameters = self.hyperparameter_sync(push)
        wanted = (hyperparameters.wanted(push.rate, rate)
                  if hyperparameters is not None else None)
        n, m = len(push.grad_keys), len(self.non_trainable_keys)
        return Update(
            grads={k: t.numpy() for k, t in zip(push.grad_keys, tensors[:n])},
            assigns={k: t.numpy() for k, t in zip(self.non_trainable_keys,
                                                   tensors[n:n + m])},
            bases={k: t.numpy() for k, t in zip(self.non_trainable_keys,
                                                 tensors[n + m:n + 2 * m])},
            rows=sum_rows(push.tables, tensors[n + 2 * m:]),
            hyperparameters=wanted or {},
            optimizer=push.group,
            optimizer_spec=push.spec)


def optimizer_state(optimizer: keras.optimizers.Optimizer, keys: list[tuple]
                    ) -> dict[str, tuple[np.ndarray, str | None]]:
    """The state of an optimizer that already trained (`iterations > 0`: a
    model loaded from a Keras file, or trained by Keras before `ke.wrap`), as
    the servers name it: {name relative to the optimizer: (value, key of the
    variable a slot belongs to, or None)}; {} for a fresh optimizer.

    Keras names a slot `{variable path with _ for /}_{slot}`; on the servers
    the variable's path is its key (with _ for /)."""
    if not getattr(optimizer, "built", False) or int(optimizer.iterations.numpy()) == 0:
        return {}
    out = {}
    by_prefix = slot_prefixes(keys)
    for variable in optimizer.variables:
        relative, owner = server_name(variable, by_prefix, with_owner=True)
        out[relative] = (np.asarray(keras.ops.convert_to_numpy(variable.value)), owner)
    return out


def slot_prefixes(keys: list[tuple]) -> dict[str, str]:
    """{a model variable's path with _ for /: its key} for `keys`, [(model
    variable, key)]: the prefixes of Keras' names of its optimizer slots."""
    return {v.path.replace("/", "_"): k for v, k in keys}


def server_name(variable, by_prefix: dict[str, str], with_owner: bool = False):
    """The name the servers give a worker's optimizer variable, relative to
    its optimizer: Keras names a slot `{variable path with _ for /}_{slot}`;
    on the servers the variable's path is its key (with _ for /).
    `by_prefix`: `slot_prefixes(...)`. With `with_owner`: (name, key of the
    variable the slot belongs to, or None)."""
    relative = variable.path.split("/", 1)[-1]
    owner = None
    cut = relative.rfind("_")
    while cut > 0:  # the longest "{variable}_" prefix that is a model variable
        key = by_prefix.get(relative[:cut])
        if key is not None:
            relative = re.sub(r"[^A-Za-z0-9_.\-]", "_", key) + relative[cut:]
            owner = key
            break
        cut = relative.rfind("_", 0, cut)
    return (relative, owner) if with_owner else relative


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value

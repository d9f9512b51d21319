"""The variables one parameter server owns, and the optimizer that updates them.

Pure TensorFlow/Keras, no gRPC: `ps/servicer.py` drives it. The store

- is initialized once (the first worker's values win; later `init` calls only
  check that they describe the same variables),
- applies gradients with a real Keras optimizer built from the worker's config
  (slot variables included), in a compiled function; a model whose train step
  applies several optimizers (a GAN's discriminator and generator optimizers)
  has one *optimizer group* each here: the model's own optimizer ("") is built
  by `init`, the others by `register_optimizer` when a worker first pushes
  with them, each over the variables it updates,
- with `grads_to_wait=k > 1` averages k gradients per update and drops
  gradients computed on a model more than `max_staleness` versions old,
- counts a model version and remembers, per variable, the version that last
  changed it, so `values_since(v)` returns only what changed after `v`,
- sets the optimizer's learning rate when a push carries a worker's change
  (a Keras `LearningRateScheduler` or `ReduceLROnPlateau` on the worker;
  see `ps/hyperparameters.py`), before applying the push's gradients,
- keeps a `TaskLog`: which elements of which task its variables contain,
  changed in the same step as the variables, so a gradient is applied at most
  once (see `ps/task_log.py`),
- holds its share of the embedding tables (`ps/embedding_table.py`): rows of
  the ids it owns, created on first use, updated row by row by a sparse
  optimizer built from the same Keras optimizer config
  (`ps/sparse_optimizers.py`), in the same push as the dense gradients.

Example:

>>> import numpy as np
>>> store = ParameterStore()
>>> store.init({"w": np.ones(2, "float32")}, {"w": True},
...            {"class_name": "SGD", "config": {"learning_rate": 0.5}})
True
>>> store.push(Update(grads={"w": np.ones(2, "float32")}), base_version=0)
PushResult(accepted=True, version=1, status='applied')
>>> store.values_since(0)["w"].tolist()
[0.5, 0.5]
"""

from __future__ import annotations

import copy
import random
import re
import threading
from collections.abc import Mapping
from typing import Any, NamedTuple

import keras
import numpy as np

from keras_elastic.common import errors
from keras_elastic.common.variable_keys import namespace_of
from keras_elastic.ps import hyperparameters as hp
from keras_elastic.ps.compiled_update import (
    as_tensor,
    compile_read_all,
    compile_update,
    read_only,
    snapshot,
)
from keras_elastic.ps.embedding_table import EmbeddingTable
from keras_elastic.ps.sparse_optimizers import sparse_optimizer_from_config
from keras_elastic.ps.store_errors import (  # noqa: F401  (re-exported)
    NOT_INITIALIZED,
    UnknownOptimizerError,
    UnknownVariableError,
)
from keras_elastic.ps.task_log import DUPLICATE, Applied, Range, TaskKey, TaskLog
from keras_elastic.ps.update import Update
from keras_elastic.ps.update_checks import check_update

# Rows of one table in a push: (ids, gradient rows).
SparseGrads = dict[str, tuple[np.ndarray, np.ndarray]]

APPLIED = "applied"
STALE = "stale"


class PushResult(NamedTuple):
    accepted: bool
    version: int
    # APPLIED (or buffered), DUPLICATE (already applied: nothing done), STALE
    # (too old, dropped), or a TaskLog refusal: "fenced" or "overlap".
    status: str


class OptimizerGroup:
    """One optimizer of the model on this server: the Keras optimizer built
    from a worker's config, the names of the variables it updates here, and
    its compiled update functions."""

    def __init__(self, name: str, optimizer: keras.optimizers.Optimizer,
                 config: dict, names: list[str],
                 relative_names: dict[int, str] | None = None) -> None:
        self.name = name
        self.optimizer = optimizer
        self.config = config
        self.names = list(names)
        # (names updated, identities of every variable) -> compiled update
        self.apply_fns: dict[tuple, Any] = {}  # keras_compat.flat_call of each
        self.pending: list[tuple[dict[str, np.ndarray], SparseGrads]] = []
        # A worker's own optimizer shared in process (`init_shared`): its
        # variables' names as the server's own optimizer would name them.
        self._relative_names = relative_names

    def relative_name(self, variable) -> str:
        """`variable`'s name relative to this optimizer, as a server names it
        (what checkpoints and `optimizer_state` use)."""
        if self._relative_names is not None:
            found = self._relative_names.get(id(variable))
            if found is not None:
                return found
        return variable.path.split("/", 1)[-1]


def build_optimizer(config: dict) -> keras.optimizers.Optimizer:
    """A Keras optimizer from its serialized config; ValueError naming the
    config if it cannot be built."""
    try:
        # (a copy: Keras turns a nested learning-rate schedule config into the
        # schedule in place, and the config goes to JSON)
        optimizer = keras.optimizers.deserialize(copy.deepcopy(config))
    except (ValueError, TypeError) as e:
        raise ValueError(f"the parameter server cannot build the optimizer from its "
                         f"config {config!r}: {e}") from e
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"the parameter server cannot build the optimizer from its "
                         f"config {config!r}: got {type(optimizer).__name__}")
    return optimizer


def load_optimizer_state(optimizer: keras.optimizers.Optimizer,
                         state: dict[str, np.ndarray]) -> None:
    """Assigns a worker's trained optimizer state (names relative to the
    optimizer, as `worker/model_sync.py optimizer_state` makes them) to the
    variables of `optimizer` that have those names; ValueError on a shape
    that differs."""
    for variable in optimizer.variables:
        value = state.get(variable.path.split("/", 1)[-1])
        if value is None:
            continue
        if tuple(np.shape(value)) != tuple(variable.shape):
            raise ValueError(f"optimizer variable '{variable.path}' has shape "
                             f"{tuple(variable.shape)}, the worker's state "
                             f"{tuple(np.shape(value))}")
        variable.assign(value)


def new_incarnation() -> int:
    """A random id for one life of a server's state (a start or a restore)."""
    return random.SystemRandom().getrandbits(62) + 1


class ParameterStore:
    """Variables, optimizer and version of one parameter-server partition."""

    def __init__(self, grads_to_wait: int = 1, max_staleness: int = 0,
                 num_partitions: int = 1) -> None:
        self.grads_to_wait = max(1, grads_to_wait)
        # The job's partitions: an embedding table's max_rows is shared by them.
        self.num_partitions = max(1, num_partitions)
        self.max_staleness = max_staleness or 4 * self.grads_to_wait
        self._lock = threading.RLock()
        self.variables: dict[str, keras.Variable] = {}
        self.trainable: dict[str, bool] = {}
        self.updated_at: dict[str, int] = {}
        # name -> group; "" is the model's own optimizer (`init`).
        self.optimizers: dict[str, OptimizerGroup] = {}
        self.tables: dict[str, EmbeddingTable] = {}
        self.table_specs: dict[str, dict] = {}
        self.version = 0
        self.pushes = 0
        self.dropped = 0
        self.duplicates = 0
        self.refused = 0
        self.restored_from: str | None = None
        # (phase, hyperparameters before that phase's first change): the
        # latest phase in which a push changed them (see `push`).
        self.phase_start: tuple[int, dict[str, float]] = (0, {})
        self.log = TaskLog()
        self.incarnation = new_incarnation()
        # (the variables' identities, a tf.function reading them all): see
        # `_read_all`.
        self._reader: tuple[tuple, Any] | None = None
        # (version, every variable's value read by the update that made that
        # version): what `values_since` answers from while nothing else wrote
        # a variable since. Never for variables a worker in this process also
        # updates itself (`init_shared`).
        self._fresh: tuple[int, dict[str, np.ndarray]] | None = None
        # name -> (variable, dtype, shape, trainable) that `check_tensor`
        # compares with, read once per variable.
        self._wanted: dict[str, tuple[Any, np.dtype, tuple[int, ...], bool]] = {}
        self._shared = False
        # Compiled assigns of a push without an update (see `_apply_fn`).
        self._assign_fns: dict[tuple, Any] = {}

    @property
    def initialized(self) -> bool:
        return "" in self.optimizers

    @property
    def optimizer(self) -> keras.optimizers.Optimizer | None:
        """The model's own optimizer (group "")."""
        group = self.optimizers.get("")
        return group.optimizer if group else None

    @property
    def optimizer_config(self) -> dict | None:
        group = self.optimizers.get("")
        return group.config if group else None

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    def specs(self) -> dict[str, tuple[str, tuple[int, ...], bool]]:
        return {n: (v.dtype, tuple(v.shape), self.trainable[n])
                for n, v in self.variables.items()}

    def init(self, values: dict[str, np.ndarray], trainable: dict[str, bool],
             optimizer_config: dict, tables: dict[str, dict] | None = None,
             optimizer_state: dict[str, np.ndarray] | None = None,
             namespace: str = "") -> bool:
        """Creates the variables, embedding tables (`tables`: name -> {"dim",
        "dtype", "input_dim" (None: unbounded), "initializer"}) and optimizer;
        returns False if already done.

        `namespace`: another model of the job ("m<k>/", keys prefixed with it:
        `common/variable_keys.py`), added once the job's first model is
        there, with its own optimizer as group "m<k>/optimizer"."""
        tables = {n: _table_spec(n, t) for n, t in (tables or {}).items()}
        with self._lock:
            if namespace:
                if not self.initialized:
                    raise errors.ServerStateError(
                        f"model '{namespace}' cannot initialize the parameter server "
                        "before the job's first model (every worker must build and "
                        "train the same models in the same order)")
                return self._add_model(namespace, values, trainable, optimizer_config,
                                       tables, optimizer_state or {})
            if self.initialized:
                self._check_same(values, trainable, {""})
                self._check_same_tables(tables, "")
                return False
            optimizer = build_optimizer(optimizer_config)
            variables = {
                name: keras.Variable(value, name=re.sub(r"[^A-Za-z0-9_.\-]", "_", name),
                                     trainable=trainable[name])
                for name, value in values.items()}
            sparse = sparse_optimizer_from_config(optimizer_config) if tables else None
            names = [n for n in variables if trainable[n]]
            optimizer.build([variables[n] for n in names])
            load_optimizer_state(optimizer, optimizer_state or {})
            self.tables = {n: self._make_table(n, t, sparse) for n, t in tables.items()}
            self.table_specs = tables
            self.variables = variables
            self._fresh = None
            self.trainable = dict(trainable)
            self.updated_at = dict.fromkeys(variables, 0)
            self.optimizers = {"": OptimizerGroup("", optimizer, optimizer_config, names)}
            return True

    def init_shared(self, variables: dict[str, keras.Variable],
                    optimizer: keras.optimizers.Optimizer, config: dict,
                    relative_names: dict[int, str], namespace: str = "") -> bool:
        """`init` for a worker in this process (an embedded cluster): the
        store holds the worker's own variables and optimizer, not copies, so
        the worker applies its updates in its own step without a call
        (`ModelSync.local_push`); every other call (a pull, a checkpoint, a
        push from elsewhere) sees and changes the same variables. `variables`:
        key -> the model's variable; `relative_names`: id(optimizer variable)
        -> its name on a server. Returns False if the model is there already.
        """
        with self._lock:
            group = namespace + "optimizer" if namespace else ""
            if group in self.optimizers:
                if any(self.variables.get(k) is not v for k, v in variables.items()):
                    self._check_same(
                        variables,  # (a value's dtype and shape: all it reads)
                        {k: bool(v.trainable) for k, v in variables.items()},
                        {namespace_of(next(iter(variables)))} if variables else None)
                    raise ValueError(
                        "the parameter server already holds another model of the "
                        f"same structure{' in namespace ' + namespace if namespace else ''}"
                        ": this process connects each model once.")
                return False
            if namespace and not self.initialized:
                raise errors.ServerStateError(
                    f"model '{namespace}' cannot initialize the parameter server "
                    "before the job's first model")
            self._share(group, variables, optimizer, config, relative_names)
            return True

    def reshare(self, variables: dict[str, keras.Variable],
                optimizer: keras.optimizers.Optimizer, config: dict,
                relative_names: dict[int, str], namespace: str = "") -> None:
        """The in-process worker's model of `namespace` (shared by
        `init_shared`) was compiled with another optimizer, or a layer's
        `trainable` changed: the store holds its variables (under their keys
        now) and its new optimizer instead, and forgets the namespace's
        other optimizers (the worker shares them again at their next apply).
        The values are the model's own: nothing is lost."""
        with self._lock:
            if not self._shared:
                raise errors.ServerStateError(
                    "reshare: the store does not hold a worker's own variables")
            for key in [k for k in self.variables if namespace_of(k) == namespace]:
                del self.variables[key]
                self.trainable.pop(key, None)
                self.updated_at.pop(key, None)
                self._wanted.pop(key, None)
            for name in [g for g in self.optimizers if namespace_of(g) == namespace]:
                del self.optimizers[name]
            self._share(namespace + "optimizer" if namespace else "", variables,
                        optimizer, config, relative_names)

    def _share(self, group: str, variables: dict[str, keras.Variable],
               optimizer: keras.optimizers.Optimizer, config: dict,
               relative_names: dict[int, str]) -> None:
        names = sorted(k for k, v in variables.items() if v.trainable)
        if not optimizer.built:
            optimizer.build([variables[k] for k in names])
        self._shared = True
        self._fresh = None
        for key, variable in variables.items():
            self.variables[key] = variable
            self.trainable[key] = bool(variable.trainable)
            self.updated_at[key] = self.version
        self.optimizers[group] = OptimizerGroup(group, optimizer, config, names,
                                                relative_names)

    def share_optimizer(self, name: str, optimizer: keras.optimizers.Optimizer,
                        config: dict, variables: list[str],
                        relative_names: dict[int, str]) -> None:
        """Holds a worker's own optimizer (in this process) as group `name`
        (its first apply, in the worker's traced step); see `init_shared`."""
        with self._lock:
            known = self.optimizers.get(name)
            if known is None or known.optimizer is not optimizer:
                self.optimizers[name] = OptimizerGroup(
                    name, optimizer, config, sorted(set(variables)), relative_names)

    def record_local_push(self, ranges: list[Range], keys: tuple[str, ...]) -> str | None:
        """The bookkeeping of an update the in-process worker applies itself
        (`init_shared`): None if it may be applied (then logged, counted, the
        version advanced), else DUPLICATE or the task log's refusal."""
        with self._lock:
            self.pushes += 1
            if ranges:
                refusal = self.log.check(ranges)
                if refusal == DUPLICATE:
                    self.duplicates += 1
                    return refusal
                if refusal is not None:
                    self.refused += 1
                    return refusal
                self.log.record(ranges)
            self.version += 1
            for key in keys:
                self.updated_at[key] = self.version
            return None

    def register_optimizer(self, name: str, config: dict, variables: list[str]) -> bool:
        """Creates optimizer group `name` (not the model's own optimizer "")
        from a worker's `config`, over the trainable variables of `variables`
        this server holds; returns False if it exists (then `config` and
        `variables` must be the ones it was made with: ValueError otherwise).

        >>> store = ParameterStore()
        >>> store.init({"w": np.ones(2, "float32")}, {"w": True},
        ...            {"class_name": "SGD", "config": {}})
        True
        >>> store.register_optimizer("g_optimizer",
        ...                          {"class_name": "Adam", "config": {}}, ["w"])
        True
        """
        with self._lock:
            if not self.initialized:
                raise errors.ServerStateError(NOT_INITIALIZED)
            if not name:
                raise ValueError("optimizer group '' is the model's own optimizer, "
                                 "made by init")
            names = sorted(n for n in set(variables)
                           if n in self.variables and self.trainable[n])
            group = self.optimizers.get(name)
            if group is not None:
                if group.config != config or group.names != names:
                    raise ValueError(
                        f"optimizer '{name}' is {group.config.get('class_name')} over "
                        f"{group.names} on this server, but a worker's is "
                        f"{config.get('class_name')} over {names}: every worker must "
                        "build the same optimizers for the same variables")
                return False
            optimizer = build_optimizer(config)
            optimizer.build([self.variables[n] for n in names])
            self.optimizers[name] = OptimizerGroup(name, optimizer, config, names)
            return True

    def group(self, name: str) -> OptimizerGroup:
        """Optimizer group `name`; `UnknownOptimizerError` if a worker has not
        registered it here (yet: a server restarted without a checkpoint)."""
        group = self.optimizers.get(name)
        if group is None:
            if not self.initialized:
                raise errors.ServerStateError(NOT_INITIALIZED)
            raise UnknownOptimizerError(name)
        return group

    def check_tensor(self, name: str, dtype: np.dtype, shape: tuple[int, ...],
                     gradient: bool) -> None:
        """Raises unless a push may carry a gradient (`gradient`) or a new value
        of variable `name` with this dtype and shape: RuntimeError before
        init, `UnknownVariableError` for a variable this server does not hold,
        ValueError for a wrong dtype or shape, or a gradient of a
        non-trainable variable.

        >>> store = ParameterStore()
        >>> store.init({"w": np.ones(2, "float32")}, {"w": True},
        ...            {"class_name": "SGD", "config": {}})
        True
        >>> store.check_tensor("w", "float32", (3,), True)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: the gradient of variable 'w' is float32 of shape [3], but ...
        """
        if not self.initialized:
            raise errors.ServerStateError(NOT_INITIALIZED)
        variable = self.variables.get(name)
        known = self._wanted.get(name)
        if known is None or known[0] is not variable:
            if variable is None:
                raise UnknownVariableError([name])
            # (a Keras variable's dtype and shape cost ~20 us to read, and a
            # dtype's name ~3 us: a push checks every tensor it carries)
            known = self._wanted[name] = (variable, np.dtype(variable.dtype),
                                          tuple(variable.shape), self.trainable[name])
        _, want_dtype, want_shape, trainable = known
        if gradient and not trainable:
            raise ValueError(f"variable '{name}' is not trainable: a push carries its "
                             "value, not a gradient")
        if dtype == want_dtype and tuple(shape) == want_shape:
            return
        raise ValueError(
            f"the {'gradient' if gradient else 'value'} of variable '{name}' is "
            f"{np.dtype(dtype)} of shape {list(shape)}, but the variable is "
            f"{want_dtype} of shape {list(want_shape)}")

    def _add_model(self, namespace: str, values: dict[str, np.ndarray],
                   trainable: dict[str, bool], optimizer_config: dict,
                   tables: dict[str, dict], optimizer_state: dict[str, np.ndarray]
                   ) -> bool:
        """`init` of another model of the job (namespace "m<k>/"): its
        variables and its own optimizer (group "m<k>/optimizer") are added,
        or checked if a worker added them before."""
        group = namespace + "optimizer"
        if group in self.optimizers or any(
                namespace_of(n) == namespace for n in self.variables):
            self._check_same(values, trainable, {namespace})
            self._check_same_tables(tables, namespace)
            return False
        outside = sorted(n for n in [*values, *tables] if namespace_of(n) != namespace)
        if outside:
            raise ValueError(
                f"the model of namespace '{namespace}' has variables or tables "
                f"outside it ({outside[:3]})")
        optimizer = build_optimizer(optimizer_config)
        sparse = sparse_optimizer_from_config(optimizer_config) if tables else None
        for name, spec in tables.items():
            self.tables[name] = self._make_table(name, spec, sparse)
            self.table_specs[name] = spec
        self._fresh = None
        for other in self.optimizers.values():
            other.apply_fns.clear()  # (they return every variable: one more now)
        self._assign_fns.clear()
        for name, value in values.items():
            self.variables[name] = keras.Variable(
                value, name=re.sub(r"[^A-Za-z0-9_.\-]", "_", name),
                trainable=trainable[name])
            self.trainable[name] = trainable[name]
            self.updated_at[name] = self.version
        names = sorted(n for n in values if trainable[n])
        optimizer.build([self.variables[n] for n in names])
        load_optimizer_state(optimizer, optimizer_state)
        self.optimizers[group] = OptimizerGroup(group, optimizer, optimizer_config, names)
        return True

    def _check_same(self, values: dict[str, np.ndarray],
                    trainable: dict[str, bool], spaces: set[str] | None = None
                    ) -> None:
        mine = {n: spec for n, spec in self.specs().items()
                if spaces is None or namespace_of(n) in spaces}
        theirs = {n: (str(np.dtype(v.dtype)), tuple(v.shape), trainable[n])
                  for n, v in values.items()}
        for name in sorted(set(mine) | set(theirs)):
            if mine.get(name) != theirs.get(name):
                raise ValueError(
                    f"the parameter server already holds a different model: variable "
                    f"'{name}' is {mine.get(name, 'absent')} there but "
                    f"{theirs.get(name, 'absent')} in this worker's model "
                    "(dtype, shape, trainable). Every worker must build the same model.")

    def _check_same_tables(self, tables: dict[str, dict], namespace: str) -> None:
        """The tables of the model of `namespace` are `tables`."""
        mine = {n for n in self.table_specs if namespace_of(n) == namespace}
        for name in sorted(mine | set(tables)):
            mine, theirs = self.table_specs.get(name), tables.get(name)
            if mine != theirs:
                raise ValueError(
                    f"the parameter server already holds a different model: embedding "
                    f"table '{name}' is {mine or 'absent'} there but "
                    f"{theirs or 'absent'} in this worker's model. Every worker must "
                    "build the same model.")

    def check_sparse(self, table: str, ids: np.ndarray | None,
                     grads_shape: tuple[int, ...] | None = None,
                     grads_dtype=None) -> EmbeddingTable:
        """The table `table`, after checking ids (and the shape and dtype of
        their gradient rows) pushed or looked up: RuntimeError before init,
        ValueError otherwise."""
        if not self.initialized:
            raise errors.ServerStateError(NOT_INITIALIZED)
        found = self.tables.get(table)
        if found is None:
            raise ValueError(f"this parameter server holds no embedding table "
                             f"'{table}' (its tables: {sorted(self.tables)})")
        if ids is not None:
            found.check_ids(ids)
        if grads_shape is not None:
            n = None if ids is None else len(ids)
            if (len(grads_shape) != 2 or grads_shape[1] != found.dim
                    or (n is not None and grads_shape[0] != n)):
                raise ValueError(f"the gradient rows of embedding table '{table}' have "
                                 f"shape {list(grads_shape)}, expected "
                                 f"[{'n' if n is None else n}, {found.dim}]")
            if str(np.dtype(grads_dtype)) != found.dtype:
                raise ValueError(f"the gradient rows of embedding table '{table}' are "
                                 f"{np.dtype(grads_dtype)}, the table is {found.dtype}")
        return found

    def reset_table(self, name: str) -> EmbeddingTable:
        """Replaces table `name` by an empty one of the same spec (a restore
        loads its rows next); returns it."""
        with self._lock:
            old = self.tables[name]
            self.tables[name] = self._make_table(name, self.table_specs[name],
                                                 old.optimizer)
            return self.tables[name]

    def _make_table(self, name: str, spec: dict, optimizer) -> EmbeddingTable:
        """An empty table of `spec`; its `max_rows` (over all partitions)
        becomes this partition's share."""
        max_rows = spec.get("max_rows")
        return EmbeddingTable(
            name, spec["dim"], spec["dtype"], spec["input_dim"], spec["initializer"],
            optimizer, admit_after=spec.get("admit_after") or 0,
            max_rows=None if not max_rows else -(-max_rows // self.num_partitions),
            ttl_versions=spec.get("ttl_versions"))

    def lookup(self, ids: dict[str, np.ndarray], create: bool = True
               ) -> dict[str, np.ndarray]:
        """Rows of the given ids of each table (a training lookup, `create`,
        makes admitted ids' rows on first use; see `EmbeddingTable.lookup`)."""
        with self._lock:
            for name, table_ids in ids.items():
                self.check_sparse(name, table_ids)
            out = {}
            for name, table_ids in ids.items():
                table = self.tables[name]
                table.clock = self.version
                out[name] = table.lookup(table_ids, create=create)
            return out

    def _apply_fn(self, group: OptimizerGroup | None, names: tuple[str, ...],
                  assigned: tuple[tuple[str, bool], ...] = ()):
        """The compiled update of one push (ps/compiled_update.py), made once
        per kind of push and kept: `group`'s optimizer (None: assign only)
        updating `names`, after the non-trainable values `assigned`."""
        key = (names, assigned, tuple(id(v) for v in self.variables.values()))
        fns = group.apply_fns if group is not None else self._assign_fns
        fn = fns.get(key)
        if fn is None:
            fn = fns[key] = compile_update(
                self.variables, group.optimizer if group is not None else None,
                names, assigned)
        return fn

    def _assigned(self, assigns: Mapping[str, np.ndarray],
                  bases: Mapping[str, np.ndarray]):
        """`(key, assign tensors, base tensors)` of a push's non-trainable
        values for `_apply_fn` (a boolean value is assigned as is)."""
        names = tuple(sorted(assigns))
        key = tuple((n, n in bases and assigns[n].dtype != np.bool_) for n in names)
        return (key, [as_tensor(assigns[n]) for n in names],
                [as_tensor(bases[n]) for n, based in key if based])

    def _assign(self, assigns: Mapping[str, np.ndarray],
                bases: Mapping[str, np.ndarray]) -> None:
        """Assigns a push's non-trainable values without an update."""
        if assigns:
            key, values, base_values = self._assigned(assigns, bases)
            self._apply_fn(None, (), key)([*values, *base_values])

    def hyperparameters(self) -> dict[str, float]:
        """The optimizers' settable hyperparameters now: {"learning_rate": v}
        for the model's optimizer, "NAME/learning_rate" for the other groups
        (none for a rate that is a LearningRateSchedule; {} before init)."""
        with self._lock:
            out = {}
            for name, group in self.optimizers.items():
                for k, v in hp.current_hyperparameters(group.optimizer).items():
                    out[f"{name}/{k}" if name else k] = v
            return out

    def push(self, update: Update, base_version: int = 0) -> PushResult:
        """Applies (or buffers) `update` (ps/update.py: gradients, table rows,
        non-trainable values, hyperparameters, the task ranges they contain);
        `base_version`: the model version the worker computed it on (-1:
        unknown), for `max_staleness`.

        The whole update is checked first (ps/update_checks.py: nothing changes
        if it fails). Then the task log decides (a duplicate is acknowledged,
        a refused task is refused: nothing changes either), then staleness,
        then the hyperparameters are set, the non-trainable values assigned
        (merged with another worker's change where a base came) and the
        gradients applied, or buffered until `grads_to_wait` arrived.

        >>> store = ParameterStore()
        >>> store.init({"w": np.ones(2, "float32")}, {"w": True},
        ...            {"class_name": "SGD", "config": {"learning_rate": 0.5}})
        True
        >>> store.push(Update(grads={"w": np.ones(2, "float32")},
        ...                   hyperparameters={"learning_rate": 0.0})).status
        'applied'
        >>> store.values_since(0)["w"].tolist()  # applied with the new rate
        [1.0, 1.0]
        """
        with self._lock:
            hyperparameters = check_update(self, update)
            group = self.group(update.optimizer)
            grads, assigns, bases = update.grads, update.assigns, update.bases
            rows, ranges = update.rows, list(update.ranges)
            self.pushes += 1
            if ranges:
                refusal = self.log.check(ranges)
                if refusal == DUPLICATE:
                    self.duplicates += 1
                    return PushResult(True, self.version, DUPLICATE)
                if refusal is not None:
                    self.refused += 1
                    return PushResult(False, self.version, refusal)
            if (update.trains and self.grads_to_wait > 1
                    and base_version < self.version - self.max_staleness):
                self.dropped += 1
                return PushResult(False, self.version, STALE)
            if hyperparameters and update.phase > self.phase_start[0]:
                # The first change of this phase: a worker that starts the
                # phase late takes the values from before it (Pull), so that
                # its own callbacks change them once, as the first worker's did.
                self.phase_start = (update.phase, self.hyperparameters())
            hp.set_hyperparameters(hyperparameters, group.optimizer)
            if assigns:
                self._fresh = None
            if update.assignment and assigns:
                self.version += 1
            for name in assigns:
                self.updated_at[name] = (self.version + 1 if update.trains
                                         else self.version)
            if not update.trains:
                self._assign(assigns, bases)
                return PushResult(True, self.version, APPLIED)
            if self.grads_to_wait == 1:
                self._apply(group, grads, rows, assigns, bases)
            else:
                self._assign(assigns, bases)
                group.pending.append((grads, rows))
                if len(group.pending) >= self.grads_to_wait:
                    self._apply_pending(group)
            self.log.record(ranges)
            return PushResult(True, self.version, APPLIED)

    def _apply_pending(self, group: OptimizerGroup) -> None:
        """Applies the group's buffered gradients: their sum over
        `grads_to_wait` (the mean of a full buffer)."""
        pending = group.pending
        if not pending:
            return
        total = {}
        for n in sorted(set().union(*(g for g, _ in pending))):
            parts = [g[n] for g, _ in pending if n in g]
            total[n] = np.sum(parts, axis=0) / self.grads_to_wait
        rows: SparseGrads = {}
        for t in sorted(set().union(*(s for _, s in pending))):
            parts = [s[t] for _, s in pending if t in s]
            rows[t] = (np.concatenate([ids for ids, _ in parts]),
                       np.concatenate([g for _, g in parts]) / self.grads_to_wait)
        group.pending = []
        self._apply(group, total, rows)

    def flush(self) -> int:
        """Applies gradients still buffered (`grads_to_wait > 1`) at once;
        returns the version."""
        with self._lock:
            for group in self.optimizers.values():
                self._apply_pending(group)
            return self.version

    def claim(self, task: TaskKey, lease: int) -> dict[str, Applied]:
        """See `TaskLog.claim`."""
        with self._lock:
            return self.log.claim(task, lease)

    def _apply(self, group: OptimizerGroup, grads: dict[str, np.ndarray],
               sparse: SparseGrads | None = None,
               assigns: Mapping[str, np.ndarray] | None = None,
               bases: Mapping[str, np.ndarray] | None = None) -> None:
        """Updates by `group`'s optimizer (after assigning a push's
        non-trainable `assigns`, see `push`)."""
        optimizer = group.optimizer
        if sparse:
            # The step and learning rate the dense update uses (Adam's bias
            # correction, schedules), read before it advances them.
            step = int(optimizer.iterations.numpy()) + 1
            learning_rate = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
            for name, (ids, rows) in sorted(sparse.items()):
                self.tables[name].clock = self.version + 1  # this update's version
                self.tables[name].apply_gradients(ids, rows, step, learning_rate)
        names = tuple(sorted(grads))
        values = None
        # The values read by the last update are let go first: TensorFlow
        # updates a variable in place only when nothing else holds its buffer
        # (else it copies it first: 4 MB pushes took 17-20 ms instead of 12-13).
        self._fresh = None
        if names:
            key, values, base_values = self._assigned(assigns or {}, bases or {})
            values = self._apply_fn(group, names, key)(
                [*(as_tensor(grads[n]) for n in names), *values, *base_values])
        else:
            self._assign(assigns or {}, bases or {})
            optimizer.iterations.assign_add(1)
        self.version += 1
        self._fresh = None if values is None or self._shared else (
            self.version, {name: read_only(tensor)
                           for name, tensor in zip(self.variables, values)})
        for n in names:
            self.updated_at[n] = self.version

    def values_since(self, version: int, names: list[str] | None = None
                     ) -> dict[str, np.ndarray]:
        """Current values of the variables changed after `version` (-1: all);
        `UnknownVariableError` if `names` has one this server does not hold."""
        with self._lock:
            selected = names or list(self.variables)
            unknown = sorted(set(selected) - set(self.variables))
            if unknown:
                raise UnknownVariableError(unknown)
            selected = [n for n in selected
                        if version < 0 or self.updated_at[n] > version]
            fresh = self._fresh
            if fresh is not None and fresh[0] == self.version:
                return {n: fresh[1][n] for n in selected}
            if len(selected) <= max(1, len(self.variables) // 4):
                return {n: snapshot(self.variables[n]) for n in selected}
            values = self._read_all()
            return {n: values[n] for n in selected}

    def _read_all(self) -> dict[str, np.ndarray]:
        """Every variable's value as `snapshot` reads it, in one compiled call
        (`compile_read_all`), made once per set of variables."""
        names = list(self.variables)
        key = tuple(id(self.variables[n]) for n in names)
        if self._reader is None or self._reader[0] != key:
            self._reader = (key, compile_read_all(list(self.variables.values())))
        return {name: read_only(tensor)
                for name, tensor in zip(names, self._reader[1]())}

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """Every optimizer's variables, named relative to their optimizer
        ("GROUP/NAME" for a group other than the model's own)."""
        with self._lock:
            out = {}
            for name, group in self.optimizers.items():
                for variable in group.optimizer.variables:
                    relative = group.relative_name(variable)
                    out[f"{name}/{relative}" if name else relative] = snapshot(variable)
            return out

    def optimizer_variables(self) -> list[keras.Variable]:
        """The variables of the model's own optimizer (slots, iterations, rate)."""
        return list(self.optimizer.variables) if self.optimizer else []

    def mark_restored(self, path: str) -> None:
        """Values were replaced from a checkpoint: a new life of this state, in
        which every variable counts as changed (workers take all of them)."""
        with self._lock:
            for group in self.optimizers.values():
                group.pending = []
            self._fresh = None
            self.version += 1
            self.updated_at = dict.fromkeys(self.variables, self.version)
            self.incarnation = new_incarnation()
            self.restored_from = path
            self.phase_start = (0, {})


def _table_spec(name: str, spec: dict) -> dict:
    """A checked, canonical table spec (what `init` compares between workers)."""
    try:
        dim = int(spec["dim"])
        dtype = str(np.dtype(spec.get("dtype", "float32")))
        input_dim = spec.get("input_dim")
        input_dim = int(input_dim) if input_dim else None
        initializer = spec.get("initializer", "uniform")
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"embedding table '{name}': malformed spec {spec!r}: {e}"
                         ) from None
    if dim <= 0 or (input_dim is not None and input_dim <= 0):
        raise ValueError(f"embedding table '{name}': dim and input_dim must be "
                         f"positive, got {dim} and {input_dim}")
    if not np.issubdtype(np.dtype(dtype), np.floating):
        raise ValueError(f"embedding table '{name}': dtype {dtype} is not a float type")
    options = {}
    for what in ("admit_after", "max_rows", "ttl_versions"):
        value = spec.get(what)
        if value is not None and (isinstance(value, bool) or int(value) != value
                                  or value < 0):
            raise ValueError(f"embedding table '{name}': {what} must be a "
                             f"non-negative integer, got {value!r}")
        options[what] = int(value) if value else (0 if what == "admit_after" else None)
    return {"dim": dim, "dtype": dtype, "input_dim": input_dim,
            "initializer": initializer, **options}

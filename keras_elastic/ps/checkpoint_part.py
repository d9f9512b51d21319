"""A parameter server's share of a checkpoint: save it, restore it.

Saving asks every server to write its variables, optimizer variables and task
log as one part, through the job's sharding callback (validated like any
`keras_elastic.checkpoint` save); whoever asked (a worker's
`ShardedModelCheckpoint`, or the launcher's automatic checkpoints, both
through `ps/checkpoint_coordinator.py`) then writes the checkpoint's
manifest. The values and the task log are copied in one step under the
server's lock (so they agree), and written to disk after the lock is
released: pushes wait only for the copy.

Restoring reads each name this server owns from whichever part holds it, so the
number of servers may change; an embedding table's rows are read from every
part and the server keeps those of the ids it owns. A server started after a
crash has no variables yet: `init_from_checkpoint` creates them from the
checkpoint (each part records the variables' keys, whether they are trainable,
the optimizer's config and the embedding tables' specs).
"""

from __future__ import annotations

import base64
import os

import cloudpickle
import numpy as np
import tensorflow as tf
from absl import logging

from keras_elastic.checkpoint import ps_layout
from keras_elastic.checkpoint.manifest import SaveInfo
from keras_elastic.checkpoint.reader import resolve
from keras_elastic.checkpoint.writer import save_trackables
from keras_elastic.common import variable_slices
from keras_elastic.ps.partition import ps_for, row_owner
from keras_elastic.ps.store import ParameterStore
from keras_elastic.ps.task_log import TaskLog


def encode_callback(callback) -> str:
    """Ships a sharding callback (even one defined in `__main__`) to a server."""
    return base64.b64encode(cloudpickle.dumps(callback)).decode("ascii")


def decode_callback(text: str | None):
    return cloudpickle.loads(base64.b64decode(text)) if text else None


def named_variables(store: ParameterStore) -> dict[str, tf.Variable]:
    """This server's variables under partition-independent names."""
    named = {ps_layout.variable_name(k): v for k, v in store.variables.items()}
    for group_name, group in store.optimizers.items():
        for variable in group.optimizer.variables:
            # "adam_3/0002_kernel_momentum": Keras numbers optimizer names per
            # process, so drop the optimizer's name; another group than the
            # model's own optimizer prefixes its own ("g_optimizer/...").
            relative = group.relative_name(variable)
            if group_name:
                relative = f"{group_name}/{relative}"
            named[ps_layout.optimizer_variable_name(relative)] = variable
    return named


def optimizer_groups(store: ParameterStore) -> dict[str, dict]:
    """The optimizer groups other than the model's own, as a checkpoint part
    records them: {name: {"config": ..., "variables": [...]}}."""
    return {name: {"config": g.config, "variables": list(g.names)}
            for name, g in store.optimizers.items() if name}


def register_groups(store: ParameterStore, groups: dict[str, dict]) -> None:
    """Makes the optimizer groups a checkpoint records (before its values are
    read into them); a group the server already has must be the same."""
    for name, group in (groups or {}).items():
        store.register_optimizer(name, group["config"], group["variables"])


def snapshot(store: ParameterStore, table_seqs: dict[str, int] | None = None
             ) -> tuple[dict[str, np.ndarray], dict]:
    """Copies of every value, and the manifest fields that go with them, taken
    in one step (buffered gradients are applied first). `table_seqs` (an
    incremental save): each embedding table's rows changed after that change
    number, and the ids removed since (`t_<table>_removed`), not every row:
    the copy under the lock follows the rows changed, not the table's size."""
    with store.lock:
        if not store.initialized:
            raise ValueError("nothing to save: the server was never initialized")
        store.flush()
        values = {name: np.array(keras_value(v))
                  for name, v in named_variables(store).items()}
        for name, table in store.tables.items():
            if table_seqs is None:
                ids, rows, slots = table.export()
            else:
                ids, rows, slots, removed = table.export_since(table_seqs[name])
                values[ps_layout.table_tensor_name(name, "removed")] = removed
            values[ps_layout.table_tensor_name(name, "ids")] = ids
            values[ps_layout.table_tensor_name(name, "values")] = rows
            for slot, array in slots.items():
                values[ps_layout.table_tensor_name(name, f"slot_{slot}")] = array
        fields = {
            "model_version": store.version,
            "variables": {k: bool(t) for k, t in store.trainable.items()},
            "optimizer_config": store.optimizer_config,
            "optimizer_groups": optimizer_groups(store),
            "tables": store.table_specs,
            "task_log": store.log.to_json(),
            # Where each table stands: what a later incremental save of this
            # server (same incarnation) starts after.
            "table_seqs": {n: t.seq for n, t in store.tables.items()},
            "incarnation": store.incarnation,
        }
    return values, fields


def _base_seqs(store: ParameterStore, partition: int, base: str) -> dict[str, int]:
    """The change numbers this server's part of checkpoint `base` recorded,
    checked to be of this server's current life (same incarnation: not
    restarted nor restored since) and of every table."""
    from keras_elastic.checkpoint.manifest import read_manifest

    part = read_manifest(os.path.join(base, f"ps-{partition:03d}"))
    seqs = part.extra.get("table_seqs")
    if part.extra.get("incarnation") != store.incarnation or seqs is None:
        raise ValueError(f"{base} is not of this server's state (restarted or "
                         "restored since): an incremental save needs a full one first")
    missing = sorted(set(store.tables) - set(seqs))
    if missing:
        raise ValueError(f"{base} does not hold embedding table(s) {missing}: an "
                         "incremental save needs a full one first")
    return {n: int(seqs[n]) for n in store.tables}


def keras_value(variable):
    value = getattr(variable, "value", variable)
    return value.numpy() if hasattr(value, "numpy") else value


def _required(value: str, what: str, method: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{method} needs a {what} (a path), got {value!r}")
    return value


def save_shard(store: ParameterStore, partition: int, num_partitions: int,
               directory: str, callback: str | None = None,
               extra: dict | None = None, table_base: str = "") -> SaveInfo:
    """Writes partition `partition`'s part (of the job's `num_partitions`)
    into the checkpoint directory `directory` (through the sharding callback
    `callback`, as `encode_callback` gives it; None: ShardByTaskPolicy);
    `extra`: what its manifest records of the save; `table_base`: an earlier
    checkpoint of this partition, whose tables this part holds the changes
    after (incremental; "": every row). Returns the part's manifest."""
    directory = _required(directory, "checkpoint directory", "Save")
    seqs = _base_seqs(store, partition, table_base) if table_base else None
    values, fields = snapshot(store, seqs)
    if table_base:
        fields["table_base"] = os.path.basename(os.path.normpath(table_base))
    module = tf.Module()
    with tf.device("/cpu:0"):
        for name, value in values.items():
            setattr(module, name, tf.Variable(value, trainable=False))
    info = save_trackables(
        directory, f"ps-{partition:03d}", {ps_layout.TRACKABLE: module},
        decode_callback(callback),
        # (The manifest's keys keep their names: "ps_index" is the partition,
        # "num_ps" the job's number of partitions.)
        extra_manifest=dict(extra or {}, ps_index=partition, num_ps=num_partitions,
                            **fields))
    return info


def _owned_log(info, partition: int, num_partitions: int) -> tuple[TaskLog, int]:
    """The task log this server takes from the checkpoint `info`."""
    parts = ps_layout.part_infos(info)
    saved_partitions = info.extra.get("num_ps", len(parts))
    if saved_partitions == num_partitions:
        for part in parts:
            if part.extra.get("ps_index") == partition:
                return TaskLog.from_json(part.extra.get("task_log")), 0
    return TaskLog.intersection([TaskLog.from_json(p.extra.get("task_log"))
                                 for p in parts])


def _is_copy(info) -> bool:
    """A server's copy of its own state (for a new backup, or a move's
    target: ps/replication.py): one part, holding only that server's slices
    of a split variable, not a checkpoint missing parts."""
    return any(p.extra.get("backup_copy") for p in ps_layout.part_infos(info))


def restore_shard(store: ParameterStore, partition: int, num_partitions: int,
                  path: str) -> dict:
    """Loads this server's variables, optimizer variables and task log from
    the checkpoint at `path`; returns what `RestoreResponse` says."""
    info = resolve(_required(path, "checkpoint path", "Restore"))
    if not ps_layout.is_ps_checkpoint(info):
        raise ValueError(f"{info.path} is not a parameter-server checkpoint")
    values = ps_layout.read_values(info, complete=not _is_copy(info))
    log, differing = _owned_log(info, partition, num_partitions)
    groups: dict[str, dict] = {}
    for part in ps_layout.part_infos(info):
        for name, group in (part.extra.get("optimizer_groups") or {}).items():
            entry = groups.setdefault(name, {"config": group["config"],
                                             "variables": []})
            entry["variables"] += [v for v in group["variables"]
                                   if v not in entry["variables"]]
    with store.lock:
        register_groups(store, {
            name: {"config": g["config"],
                   "variables": [v for v in g["variables"] if v in store.variables]}
            for name, g in groups.items() if name not in store.optimizers})
        named = named_variables(store)
        missing = sorted(ps_layout.variable_name(k) for k in store.variables
                         if variable_slices.value_of(
                             values, ps_layout.variable_name(k)) is None)
        if missing:
            raise ValueError(f"{info.path} has no value for model variable(s) "
                             f"{missing[:10]}: it was saved from another model")
        skipped = sorted(n for n in named
                         if variable_slices.value_of(values, n) is None)
        if skipped:
            logging.warning("parameter server %d: %s has no value for optimizer "
                            "variables %s (another optimizer?): they start afresh",
                            partition, info.path, skipped[:10])
        tables = {name: ps_layout.read_table(info, name, table.slot_names)
                  for name, table in store.tables.items()}
        absent = sorted(n for n, rows in tables.items() if rows is None)
        if absent:
            raise ValueError(f"{info.path} has no rows of embedding table(s) {absent}: "
                             "it was saved from another model")
        for name, variable in named.items():
            value = variable_slices.value_of(values, name)
            if value is None:
                continue
            fitted = ps_layout.fit_shape(value, tuple(variable.shape))
            if fitted is None:
                raise ValueError(f"{info.path}: '{name}' has shape {list(value.shape)} "
                                 f"there, {list(variable.shape)} on this server: it "
                                 "was saved from another model")
            variable.assign(fitted)
        for name, (ids, rows, slots) in tables.items():
            owned = row_owner(ids, num_partitions) == partition
            store.reset_table(name).load(ids[owned], rows[owned],
                                         {s: a[owned] for s, a in slots.items()})
        store.log = log
        store.mark_restored(info.path)
    if differing:
        logging.warning(
            "parameter server %d: %s was saved by %s servers and is restored onto %d; "
            "%d element(s) of tasks in flight at the save were applied to some of its "
            "variables and not others, and may now be applied twice to some.",
            partition, info.path, info.extra.get("num_ps"), num_partitions, differing)
    # (RestoreResponse's fields: its ps_index is the partition.)
    return {"ps_index": partition, "restored": len(named) - len(skipped),
            "path": info.path, "version": store.version,
            "incarnation": store.incarnation}


def init_from_checkpoint(store: ParameterStore, partition: int, num_partitions: int,
                         path: str) -> dict:
    """Creates the variables of a server that has none from a checkpoint, then
    restores them (a server restarted after a crash, a new backup)."""
    info = resolve(_required(path, "checkpoint path", "Restore"))
    if not ps_layout.is_ps_checkpoint(info):
        raise ValueError(f"{info.path} is not a parameter-server checkpoint")
    trainable: dict[str, bool] = {}
    config = None
    tables: dict[str, dict] = {}
    recorded = False  # the parts say what they hold (an empty dict: nothing)
    for part in ps_layout.part_infos(info):
        recorded = recorded or "variables" in part.extra
        trainable.update(part.extra.get("variables") or {})
        config = config or part.extra.get("optimizer_config")
        tables.update(part.extra.get("tables") or {})
    # A partition that holds no variable (one variable, several partitions)
    # is restored as an empty, initialized server, like any other.
    if not recorded or config is None:
        raise ValueError(f"{info.path} does not record its variables and optimizer "
                         "(saved by an older keras_elastic): it cannot start a server")
    parts = ps_layout.part_infos(info)
    mine = [p for p in parts if p.extra.get("ps_index") == partition]
    if info.extra.get("num_ps", len(parts)) == num_partitions and mine:
        owned = sorted(mine[0].extra.get("variables") or {})  # what it held
    elif any(variable_slices.parse(k) for k in trainable):
        raise ValueError(
            f"{info.path} was saved by {info.extra.get('num_ps')} servers with "
            f"variables split over them: a server {partition} of {num_partitions} "
            "cannot be created from it alone (the workers know the variables' shapes: "
            "their Init restores it onto any number of servers, as --resume does)")
    else:
        owned = sorted(k for k in trainable if ps_for(k, num_partitions) == partition)
    names = [ps_layout.variable_name(k) for k in owned]
    values = ps_layout.read_values(info, names, complete=not _is_copy(info))
    store.init({k: values[n] for k, n in zip(owned, names)},
               {k: trainable[k] for k in owned}, config, tables)
    return restore_shard(store, partition, num_partitions, info.path)


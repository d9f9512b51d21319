"""Checkpoints of a parameter-server job: one part per server, one manifest.

```
ckpt-0003/
  ps-000/  ckpt.index  ckpt.data-*  manifest.json   (server 0's variables + slots)
  ps-001/  ...
  manifest.json    written last: layout "parameter_servers", number of servers,
                   parts, step, epoch, the master's progress, variable keys
```

Every tensor is saved under a name that does not depend on how variables were
partitioned: `v_<variable key>` for a model variable, `o_<optimizer variable
path>` for an optimizer variable (slot names embed their variable's key). So
a checkpoint of N servers restores onto M servers: each server reads the
names it now owns from whichever part holds them. An embedding table is in
every part: the rows that server held, as `t_<table>_ids`, `t_<table>_values`
and `t_<table>_slot_<slot>`; a server restoring it reads every part's rows
and keeps those of the ids it now owns.

Example:

```python
info = ke.checkpoint.latest("ckpt/")
values = read_values(info)          # {name: array} over all parts
```
"""

from __future__ import annotations

import os
import re

import numpy as np
import tensorflow as tf

from keras_elastic.checkpoint.errors import CheckpointError
from keras_elastic.checkpoint.manifest import SaveInfo, read_manifest
from keras_elastic.checkpoint.ps_manifest import LAYOUT
from keras_elastic.common import variable_slices

_ATTR = "/.ATTRIBUTES/VARIABLE_VALUE"
TRACKABLE = "ps"


def safe_name(prefix: str, name: str) -> str:
    """A Python identifier for `name` (tf.train.Checkpoint attribute names)."""
    return prefix + re.sub(r"[^A-Za-z0-9_]", "_", name)


def variable_name(key: str) -> str:
    return safe_name("v_", key)


def optimizer_variable_name(path: str) -> str:
    return safe_name("o_", path)


def table_tensor_name(table: str, what: str) -> str:
    """Name of one tensor of a table's rows in a part: `what` is "ids",
    "values" or "slot_<name>"."""
    return safe_name("t_", f"{table}_{what}")


def is_ps_checkpoint(info: SaveInfo) -> bool:
    return info.extra.get("layout") == LAYOUT


def part_infos(info: SaveInfo) -> list[SaveInfo]:
    parts = info.extra.get("parts")
    if not parts:
        raise CheckpointError(f"{info.path}: parameter-server checkpoint without parts")
    return [read_manifest(os.path.join(info.path, p)) for p in parts]


def read_values(info: SaveInfo, names: list[str] | None = None,
                complete: bool = True) -> dict[str, np.ndarray]:
    """Values by name over every part. A name several parts hold (an optimizer's
    `iterations`, its learning rate) takes the largest value. Variables split
    over the servers (`common/variable_slices.py`) are also read whole, by
    their whole names (1-D), and a slice asked for is cut from the whole
    however the checkpoint split it: a checkpoint of N servers restores onto
    any number of them. `complete=False`: the checkpoint may hold only some
    slices of a split variable (one server's copy of its own state, for a
    backup or a move: `ps/replication.py`), read as they are; the caller
    checks that it has what it needs."""
    wanted = set(names) if names is not None else None
    wholes = None if wanted is None else {
        (found.whole if (found := variable_slices.parse(n)) else n) for n in wanted}
    values: dict[str, np.ndarray] = {}
    for part in part_infos(info):
        reader = tf.train.load_checkpoint(part.tf_prefix)
        for key in reader.get_variable_to_shape_map():
            if not key.startswith(TRACKABLE + "/") or not key.endswith(_ATTR):
                continue
            name = key[len(TRACKABLE) + 1:-len(_ATTR)]
            if name.startswith("t_"):
                continue  # (table rows: `read_table`)
            if wanted is not None and name not in wanted and name not in wholes:
                found = variable_slices.parse(name)
                if found is None or found.whole not in wholes:
                    continue
            value = reader.get_tensor(key)
            if name in values and np.ndim(value) == 0:
                value = np.maximum(values[name], value)
            values[name] = value
    sliced = {n: v for n, v in values.items() if variable_slices.parse(n)}
    if sliced:
        broken = [n for n in variable_slices.missing_slices(sliced) if n not in values]
        if complete and broken and (wanted is None or set(broken) & wholes):
            raise CheckpointError(f"{info.path}: the slices of {broken[:10]} do not "
                                  "cover them (a part is missing?)")
        values.update({n: v for n, v in variable_slices.assemble(sliced).items()
                       if n not in values})
    if wanted is not None:
        for name in wanted - set(values):
            value = variable_slices.value_of(values, name)
            if value is not None:
                values[name] = value
        missing = sorted(wanted - set(values))
        if missing:
            raise CheckpointError(f"{info.path}: no value for {missing[:10]}"
                                  f"{' ...' if len(missing) > 10 else ''} in any part")
    return values


def table_base(info: SaveInfo) -> SaveInfo | None:
    """The checkpoint an incremental checkpoint's tables build on (its
    manifest's "table_base", beside it), or None for a full one.

    Raises:
        CheckpointError: the base is missing or unreadable (named)."""
    name = info.extra.get("table_base")
    if not name:
        return None
    path = os.path.join(os.path.dirname(os.path.normpath(info.path)), name)
    try:
        return read_manifest(path)
    except (CheckpointError, OSError, ValueError) as e:
        raise CheckpointError(f"{info.path} holds the embedding rows changed since "
                              f"{path}, which cannot be read: {e}") from None


def read_table(info: SaveInfo, table: str, slot_names: tuple[str, ...] | list[str]
               ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]] | None:
    """The rows of embedding table `table` over every part: (ids, values,
    {slot: rows}), or None if no part holds the table. An incremental
    checkpoint's rows are those of its base (read the same way, down the
    chain to a full one) less the ids it removed, with the rows it holds
    (changed since the base) in their place."""
    what = ["ids", "values", *(f"slot_{s}" for s in slot_names)]
    found: dict[str, list[np.ndarray]] = {w: [] for w in what}
    removed: list[np.ndarray] = []
    for part in part_infos(info):
        reader = tf.train.load_checkpoint(part.tf_prefix)
        keys = set(reader.get_variable_to_shape_map())
        names = {w: f"{TRACKABLE}/{table_tensor_name(table, w)}{_ATTR}" for w in what}
        if names["ids"] not in keys:
            continue
        missing = [w for w, key in names.items() if key not in keys]
        if missing:
            raise CheckpointError(
                f"{part.path}: embedding table '{table}' lacks {missing} (saved with "
                f"another optimizer? the table's optimizer has slots {list(slot_names)})")
        for w, key in names.items():
            found[w].append(reader.get_tensor(key))
        gone = f"{TRACKABLE}/{table_tensor_name(table, 'removed')}{_ATTR}"
        if gone in keys:
            removed.append(reader.get_tensor(gone))
    if not found["ids"]:
        return None
    ids = np.concatenate(found["ids"])
    values = np.concatenate(found["values"])
    slots = {s: np.concatenate(found[f"slot_{s}"]) for s in slot_names}
    base = table_base(info)
    if base is None:
        return ids, values, slots
    before = read_table(base, table, slot_names)
    if before is None:
        raise CheckpointError(f"{info.path}: its base {base.path} has no rows of "
                              f"embedding table '{table}'")
    old_ids, old_values, old_slots = before
    keep = ~np.isin(old_ids, np.concatenate([ids, *removed]))
    order = np.argsort(np.concatenate([old_ids[keep], ids]), kind="stable")
    return (np.concatenate([old_ids[keep], ids])[order],
            np.concatenate([old_values[keep], values])[order],
            {s: np.concatenate([old_slots[s][keep], slots[s]])[order]
             for s in slot_names})


def fit_shape(value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """`value` in `shape`: as it is, or a variable split over servers read
    whole (1-D, C order) reshaped; None if it is not of that shape."""
    if tuple(np.shape(value)) == tuple(shape):
        return value
    if np.ndim(value) == 1 and np.size(value) == int(np.prod(shape, dtype=np.int64)):
        return np.reshape(value, shape)
    return None


# Called as `listener(model, path)` once a parameter-server checkpoint's
# variables are loaded into a model: an elastic model's session then has the
# servers restore the whole checkpoint (worker/session.py registers itself; a
# reader of checkpoints sends no RPC of its own).
RESTORE_LISTENERS: list = []


def restore_model_variables(model, info: SaveInfo) -> None:
    """Loads a parameter-server checkpoint's model variables into `model`
    (weights only: the optimizer's slots live on the servers). An elastic
    model's servers restore the whole checkpoint (slots and embedding tables
    included): at once if the model is connected to them, else when it
    connects (its next fit, evaluate or predict)."""
    from keras_elastic.common.variable_keys import model_variables, variable_keys

    keys = variable_keys(model)
    values = read_values(info, [variable_name(k) for k in keys])
    for key, variable in zip(keys, model_variables(model)):
        value = fit_shape(values[variable_name(key)], tuple(variable.shape))
        if value is None:
            raise CheckpointError(
                f"{info.path}: variable {key} ({variable.path}) has shape "
                f"{tuple(variable.shape)} in the model but "
                f"{values[variable_name(key)].shape} in the checkpoint")
        variable.assign(value)
    for listener in RESTORE_LISTENERS:
        listener(model, info.path)

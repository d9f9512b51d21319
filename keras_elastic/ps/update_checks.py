"""Whether a parameter server may apply an `Update`: every check, before anything
changes.

`ParameterStore.push` calls `check_update` first; a push that fails it
changes nothing (not the variables, the task log, the hyperparameters or the
counters) and its error names what is wrong: `errors.ServerStateError` before
init, `UnknownVariableError` for a variable this server does not hold,
`UnknownOptimizerError` for a group never registered, ValueError otherwise
(a tensor's dtype or shape, a gradient of a non-trainable variable, a base
without its value, table rows pushed by another optimizer, a malformed task
range, a hyperparameter, an assignment that carries gradients).

Example:

>>> import numpy as np
>>> from keras_elastic.ps.store import ParameterStore
>>> store = ParameterStore()
>>> store.init({"w": np.ones(2, "float32")}, {"w": True},
...            {"class_name": "SGD", "config": {"learning_rate": 0.5}})
True
>>> check_update(store, Update(grads={"w": np.ones(2, "float32")},
...                            hyperparameters={"learning_rate": 0.1}))
{'learning_rate': 0.1}
>>> check_update(store, Update(grads={"w": np.ones(3, "float32")}))
... # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: the gradient of variable 'w' is float32 of shape [3], but ...
"""

from __future__ import annotations

from typing import Any

import numpy as np

from keras_elastic.common import errors
from keras_elastic.common.variable_keys import namespace_of
from keras_elastic.ps import hyperparameters as hp
from keras_elastic.ps.store_errors import NOT_INITIALIZED, UnknownVariableError
from keras_elastic.ps.task_log import check_ranges
from keras_elastic.ps.update import Update


def check_update(store: Any, update: Update) -> dict[str, float]:
    """Raises unless `store` (a `ParameterStore`, which calls this) may apply
    `update` (see the module doc); returns the update's hyperparameters,
    checked against its optimizer group."""
    if not store.initialized:
        raise errors.ServerStateError(NOT_INITIALIZED)
    grads, assigns, bases, rows = (update.grads, update.assigns, update.bases,
                                   update.rows)
    unknown = sorted((set(grads) | set(assigns)) - set(store.variables))
    if unknown:
        raise UnknownVariableError(unknown)
    group = store.group(update.optimizer)
    if update.optimizer:
        outside = sorted(set(grads) - set(group.names))
        if outside:
            raise ValueError(f"optimizer '{update.optimizer}' does not update "
                             f"{outside} on this server (it updates {group.names})")
    if rows:
        _check_rows_optimizer(update)
    for name, value in grads.items():
        store.check_tensor(name, value.dtype, np.shape(value), gradient=True)
    for name, value in assigns.items():
        store.check_tensor(name, value.dtype, np.shape(value), gradient=False)
    for name, value in bases.items():
        if name not in assigns:
            raise ValueError(f"the push has a base value for '{name}' but does not "
                             "assign it")
        store.check_tensor(name, value.dtype, np.shape(value), gradient=False)
    for name, (ids, table_rows) in rows.items():
        store.check_sparse(name, ids, np.shape(table_rows), table_rows.dtype)
    check_ranges(list(update.ranges))
    if update.assignment and (update.trains or update.ranges):
        raise ValueError("an assignment push carries values only (no gradient, rows "
                         "or task ranges)")
    return hp.check_hyperparameters(dict(update.hyperparameters), group.optimizer)


def _check_rows_optimizer(update: Update) -> None:
    """A model's tables are updated by its own optimizer ("" for the job's
    first model, "m<k>/optimizer" for model k)."""
    space = namespace_of(update.optimizer)
    if update.optimizer != (space + "optimizer" if space else "") or any(
            namespace_of(t) != space for t in update.rows):
        raise ValueError(
            "embedding-table rows are updated by their model's own optimizer: tables "
            f"{sorted(update.rows)} were pushed with optimizer "
            f"'{update.optimizer or 'optimizer'}'")

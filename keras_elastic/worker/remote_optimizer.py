"""The optimizer seam: a model's optimizers apply their updates on the servers.

An optimizer is Keras' own boundary between a train step and the variable
update (where Horovod's `DistributedOptimizer` and TensorFlow's
parameter-server strategy sit too). Every optimizer of an elastic model is
hooked, in place: its `apply` (which `apply_gradients` and `minimize` call)

- outside an elastic train step is Keras' own, unchanged;
- inside one (`worker/step_context.py`) pushes the gradients to the
  parameter servers with the batch's task ranges, named as this update of
  the step, takes the new values of every variable back and assigns them
  (`ModelSync.hand_over`, through one `tf.py_function`), then counts the
  optimizer's `iterations` as Keras does.

So a model's own `train_step` runs unchanged, with any number of optimizers
(a GAN's step applies a discriminator and a generator optimizer; the
generator's loss then sees the discriminator's new values, as in Keras).

The model's optimizers are `model.optimizer` (group `""`, created on the
servers by `init`) and every other `keras.optimizers.Optimizer` the model
holds as an attribute (group = the attribute's name, e.g. `"d_optimizer"`,
created on a server by the first push that uses it, over the variables of its
first apply, as Keras builds an optimizer on its first apply).

Example:

```python
class GAN(keras.Model):
    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer   # group "d_optimizer"
        self.g_optimizer = g_optimizer   # group "g_optimizer"
        ...

gan = ke.wrap(GAN(discriminator, generator))
```
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
from typing import Any

import keras
import tensorflow as tf

from keras_elastic.common import step_context
from keras_elastic.ps.hyperparameters import learning_rate_variable

_LINK = "_ke_remote"


def optimizers_of(model: keras.Model) -> dict[str, keras.optimizers.Optimizer]:
    """The model's optimizers by group: `""` for `model.optimizer`, the
    attribute name for every other optimizer the model holds.

    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> model.g_optimizer = keras.optimizers.Adam()
    >>> sorted(optimizers_of(model))
    ['', 'g_optimizer']
    """
    found: dict[str, keras.optimizers.Optimizer] = {}
    main = getattr(model, "optimizer", None)
    if isinstance(main, keras.optimizers.Optimizer):
        found[""] = main
    for name, value in sorted(vars(model).items()):
        if (isinstance(value, keras.optimizers.Optimizer) and name != "optimizer"
                and all(value is not o for o in found.values())):
            found[name] = value
    return found


@dataclasses.dataclass(frozen=True)
class Push:
    """The static layout of one update's push, fixed when the step is traced:
    what each input of the `tf.py_function` is."""

    group: str                      # optimizer group ("" = model.optimizer)
    update: str                     # its name in the step ("", "g_optimizer#1")
    grad_keys: tuple[str, ...]      # keys of the gradients sent
    tables: tuple[str, ...] = ()    # embedding tables whose rows follow
    rate: Any = None                # the learning-rate variable read, or None
    # (config JSON, keys of the variables the group updates): for a group
    # other than "", what a server creates it from.
    spec: tuple[str, tuple[str, ...]] | None = None


class RemoteOptimizer:
    """The link between one optimizer of the model and the servers."""

    def __init__(self, group: str, optimizer: keras.optimizers.Optimizer,
                 sync: Any) -> None:
        self.group = group
        self.optimizer = optimizer
        self.sync = sync
        self.spec: tuple[str, tuple[str, ...]] | None = None

    def _group_spec(self, keys: list[str]) -> tuple[str, tuple[str, ...]] | None:
        """The spec of this group for the servers (None for the model's own
        optimizer, which `init` created): its first apply's variables."""
        if self.group == self.sync.main_group:
            return None  # the model's own optimizer: made by init
        if self.spec is None:
            with tf.init_scope():  # (traced: the config reads variables eagerly)
                config = json.dumps(_jsonable(keras.optimizers.serialize(
                    self.optimizer)))
            self.spec = (config, tuple(keys))
        elif not set(keys) <= set(self.spec[1]):
            raise ValueError(
                f"optimizer '{self.group}' was first applied to variables "
                f"{list(self.spec[1])} and now also to "
                f"{sorted(set(keys) - set(self.spec[1]))}: as in Keras (which builds "
                "an optimizer on its first apply), an optimizer must be applied to "
                "the same variables, or a subset of them, in every step")
        return self.spec

    def apply(self, context: step_context.StepContext, grads, variables) -> None:
        """The optimizer's apply inside an elastic step (see the module doc)."""
        sync = self.sync
        if variables is None:
            variables = getattr(self.optimizer, "_trainable_variables", None)
            if not variables:
                raise ValueError(f"optimizer '{self.group or 'optimizer'}'.apply() got "
                                 "no variables and was never built")
        grads, variables = list(grads), list(variables)
        keys = [sync.key_of(v, self.group) for v in variables]
        if sync.local and not context.row_grads:
            return self._apply_in_step(context, grads, variables, keys)
        pairs = [(k, g) for k, g in zip(keys, grads) if g is not None]
        rows = context.take_row_grads() if self.group == sync.main_group else []
        rate = learning_rate_variable(self.optimizer)
        push = Push(self.group, context.update_name(self.group),
                    tuple(k for k, _ in pairs), tuple(t for t, _, _ in rows), rate,
                    self._group_spec(keys))
        sync.note_update(push)
        # (TrainFunction, the only maker of step contexts, set them at the
        # step's start for every step that pushes.)
        inputs = [context.tags] + [tf.convert_to_tensor(g) for _, g in pairs] + [
            v.value for v in sync.non_trainable] + list(context.bases) + [
            t for _, ids, g in rows for t in (ids, tf.convert_to_tensor(g))]
        if rate is not None:
            inputs.append(tf.convert_to_tensor(rate.value))
        values = tf.py_function(functools.partial(sync.hand_over, push), inputs,
                                Tout=[v.dtype for v in sync.variables])
        if not sync.variables:  # (only server tables: the call is an Operation)
            values = []
        for variable, value in zip(sync.variables, values):
            value.set_shape(variable.shape)
            variable.assign(value)
        # A later update of the step computes from the values just assigned.
        context.bases = sync.non_trainable_values()
        self.optimizer.iterations.assign_add(1)

    def _apply_in_step(self, context: step_context.StepContext, grads, variables,
                       keys: list[str]) -> None:
        """The update with the store in this process (an embedded cluster,
        `ModelSync.local`): the store holds the model's own variables and
        this very optimizer, so the step applies Keras' own update to them,
        as plain Keras does, once the task log allows it (one small
        `tf.py_function`: duplicates of a replay and refused pushes are not
        applied)."""
        sync = self.sync
        optimizer = self.optimizer
        if not optimizer.built:  # (not in the branch below: it makes variables)
            optimizer.build(variables)
        if self.group != sync.main_group:
            sync.share_optimizer(self.group, optimizer, keys)
        index = context.num_updates
        push = Push(self.group, context.update_name(self.group),
                    tuple(k for k, g in zip(keys, grads) if g is not None))
        sync.note_update(push)

        def apply():
            type(optimizer).apply(optimizer, grads, variables)
            return tf.constant(True)

        tf.cond(context.allowed[index], apply, lambda: tf.constant(False))


def _hooked_apply(self, grads, trainable_variables=None):
    """`Optimizer.apply`, routed to the servers inside an elastic step."""
    link = self.__dict__.get(_LINK)
    context = step_context.current()
    if (link is None or context is None or context.runtime is None
            or context.runtime.sync is not link.sync):
        return type(self).apply(self, grads, trainable_variables)
    return link.apply(context, grads, trainable_variables)


def attach(model: keras.Model, sync: Any) -> dict[str, RemoteOptimizer]:
    """Hooks every optimizer of `model` to `sync` (idempotent; a model
    compiled again gets its new optimizers hooked at its next fit)."""
    links = {}
    for group, optimizer in sync.optimizers().items():
        link = optimizer.__dict__.get(_LINK)
        if link is None or link.sync is not sync or link.group != group:
            link = RemoteOptimizer(group, optimizer, sync)
            object.__setattr__(optimizer, _LINK, link)
        if "apply" not in optimizer.__dict__:
            object.__setattr__(optimizer, "apply", types.MethodType(_hooked_apply,
                                                                    optimizer))
        links[group] = link
    return links


def _jsonable(value):
    import numpy as np

    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value

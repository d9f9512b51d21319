"""A parameter server's share of a checkpoint: save it, restore it.

The worker that saves (see `keras_elastic/worker/ps_checkpoint.py`) asks every
server to write its variables and optimizer variables as one part, through the
job's sharding callback (validated like any `keras_elastic.checkpoint` save),
then writes the checkpoint's manifest. Restoring reads each name this server
owns from whichever part holds it, so the number of servers may change.
"""

from __future__ import annotations

import base64

import cloudpickle
import tensorflow as tf
from absl import logging

from keras_elastic.checkpoint import ps_layout
from keras_elastic.checkpoint.reader import resolve
from keras_elastic.checkpoint.writer import save_trackables
from keras_elastic.ps.store import ParameterStore


def encode_callback(callback) -> str:
    """Ships a sharding callback (even one defined in `__main__`) to a server."""
    return base64.b64encode(cloudpickle.dumps(callback)).decode("ascii")


def decode_callback(text: str | None):
    return cloudpickle.loads(base64.b64decode(text)) if text else None


def named_variables(store: ParameterStore) -> dict[str, tf.Variable]:
    """This server's variables under partition-independent names."""
    named = {ps_layout.variable_name(k): v for k, v in store.variables.items()}
    for variable in store.optimizer_variables():
        # "adam_3/0002_kernel_momentum": Keras numbers optimizer names per
        # process, so drop the optimizer's name.
        relative = variable.path.split("/", 1)[-1]
        named[ps_layout.optimizer_variable_name(relative)] = variable
    return named


def save_shard(store: ParameterStore, ps_index: int, num_ps: int, args: dict) -> dict:
    """Writes this server's part into `args["directory"]`; returns its manifest."""
    with store.lock:
        if not store.initialized:
            raise ValueError("nothing to save: the server was never initialized")
        module = tf.Module()
        for name, variable in named_variables(store).items():
            setattr(module, name, getattr(variable, "value", variable))
        info = save_trackables(
            args["directory"], f"ps-{ps_index:03d}", {ps_layout.TRACKABLE: module},
            decode_callback(args.get("callback")),
            extra_manifest=dict(args.get("extra", {}), ps_index=ps_index,
                                num_ps=num_ps, model_version=store.version))
    data = info.to_json()
    data["path"] = info.path
    return data


def restore_shard(store: ParameterStore, ps_index: int, num_ps: int, args: dict) -> dict:
    """Loads this server's variables and optimizer variables from a checkpoint."""
    info = resolve(args["path"])
    if not ps_layout.is_ps_checkpoint(info):
        raise ValueError(f"{info.path} is not a parameter-server checkpoint")
    values = ps_layout.read_values(info)
    with store.lock:
        named = named_variables(store)
        missing = sorted(ps_layout.variable_name(k) for k in store.variables
                         if ps_layout.variable_name(k) not in values)
        if missing:
            raise ValueError(f"{info.path} has no value for model variable(s) "
                             f"{missing[:10]}: it was saved from another model")
        skipped = sorted(n for n in named if n not in values)
        if skipped:
            logging.warning("parameter server %d: %s has no value for optimizer "
                            "variables %s (another optimizer?): they start afresh",
                            ps_index, info.path, skipped[:10])
        for name, variable in named.items():
            if name in values:
                variable.assign(values[name])
        store.restored_from = info.path
    return {"ps_index": ps_index, "restored": len(named) - len(skipped),
            "path": info.path}

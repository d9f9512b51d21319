"""Seed 000's 2019 ElasticDL worker loop, against keras-elastic's master and PS.

The "before" of seed 000's table (51.0 s -> 23.8 s), rebuilt on the same
services and data as bench_training.py's keras-elastic runs, so that the two
are compared in one run. Everything is serialized on one thread, as it was:

    per task:      get_task (master RPC), read the task's records
    per minibatch: input_fn (`dataset_fn` on a `tf.data` of the minibatch's
                   records, in Python, batched), get_model (pull every variable
                   from the PS, assign them), an eager compute_loss + gradient
                   (no `tf.function`), report_gradient (push, wait for the PS)
    per task:      report_task_result (master RPC)

Its phases use the seed's column names (`get_batch`, `input_fn`, `compute`,
`get_model`, `report_gradient`).

Example (what bench_training.py's "legacy" configuration does, as the worker of
a master and a PS it started):

>>> phases, seconds, loss = run_legacy(files, cifar10, 128, 32, warmup=8)  # doctest: +SKIP
"""

from __future__ import annotations

import time
import types

import keras
import tensorflow as tf

from keras_elastic.ps.update import Update

NAME = "legacy"


def run_legacy(files: list[str], cifar10: types.ModuleType, batch_size: int,
               minibatches_per_task: int, warmup: int
               ) -> tuple[dict[str, float], float, float]:
    """Trains one epoch of `files` with the seed's loop on the cluster of this
    process; returns (phase seconds, wall seconds, last loss), timed from the
    end of minibatch `warmup` as bench_training times every configuration."""
    import keras_elastic as ke
    from keras_elastic.common.variable_keys import model_variables, variable_keys
    from keras_elastic.worker.cluster import get_cluster

    cluster = get_cluster()
    master, ps = cluster.master, cluster.ps
    data = ke.ElasticDataset(files, dataset_fn=cifar10.dataset_fn,
                             batch_size=batch_size,
                             minibatches_per_task=minibatches_per_task, name=NAME)
    master.register_dataset(data.registration(1))
    keras.utils.set_random_seed(0)
    model = cifar10.custom_model()
    optimizer, loss_fn = cifar10.optimizer(), cifar10.loss()
    model.compile(optimizer=optimizer, loss=loss_fn)
    if not model.built:
        model(tf.nest.map_structure(lambda s: tf.zeros([1, *s.shape[1:]], s.dtype),
                                    data.batched_spec[0]))
    keys, variables = variable_keys(model), model_variables(model)
    optimizer.build(model.trainable_variables)
    ps.init({k: (v.numpy(), v.trainable) for k, v in zip(keys, variables)},
            keras.optimizers.serialize(optimizer))
    trainable = set(keys[:len(model.trainable_variables)])
    by_key = dict(zip(keys, variables))

    phases = dict.fromkeys(("get_batch", "input_fn", "get_model", "compute",
                            "report_gradient", "report_task"), 0.0)
    batches, started, loss = 0, None, float("nan")

    def timed(phase: str, t0: float) -> float:
        now = time.perf_counter()
        if started is not None:
            phases[phase] += now - t0
        return now

    while True:
        t = time.perf_counter()
        task = master.get_task(NAME, 0)
        if task is None:
            break
        records = data.source.read(task.shard, task.start, task.end)
        t = timed("get_batch", t)
        for i in range(0, len(records), batch_size):
            # input_fn: the user's dataset_fn on this minibatch's records.
            chunk = tf.data.Dataset.from_tensor_slices(records[i:i + batch_size])
            x, y = next(iter(cifar10.dataset_fn(chunk, "training").batch(batch_size)))
            t = timed("input_fn", t)
            # get_model: every variable from the PS.
            for key, value in ps.pull().items():
                by_key[key].assign(value)
            t = timed("get_model", t)
            with tf.GradientTape() as tape:  # eager, as in 2019
                loss_value = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss_value, model.trainable_variables)
            t = timed("compute", t)
            ps.send(Update(
                grads={k: g.numpy() for k, g in zip(keys, grads) if k in trainable},
                assigns={k: by_key[k].numpy() for k in keys if k not in trainable}))
            t = timed("report_gradient", t)
            batches += 1
            loss = float(loss_value)
            if batches == warmup:
                started = t = time.perf_counter()
        master.report_tasks(NAME, [task.task_id], success=True, leases=[task.lease])
        t = timed("report_task", t)
    seconds = time.perf_counter() - started if started is not None else 0.0
    return phases, seconds, loss


def phase_row(phases: dict[str, float], seconds: float) -> list[float]:
    """The seed's columns: total, get_batch, input_fn, compute, get_model,
    report_gradient (report_task is folded into get_batch, as a task RPC)."""
    return [seconds,
            phases.get("get_batch", 0.0) + phases.get("report_task", 0.0),
            phases.get("input_fn", phases.get("input_wait", 0.0)),
            phases.get("compute", 0.0),
            phases.get("get_model", phases.get("pull", 0.0)),
            phases.get("report_gradient", phases.get("push", 0.0))]


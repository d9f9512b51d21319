"""Checkpoints of a parameter-server job, saved and resumed from a worker.

`ShardedModelCheckpoint` calls `save_parameter_servers` when the model trains
on the cluster: every server writes its part (variables and optimizer slots,
through the job's sharding callback) into a hidden directory, the saving
worker adds the manifest (step, epoch, number of servers, the master's
progress: which tasks of the current epoch are done) and renames the directory
into place. A process killed during a save leaves no checkpoint that looks
complete.

`resume_info` finds the checkpoint a `fit` should resume from; `ke.Model.fit`
then has the servers load it while they initialize and the master skip the
tasks already done.
"""

from __future__ import annotations

import abc
import time
from typing import Any

from keras_elastic.checkpoint import layout
from keras_elastic.checkpoint.manifest import SaveInfo
from keras_elastic.checkpoint.ps_manifest import training_progress
from keras_elastic.ps.checkpoint_coordinator import save_checkpoint
from keras_elastic.ps.checkpoint_part import encode_callback
from keras_elastic.worker.cluster import Cluster, is_chief  # noqa: F401 (re-exported)


def master_progress(cluster: Cluster) -> dict[str, dict]:
    """Per training dataset: the epoch in progress and its tasks done."""
    return training_progress(cluster.master.job_status())


def save_parameter_servers(sync: Any, cluster: Cluster, directory: str,
                           name: str, sharding_callback, extra: dict[str, Any],
                           max_to_keep: int | None = None,
                           select=None) -> SaveInfo:
    """Writes one checkpoint of every parameter server's share (`sync`: the
    model's `ModelSync`, whose variable keys the manifest records)."""
    start = time.time()
    callback = sharding_callback or __import__(
        "tensorflow").train.experimental.ShardByTaskPolicy()
    progress = master_progress(cluster)  # before the saves: its done tasks are in
    info, _ = save_checkpoint(
        cluster.ps, directory, name, progress, sharding_callback=encode_callback(callback),
        epoch=extra.get("epoch"), batch=extra.get("batch"), step=extra.get("step"),
        extra=dict({k: v for k, v in extra.items() if k not in ("epoch", "batch",
                                                                 "step")},
                   variable_keys=dict(zip(sync.keys, (v.path for v in sync.variables)))),
        max_to_keep=max_to_keep, select=select, started=start)
    return info


class RestoringCheckpoint(abc.ABC):
    """A checkpoint callback whose checkpoints hold the parameter servers'
    values, and which may restore them when `fit` starts.

    `ke.callbacks.ShardedModelCheckpoint` implements it. The worker finds such
    a callback among `fit`'s callbacks by this class (the callbacks sit above
    the worker and import it, never the reverse).

    Attributes: `directory` (where its checkpoints are), `restore_on_start`;
    `latest()` returns the newest intact checkpoint's `SaveInfo` or None.
    """

    directory: str = ""
    restore_on_start: bool = False

    @abc.abstractmethod
    def latest(self) -> SaveInfo | None:
        """The newest intact checkpoint, or None."""


def resume_info(callbacks) -> tuple[Any, SaveInfo | None]:
    """The `RestoringCheckpoint` among `callbacks` that restores on start,
    and the checkpoint it would restore (None if there is none)."""
    for callback in callbacks or []:
        if isinstance(callback, RestoringCheckpoint) and callback.restore_on_start:
            layout.remove_stale(callback.directory)
            return callback, callback.latest()
    return None, None

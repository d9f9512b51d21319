"""The manifest of a parameter-server checkpoint, written by whoever asked the
servers to save (a worker's `ShardedModelCheckpoint`, or the launcher's
automatic checkpoints). No TensorFlow: the launcher uses it.

A checkpoint is one directory with one part per server and a manifest written
last (see `ps_layout.py`); the manifest records the master's progress at the
moment before the servers saved, so every task it lists as done is wholly in
every part.

Example:

```python
temp = layout.temp_dir_for(directory, "ckpt-0007")
parts = ps_client.save_all(temp)
info = write_ps_manifest(temp, os.path.join(directory, "ckpt-0007"), parts,
                         progress=training_progress(master.job_status()))
```
"""

from __future__ import annotations

import os
import time
from typing import Any

from keras_elastic.checkpoint import layout
from keras_elastic.checkpoint.manifest import SaveInfo, read_manifest, write_manifest

LAYOUT = "parameter_servers"


def training_progress(status: Any) -> dict[str, dict]:
    """Per training dataset of a master status (`master.status.JobStatus`):
    the epoch in progress and its tasks done."""
    return {name: {"epoch": ds.epoch, "done_task_ids": list(ds.done_task_ids),
                   "records_per_task": ds.records_per_task}
            for name, ds in status.datasets.items() if ds.mode == "training"}


def write_ps_manifest(temp: str, final: str, parts: list[Any],
                      progress: dict[str, dict] | None, *, started: float | None = None,
                      epoch: int | None = None, batch: int | None = None,
                      step: int | None = None, extra: dict[str, Any] | None = None,
                      sequence: int | None = None, num_ps: int | None = None
                      ) -> SaveInfo:
    """Writes the manifest over `parts` into `temp` and commits it as `final`
    (`temp == final`: the parts are in place already). `parts`: the parts
    the servers wrote into `temp`, in server order: their Save answers, or
    anything with the part's `path` (each part's own manifest is read from
    there). `progress=None` means "the start of the job" (the initial
    model). `num_ps`: the servers of the job, when `parts` are some of them
    (a server's copy of its own state for its new backup)."""
    started = time.time() if started is None else started
    infos = [read_manifest(part.path) for part in parts]
    parts = [dict(info.to_json(), name=info.name,
                  model_version=info.extra.get("model_version")) for info in infos]
    directory = os.path.dirname(final)
    info = SaveInfo(
        path=final, name=os.path.basename(final),
        sequence=layout.next_sequence(directory) if sequence is None else sequence,
        created=started, prefix="", trackables=["ps"],
        description=parts[0]["description"], callback_class=parts[0]["callback_class"],
        latency_s=sum(p["latency_s"] for p in parts),
        validation_s=sum(p["validation_s"] for p in parts),
        write_s=time.time() - started,
        num_shards=sum(p["num_shards"] for p in parts),
        shard_sizes=[s for p in parts for s in p["shard_sizes"]],
        shard_tensors=[[f"{p['name']}:{t}" for t in shard] for p in parts
                       for shard in p["shard_tensors"]],
        epoch=epoch, batch=batch, step=step,
        extra=dict(extra or {}, layout=LAYOUT,
                   num_ps=len(parts) if num_ps is None else num_ps,
                   parts=[p["name"] for p in parts], progress=progress,
                   model_versions=[p.get("model_version") for p in parts]))
    write_manifest(temp, info)
    if os.path.abspath(temp) != os.path.abspath(final):
        layout.commit(temp, final)
    return info

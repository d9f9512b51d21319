"""Parameter-server checkpoints, coordinated: the one sequence that saves every
server's share.

Every writer of a parameter-server checkpoint uses `save_checkpoint`: a
worker's `ShardedModelCheckpoint` (`worker/checkpoint_resume.py`) and the
launcher's automatic checkpoints (`launcher/auto_checkpointer.py`). It has every
server write its part into a hidden directory, writes the manifest over the
parts (with the master's progress read before the saves), renames the
directory into place, and prunes old checkpoints; a save that fails leaves
nothing behind. A recovery restores only the server that restarted (it
starts with `--restore_from`); the others keep their state
(`launcher/recovery.py`).

The layout and manifest of a checkpoint are `keras_elastic.checkpoint`'s
(`ps_layout.py`, `ps_manifest.py`); a server writes and reads its own part
(`ps/checkpoint_part.py`). No TensorFlow here: the launcher uses it. Every
module of a parameter-server checkpoint, by role: docs/architecture.md
("Parameter-server checkpoints, by role").

Example:

```python
info = save_checkpoint(client, "/tmp/ckpts", "ckpt-000003",
                       progress=training_progress(master.job_status()))
```
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from typing import Any

from keras_elastic.checkpoint import layout
from keras_elastic.checkpoint.manifest import SaveInfo
from keras_elastic.checkpoint.ps_manifest import write_ps_manifest
from keras_elastic.ps.client import PSClient


def save_checkpoint(client: PSClient, directory: str, name: str,
                    progress: dict[str, dict] | None, *, sharding_callback: str = "",
                    epoch: int | None = None, batch: int | None = None,
                    step: int | None = None, automatic: bool = False,
                    extra: dict[str, Any] | None = None,
                    max_to_keep: int | None = None,
                    select: Callable[[SaveInfo], bool] | None = None,
                    started: float | None = None,
                    table_base: str = "") -> tuple[SaveInfo, list]:
    """Writes checkpoint `directory/name` of every server's share; returns its
    `SaveInfo` and the servers' answers (one part each, in server order).

    `progress`: the master's progress read before the saves (every task it
    lists as done is wholly in every part; see `ps_manifest.py`).
    `sharding_callback`: `ps.checkpoint_part.encode_callback(...)` ("" for
    ShardByTaskPolicy). `epoch`/`batch`/`step`: what the manifest records of
    the save. `automatic`: one of the launcher's recovery points. `extra`:
    more manifest fields. `max_to_keep`: then prunes the oldest checkpoints
    `select` accepts (all by default). `table_base`: an earlier checkpoint of
    the same servers in `directory`; the embedding tables' rows changed since
    it are saved (an incremental checkpoint, whose manifest names its base:
    restoring it reads the chain, `ps_layout.read_table`)."""
    started = time.time() if started is None else started
    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    layout.check_name(name)
    temp = layout.temp_dir_for(directory, name)
    os.makedirs(temp)
    try:
        parts = client.save_all(temp, sharding_callback, epoch=epoch, batch=batch,
                                step=step, automatic=automatic, table_base=table_base)
        if table_base:
            extra = dict(extra or {}, table_base=os.path.basename(
                os.path.normpath(table_base)))
        info = write_ps_manifest(temp, os.path.join(directory, name), parts, progress,
                                 started=started, epoch=epoch, batch=batch, step=step,
                                 extra=extra)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)  # nothing half-written stays
        raise
    if max_to_keep:
        layout.prune(directory, max_to_keep, select)
    return info, parts


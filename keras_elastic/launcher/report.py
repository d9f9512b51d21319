"""What the launcher tells the user and leaves in the job directory: the
progress line, the summary at the end, and the JSON artifacts (ledger.json,
summary.json, ...) written so that a full disk costs a line, not the job.

Pure text from the job's status, apart from `Artifacts`, which writes files:

```python
artifacts = Artifacts("/tmp/job")
artifacts.write("summary.json", {"tasks_done": 32}, indent=1)
artifacts.missing   # {} unless a write met a full disk: {name: why}
```
"""

from __future__ import annotations

import json
import os
import shlex

from absl import logging

from keras_elastic.common import disk
from keras_elastic.common.timing import PHASE_HELP, format_table
from keras_elastic.master.status import JobStatus


def progress_line(status: JobStatus, waiting_for_room: int = 0) -> str:
    """The launcher's periodic line: where each dataset is, the workers.

    >>> status = JobStatus.from_dict({
    ...     "uptime": 9.0, "master_restarts": 0, "error": None, "datasets": {},
    ...     "workers": {"alive": [0, 1], "lost": 1, "exited": [], "registered": 3},
    ...     "tasks_done": 5, "requeued": 1, "timings": {}})
    >>> progress_line(status, waiting_for_room=1)
    '[launcher] workers 2 alive, 1 lost, 1 waiting for room | requeued 1'
    """
    parts = []
    for name, ds in status.datasets.items():
        if ds.num_epochs:
            where = f"epoch {min(ds.epoch + 1, ds.num_epochs)}/{ds.num_epochs}"
        else:  # evaluation / prediction: rounds
            where = f"round {ds.epoch}"
        parts.append(f"{name}: {where}, tasks {ds.done}/"
                     f"{ds.tasks_per_epoch} done, {ds.doing} doing")
    waiting = f", {waiting_for_room} waiting for room" if waiting_for_room else ""
    parts.append(f"workers {len(status.workers.alive)} alive, "
                 f"{status.workers.lost} lost{waiting}")
    parts.append(f"requeued {status.requeued}")
    return "[launcher] " + " | ".join(parts)


def summary_text(summary: dict, job_dir: str) -> str:
    """The summary printed at the job's end, from summary.json's content (plus
    `missing_artifacts`): counts, recoveries, tables, datasets, the time per
    phase, where the logs are."""
    lines = ["", "[launcher] ===== job summary ====="]
    lines.append(f"[launcher] elapsed {summary['elapsed']:.1f} s; tasks done "
                 f"{summary['tasks_done']}, requeued {summary['requeued']}; workers "
                 f"lost {summary['workers_lost']}, restarts "
                 f"{summary['worker_restarts']}; parameter-server restarts "
                 f"{summary['ps_restarts']}, master restarts "
                 f"{summary['master_restarts']}, automatic checkpoints "
                 f"{summary['ps_checkpoints']}")
    for r in summary.get("ps_recoveries", []):
        if r.get("failover"):
            lines.append(f"[launcher] parameter server {r['ps']} {r['reason']}: its "
                         f"backup took its place in {r['seconds']:.1f} s, nothing "
                         "trained again")
            continue
        lines.append(f"[launcher] parameter server {r['ps']} {r['reason']}: back in "
                     f"{r['seconds']:.1f} s from {r['checkpoint']}, completions "
                     f"undone {r['completions_undone']}")
    for r in summary.get("ps_backups_lost", []):
        lines.append(f"[launcher] the backup of parameter server {r['ps']} "
                     f"{r['reason']}")
    for r in summary.get("ps_backups_rebuilt", []):
        lines.append(f"[launcher] parameter server {r['ps']} got a new backup in "
                     f"{r['seconds']:.1f} s")
    for d in (summary.get("autoscale") or {}).get("decisions", []):
        lines.append(f"[launcher] autoscale at {d['at_s']:.0f} s: {d['reason']}")
    if summary.get("workers_started_for_reopened"):
        lines.append(f"[launcher] workers started again "
                     f"{summary['workers_started_for_reopened']} time(s): a recovery "
                     "reopened training after every worker had finished the script")
    for name, t in summary.get("embedding_tables", {}).items():
        lines.append(f"[launcher] embedding table '{name}': {t['rows']} rows "
                     f"({t['bytes'] / 2**20:.1f} MiB) over the servers, "
                     f"{t['admitted']} admitted, {t['evicted']} evicted, "
                     f"{t['dropped']} gradient rows of ids not admitted dropped")
    for name, ds in summary["datasets"].items():
        unit = "epoch(s)" if ds["num_epochs"] else "round(s)"
        lines.append(f"[launcher] dataset '{name}' ({ds['mode']}): "
                     f"{ds['tasks_done_total']} tasks over {ds['epoch']} {unit} of "
                     f"{ds['tasks_per_epoch']} tasks")
    if summary["timings"]:
        lines.append("[launcher] seconds per phase, summed over workers:")
        lines.extend("[launcher]   " + row for row in
                     format_table(summary["timings"]).splitlines())
        for phase in PHASE_HELP:
            if phase in summary["timings"]:
                lines.append(f"[launcher]   {phase}: {PHASE_HELP[phase]}")
    if summary.get("ps_checkpoint_failures"):
        age = summary.get("recovery_point_age_s")
        lines.append(f"[launcher] automatic checkpoints skipped: "
                     f"{summary['ps_checkpoint_failures']}; the newest recovery "
                     "point is " + ("none" if age is None else f"{age:.0f} s old"))
    for name, why in summary.get("missing_artifacts", {}).items():
        lines.append(f"[launcher] missing {name}: {why}")
    lines.extend(f"[launcher] TensorBoard: tensorboard --logdir {shlex.quote(d)}"
                 for d in tensorboard_log_dirs(job_dir))
    lines.append(f"[launcher] logs, ledger and summary in {job_dir}")
    return "\n".join(lines)


def tensorboard_log_dirs(job_dir: str) -> list[str]:
    """The TensorBoard log dirs the workers recorded (worker/tensorboard.py)."""
    try:
        with open(os.path.join(job_dir, "tensorboard.json")) as f:
            return [str(d) for d in json.load(f).get("log_dirs", [])]
    except (OSError, ValueError, AttributeError):
        return []


class Artifacts:
    """The job directory's JSON files, each written atomically (a temporary
    file, then a rename). A disk condition (full, quota, read-only) is one
    logged line and an entry of `missing` ({name: why}), not an exception:
    training goes on, and the job's exit status and summary name what is
    missing. Any other OSError is raised.

    >>> import tempfile
    >>> artifacts = Artifacts(tempfile.mkdtemp())
    >>> artifacts.write("ledger.json", {"training": []})
    True
    >>> artifacts.missing
    {}
    """

    def __init__(self, job_dir: str) -> None:
        self.job_dir = job_dir
        self.missing: dict[str, str] = {}

    def write(self, name: str, data, indent: int | None = None) -> bool:
        """Writes JOB_DIR/`name` as JSON; False when a disk condition kept it
        from being written (then recorded in `missing`)."""
        path = os.path.join(self.job_dir, name)
        try:
            with open(path + ".tmp", "w") as f:
                json.dump(data, f, indent=indent)
            os.replace(path + ".tmp", path)
            self.missing.pop(name, None)
            return True
        except OSError as e:
            if not disk.is_disk_condition(e):
                raise
            message = disk.describe_write_error(path, e)
            if self.missing.get(name) != message:
                logging.error("%s", message)
            self.missing[name] = message
            try:
                os.remove(path + ".tmp")
            except OSError:
                pass
            return False

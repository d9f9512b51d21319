"""Fault injection: kill this process (SIGKILL) at a named point of the code.

For tests of what survives a crash at a precise moment (like etcd's or TiKV's
failpoints). Off unless the environment variable `KERAS_ELASTIC_FAULTS` is set:
a comma-separated list of `POINT@N` or `POINT@N:wID` — die the N-th time POINT
is reached (in the worker with id ID only). The points:

- `after_claim`: a task was claimed on the parameter servers, nothing of it
  pushed yet;
- `mid_push`: a push reached the first of its servers, not the others (with one
  server: it was applied, its reply never read);
- `after_push`: a push was applied everywhere, the trained tasks not reported;
- `epoch_end`: at the epoch barrier: the worker's stream ran out (or ended a
  segment, see `common/keras_compat.py`), its last tasks trained and pushed,
  not reported;
- `validation`: during a validation round, after the first evaluated task.

Example:

```bash
KERAS_ELASTIC_FAULTS=mid_push@5:w1 keras-elastic run --num_workers 2 -- python train.py
```
"""

from __future__ import annotations

import os
import signal
import sys
import threading

ENV = "KERAS_ELASTIC_FAULTS"
POINTS = ("after_claim", "mid_push", "after_push", "epoch_end", "validation")

_lock = threading.Lock()
_counts: dict[str, int] = {}
_plan: dict[str, int] | None = None


def _parse(text: str, worker_id: str) -> dict[str, int]:
    plan = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        point, _, rest = item.partition("@")
        count, _, who = rest.partition(":")
        if point not in POINTS or not count.isdigit():
            raise ValueError(f"{ENV}: bad entry {item!r}; expected POINT@N or "
                             f"POINT@N:wID with POINT one of {POINTS}")
        if who and who != f"w{worker_id}":
            continue
        plan[point] = int(count)
    return plan


def _load() -> dict[str, int]:
    global _plan
    if _plan is None:
        _plan = _parse(os.environ.get(ENV, ""),
                       os.environ.get("KERAS_ELASTIC_WORKER_ID", ""))
    return _plan


def due(point: str) -> bool:
    """Counts `point`; True if this is the time the plan says to die there.

    For points where the caller does part of the work first (see `die`)."""
    plan = _load()
    if point not in plan:
        return False
    with _lock:
        _counts[point] = _counts.get(point, 0) + 1
        return _counts[point] == plan[point]


def die(point: str) -> None:
    """Kills this process with SIGKILL, saying where."""
    sys.stderr.write(f"keras_elastic fault injection: SIGKILL at '{point}', "
                     f"pid {os.getpid()}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def reached(point: str) -> None:
    """Counts `point`; kills this process if the plan says so."""
    if due(point):
        die(point)

"""Where the chief's word is the job's: milestones the other workers wait for.

Every worker of a job runs the same script, so whatever the script does to
the job as a whole (write a file, assign a model's weights) happens once per
worker. The chief's (`keras_elastic.worker.cluster.is_chief`) is the job's;
the others must not act before it has. A worker reports milestones to the
master (`MasterClient.set_mark`: a name and a count that only goes up), and a
worker that is not the chief waits for the chief's (`wait_for_chief`), as it
waits for the chief's files at the end of a `fit`
(`worker/file_callbacks.py`), or for the chief's assignments of the model's
weights at the start of each phase (`worker/session.py`).

Counts rather than names keep the marks few: the k-th phase of a script is
the same phase on every worker (every worker makes the same calls), so "the
chief reached phase k" is the mark `("phase", k)`.

Example:

```python
if is_chief(cluster):
    ...                                   # act for the job
    reach(cluster, "phase", k)
else:
    wait_for_chief(cluster, "phase", k)   # the chief has acted
```
"""

from __future__ import annotations

import time

from absl import logging

from keras_elastic.common import cluster_env

POLL_SECONDS = 0.1


def reach(cluster, mark: str, count: int = 1) -> None:
    """Reports that this worker reached `count` of milestone `mark` (a no-op on
    an embedded cluster); a master that cannot be reached gets it with the
    next heartbeat."""
    if cluster.embedded:
        return
    try:
        cluster.master.set_mark(mark, count)
    except ConnectionError as e:
        logging.warning("keras_elastic: cannot report milestone %s=%d now (%s): the "
                        "master gets it with the next heartbeat", mark, count, e)


def wait_for_workers(cluster, mark: str, count: int,
                     limit: float | None = None, what: str = "") -> None:
    """Returns once every other alive worker reached `count` of milestone
    `mark` (or after `limit` seconds, default the liveness timeout, with a
    warning naming `what` they did not do). The chief waits so before it acts
    on what the others must have read first."""
    if cluster.embedded:
        return
    master, me = cluster.master, cluster.worker_id
    if limit is None:
        limit = cluster_env.call_deadline(60.0)
    deadline = time.monotonic() + limit
    while True:
        try:
            workers = master.job_status().workers
        except ConnectionError:  # the master is restarting
            workers = None
        if workers is not None and all(
                (workers.mark(w, mark) or 0) >= count
                for w in workers.alive if w != me and w not in workers.exited):
            return
        if time.monotonic() > deadline:
            logging.warning("keras_elastic: worker %d: the other workers did not %s "
                            "within %.0f s; going on", me,
                            what or f"reach {mark}={count}", limit)
            return
        time.sleep(POLL_SECONDS)


def follows_live_chief(cluster) -> bool:
    """Whether another worker is the chief and has not finished its script:
    this worker then comes to each sync point after it (`wait_for_chief`),
    and what the servers hold may already be the chief's changes of the
    phase. False on an embedded cluster, for the chief, and where the master
    cannot be reached."""
    if cluster.embedded:
        return False
    try:
        workers = cluster.master.job_status().workers
    except ConnectionError:
        return False
    return workers.chief not in (None, cluster.worker_id) and (
        workers.chief not in workers.exited)


def wait_for_chief(cluster, mark: str, count: int = 1,
                   limit: float | None = None, what: str = "",
                   then: str = "going on") -> bool:
    """Returns once the chief reached `count` of milestone `mark`, or has
    finished its script, or this worker became the chief (the chief died),
    or after `limit` seconds (default: the liveness timeout), with a warning
    naming `what` the chief did not do and what this worker does `then`.
    True if this worker is the chief now. On an embedded cluster (one
    worker, the chief) at once."""
    if cluster.embedded:
        return True
    master, me = cluster.master, cluster.worker_id
    if limit is None:
        limit = cluster_env.call_deadline(60.0)
    deadline = time.monotonic() + limit
    while True:
        try:
            workers = master.job_status().workers
        except ConnectionError:  # the master is restarting
            workers = None
        if workers is not None:
            chief = workers.chief
            if chief in (None, me):
                return True
            if chief in workers.exited or (workers.mark(chief, mark) or 0) >= count:
                return False
        if time.monotonic() > deadline:
            logging.warning("keras_elastic: worker %d: the chief did not %s within "
                            "%.0f s; %s", me, what or f"reach {mark}={count}",
                            limit, then)
            return False
        time.sleep(POLL_SECONDS)

"""The launcher: master, parameter servers and workers, kept alive.

`keras-elastic run --num_workers 2 --num_ps 1 -- python train.py` starts them
(as processes of this machine, or with `--backend ray` as Ray actors on the
nodes of a Ray cluster: `backends/`), passes the cluster to each worker
through environment variables, relaunches a worker that dies (at most
`max_worker_restarts` times in all: one more death fails the job), keeps the
number of workers within `[min_workers, max_workers]`, lets workers join
(`keras-elastic join`) and leave, prints a progress line while the job runs,
and a summary at the end. Everything here is the same on every backend.

On a cluster a worker may be lost with its node; when no node has room for
its replacement, the slot waits (`pending_slots`) and is filled, within the
restart budget, as soon as room appears. When nodes join, the launcher scales
up toward `max_workers` while workers fit.

Parameter servers are saved automatically (`auto_checkpointer.py`). A server
that dies is restarted (on its address locally, wherever the backend places it
on a cluster: clients re-read `cluster.json`) from the latest of those checkpoints;
the other servers keep their state, the master rolls training back to the
checkpoint's progress, and the servers' task logs let each server take only
what it lacks of the tasks trained again, so every element's gradient is
applied exactly once (workers wait for the server and carry on). A server
that keeps dying (`max_ps_restarts`) fails the job with its log.

With `--autoscale`, the job sizes its workers itself (`autoscaler.py` measures
and applies, `autoscale.py` decides).
The launcher decides whether to recover (`policy.py`); the steps of a
recovery, in their order, are `recovery.py`'s. What the job was asked for is
`config.py`'s `LaunchConfig`; what it prints and writes at the end,
`report.py`'s.

The launcher is a loop over two parts: the services (master, parameter
servers: their start, cluster.json, health checks and recovery) are
`services.py`'s `JobServices`; the workers (start, deaths, fencing, scaling)
`worker_group.py`'s `WorkerGroup`. `Launcher` composes them, runs the loop,
and writes the summary at the end.

The job directory holds every process's log, `cluster.json` (for joining
workers), `ps_checkpoints/`, `ledger.json` (every task completion) and
`summary.json`.

Example:

```python
launcher = Launcher(["python", "train.py"], LaunchConfig(num_workers=2, num_ps=1))
exit_code = launcher.run()
```
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence

from absl import logging

from keras_elastic.checkpoint.errors import NoIntactCheckpointError
from keras_elastic.common import disk
from keras_elastic.launcher.autoscale import Limits, Thresholds
from keras_elastic.launcher.autoscaler import Autoscaler, ServerLoad
from keras_elastic.launcher.backends import Backend, make_backend
from keras_elastic.launcher.config import LaunchConfig
from keras_elastic.launcher.job_log import JobLog
from keras_elastic.launcher.policy import FailurePolicy
from keras_elastic.launcher.report import Artifacts, progress_line, summary_text
from keras_elastic.launcher.server_scaler import ServerScaler
from keras_elastic.launcher.services import (
    JobServices,
    check_journal,
    first_generation,
    job_seed,
)
from keras_elastic.launcher.worker_group import DESIRED_WORKERS_FILE, WorkerGroup
from keras_elastic.master.status import JobStatus

__all__ = ["ARTIFACTS_MISSING", "DESIRED_WORKERS_FILE", "Launcher"]

# The exit status of a job that trained but could not write some of its
# artifacts (ledger.json, summary.json, ...: a full disk); the summary names them.
ARTIFACTS_MISSING = 3


class Launcher:
    """Starts a job's services and workers and runs the loop that keeps them
    alive, to the summary (module docstring)."""

    def __init__(self, command: Sequence[str], config: LaunchConfig) -> None:
        if not command:
            raise ValueError("no worker command: put it after `--`, e.g. "
                             "`keras-elastic run --num_workers 2 -- python train.py`")
        config.validate()
        self.command = list(command)
        self.config = config
        self.job_dir = config.job_dir or tempfile.mkdtemp(prefix="keras-elastic-job-")
        os.makedirs(self.job_dir, exist_ok=True)
        check_journal(config, self.job_dir)
        generation = first_generation(config, self.job_dir)
        seed = job_seed(config, self.job_dir)
        # JOB_DIR's JSON files (`missing`: those a full disk kept out).
        self.artifacts = Artifacts(self.job_dir)
        self.policy = FailurePolicy(config.max_worker_restarts, config.num_workers,
                                    config.max_ps_restarts, config.max_master_restarts)
        self.error: str | None = None
        self._stop_requested = False
        self._last_status: JobStatus | None = None
        self.started = time.time()
        # Last: fails early (Ray missing or unreachable, resources no node has,
        # a job directory some node cannot see, a bind address that needs
        # TLS), before anything starts.
        self.backend: Backend = make_backend(config)
        try:
            self.backend.check(self.job_dir)
            # A warm process starts importing now, while the master comes up.
            self.backend.prepare(self.job_dir)
            self.services = JobServices(
                config, self.job_dir, self.backend, self.artifacts, self.policy,
                generation, seed,
                workers=lambda: (self.group.workers, self.group.pending_slots))
            self.group = WorkerGroup(self.command, config, self.job_dir, self.backend,
                                     self.services, self.policy)
        except BaseException:
            self.backend.shutdown()
            raise
        # (made once nothing refused the job: no file of a job never started)
        self.log = JobLog(self.job_dir)  # JOB_DIR/launcher.log
        # `keras-elastic scale --num_ps / --drain_ps`: servers moved live.
        self.server_scaler = ServerScaler(self.services)
        self.server_load: ServerLoad | None = None
        self.autoscaler: Autoscaler | None = None
        if config.autoscale:
            lo, hi = config.bounds
            # Servers within --min_ps/--max_ps (--num_ps unless given), added
            # and removed live (server_scaler.py).
            self.server_load = ServerLoad(self.services.server_statuses)
            self.autoscaler = Autoscaler(
                Limits(lo, hi, *config.ps_bounds),
                Thresholds(settle_s=config.autoscale_window,
                           server_busy=config.autoscale_server_busy),
                self.server_load.latest, self._autoscale_workers, self.log.say,
                apply_servers=self.server_scaler.ask)
        logging.info("backend: %s", self.backend.describe())

    def run(self) -> int:
        """Runs the job to its end; returns the exit code (0: success)."""
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

        def request_stop(signum, frame):
            self._stop_requested = True

        for s in previous:
            signal.signal(s, request_stop)
        try:
            try:
                self.services.start()
            except NoIntactCheckpointError as e:
                self.error = f"--resume: {e}"
                self.log.say(f"[launcher] job FAILED: {self.error}", sys.stderr)
                return 1
            for _ in range(self.config.num_workers):
                self.group.start_worker()
            if self.server_load is not None:
                self.server_load.start()
            last_progress = time.time()
            seen = 0  # the feed's round of the last status acted on
            settled = time.monotonic()
            while True:
                time.sleep(0.2)
                if self._stop_requested:
                    self.error = "interrupted"
                    break
                before = self._events()
                self.error = (self.services.check_master() or self.services.check_ps()
                              or self.group.check(self._last_status))
                if self.error:
                    break
                if self._events() != before:
                    # A recovery ended or a worker finished: the end of the job is
                    # decided on a status asked for after that (an older one
                    # predates a rollback the recovery made).
                    settled = time.monotonic()
                self.services.note_placements()
                # The master's status, fetched off this loop (a frozen master
                # holds up the feed's thread, never the loop that replaces it).
                round_, status, asked_at = self.services.feed.latest()
                if status is None or round_ == seen:
                    continue
                seen, self._last_status = round_, status
                if status.error:
                    self.error = f"the master failed the job: {status.error}"
                    break
                self.services.prober.reported(status.workers.waiting,
                                              status.workers.unreachable,
                                              status.workers.alive,
                                              status.workers.reached)
                self.group.fence_lost(status)
                if (not self.group.workers and self.group.finished_ok
                        and not status.workers.alive
                        and asked_at > settled
                        and not self.group.restart_if_reopened(status)):
                    break  # every worker is done, joined ones included
                if self.autoscaler is not None and not self.group.job_over():
                    self.autoscaler.tick(status, servers=len(self.services.hosts()))
                self.group.scale()
                if not self.group.job_over():
                    self.server_scaler.tick()
                if time.time() - last_progress >= self.config.progress_interval:
                    last_progress = time.time()
                    self.log.say(progress_line(status, self.group.pending_slots))
            return self._finish()
        except OSError as e:
            if not disk.is_disk_condition(e):
                raise
            # A full disk (or quota, read-only filesystem) where the launcher
            # writes: one line, not a traceback.
            self.error = disk.describe_write_error(e.filename or self.job_dir, e)
            self.services.stop_background()  # nothing logs after the last line
            self.log.say(f"[launcher] job FAILED: {self.error}", sys.stderr)
            return 1
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self._shutdown()

    def _autoscale_workers(self, count: int) -> None:
        """The autoscaler's worker count, for the workers this launcher runs
        (joined workers count toward `count` but are not its to start)."""
        alive = self._last_status.workers.alive if self._last_status else []
        joined = sum(1 for w in alive if w not in self.group.workers)
        self.group.autoscale_to(max(0, count - joined))

    def _events(self) -> tuple[int, int, int]:
        """Counts that change when a recovery ended or a worker finished."""
        return (len(self.services.recoveries), self.services.master_restarts,
                len(self.group.finished_ok))

    def _finish(self) -> int:
        services, group = self.services, self.group
        if self.error:
            # The workers still running stop before the summary is written: a
            # worker sees the job's end in it (common/job_end.py) and would
            # stop retrying its servers, raising into the job's last lines.
            group.stop()
        status = None
        if services.master is not None:
            try:
                status = services.master.status(include_ledger=True)
            except ConnectionError as e:
                self.error = self.error or str(e)
        if status is not None:
            ledger = {name: ds.pop("ledger", []) for name, ds in
                      status["datasets"].items()}
            self.artifacts.write("ledger.json", ledger)
            checkpointer = services.checkpointer
            summary = dict(status, elapsed=time.time() - self.started,
                           worker_restarts=group.restarts, workers_lost=group.lost,
                           workers_started_for_reopened=group.reopened_starts,
                           ps_restarts=services.ps_restarts,
                           ps_recoveries=services.recoveries,
                           ps_backups_lost=services.backup_losses,
                           ps_backups_rebuilt=services.backup_rebuilds,
                           ps_scaling=self.server_scaler.records,
                           ps_spares={"count": services.spares.count,
                                      "started": services.spares.started,
                                      "taken": services.spares.taken},
                           master_restarts=services.master_restarts,
                           master_recoveries=services.master_recoveries,
                           resumed_from=services.resumed_from,
                           ps_checkpoints=checkpointer.saves if checkpointer else 0,
                           backend=self.backend.name, placements=services.placements,
                           worker_slots_pending=group.pending_slots,
                           ps_checkpoint_failures=checkpointer.failures
                           if checkpointer else 0,
                           recovery_point_age_s=checkpointer.recovery_point_age()
                           if checkpointer else None,
                           embedding_tables=services.table_stats(),
                           autoscale=self.autoscaler.record()
                           if self.autoscaler else None,
                           launcher_error=self.error)
            self.artifacts.write("summary.json", summary, indent=1)
            summary["missing_artifacts"] = dict(self.artifacts.missing)
            self.log.say(summary_text(summary, self.job_dir))
        services.stop_background()  # nothing logs after the last line below
        if self.error:
            self.log.say(f"[launcher] job FAILED: {self.error}", sys.stderr)
            return 1
        if self.artifacts.missing:
            self.log.say("[launcher] the job trained, but could not write "
                         f"{', '.join(self.artifacts.missing)}: "
                         f"{next(iter(self.artifacts.missing.values()))}", sys.stderr)
            return ARTIFACTS_MISSING
        return 0

    def _shutdown(self) -> None:
        if self.server_load is not None:
            self.server_load.stop()
        self.server_scaler.stop()
        self.services.stop_background()
        self.group.stop()
        self.services.stop()
        self.backend.shutdown()
        self.log.close()

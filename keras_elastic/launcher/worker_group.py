"""The job's workers: started, watched, relaunched, fenced and scaled (the
services they use are `services.py`'s; the loop over both, `launcher.py`).

`WorkerGroup` starts each worker with the cluster in its environment
(`cluster_env`), and at each round of the launcher's loop:

- `check`: a worker that exited 0 finished the script (no worker is started
  any more: `job_over`); one that died is told to the master, and the
  failure policy (`policy.py`) decides: relaunch it, wait for room on the
  backend (`pending_slots`), or fail the job (the reason returned);
- `fence_lost`: kills the workers the master declared lost (no heartbeat,
  or a task held far too long while every server answered) whose process
  still runs; their deaths are then handled as any other;
- `scale`: toward the desired number of workers (`keras-elastic scale`'s
  file, `--max_workers` once nodes joined, else `--num_workers`), filling
  the slots that waited for room first.

Deaths are told to the master off the loop, in order, and again later if the
master was down (`status_feed.StatusFeed.report_dead`).

Example:

```python
group = WorkerGroup(["python", "train.py"], config, job_dir, backend, services,
                    policy)
group.start_worker()
error = group.check(last_status)   # None: the job goes on
```
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from absl import logging

from keras_elastic.common import cluster_env, fencing, tls
from keras_elastic.launcher.backends import Backend, RoleHandle
from keras_elastic.launcher.config import LaunchConfig
from keras_elastic.launcher.exit_cause import exit_cause
from keras_elastic.launcher.policy import (
    FAIL_BUDGET,
    FAIL_SAME_FAILURE,
    FAIL_UNFIXABLE,
    IGNORE,
    WAIT_FOR_ROOM,
    Decision,
    FailurePolicy,
    JobView,
    WorkerDeath,
    blame_overdue,
    desired_workers,
    scale_steps,
)
from keras_elastic.launcher.services import JobServices
from keras_elastic.master.status import JobStatus
from keras_elastic.ps.partition import PARTITION_BYTES_ENV

DESIRED_WORKERS_FILE = "desired_workers"
# How long a hung worker has to write its threads' stacks before SIGKILL.
STACK_DUMP_SECONDS = 0.5


class WorkerGroup:
    """The workers of one job (module docstring)."""

    def __init__(self, command: Sequence[str], config: LaunchConfig, job_dir: str,
                 backend: Backend, services: JobServices, policy: FailurePolicy
                 ) -> None:
        self.command = list(command)
        self.config = config
        self.job_dir = job_dir
        self.backend = backend
        self.services = services
        self.policy = policy
        self.workers: dict[int, RoleHandle] = {}
        # Workers lost whose replacement waits for room on the backend.
        self.pending_slots = 0
        self._grown_to = 0      # target after nodes joined (0: none)
        self._grown_at = 0.0
        self._autoscaled: int | None = None  # the autoscaler's count (None: none)
        self._autoscaled_at = 0.0
        self.next_worker_id = 0
        self.restarts = 0
        self.lost = 0
        self._fenced: set[int] = set()  # workers killed because the master lost them
        # Every worker death, for the failure policy (launcher/policy.py).
        self.failures: list[WorkerDeath] = []
        self.finished_ok: list[int] = []
        # restart_if_reopened: the count of reopenings acted on, per dataset,
        # and how many times the workers were started again for them.
        self._reopened_seen: dict[str, int] = {}
        self._blamed: set[int] = set()  # cut off from a server: reported lost
        self.reopened_starts = 0

    def start_worker(self, replaces: int | None = None) -> int:
        """Starts the next worker (`replaces`: the worker whose process ended,
        which it is started to replace); its id."""
        worker_id = self.next_worker_id
        self.next_worker_id += 1
        services = self.services
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's C++ INFO lines
        env.update(cluster_env.to_env(services.master_address, services.partition_addresses,
                                      worker_id, self.job_dir, services.seed))
        env[cluster_env.CONNECT_TIMEOUT] = str(self.config.connect_timeout)
        env[cluster_env.LIVENESS_TIMEOUT] = str(self.config.liveness_timeout)
        env[fencing.GENERATION_ENV] = str(services.generation)
        env[PARTITION_BYTES_ENV] = str(self.config.ps_partition_bytes)
        env.pop(cluster_env.REPLACES, None)
        if replaces is not None:
            env[cluster_env.REPLACES] = str(replaces)
        for server_only in (tls.CERT_ENV, tls.KEY_ENV):  # a worker is a client
            env.pop(server_only, None)
        self.workers[worker_id] = self.backend.start(
            f"worker-{worker_id}", self.command,
            os.path.join(self.job_dir, f"worker-{worker_id}.log"), env=env,
            kind="worker", echo=self.config.echo_worker_output)
        pid = self.workers[worker_id].pid
        logging.info("started worker %d (%s)", worker_id, f"pid {pid}" if pid else
                     f"placed by {self.backend.name}")
        services.write_cluster_file()
        return worker_id

    def _room_for_worker(self) -> bool:
        capacity = self.backend.worker_capacity()
        return capacity is None or capacity > 0

    # -- deaths -----------------------------------------------------------------
    def _report_dead(self, worker_id: int, reason: str) -> None:
        """Tells the master a worker is gone (off the loop: the feed's thread,
        later if the master is down)."""
        self.services.feed.report_dead(worker_id, reason)

    def check(self, last_status: JobStatus | None) -> str | None:
        """Handles the workers that exited since the last round (`last_status`:
        the master's last status, for the tasks done); returns why the job
        fails, None while it goes on."""
        for worker_id, proc in list(self.workers.items()):
            code = proc.poll()
            if code is None:
                continue
            proc.close()
            del self.workers[worker_id]
            if code == 0:
                self.finished_ok.append(worker_id)
                logging.info("worker %d finished", worker_id)
                continue
            error = self._died(worker_id, proc, code, last_status)
            if error:
                return error
        return None

    def _died(self, worker_id: int, proc: RoleHandle, code: int,
              last_status: JobStatus | None) -> str | None:
        """A worker died (exit `code`): recorded, told to the master, then
        what the failure policy decides is done; returns why the job fails."""
        self.lost += 1
        reason = proc.describe_exit(code)
        tail = proc.tail()
        done = last_status.tasks_done if last_status else 0
        # A role lost with its node is not the script failing the same way.
        cause = exit_cause(tail) if not proc.lost_reason else None
        self.failures.append(WorkerDeath(
            worker_id, proc.lost_reason or cause.text, done,
            exception=cause.exception_name if cause else "",
            where=cause.where if cause else ""))
        logging.warning("worker %d %s; log: %s", worker_id, reason, proc.log_path)
        self._report_dead(worker_id, reason)
        decision = self.policy.on_worker_death(JobView(
            deaths=self.failures, job_over=self.job_over(),
            restarts_used=self.restarts, pending_slots=self.pending_slots,
            room_for_worker=self._room_for_worker()))
        if decision.action == IGNORE:
            return None
        if decision.action in (FAIL_BUDGET, FAIL_UNFIXABLE, FAIL_SAME_FAILURE):
            return self._failure_text(decision, worker_id, reason, proc.log_path, tail)
        if decision.action == WAIT_FOR_ROOM:
            self.pending_slots += 1
            self.services.write_cluster_file()
            logging.warning("no room for a new worker on %s now: worker %d is "
                            "relaunched when a node has room", self.backend.name,
                            worker_id)
            return None
        self.restarts += 1
        new_id = self.start_worker(replaces=worker_id)
        logging.warning("relaunched worker %d as worker %d (restart %d of %d)",
                        worker_id, new_id, self.restarts,
                        self.config.max_worker_restarts)
        return None

    def _failure_text(self, decision: Decision, worker_id: int, reason: str,
                      log_path: str, tail: str) -> str:
        """Why the job fails after worker `worker_id`'s death, by the policy's
        `decision` (FAIL_BUDGET, FAIL_UNFIXABLE or FAIL_SAME_FAILURE)."""
        if decision.action == FAIL_BUDGET:
            causes = {d.cause for d in self.failures}
            same = (f" Every worker that died failed the same way: "
                    f"{causes.pop()}" if len(causes) == 1 else "")
            return (
                f"worker {worker_id} {reason} and the job has used all "
                f"{self.config.max_worker_restarts} worker restarts "
                f"(--max_worker_restarts).{same} Its log ({log_path}) ends "
                f"with:\n{tail}")
        if decision.action == FAIL_UNFIXABLE:
            return (
                f"worker {worker_id} {reason}: {self.failures[-1].cause} "
                f"Relaunching the same script cannot fix that, so the job stops "
                f"(restart {self.restarts} of {self.config.max_worker_restarts} "
                f"used). Its log ({log_path}) ends with:\n{tail}")
        death = self.failures[-1]
        how = (f"raised {death.exception} at {death.where}" if decision.streak
               == 2 and death.script_error else "failed the same way with no "
               "task done in between")
        return (
            f"worker {worker_id} {reason}: the last {decision.streak} workers "
            f"all {how}, so relaunching cannot help (restart {self.restarts} "
            f"of {self.config.max_worker_restarts} used). Its log "
            f"({log_path}) ends with:\n{tail}")

    def fence_lost(self, status: JobStatus) -> None:
        """Kills the workers the master declared lost whose process still runs
        (no heartbeat, or no progress on a task: a deadlocked training
        thread): their tasks went to others, and the process must not wake up
        into the job. The death is then handled as any other (relaunch)."""
        lost = list(status.workers.lost_ids)
        fine_for = self.services.prober.services_fine_for()
        for worker_id in blame_overdue(status.workers.overdue, fine_for,
                                       status.workers.waiting):
            if worker_id in self.workers and worker_id not in self._fenced:
                limit = status.workers.overdue[worker_id]
                reason = (f"no progress: it held a task for more than {limit:.0f} s "
                          f"(the dataset's tasks take far less) while every server "
                          f"answered")
                logging.warning("worker %d: %s; declaring it lost", worker_id, reason)
                self._report_dead(worker_id, reason)
                lost.append(worker_id)
        # Workers cut off from a server the others reach (a partition between
        # machines): lost, whether launched here (then killed) or joined.
        for worker_id, reason in self.services.prober.cut_off_workers().items():
            if worker_id in self._blamed:
                continue
            self._blamed.add(worker_id)
            logging.warning("worker %d %s; declaring it lost", worker_id, reason)
            self._report_dead(worker_id, reason)
            lost.append(worker_id)
        for worker_id in lost:
            proc = self.workers.get(worker_id)
            if proc is None or worker_id in self._fenced or proc.poll() is not None:
                continue
            logging.warning("worker %d (pid %s) was declared lost by the master while "
                            "its process runs: killing it", worker_id, proc.pid)
            self._fenced.add(worker_id)
            proc.dump_stacks()  # what it was doing, in its log
            time.sleep(STACK_DUMP_SECONDS)
            proc.kill()

    # -- scaling -------------------------------------------------------------------
    def job_over(self) -> bool:
        """A worker finished the script (exit 0): no worker is started any more,
        neither to replace a lost one nor to scale up.

        Every worker runs the same script, and a worker's training, evaluation
        and prediction end only when the job's round of the dataset is over
        (the master makes a worker wait while others still hold tasks), or
        when the script stops training itself (`EarlyStopping`: every worker
        decides the same at the same epoch's end). So once one worker is
        through, a new one would only train what the script chose not to
        train (epochs after an early stop)."""
        return bool(self.finished_ok)

    def restart_if_reopened(self, status: JobStatus) -> bool:
        """Every worker finished the script, but a recovery since sent the
        parameter servers back to a checkpoint older than the end of training
        and the master reopened a training dataset that had finished
        (`reopened_after_finish`): the scripts ended before the rollback (a
        server the launcher could not reach while the workers still could,
        then lost). Nobody would train what was reopened, and the job would
        end with its model behind its ledger's past: the workers are started
        again (within the job's bounds, as at the start), their `fit` trains
        the reopened tasks. Returns whether it started them."""
        reopened = {name: ds.reopened_after_finish for name, ds in
                    status.training_datasets().items()
                    if not ds.finished and ds.reopened_after_finish
                    > self._reopened_seen.get(name, 0)}
        if not reopened:
            return False
        self._reopened_seen.update(reopened)
        logging.warning(
            "every worker finished the script, but a recovery reopened training "
            "dataset(s) %s after they had finished (the parameter servers went back "
            "to a checkpoint older than the end of training): starting %d worker(s) "
            "again to train what was reopened", ", ".join(sorted(reopened)),
            self.config.num_workers)
        self.finished_ok.clear()
        self.reopened_starts += 1
        for _ in range(self.config.num_workers):
            self.start_worker()
        return True

    def _desired_workers(self) -> int:
        """The newest of `keras-elastic scale`'s number, the autoscaler's and
        (nodes joined) --max_workers, clamped to the bounds; else
        --num_workers."""
        path = os.path.join(self.job_dir, DESIRED_WORKERS_FILE)
        try:
            written = os.path.getmtime(path)
            with open(path) as f:
                wanted = int(f.read().strip())
        except (OSError, ValueError):
            wanted, written = None, 0.0
        return desired_workers(self.config.num_workers, self.config.bounds, wanted,
                               written, self._grown_to, self._grown_at,
                               self._autoscaled, self._autoscaled_at)

    def autoscale_to(self, count: int) -> None:
        """The autoscaler's decision (`launcher/autoscaler.py`): run `count`
        workers from now on (as `keras-elastic scale` would; the next
        `scale()` starts or stops them)."""
        self._autoscaled, self._autoscaled_at = count, time.time()

    def scale(self) -> None:
        if self.job_over():
            return
        lo, hi = self.config.bounds
        if self.backend.nodes_joined() and self._grown_to < hi:
            self._grown_to, self._grown_at = hi, time.time()
            logging.info("node(s) joined: scaling toward %d workers (--max_workers) "
                         "as they fit", hi)
        desired = self._desired_workers()
        steps = scale_steps(len(self.workers), self.pending_slots, desired,
                            self.backend.worker_capacity())
        for _ in range(steps.fill_pending):
            self.pending_slots -= 1
            self.restarts += 1
            new_id = self.start_worker()
            logging.warning("room again: started worker %d for a lost one (restart %d "
                            "of %d)", new_id, self.restarts,
                            self.config.max_worker_restarts)
        for _ in range(steps.start):
            self.start_worker()
        self.pending_slots -= steps.drop_pending
        for _ in range(steps.stop):
            worker_id = max(self.workers)
            logging.info("scaling down: stopping worker %d", worker_id)
            proc = self.workers.pop(worker_id)
            proc.terminate()
            self._report_dead(worker_id, "scaled down")

    def stop(self) -> None:
        """Ends every running worker."""
        for proc in self.workers.values():
            proc.terminate()
        self.workers.clear()

"""The local launcher: master, parameter servers and workers as processes.

`keras-elastic run --num_workers 2 --num_ps 1 -- python train.py` starts them
on this machine, passes the cluster to each worker through environment
variables, relaunches a worker that dies (up to `max_worker_restarts` times),
keeps the number of workers within `[min_workers, max_workers]`, lets workers
join (`keras-elastic join`) and leave, prints a progress line while the job
runs, and a summary at the end. The job directory holds every process's log,
`cluster.json` (for joining workers), `ledger.json` (every task completion)
and `summary.json`.

Example:

```python
launcher = Launcher(["python", "train.py"], num_workers=2, num_ps=1)
exit_code = launcher.run()
```
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence

from absl import logging

from keras_elastic.common import cluster_env
from keras_elastic.common.timing import PHASE_HELP, format_table
from keras_elastic.launcher.processes import ManagedProcess, start_service
from keras_elastic.master.client import MasterClient

DESIRED_WORKERS_FILE = "desired_workers"


@dataclasses.dataclass
class LaunchConfig:
    num_workers: int = 1
    num_ps: int = 1
    min_workers: int = 0          # 0: num_workers
    max_workers: int = 0          # 0: num_workers
    max_worker_restarts: int = 3
    grads_to_wait: int = 1
    heartbeat_timeout: float = 30.0
    max_task_retries: int = 3
    progress_interval: float = 10.0
    job_dir: str | None = None
    echo_worker_output: bool = True

    def validate(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"--num_workers must be at least 1, got {self.num_workers}")
        if self.num_ps < 1:
            raise ValueError(f"--num_ps must be at least 1, got {self.num_ps}")
        if self.max_workers and self.max_workers < self.num_workers:
            raise ValueError(f"--num_workers={self.num_workers} is more than "
                             f"--max_workers={self.max_workers}")
        if self.min_workers > self.num_workers:
            raise ValueError(f"--min_workers={self.min_workers} is more than "
                             f"--num_workers={self.num_workers}")
        if self.max_worker_restarts < 0:
            raise ValueError("--max_worker_restarts must be >= 0, got "
                             f"{self.max_worker_restarts}")
        if self.grads_to_wait < 1:
            raise ValueError(f"--grads_to_wait must be >= 1, got {self.grads_to_wait}")

    @property
    def bounds(self) -> tuple[int, int]:
        return (self.min_workers or self.num_workers,
                self.max_workers or self.num_workers)


class Launcher:
    def __init__(self, command: Sequence[str], config: LaunchConfig) -> None:
        if not command:
            raise ValueError("no worker command: put it after `--`, e.g. "
                             "`keras-elastic run --num_workers 2 -- python train.py`")
        config.validate()
        self.command = list(command)
        self.config = config
        self.job_dir = config.job_dir or tempfile.mkdtemp(prefix="keras-elastic-job-")
        os.makedirs(self.job_dir, exist_ok=True)
        self.master_proc: ManagedProcess | None = None
        self.ps_procs: list[ManagedProcess] = []
        self.workers: dict[int, ManagedProcess] = {}
        self.next_worker_id = 0
        self.restarts = 0
        self.lost = 0
        self.finished_ok: list[int] = []
        self.error: str | None = None
        self.master: MasterClient | None = None
        self._stop_requested = False
        self._last_status: dict | None = None
        self.started = time.time()

    # -- services ---------------------------------------------------------
    def _start_services(self) -> None:
        lo, hi = self.config.bounds
        self.master_proc, info = start_service(
            "master", "keras_elastic.master",
            [f"--heartbeat_timeout={self.config.heartbeat_timeout}",
             f"--max_task_retries={self.config.max_task_retries}",
             f"--max_workers={hi}"], self.job_dir)
        self.master_address = info["address"]
        self.ps_addresses = []
        for i in range(self.config.num_ps):
            proc, ps_info = start_service(
                f"ps-{i}", "keras_elastic.ps",
                [f"--ps_index={i}", f"--num_ps={self.config.num_ps}",
                 f"--grads_to_wait={self.config.grads_to_wait}"], self.job_dir)
            self.ps_procs.append(proc)
            self.ps_addresses.append(ps_info["address"])
        self.master = MasterClient(self.master_address)
        with open(os.path.join(self.job_dir, "cluster.json"), "w") as f:
            json.dump({"master": self.master_address, "ps": self.ps_addresses,
                       "launcher_pid": os.getpid()}, f)
        logging.info("job dir %s: master %s, PS %s", self.job_dir, self.master_address,
                     ", ".join(self.ps_addresses))

    def _start_worker(self) -> int:
        worker_id = self.next_worker_id
        self.next_worker_id += 1
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's C++ INFO lines
        env.update(cluster_env.to_env(self.master_address, self.ps_addresses, worker_id,
                                      self.job_dir))
        self.workers[worker_id] = ManagedProcess(
            f"worker-{worker_id}", self.command,
            os.path.join(self.job_dir, f"worker-{worker_id}.log"), env=env,
            echo=self.config.echo_worker_output)
        logging.info("started worker %d (pid %d)", worker_id,
                     self.workers[worker_id].pid)
        return worker_id

    # -- the loop ---------------------------------------------------------
    def _desired_workers(self) -> int:
        path = os.path.join(self.job_dir, DESIRED_WORKERS_FILE)
        lo, hi = self.config.bounds
        try:
            with open(path) as f:
                wanted = int(f.read().strip())
        except (OSError, ValueError):
            return self.config.num_workers
        return min(max(wanted, lo), hi)

    def _check_workers(self) -> None:
        for worker_id, proc in list(self.workers.items()):
            code = proc.poll()
            if code is None:
                continue
            proc.close()
            del self.workers[worker_id]
            if code == 0:
                self.finished_ok.append(worker_id)
                continue
            self.lost += 1
            reason = f"exited with code {code}"
            logging.warning("worker %d %s; log: %s", worker_id, reason, proc.log_path)
            try:
                self.master.report_worker_dead(worker_id, reason)
            except ConnectionError as e:
                logging.error("could not tell the master: %s", e)
            if self._job_over():
                continue
            if self.restarts >= self.config.max_worker_restarts:
                if not self.workers:
                    self.error = (
                        f"worker {worker_id} {reason} and the job has used all "
                        f"{self.config.max_worker_restarts} worker restarts; its log "
                        f"({proc.log_path}) ends with:\n{proc.tail()}")
                continue
            self.restarts += 1
            new_id = self._start_worker()
            logging.warning("relaunched worker %d as worker %d (restart %d of %d)",
                            worker_id, new_id, self.restarts,
                            self.config.max_worker_restarts)

    def _job_over(self) -> bool:
        """Every registered dataset is done: a lost worker need not come back."""
        datasets = (self._last_status or {}).get("datasets", {})
        return bool(datasets) and bool(self.finished_ok) and all(
            ds["finished"] or not ds["num_epochs"] for ds in datasets.values())

    def _scale(self) -> None:
        if self._job_over():
            return
        desired = self._desired_workers()
        while len(self.workers) < desired:
            self._start_worker()
        while len(self.workers) > desired:
            worker_id = max(self.workers)
            logging.info("scaling down: stopping worker %d", worker_id)
            proc = self.workers.pop(worker_id)
            proc.terminate()
            try:
                self.master.report_worker_dead(worker_id, "scaled down")
            except ConnectionError:
                pass

    def _progress(self, status: dict) -> str:
        parts = []
        for name, ds in status["datasets"].items():
            if ds["num_epochs"]:
                where = f"epoch {min(ds['epoch'] + 1, ds['num_epochs'])}/{ds['num_epochs']}"
            else:  # evaluation / prediction: rounds
                where = f"round {ds['epoch']}"
            parts.append(f"{name}: {where}, tasks {ds['done']}/"
                         f"{ds['tasks_per_epoch']} done, {ds['doing']} doing")
        workers = status["workers"]
        parts.append(f"workers {len(workers['alive'])} alive, {workers['lost']} lost")
        parts.append(f"requeued {status['requeued']}")
        return "[launcher] " + " | ".join(parts)

    def run(self) -> int:
        """Runs the job to its end; returns the exit code (0: success)."""
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

        def request_stop(signum, frame):
            self._stop_requested = True

        for s in previous:
            signal.signal(s, request_stop)
        try:
            self._start_services()
            for _ in range(self.config.num_workers):
                self._start_worker()
            last_progress = time.time()
            while True:
                time.sleep(0.2)
                if self._stop_requested:
                    self.error = "interrupted"
                    break
                self._check_workers()
                if self.error:
                    break
                status = self._last_status = self.master.status()
                if status["error"]:
                    self.error = f"the master failed the job: {status['error']}"
                    break
                if not self.workers and self.finished_ok and not status["workers"][
                        "alive"]:
                    break  # every worker is done, joined ones included
                self._scale()
                if time.time() - last_progress >= self.config.progress_interval:
                    last_progress = time.time()
                    print(self._progress(status), flush=True)
            return self._finish()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self._shutdown()

    def _finish(self) -> int:
        status = None
        if self.master is not None:
            try:
                status = self.master.status(include_ledger=True)
            except ConnectionError as e:
                self.error = self.error or str(e)
        if status is not None:
            ledger = {name: ds.pop("ledger", []) for name, ds in
                      status["datasets"].items()}
            with open(os.path.join(self.job_dir, "ledger.json"), "w") as f:
                json.dump(ledger, f)
            summary = dict(status, elapsed=time.time() - self.started,
                           worker_restarts=self.restarts, workers_lost=self.lost,
                           launcher_error=self.error)
            with open(os.path.join(self.job_dir, "summary.json"), "w") as f:
                json.dump(summary, f, indent=1)
            print(self.summary(summary), flush=True)
        if self.error:
            print(f"[launcher] job FAILED: {self.error}", file=sys.stderr, flush=True)
            return 1
        return 0

    def summary(self, summary: dict) -> str:
        lines = ["", "[launcher] ===== job summary ====="]
        lines.append(f"[launcher] elapsed {summary['elapsed']:.1f} s; tasks done "
                     f"{summary['tasks_done']}, requeued {summary['requeued']}; workers "
                     f"lost {summary['workers_lost']}, restarts "
                     f"{summary['worker_restarts']}")
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
        lines.append(f"[launcher] logs, ledger and summary in {self.job_dir}")
        return "\n".join(lines)

    def _shutdown(self) -> None:
        for proc in self.workers.values():
            proc.terminate()
        self.workers.clear()
        if self.master is not None:
            self.master.close()
        for proc in self.ps_procs:
            proc.terminate()
        if self.master_proc is not None:
            self.master_proc.terminate()

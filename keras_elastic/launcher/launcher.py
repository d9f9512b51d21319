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
the other servers restore it too and the master rolls training back to its
progress, so the job goes on from one consistent point, every element's
gradient applied exactly once (workers wait for the server and carry on). A
server that keeps dying (`max_ps_restarts`) fails the job with its log.
The launcher decides whether to recover (`policy.py`); the steps of a
recovery, in their order, are `recovery.py`'s. What the job was asked for is
`config.py`'s `LaunchConfig`; what it prints and writes at the end,
`report.py`'s.

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

import json
import os
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Sequence

from absl import logging

from keras_elastic.checkpoint.errors import NoIntactCheckpointError
from keras_elastic.common import auth, cluster_env, disk, fencing, rpc, tls
from keras_elastic.launcher.auto_checkpointer import (
    INIT,
    AutoCheckpointer,
    latest_checkpoint,
)
from keras_elastic.launcher.backends import (
    Backend,
    RoleHandle,
    make_backend,
    start_service,
    start_services,
)
from keras_elastic.launcher.config import LaunchConfig
from keras_elastic.launcher.exit_cause import exit_cause
from keras_elastic.launcher.job_log import JobLog
from keras_elastic.launcher.liveness import HealthProber
from keras_elastic.launcher.policy import (
    FAIL_BUDGET,
    FAIL_SAME_FAILURE,
    FAIL_UNFIXABLE,
    IGNORE,
    WAIT_FOR_ROOM,
    FailurePolicy,
    JobView,
    ServiceLiveness,
    WorkerDeath,
    blame_overdue,
    desired_workers,
    scale_steps,
)
from keras_elastic.launcher.recovery import Recovery, RecoveryFailed
from keras_elastic.launcher.report import Artifacts, progress_line, summary_text
from keras_elastic.master.client import MasterClient
from keras_elastic.master.status import JobStatus
from keras_elastic.ps.partition import PARTITION_BYTES_ENV

DESIRED_WORKERS_FILE = "desired_workers"
# The exit status of a job that trained but could not write some of its
# artifacts (ledger.json, summary.json, ...: a full disk); the summary names them.
ARTIFACTS_MISSING = 3
JOURNAL_FILE = "master.journal"
# How long a hung worker has to write its threads' stacks before SIGKILL.
STACK_DUMP_SECONDS = 0.5


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
        self.journal_path = os.path.join(self.job_dir, JOURNAL_FILE)
        if config.resume and not os.path.isfile(self.journal_path):
            raise ValueError(f"--resume: {self.job_dir} holds no job to continue (no "
                             f"{JOURNAL_FILE}); start the job without --resume")
        if not config.resume and os.path.isfile(self.journal_path):
            raise ValueError(f"{self.job_dir} holds an earlier job ({JOURNAL_FILE}): "
                             "pass --resume to continue it, or give a new --job_dir")
        self.master_proc: RoleHandle | None = None
        self.ps_procs: list[RoleHandle] = []
        self.workers: dict[int, RoleHandle] = {}
        # Workers lost whose replacement waits for room on the backend.
        self.pending_slots = 0
        self._grown_to = 0      # target after nodes joined (0: none)
        self._grown_at = 0.0
        self.placements: list[dict] = []  # {"role", "node", "at"}
        self._placed: dict[str, str] = {}
        self.next_worker_id = 0
        # The job's generation (common/fencing.py): one more at each recovery
        # of a service; a resumed job goes on from its last.
        self.generation = _last_generation(self.job_dir) + 1 if config.resume else 0
        self.seed = _job_seed(config, self.job_dir)
        self.restarts = 0
        self.lost = 0
        self.ps_restarts = 0
        self.master_restarts = 0
        self.master_recoveries: list[dict] = []
        self.resumed_from: dict | None = None
        self._pending_dead: list[tuple[int, str]] = []  # not yet told to the master
        self._fenced: set[int] = set()  # workers killed because the master lost them
        # JOB_DIR's JSON files (`missing`: those a full disk kept out).
        self.artifacts = Artifacts(self.job_dir)
        self.recoveries: list[dict] = []
        # Every worker death, for the failure policy (launcher/policy.py).
        self.failures: list[WorkerDeath] = []
        self.policy = FailurePolicy(config.max_worker_restarts, config.num_workers,
                                    config.max_ps_restarts, config.max_master_restarts)
        self.checkpointer: AutoCheckpointer | None = None
        self.recovery = Recovery(self, config.num_ps)
        interval = min(2.0, config.liveness_timeout / 5)
        self.prober = HealthProber(ServiceLiveness(config.liveness_timeout, interval),
                                   interval)
        self.finished_ok: list[int] = []
        self.error: str | None = None
        self.master: MasterClient | None = None
        self._stop_requested = False
        self._last_status: JobStatus | None = None
        self.started = time.time()
        # Last: fails early (Ray missing or unreachable, resources no node has,
        # a job directory some node cannot see), before anything starts.
        self.backend: Backend = make_backend(config)
        try:
            self.backend.check(self.job_dir)
            self.tls_on = self._tls_wanted()
            if not self.tls_on:
                rpc.check_bind(self.backend.routable_host() or "127.0.0.1", False,
                               config.insecure)
        except BaseException:
            self.backend.shutdown()
            raise
        # (made once nothing refused the job: no file of a job never started)
        self.log = JobLog(self.job_dir)  # JOB_DIR/launcher.log
        logging.info("backend: %s", self.backend.describe())

    def _tls_wanted(self) -> bool:
        """TLS beyond loopback unless --insecure (see LaunchConfig.tls_on)."""
        if self.config.tls_cert:
            return True
        if self.config.tls is not None:
            return self.config.tls
        return not self.backend.loopback_only() and not self.config.insecure

    # -- services ---------------------------------------------------------
    def _setup_security(self) -> None:
        """The job token (JOB_DIR/token) and TLS settings, put in this process's
        environment: its clients use them, its children inherit them."""
        auth.write_token_file(self.job_dir)
        self.tls_config = None
        if self.config.tls_cert:
            # A cluster's services listen on their nodes' addresses: the
            # certificate must name them (docs/ray.md).
            self.tls_config = tls.TLSConfig(
                os.path.abspath(self.config.tls_cert), os.path.abspath(self.config.tls_key),
                self.config.tls_ca and os.path.abspath(self.config.tls_ca))
        elif self.tls_on:
            # The nodes' addresses are not known in advance on a cluster: the
            # certificate names the job (tls.JOB_SERVER_NAME), which clients check.
            by_name = self.backend.tls_by_name
            hosts = [] if by_name else [self.config.advertise or self.config.bind,
                                        self.config.bind]
            self.tls_config = tls.make_self_signed(
                os.path.join(self.job_dir, "tls"), hosts,
                server_name=tls.JOB_SERVER_NAME if by_name else None)
        if self.tls_config is not None:
            os.environ.update(self.tls_config.to_env())
        elif self.config.insecure:
            os.environ[tls.INSECURE_ENV] = "1"

    def _advertised(self, address: str) -> str:
        """A service's bound address as the job's processes reach it."""
        return self.backend.advertised(address)

    def _start_service(self, name: str, module: str, args: list[str]
                       ) -> tuple[RoleHandle, dict]:
        return start_service(name, module, args, self.job_dir, backend=self.backend,
                             kind=name.split("-")[0])

    def _ps_args(self, i: int, port: int = 0) -> list[str]:
        return [f"--ps_index={i}", f"--num_ps={self.config.num_ps}",
                f"--host={self.backend.service_host()}",
                f"--grads_to_wait={self.config.grads_to_wait}", f"--port={port}",
                f"--generation={self.generation}",
                f"--init_checkpoint_dir={os.path.join(self.ps_checkpoint_dir, INIT)}"]

    def _start_services(self) -> None:
        lo, hi = self.config.bounds
        self._setup_security()
        self.ps_checkpoint_dir = os.path.join(self.job_dir, "ps_checkpoints")
        os.makedirs(os.path.join(self.ps_checkpoint_dir, INIT), exist_ok=True)
        resume_from = None
        if self.config.resume:
            resume_from = latest_checkpoint(self.ps_checkpoint_dir, self.config.num_ps)
        services = [("master", "keras_elastic.master", self._master_args())]
        for i in range(self.config.num_ps):
            args = self._ps_args(i)
            if resume_from is not None:
                args += [f"--restore_from={resume_from.path}", "--paused"]
            services.append((f"ps-{i}", "keras_elastic.ps", args))
        # All at once: their start-ups (imports) overlap.
        (self.master_proc, info), *servers = start_services(
            services, self.job_dir, backend=self.backend)
        self.master_address = self._advertised(info["address"])
        self.ps_procs = [proc for proc, _ in servers]
        self.ps_addresses = [self._advertised(ps_info["address"])
                             for _, ps_info in servers]
        # Short retries: while the master is down the loop must go on (and
        # restart it); workers retry for --connect_timeout.
        self.master = MasterClient(self.master_address, reconnect_timeout=3.0)
        self._write_cluster_file()
        if self.config.resume:
            self.resumed_from = self.recovery.resume(resume_from)
        self.checkpointer = AutoCheckpointer(
            self.ps_checkpoint_dir, self.ps_addresses, self.master,
            every_secs=self.config.ps_checkpoint_secs,
            every_versions=self.config.ps_checkpoint_versions,
            full_every=self.config.ps_checkpoint_full_every,
            keep=self.config.ps_checkpoints_to_keep)
        self.checkpointer.start()
        self.prober.set_targets({"master": self.master_address, **{
            f"ps-{i}": a for i, a in enumerate(self.ps_addresses)}})
        self.prober.start()
        logging.info("job dir %s: master %s, PS %s", self.job_dir, self.master_address,
                     ", ".join(self.ps_addresses))

    def _master_args(self, port: int = 0) -> list[str]:
        return [f"--host={self.backend.service_host()}", f"--port={port}",
                f"--journal={self.journal_path}",
                f"--heartbeat_timeout={self.config.heartbeat_timeout}",
                f"--progress_timeout={self.config.liveness_timeout}",
                f"--generation={self.generation}",
                f"--max_task_retries={self.config.max_task_retries}",
                f"--max_workers={self.config.bounds[1]}",
                f"--min_workers={self.config.num_workers}",
                f"--rendezvous_timeout={self.config.rendezvous_timeout}"]

    # -- master recovery ------------------------------------------------------
    def _exit_or_lost(self, role: str, proc: RoleHandle) -> tuple[int, str] | None:
        """(exit code, reason) if the service `role` exited, or answered no
        health check for --liveness_timeout seconds: then it is killed first
        (fencing: a frozen process must not wake up into the job after it
        was replaced), and waited for. None while it lives and answers."""
        code = proc.poll()
        if code is not None:
            return code, proc.describe_exit(code)
        why = self.prober.why(role)
        if why is None:
            return None
        logging.warning("%s (pid %s) %s: killing it", role, proc.pid, why)
        proc.kill()
        deadline = time.monotonic() + 30
        while (code := proc.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return (-9 if code is None else code), f"{why} and was killed"

    def _check_master(self) -> None:
        exited = self._exit_or_lost("master", self.master_proc)
        if exited is None:
            return
        self.master_proc.close()
        _, reason = exited
        if not self.policy.restart_service("master", self.master_restarts):
            self.error = (f"the master {reason} and was already restarted "
                          f"{self.master_restarts} time(s) (--max_master_restarts="
                          f"{self.config.max_master_restarts}); its log "
                          f"({self.master_proc.log_path}) ends with:\n"
                          f"{self.master_proc.tail()}")
            return
        self.master_restarts += 1
        logging.warning("the master %s; restarting it from its journal (restart %d "
                        "of %d)", reason, self.master_restarts,
                        self.config.max_master_restarts)
        try:
            record = self.recovery.restart_master(reason)
        except RecoveryFailed as e:
            self.error = str(e)
            return
        self.prober.set_target("master", self.master_address)
        self.prober.recovered()
        self.master_recoveries.append(record)
        logging.warning("the master is back in %.1f s", record["seconds"])

    def _report_dead(self, worker_id: int, reason: str) -> None:
        """Tells the master a worker is gone (later, if the master is down)."""
        self._pending_dead.append((worker_id, reason))
        self._flush_dead_reports()

    def _flush_dead_reports(self) -> None:
        while self._pending_dead:
            try:
                self.master.report_worker_dead(*self._pending_dead[0])
            except ConnectionError as e:
                logging.warning("could not tell the master (will retry): %s", e)
                return
            self._pending_dead.pop(0)

    def _write_cluster_file(self) -> None:
        """JOB_DIR/cluster.json: where the services are (clients re-read it
        when a service they lost moved), pids and nodes of every role."""
        roles = {"master": self.master_proc, **{f"ps-{i}": p for i, p in
                                                 enumerate(self.ps_procs)},
                 **{f"worker-{i}": p for i, p in self.workers.items()}}
        self.artifacts.write("cluster.json", {
            "master": self.master_address, "ps": self.ps_addresses,
            "generation": self.generation,
            "seed": self.seed,
            # Lost workers whose replacement waits for room on the backend.
            "worker_slots_pending": self.pending_slots,
            "ps_pids": [p.pid for p in self.ps_procs],
            "worker_pids": {str(i): p.pid for i, p in self.workers.items()},
            "master_pid": self.master_proc.pid,
            "launcher_pid": os.getpid(),
            "backend": self.backend.name,
            "nodes": {name: p.node for name, p in roles.items()},
            # What a joining client trusts (ca None: the system's CAs;
            # server_name: the name job-made certificates carry).
            "tls": self._tls_for_clients()})

    def _tls_for_clients(self) -> dict | None:
        if self.tls_config is None:
            return None
        given = {"ca": self.tls_config.ca}
        if self.tls_config.server_name:
            given["server_name"] = self.tls_config.server_name
        return given

    def _note_placements(self) -> None:
        """Records where roles landed (a cluster places them some time after
        they are started) and rewrites cluster.json when one did."""
        roles = [self.master_proc, *self.ps_procs, *self.workers.values()]
        changed = False
        for role in roles:
            node = role.node
            if node is not None and self._placed.get(role.name) != node:
                self._placed[role.name] = node
                self.placements.append({"role": role.name, "node": node,
                                        "at": time.time()})
                changed = True
        if changed:
            self._write_cluster_file()

    # -- parameter-server recovery ------------------------------------------
    def _check_ps(self) -> None:
        for i, proc in enumerate(self.ps_procs):
            exited = self._exit_or_lost(f"ps-{i}", proc)
            if exited is not None:
                self._recover_ps(i, exited[1])
                if self.error:
                    return

    def _recover_ps(self, i: int, reason: str) -> None:
        """Restarts parameter server `i` on its address from the latest
        automatic checkpoint; the other servers and the master go back to it."""
        proc = self.ps_procs[i]
        proc.close()
        if not self.policy.restart_service("ps", self.ps_restarts):
            self.error = (f"parameter server {i} {reason} and was already restarted "
                          f"{self.ps_restarts} time(s) (--max_ps_restarts="
                          f"{self.config.max_ps_restarts}); its log ({proc.log_path}) "
                          f"ends with:\n{proc.tail()}")
            return
        self.ps_restarts += 1
        logging.warning("parameter server %d %s; restarting it (restart %d of %d)", i,
                        reason, self.ps_restarts, self.config.max_ps_restarts)
        try:
            record = self.recovery.recover_ps(i, reason)
        except RecoveryFailed as e:
            self.error = str(e)
            return
        self.prober.set_target(f"ps-{i}", self.ps_addresses[i])
        self.prober.recovered()  # (the other servers were paused meanwhile)
        if record is not None:
            self.recoveries.append(record)
            logging.warning("parameter server %d is back from %s in %.1f s; tasks "
                            "undone: %s", i, record["checkpoint"] or "nothing (it was "
                            "never initialized)", record["seconds"],
                            record["completions_undone"])

    def _start_worker(self) -> int:
        worker_id = self.next_worker_id
        self.next_worker_id += 1
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's C++ INFO lines
        env.update(cluster_env.to_env(self.master_address, self.ps_addresses, worker_id,
                                      self.job_dir, self.seed))
        env[cluster_env.CONNECT_TIMEOUT] = str(self.config.connect_timeout)
        env[cluster_env.LIVENESS_TIMEOUT] = str(self.config.liveness_timeout)
        env[fencing.GENERATION_ENV] = str(self.generation)
        env[PARTITION_BYTES_ENV] = str(self.config.ps_partition_bytes)
        for server_only in (tls.CERT_ENV, tls.KEY_ENV):  # a worker is a client
            env.pop(server_only, None)
        self.workers[worker_id] = self.backend.start(
            f"worker-{worker_id}", self.command,
            os.path.join(self.job_dir, f"worker-{worker_id}.log"), env=env,
            kind="worker", echo=self.config.echo_worker_output)
        pid = self.workers[worker_id].pid
        logging.info("started worker %d (%s)", worker_id, f"pid {pid}" if pid else
                     f"placed by {self.backend.name}")
        self._write_cluster_file()
        return worker_id

    def _room_for_worker(self) -> bool:
        capacity = self.backend.worker_capacity()
        return capacity is None or capacity > 0

    # -- the loop ---------------------------------------------------------
    def _desired_workers(self) -> int:
        """`keras-elastic scale`'s number (clamped to the bounds), unless nodes
        joined since: then --max_workers; else --num_workers."""
        path = os.path.join(self.job_dir, DESIRED_WORKERS_FILE)
        try:
            written = os.path.getmtime(path)
            with open(path) as f:
                wanted = int(f.read().strip())
        except (OSError, ValueError):
            wanted, written = None, 0.0
        return desired_workers(self.config.num_workers, self.config.bounds, wanted,
                               written, self._grown_to, self._grown_at)

    def _check_workers(self) -> None:
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
            self.lost += 1
            reason = proc.describe_exit(code)
            tail = proc.tail()
            done = self._last_status.tasks_done if self._last_status else 0
            # A role lost with its node is not the script failing the same way.
            cause = exit_cause(tail) if not proc.lost_reason else None
            self.failures.append(WorkerDeath(
                worker_id, proc.lost_reason or cause.text, done,
                exception=cause.exception_name if cause else "",
                where=cause.where if cause else ""))
            logging.warning("worker %d %s; log: %s", worker_id, reason, proc.log_path)
            self._report_dead(worker_id, reason)
            decision = self.policy.on_worker_death(JobView(
                deaths=self.failures, job_over=self._job_over(),
                restarts_used=self.restarts, pending_slots=self.pending_slots,
                room_for_worker=self._room_for_worker()))
            if decision.action == IGNORE:
                continue
            if decision.action == FAIL_BUDGET:
                causes = {d.cause for d in self.failures}
                same = (f" Every worker that died failed the same way: "
                        f"{causes.pop()}" if len(causes) == 1 else "")
                self.error = (
                    f"worker {worker_id} {reason} and the job has used all "
                    f"{self.config.max_worker_restarts} worker restarts "
                    f"(--max_worker_restarts).{same} Its log ({proc.log_path}) ends "
                    f"with:\n{tail}")
                return
            if decision.action == FAIL_UNFIXABLE:
                self.error = (
                    f"worker {worker_id} {reason}: {self.failures[-1].cause} "
                    f"Relaunching the same script cannot fix that, so the job stops "
                    f"(restart {self.restarts} of {self.config.max_worker_restarts} "
                    f"used). Its log ({proc.log_path}) ends with:\n{tail}")
                return
            if decision.action == FAIL_SAME_FAILURE:
                death = self.failures[-1]
                how = (f"raised {death.exception} at {death.where}" if decision.streak
                       == 2 and death.script_error else "failed the same way with no "
                       "task done in between")
                self.error = (
                    f"worker {worker_id} {reason}: the last {decision.streak} workers "
                    f"all {how}, so relaunching cannot help (restart {self.restarts} "
                    f"of {self.config.max_worker_restarts} used). Its log "
                    f"({proc.log_path}) ends with:\n{tail}")
                return
            if decision.action == WAIT_FOR_ROOM:
                self.pending_slots += 1
                self._write_cluster_file()
                logging.warning("no room for a new worker on %s now: worker %d is "
                                "relaunched when a node has room", self.backend.name,
                                worker_id)
                continue
            self.restarts += 1
            new_id = self._start_worker()
            logging.warning("relaunched worker %d as worker %d (restart %d of %d)",
                            worker_id, new_id, self.restarts,
                            self.config.max_worker_restarts)

    def _fence_lost_workers(self, status: JobStatus) -> None:
        """Kills the workers the master declared lost whose process still runs
        (no heartbeat, or no progress on a task: a deadlocked training
        thread): their tasks went to others, and the process must not wake up
        into the job. The death is then handled as any other (relaunch)."""
        lost = list(status.workers.lost_ids)
        fine_for = self.prober.services_fine_for()
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

    def _job_over(self) -> bool:
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

    def _scale(self) -> None:
        if self._job_over():
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
            new_id = self._start_worker()
            logging.warning("room again: started worker %d for a lost one (restart %d "
                            "of %d)", new_id, self.restarts,
                            self.config.max_worker_restarts)
        for _ in range(steps.start):
            self._start_worker()
        self.pending_slots -= steps.drop_pending
        for _ in range(steps.stop):
            worker_id = max(self.workers)
            logging.info("scaling down: stopping worker %d", worker_id)
            proc = self.workers.pop(worker_id)
            proc.terminate()
            self._report_dead(worker_id, "scaled down")

    def run(self) -> int:
        """Runs the job to its end; returns the exit code (0: success)."""
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

        def request_stop(signum, frame):
            self._stop_requested = True

        for s in previous:
            signal.signal(s, request_stop)
        try:
            try:
                self._start_services()
            except NoIntactCheckpointError as e:
                self.error = f"--resume: {e}"
                self.log.say(f"[launcher] job FAILED: {self.error}", sys.stderr)
                return 1
            for _ in range(self.config.num_workers):
                self._start_worker()
            last_progress = time.time()
            while True:
                time.sleep(0.2)
                if self._stop_requested:
                    self.error = "interrupted"
                    break
                self._check_master()
                if self.error:
                    break
                self._check_ps()
                if self.error:
                    break
                self._check_workers()
                if self.error:
                    break
                self._note_placements()
                try:
                    self._flush_dead_reports()
                    status = self._last_status = self.master.job_status()
                except ConnectionError as e:
                    logging.log_every_n_seconds(logging.WARNING, "%s", 10, e)
                    continue  # the master is down: the next round restarts it
                if status.error:
                    self.error = f"the master failed the job: {status.error}"
                    break
                self.prober.reported(status.workers.waiting, status.workers.unreachable,
                                     status.workers.alive)
                self._fence_lost_workers(status)
                if not self.workers and self.finished_ok and not status.workers.alive:
                    break  # every worker is done, joined ones included
                self._scale()
                if time.time() - last_progress >= self.config.progress_interval:
                    last_progress = time.time()
                    self.log.say(progress_line(status, self.pending_slots))
            return self._finish()
        except OSError as e:
            if not disk.is_disk_condition(e):
                raise
            # A full disk (or quota, read-only filesystem) where the launcher
            # writes: one line, not a traceback.
            self.error = disk.describe_write_error(e.filename or self.job_dir, e)
            self._stop_background()  # nothing logs after the last line
            self.log.say(f"[launcher] job FAILED: {self.error}", sys.stderr)
            return 1
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
            self.artifacts.write("ledger.json", ledger)
            summary = dict(status, elapsed=time.time() - self.started,
                           worker_restarts=self.restarts, workers_lost=self.lost,
                           ps_restarts=self.ps_restarts, ps_recoveries=self.recoveries,
                           master_restarts=self.master_restarts,
                           master_recoveries=self.master_recoveries,
                           resumed_from=self.resumed_from,
                           ps_checkpoints=self.checkpointer.saves
                           if self.checkpointer else 0,
                           backend=self.backend.name, placements=self.placements,
                           worker_slots_pending=self.pending_slots,
                           ps_checkpoint_failures=self.checkpointer.failures
                           if self.checkpointer else 0,
                           recovery_point_age_s=self.checkpointer.recovery_point_age()
                           if self.checkpointer else None,
                           embedding_tables=self._table_stats(),
                           launcher_error=self.error)
            self.artifacts.write("summary.json", summary, indent=1)
            summary["missing_artifacts"] = dict(self.artifacts.missing)
            self.log.say(summary_text(summary, self.job_dir))
        self._stop_background()  # nothing logs after the last line below
        if self.error:
            self.log.say(f"[launcher] job FAILED: {self.error}", sys.stderr)
            return 1
        if self.artifacts.missing:
            self.log.say("[launcher] the job trained, but could not write "
                         f"{', '.join(self.artifacts.missing)}: "
                         f"{next(iter(self.artifacts.missing.values()))}", sys.stderr)
            return ARTIFACTS_MISSING
        return 0

    def _table_stats(self) -> dict[str, dict[str, int]]:
        """The embedding tables' counters summed over the servers (rows,
        admitted, evicted, dropped, bytes); {} without tables or servers."""
        if self.checkpointer is None or not self.ps_addresses:
            return {}
        try:
            statuses = self.checkpointer.client().status_all(timeout=30)
        except (ConnectionError, ValueError) as e:
            logging.warning("embedding table counters unavailable: %s", e)
            return {}
        out: dict[str, dict[str, int]] = {}
        for status in statuses:
            for name, counters in status.table_stats.items():
                total = out.setdefault(name, dict.fromkeys(counters, 0))
                for key, value in counters.items():
                    total[key] += value
        return out

    def _stop_background(self) -> None:
        """Stops the health prober and the automatic checkpoints (their
        threads log): the job's last line is then the launcher's last word."""
        self.prober.stop()
        if self.checkpointer is not None:
            self.checkpointer.stop()
            self.checkpointer = None

    def _shutdown(self) -> None:
        self._stop_background()
        for proc in self.workers.values():
            proc.terminate()
        self.workers.clear()
        if self.master is not None:
            self.master.close()
        for proc in self.ps_procs:
            proc.terminate()
        if self.master_proc is not None:
            self.master_proc.terminate()
        self.backend.shutdown()
        self.log.close()


def _job_seed(config: LaunchConfig, job_dir: str) -> int:
    """The job's seed (common/seeding.py): `--seed`, else a resumed job's own
    (its last cluster.json), else a random one."""
    last = None
    if config.resume:
        try:
            with open(os.path.join(job_dir, "cluster.json")) as f:
                last = json.load(f).get("seed")
        except (OSError, ValueError, AttributeError):
            last = None
    if config.seed is not None:
        if last is not None and int(last) != config.seed:
            logging.warning("--seed=%d: the job resumed used seed %s; workers whose "
                            "data depends on it build other data than before",
                            config.seed, last)
        return config.seed
    if last is not None:
        return int(last)
    return secrets.randbelow(2 ** 31)


def _last_generation(job_dir: str) -> int:
    """The generation of the job's last cluster.json (0 if none)."""
    try:
        with open(os.path.join(job_dir, "cluster.json")) as f:
            return int(json.load(f).get("generation", 0))
    except (OSError, ValueError, TypeError):
        return 0


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"

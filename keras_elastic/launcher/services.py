"""The job's services: the master and the parameter servers, started and kept
alive (the workers are `worker_group.py`'s; the loop over both, `launcher.py`).

`JobServices` holds what the job's processes must know of them and what the
launcher does to them:

- their flags (`_master_args`, `_ps_args`) and their start, all at once;
- the job token and TLS (`_setup_security`), and the addresses they are
  reached at (`_advertised`: a cluster's node address for a bound one);
- `cluster.json` (`write_cluster_file`: where every role is, the job's
  generation and seed, what a joining client trusts) and where a cluster
  placed each role (`note_placements`);
- their health: an exit, or no answer to health checks for
  `--liveness_timeout` (`liveness.py`), is a loss; a lost service is killed
  (fencing) and, within its restart budget (`policy.py`), recovered by the
  sequences of `recovery.py` (`check_master`, `check_ps`);
- the automatic parameter-server checkpoints (`auto_checkpointer.py`);
- the master's job status and the deaths told to it, fetched and sent off the
  launcher's loop (`feed`: `status_feed.py`), so that the loop, which finds
  a frozen master and replaces it, never waits on it.

The workers enter only through `workers`, a callable giving the running
workers and the slots waiting for room, for `cluster.json`.

Example:

```python
services = JobServices(config, job_dir, backend, Artifacts(job_dir), policy,
                       generation=0, seed=7, workers=lambda: ({}, 0))
services.start()
error = services.check_master() or services.check_ps()   # None: all is well
```
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable
from concurrent import futures

from absl import logging

from keras_elastic.common import auth, rpc, tls
from keras_elastic.launcher import placement
from keras_elastic.launcher.auto_checkpointer import (
    INIT,
    AutoCheckpointer,
    latest_checkpoint,
)
from keras_elastic.launcher.backends import (
    Backend,
    ProcessStartError,
    RoleHandle,
    start_service,
    start_services,
)
from keras_elastic.launcher.config import LaunchConfig
from keras_elastic.launcher.liveness import HealthProber, probe_deadline
from keras_elastic.launcher.policy import FailurePolicy, ServiceLiveness
from keras_elastic.launcher.recovery import Recovery, RecoveryFailed
from keras_elastic.launcher.report import Artifacts
from keras_elastic.launcher.spares import SpareServers
from keras_elastic.launcher.status_feed import StatusFeed
from keras_elastic.master.client import MasterClient
from keras_elastic.ps.client import PSClient, ServerStatus
from keras_elastic.ps.replication import backup_timeout

JOURNAL_FILE = "master.journal"


class JobServices:
    """The master and the parameter servers of one job (module docstring)."""

    def __init__(self, config: LaunchConfig, job_dir: str, backend: Backend,
                 artifacts: Artifacts, policy: FailurePolicy, generation: int,
                 seed: int, workers: Callable[[], tuple[dict[int, RoleHandle], int]]
                 ) -> None:
        self.config = config
        self.job_dir = job_dir
        self.backend = backend
        self.artifacts = artifacts
        self.policy = policy
        # The job's generation (common/fencing.py): one more at each recovery
        # of a service; a resumed job goes on from its last.
        self.generation = generation
        self.seed = seed
        self._workers = workers
        self.journal_path = os.path.join(job_dir, JOURNAL_FILE)
        self.master_proc: RoleHandle | None = None
        # Indexed by partition (of --ps_partitions): the server process
        # holding it (one process is repeated for each partition it holds),
        # and that process's address (`partition_addresses`, set by `start`).
        self.partition_procs: list[RoleHandle] = []
        self.partition_addresses: list[str] = []
        self.master: MasterClient | None = None
        self.tls_config: tls.TLSConfig | None = None
        self.placements: list[dict] = []  # {"role", "node", "at"}
        self._placed: dict[str, str] = {}
        self.ps_restarts = 0
        self.master_restarts = 0
        self.master_recoveries: list[dict] = []
        self.recoveries: list[dict] = []
        self.resumed_from: dict | None = None
        self.checkpointer: AutoCheckpointer | None = None
        self._status_client: tuple[list, PSClient] | None = None
        # --ps_replicas=2: each server process's backup (ps/replication.py),
        # None where it has none (lost, or promoted to take its server's
        # place). Indexed by partition, as `partition_procs` (with backups
        # every server process holds one partition: config.py).
        self.backup_procs: list[RoleHandle | None] = []
        self.backup_addresses: list[str | None] = []
        self.backup_losses: list[dict] = []
        self.backup_rebuilds: list[dict] = []
        # New backups being built off the loop: partition -> (the build, the
        # server process it is for, when it began).
        self._building: dict[int, tuple[futures.Future, RoleHandle, float]] = {}
        # (One thread: a lost backup's detach, then its successor's build.)
        self._builder = futures.ThreadPoolExecutor(1, "backup-build")
        self._builds_tried: dict[int, int] = {}
        self.recovery = Recovery(self, config.partitions)
        # Started server processes that hold nothing, for a recovery to
        # restore onto (launcher/spares.py): filled from the first periodic
        # automatic checkpoint on (`_fill_spares`).
        self.spares = SpareServers(self._start_spare, config.spares)
        interval = self.prober_interval = min(2.0, config.liveness_timeout / 5)
        deadline = probe_deadline(config.liveness_timeout)
        self.prober = HealthProber(
            ServiceLiveness(config.liveness_timeout, interval, deadline=deadline),
            interval, deadline)
        # The master's status and the deaths told to it, off the loop.
        self.feed = StatusFeed(lambda: self.master)
        self.tls_on = self._tls_wanted()
        if not self.tls_on:
            rpc.check_bind(backend.routable_host() or "127.0.0.1", False,
                           config.insecure)

    def _tls_wanted(self) -> bool:
        """TLS beyond loopback unless --insecure (see LaunchConfig.tls_on)."""
        if self.config.tls_cert:
            return True
        if self.config.tls is not None:
            return self.config.tls
        return not self.backend.loopback_only() and not self.config.insecure

    # -- start ----------------------------------------------------------------
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

    def _ps_args(self, partition: int, port: int = 0, backup: bool = False,
                 partitions: list[int] | None = None) -> list[str]:
        """A server process's flags: it holds partition `partition` (which
        names it), or `partitions` (of the job's --ps_partitions), or none
        (`[]`: one that waits for moves)."""
        args = [f"--partition={partition}",
                f"--num_partitions={self.config.partitions}",
                f"--job_dir={self.job_dir}",
                f"--host={self.backend.service_host()}",
                f"--grads_to_wait={self.config.grads_to_wait}", f"--port={port}",
                f"--generation={self.generation}",
                f"--backup_timeout={backup_timeout(self.config.liveness_timeout)}"]
        if partitions is not None and partitions != [partition]:
            args.append(f"--partitions={','.join(map(str, partitions)) or 'none'}")
        if backup:
            return args + ["--backup"]
        return args + [
            f"--init_checkpoint_dir={os.path.join(self.ps_checkpoint_dir, INIT)}"]

    def _start_spare(self, name: str) -> tuple[RoleHandle, str]:
        """(Off the loop.) A server process holding no partition, for a
        recovery to restore a lost one's partitions onto (`spares.py`); its
        --partition, past the job's partitions, only names it."""
        named = self.config.partitions + int(name.rsplit("s", 1)[1])
        proc, info = self._start_service(name, "keras_elastic.ps",
                                         self._ps_args(named, partitions=[]))
        return proc, self._advertised(info["address"])

    def _fill_spares(self) -> None:
        """Keeps --ps_spares spares started once the job has trained long
        enough for its first periodic automatic checkpoint (--ps_checkpoint_secs):
        a short job, or one that loses a server in its first seconds, never
        pays a spare's start (its TensorFlow import competes with the job's
        own), and a loss then is recovered onto a new process, as without
        spares."""
        checkpointer = self.checkpointer
        if self.spares.count and checkpointer is not None and checkpointer.periodic_saves:
            self.spares.fill()

    def _master_args(self, port: int = 0) -> list[str]:
        return [f"--host={self.backend.service_host()}", f"--port={port}",
                f"--journal={self.journal_path}", f"--job_dir={self.job_dir}",
                f"--heartbeat_timeout={self.config.heartbeat_timeout}",
                f"--progress_timeout={self.config.liveness_timeout}",
                f"--generation={self.generation}",
                f"--max_task_retries={self.config.max_task_retries}",
                f"--max_workers={self.config.bounds[1]}",
                f"--min_workers={self.config.num_workers}",
                f"--rendezvous_timeout={self.config.rendezvous_timeout}"]

    def start(self) -> None:
        """Starts the master and the servers (from the latest automatic
        checkpoint, paused, on --resume), writes cluster.json, then starts
        the automatic checkpoints and the health checks. Raises
        NoIntactCheckpointError (--resume with only damaged checkpoints)."""
        self._setup_security()
        self.ps_checkpoint_dir = os.path.join(self.job_dir, "ps_checkpoints")
        os.makedirs(os.path.join(self.ps_checkpoint_dir, INIT), exist_ok=True)
        resume_from = None
        if self.config.resume:
            resume_from = latest_checkpoint(self.ps_checkpoint_dir,
                                            self.config.partitions)
        services = [("master", "keras_elastic.master", self._master_args())]
        backups = self.config.ps_replicas > 1
        layout = placement.initial(self.config.partitions, self.config.num_ps)
        for held in layout:  # each server process's partitions
            first = held[0]
            for backup in (False, True) if backups else (False,):
                args = self._ps_args(first, backup=backup, partitions=held)
                if resume_from is not None:
                    args += [f"--restore_from={resume_from.path}", "--paused"]
                services.append((f"ps-{first}" + ("b" if backup else ""),
                                 "keras_elastic.ps", args))
        # All at once: their start-ups (imports) overlap.
        (self.master_proc, info), *servers = start_services(
            services, self.job_dir, backend=self.backend)
        self.master_address = self._advertised(info["address"])
        step = 2 if backups else 1
        # Per partition: the process holding it (shared by the partitions of
        # one process) and its address.
        by_partition = {p: (proc, self._advertised(ps_info["address"]))
                        for held, (proc, ps_info) in zip(layout, servers[::step])
                        for p in held}
        self.partition_procs = [by_partition[p][0] for p in sorted(by_partition)]
        self.partition_addresses = [by_partition[p][1] for p in sorted(by_partition)]
        if backups:
            self.backup_procs = [proc for proc, _ in servers[1::2]]
            self.backup_addresses = [self._advertised(ps_info["address"])
                                     for _, ps_info in servers[1::2]]
            self._attach_backups()
        # Short retries: while the master is down the loop must go on (and
        # restart it); workers retry for --connect_timeout.
        self.master = MasterClient(self.master_address, reconnect_timeout=3.0)
        self.write_cluster_file()
        if self.config.resume:
            self.resumed_from = self.recovery.resume(resume_from)
        self.checkpointer = AutoCheckpointer(
            self.ps_checkpoint_dir, self.partition_addresses, self.master,
            every_secs=self.config.ps_checkpoint_secs,
            every_versions=self.config.ps_checkpoint_versions,
            full_every=self.config.ps_checkpoint_full_every,
            keep=self.config.ps_checkpoints_to_keep)
        self.checkpointer.start()
        self.prober.set_targets({"master": self.master_address, **{
            f"ps-{p}": a for p, a in enumerate(self.partition_addresses)}, **{
            f"ps-{p}b": a for p, a in enumerate(self.backup_addresses) if a}})
        self.prober.start()
        self.feed.start()
        logging.info("job dir %s: master %s, PS %s", self.job_dir, self.master_address,
                     ", ".join(self.partition_addresses))

    def _attach_backups(self) -> None:
        """Each server forwards its calls to its backup from now on (both
        started from the same state: new, or the same checkpoint)."""
        client = PSClient(self.partition_addresses, worker_id=-1, connect_timeout=60)
        try:
            for partition, address in enumerate(self.backup_addresses):
                client.attach_backup(partition, address, same_start=True)
        finally:
            client.close()
        logging.info("every parameter server has a backup: %s",
                     ", ".join(self.backup_addresses))

    def hosts(self) -> list[tuple[RoleHandle, list[int]]]:
        """The server processes, each with the partitions it holds."""
        held: dict[int, tuple[RoleHandle, list[int]]] = {}
        for partition, proc in enumerate(self.partition_procs):
            held.setdefault(id(proc), (proc, []))[1].append(partition)
        return list(held.values())

    # -- cluster.json -----------------------------------------------------------
    def write_cluster_file(self) -> None:
        """JOB_DIR/cluster.json: where the services are (clients re-read it
        when a service they lost moved), pids and nodes of every role."""
        workers, pending_slots = self._workers()
        roles = {"master": self.master_proc,
                 **{f"ps-{p}": proc for p, proc in enumerate(self.partition_procs)},
                 **{f"ps-{p}b": proc for p, proc in enumerate(self.backup_procs)
                    if proc},
                 **{f"worker-{i}": proc for i, proc in workers.items()}}
        self.artifacts.write("cluster.json", {
            "master": self.master_address, "ps": self.partition_addresses,
            "generation": self.generation,
            "seed": self.seed,
            # Lost workers whose replacement waits for room on the backend.
            "worker_slots_pending": pending_slots,
            "ps_pids": [proc.pid for proc in self.partition_procs],  # per partition
            # The server processes and the partitions each holds.
            "ps_hosts": [{"name": proc.name, "pid": proc.pid,
                          "address": self.partition_addresses[held[0]], "partitions": held}
                         for proc, held in self.hosts()],
            # --ps_replicas=2: each server's backup (None: it has none now).
            "ps_backups": self.backup_addresses,
            "ps_backup_pids": [proc.pid if proc else None for proc in self.backup_procs],
            "worker_pids": {str(i): p.pid for i, p in workers.items()},
            "master_pid": self.master_proc.pid,
            "launcher_pid": os.getpid(),
            "backend": self.backend.name,
            "nodes": {name: p.node for name, p in roles.items()},
            # What a joining worker's calls outlast and retry for, as the
            # launched workers' (`keras-elastic join` passes them on).
            "liveness_timeout": self.config.liveness_timeout,
            "connect_timeout": self.config.connect_timeout,
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

    def note_placements(self) -> None:
        """Records where roles landed (a cluster places them some time after
        they are started) and rewrites cluster.json when one did."""
        workers, _ = self._workers()
        roles = [self.master_proc, *self.partition_procs, *workers.values()]
        changed = False
        for role in roles:
            node = role.node
            if node is not None and self._placed.get(role.name) != node:
                self._placed[role.name] = node
                self.placements.append({"role": role.name, "node": node,
                                        "at": time.time()})
                changed = True
        if changed:
            self.write_cluster_file()

    # -- health and recovery ------------------------------------------------------
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

    def check_master(self) -> str | None:
        """Restarts the master if it is lost; returns why the job fails (the
        restart budget spent, or the restart failed), None otherwise."""
        exited = self._exit_or_lost("master", self.master_proc)
        if exited is None:
            return None
        self.master_proc.close()
        _, reason = exited
        if not self.policy.restart_service("master", self.master_restarts):
            return (f"the master {reason} and was already restarted "
                    f"{self.master_restarts} time(s) (--max_master_restarts="
                    f"{self.config.max_master_restarts}); its log "
                    f"({self.master_proc.log_path}) ends with:\n"
                    f"{self.master_proc.tail()}")
        self.master_restarts += 1
        logging.warning("the master %s; restarting it from its journal (restart %d "
                        "of %d)", reason, self.master_restarts,
                        self.config.max_master_restarts)
        try:
            record = self.recovery.restart_master(reason)
        except RecoveryFailed as e:
            return str(e)
        self.prober.set_target("master", self.master_address)
        self.prober.recovered()
        self.master_recoveries.append(record)
        logging.warning("the master is back in %.1f s", record["seconds"])
        return None

    def check_ps(self) -> str | None:
        """Recovers each lost parameter server; returns why the job fails,
        None otherwise."""
        self._fill_spares()
        self._adopt_backups()
        for partition, proc in enumerate(self.backup_procs):
            if proc is not None:
                exited = self._exit_or_lost(f"ps-{partition}b", proc)
                if exited is not None:
                    self._backup_lost(partition, exited[1])
                    self._rebuild_backup(partition)
        for proc, held in self.hosts():
            exited = None
            for p in held:
                exited = self._exit_or_lost(f"ps-{p}", proc)
                if exited is not None:
                    break
            if exited is not None:
                error = self._recover_ps(held, exited[1])
                if error:
                    return error
                for p in held:
                    self._rebuild_backup(p)
        return None

    def _rebuild_backup(self, p: int) -> None:
        """With --ps_replicas=2: a new backup for the server process of
        partition `p`, which lost its own or was itself a backup promoted,
        so the job stays replicated through further losses. Built off the
        loop (a process start and a copy of the server's state, under its
        lock: its calls wait for the copy; `_build_backup`), adopted by
        `_adopt_backups`. At most --max_ps_restarts per server; a failure is
        logged and leaves the server without a backup."""
        if (self.config.ps_replicas < 2 or p >= len(self.backup_procs)
                or self.backup_procs[p] is not None or p in self._building):
            return
        tried = self._builds_tried.get(p, 0)
        if tried >= self.config.max_ps_restarts + 1:
            logging.warning("parameter server %d: %d new backups tried "
                            "(--max_ps_restarts + 1): it goes on without one", p, tried)
            return
        self._builds_tried[p] = tried + 1
        build = self._builder.submit(
            self._build_backup, p, self.partition_addresses[p],
            self._ps_args(p, backup=True), os.path.join(self.job_dir, "backup_copies"))
        self._building[p] = (build, self.partition_procs[p], time.time())

    def _build_backup(self, p: int, primary: str, args: list[str], copy_dir: str
                      ) -> tuple[RoleHandle, str]:
        """(Off the loop.) Starts a backup process and has the server process
        of partition `p`, at `primary`, attach it with a copy of its state."""
        proc, info = self._start_service(f"ps-{p}b", "keras_elastic.ps", args)
        address = self._advertised(info["address"])
        try:
            # The job's generation now (it may have moved since `args`): the
            # server's forwarded calls carry it (adopted, it is fenced along).
            self.recovery.fence(address, self.generation, f"new backup of server {p}")
            _attach(p, primary, address, copy_dir=copy_dir, connect_timeout=10,
                    reconnect_timeout=5, timeout=120)
        except BaseException:
            proc.kill()
            proc.close()
            raise
        return proc, address

    def _adopt_backups(self) -> None:
        """The new backups built since the last round become their servers'
        (unless the server was replaced meanwhile: then the backup follows
        nobody, and the new server gets one of its own)."""
        for p, (build, server_proc, began) in list(self._building.items()):
            if not build.done():
                continue
            del self._building[p]
            try:
                proc, address = build.result()
            except (ProcessStartError, ConnectionError, ValueError) as e:
                logging.warning("no new backup for parameter server %d: %s", p, e)
                self._rebuild_backup(p)  # (within its budget)
                continue
            if (self.partition_procs[p] is not server_proc
                    or self.backup_procs[p] is not None):
                proc.kill()
                proc.close()
                self._rebuild_backup(p)
                continue
            self.backup_procs[p], self.backup_addresses[p] = proc, address
            # Into the generation of a recovery made while it was built.
            self.recovery.fence(address, self.generation, f"new backup of server {p}")
            self.prober.set_target(f"ps-{p}b", address)
            record = {"ps": p, "backup": address,
                      "seconds": round(time.time() - began, 2), "at": time.time()}
            self.backup_rebuilds.append(record)
            logging.warning("parameter server %d has a new backup at %s (%.1f s)", p,
                            address, record["seconds"])
            self.write_cluster_file()

    def _backup_lost(self, p: int, reason: str) -> None:
        """The backup of partition `p`'s server process is gone (dead, or
        killed as lost): the server is told to go on alone (off the loop: it would after its
        backup_timeout anyway, and a frozen server must not hold up this
        loop). It has no backup from now on."""
        proc = self.backup_procs[p]
        proc.close()
        self.backup_procs[p] = self.backup_addresses[p] = None
        self.prober.remove_target(f"ps-{p}b")
        logging.warning("the backup of parameter server %d %s: the server goes on "
                        "without one", p, reason)
        self._builder.submit(self._detach_backup, p, self.partition_addresses[p])
        self.backup_losses.append({"ps": p, "reason": reason, "at": time.time()})
        self.write_cluster_file()

    @staticmethod
    def _detach_backup(p: int, primary: str) -> None:
        """(Off the loop.) Tells the server process of partition `p`, at
        `primary`, its backup is gone: a call of the server retrying it gives
        up now, not after its backup_timeout."""
        try:
            _attach(p, primary, "", connect_timeout=5, timeout=10)
        except (ConnectionError, ValueError) as e:
            logging.warning("could not detach the backup of parameter server %d (it "
                            "detaches it itself after its backup_timeout): %s", p, e)

    def _recover_ps(self, held: list[int], reason: str) -> str | None:
        """Restarts the server process of partitions `held` on its address
        from the latest automatic checkpoint (or promotes its backup); the
        master goes back to it. Returns why the job fails, None otherwise."""
        first = held[0]
        proc = self.partition_procs[first]
        proc.close()
        building = self._building.get(first)
        if building is not None:
            # A new backup the server took before it was lost holds every
            # call it answered since: adopted first, it can take its place.
            # (One it had not taken yet fails to attach, at once.)
            futures.wait([building[0]], timeout=15)
        self._adopt_backups()
        if not self.policy.restart_service("ps", self.ps_restarts):
            return (f"parameter server {first} {reason} and was already restarted "
                    f"{self.ps_restarts} time(s) (--max_ps_restarts="
                    f"{self.config.max_ps_restarts}); its log ({proc.log_path}) "
                    f"ends with:\n{proc.tail()}")
        self.ps_restarts += 1
        logging.warning("parameter server %d %s; restarting it (restart %d of %d)",
                        first, reason, self.ps_restarts, self.config.max_ps_restarts)
        try:
            record = self.recovery.recover_ps(held, reason)
        except RecoveryFailed as e:
            return str(e)
        for p in held:
            self.prober.set_target(f"ps-{p}", self.partition_addresses[p])
        self.prober.recovered()  # (the other servers were paused meanwhile)
        if record is not None and record.get("failover"):
            self.prober.remove_target(f"ps-{first}b")
            self.recoveries.append(record)
            logging.warning("parameter server %d: its backup took its place in %.1f s; "
                            "nothing is trained again", first, record["seconds"])
        elif record is not None:
            self.recoveries.append(record)
            logging.warning("parameter server %d is back from %s in %.1f s; tasks "
                            "undone: %s", first,
                            record["checkpoint"] or "nothing (it was never initialized)",
                            record["seconds"],
                            record["completions_undone"])
        return None

    def server_statuses(self, timeout: float = 5.0) -> list[ServerStatus]:
        """Each server process's Status, asked of its first partition (for
        the autoscaler's `ServerLoad` thread, its only caller: the process's
        CPU seconds; the client is its own, made again when a partition
        moved)."""
        firsts = [held[0] for _, held in self.hosts()]
        key = [(p, self.partition_addresses[p]) for p in firsts]
        if self._status_client is None or self._status_client[0] != key:
            if self._status_client is not None:
                self._status_client[1].close()
            self._status_client = (key, PSClient(
                [a for _, a in key], worker_id=-1, connect_timeout=timeout,
                reconnect_timeout=1, partitions=firsts))
        return self._status_client[1].status_all(timeout=timeout)

    # -- the end --------------------------------------------------------------
    def table_stats(self) -> dict[str, dict[str, int]]:
        """The embedding tables' counters summed over the servers (rows,
        admitted, evicted, dropped, bytes); {} without tables or servers."""
        if self.checkpointer is None or not self.partition_addresses:
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

    def stop_background(self) -> None:
        """Stops the health prober and the automatic checkpoints (their
        threads log): the job's last line is then the launcher's last word."""
        self.prober.stop()
        self.feed.stop()
        if self.checkpointer is not None:
            self.checkpointer.stop()
            self.checkpointer = None

    def stop(self) -> None:
        """Closes the launcher's master client and ends the servers (the
        background threads first: `stop_background`)."""
        if self.master is not None:
            self.master.close()
        if self._status_client is not None:
            self._status_client[1].close()
        self._builder.shutdown(wait=False, cancel_futures=True)
        self.spares.stop()
        for build, _, _ in self._building.values():
            try:  # a backup being built ends with the job
                proc, _ = build.result(timeout=60)
                proc.terminate()
            except (futures.CancelledError, futures.TimeoutError, ProcessStartError,
                    ConnectionError, ValueError):
                pass
        for proc in [*(proc for proc, _ in self.hosts()),
                     *(backup for backup in self.backup_procs if backup)]:
            proc.terminate()
        if self.master_proc is not None:
            self.master_proc.terminate()


def _attach(partition: int, primary: str, backup: str, copy_dir: str = "",
            connect_timeout: float = 10, reconnect_timeout: float = 0,
            timeout: float = 60) -> None:
    """The server process of partition `partition`, at `primary`, takes the
    server at `backup` as its backup ("": it has none from now on;
    `copy_dir`: it copies its state first)."""
    client = PSClient([primary], worker_id=-1, connect_timeout=connect_timeout,
                      reconnect_timeout=reconnect_timeout, partitions=[partition])
    try:
        client.attach_backup(0, backup, copy_dir=copy_dir, timeout=timeout)
    finally:
        client.close()


def check_journal(config: LaunchConfig, job_dir: str) -> None:
    """Refuses --resume without a job in `job_dir`, and a new job where one
    ran (ValueError)."""
    journal_path = os.path.join(job_dir, JOURNAL_FILE)
    if config.resume and not os.path.isfile(journal_path):
        raise ValueError(f"--resume: {job_dir} holds no job to continue (no "
                         f"{JOURNAL_FILE}); start the job without --resume")
    if not config.resume and os.path.isfile(journal_path):
        raise ValueError(f"{job_dir} holds an earlier job ({JOURNAL_FILE}): "
                         "pass --resume to continue it, or give a new --job_dir")


def job_seed(config: LaunchConfig, job_dir: str) -> int:
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


def first_generation(config: LaunchConfig, job_dir: str) -> int:
    """The job's first generation: 0, or one more than a resumed job's last
    (its last cluster.json's; 0 if none)."""
    if not config.resume:
        return 0
    try:
        with open(os.path.join(job_dir, "cluster.json")) as f:
            return int(json.load(f).get("generation", 0)) + 1
    except (OSError, ValueError, TypeError):
        return 1

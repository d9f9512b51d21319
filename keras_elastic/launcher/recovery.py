"""The recovery sequences of the job's services: what the launcher does, step
by step, once its policy (`policy.py`) decided that a master or a parameter
server must be replaced, and when a job is resumed.

- `restart_master`: a new master on the old address (locally; elsewhere on a
  cluster), which replays its journal; the launcher's clients follow it.
  The job's generation goes one up, and every server is fenced into it
  (`common/fencing.py`): a replaced master that wakes up serves nobody.
- `recover_ps`: automatic checkpoints paused; the lost server's partitions
  restored from the latest automatic checkpoint, paused, onto a spare
  process that is up already (`spares.py`: no process start to wait for)
  or else onto a new process; every other server pauses and
  keeps its state (issue 43: before, each went back to the checkpoint too);
  every server is fenced into the job's next generation; the master rolls
  back to the checkpoint's progress; every server resumes with the
  rollback's lease floor (claims of tasks handed out before it are refused).
  The tasks done since the checkpoint are trained again, and each server's
  task log (`ps/task_log.py`) makes the pushes exactly-once: the servers
  that kept their state have those tasks' elements applied (a claim says
  so, and the worker pushes them nothing), the restored one lacks them and
  gets them. So a lost server costs only its own share: the others lose
  nothing, and nothing is applied twice.
- `fail_over` (`--ps_replicas=2`, from `recover_ps`): the lost server's
  backup takes its place (ps/replication.py): it applied every call the
  server answered, so the master does not roll back, no other server pauses,
  nothing is trained again; the job's generation goes one up and every
  server (the promoted one included) is fenced into it, and clients follow
  its address in cluster.json. Only when the backup is alive and the server
  never answered a call its backup lacks (no `ps-<i>.unreplicated` file);
  else the checkpoint recovery above (a stale backup is killed first).
- `resume`: `--resume` of a stopped job: the same rollback, from the
  checkpoint the servers were started with.

The order is what makes a recovery exact, so it lives here, in one place;
the launcher only decides *whether* (restart budgets) and records *what
happened*. The sequences see the job's services (`services.JobServices`)
through `ServiceHost`.

Example:

```python
recovery = Recovery(services, num_partitions=1)
record = recovery.recover_ps(0, "exited with code -9")
```
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import grpc
from absl import logging

from keras_elastic.checkpoint.errors import NoIntactCheckpointError
from keras_elastic.common import fencing, rpc
from keras_elastic.common.errors import ClusterError
from keras_elastic.launcher.auto_checkpointer import AutoCheckpointer
from keras_elastic.launcher.backends import Backend, ProcessStartError, RoleHandle
from keras_elastic.launcher.spares import SpareServers, restore_onto
from keras_elastic.master.client import MasterClient
from keras_elastic.ps.client import PSClient
from keras_elastic.ps.replication import is_replicated


class RecoveryFailed(ClusterError):
    """A service could not be brought back: the job fails with this message."""


class ServiceHost(Protocol):
    """What the recovery sequences use of the job's services."""

    backend: Backend
    checkpointer: AutoCheckpointer
    generation: int
    master: MasterClient
    master_proc: RoleHandle
    master_address: str
    # Indexed by partition: the server process holding each (one process per
    # partition it holds) and its address; with --ps_replicas=2 the backup of
    # each (every server process then holds one partition).
    partition_procs: list[RoleHandle]
    partition_addresses: list[str]
    backup_procs: list[RoleHandle | None]
    backup_addresses: list[str | None]
    job_dir: str
    spares: SpareServers

    def _start_service(self, name: str, module: str, args: list[str]
                       ) -> tuple[RoleHandle, dict]: ...

    def _advertised(self, address: str) -> str: ...

    def _master_args(self, port: int = 0) -> list[str]: ...

    def _ps_args(self, partition: int, port: int = 0, backup: bool = False,
                 partitions: list[int] | None = None) -> list[str]: ...

    def write_cluster_file(self) -> None: ...


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


class Recovery:
    """The sequences of the module docstring, over a `ServiceHost`."""

    def __init__(self, host: ServiceHost, num_partitions: int) -> None:
        self.host = host
        self.num_partitions = num_partitions

    # -- the master -----------------------------------------------------------
    def restart_master(self, reason: str) -> dict[str, Any]:
        """Starts a new master (it replays the journal); returns the record
        of the recovery. Raises RecoveryFailed."""
        host = self.host
        started = time.time()
        host.generation += 1
        # Its old port locally; on a cluster it may land on another node.
        port = _port(host.master_address) if host.backend.keeps_addresses else 0
        for attempt in range(10):
            try:
                host.master_proc, info = host._start_service(
                    "master", "keras_elastic.master", host._master_args(port))
                break
            except ProcessStartError as e:
                if attempt == 9 or "journal" in str(e):
                    raise RecoveryFailed(f"the master could not be restarted: {e}"
                                         ) from e
                time.sleep(0.5)  # the port may linger a moment
        address = host._advertised(info["address"])
        if address != host.master_address:
            self._master_moved(address)
        host.write_cluster_file()
        self.fence_all()
        return {"reason": reason, "generation": host.generation,
                "seconds": round(time.time() - started, 2), "at": time.time()}

    def _master_moved(self, address: str) -> None:
        """The restarted master listens elsewhere: the launcher's clients follow
        (workers find it in cluster.json)."""
        host = self.host
        logging.warning("the master moved from %s to %s", host.master_address, address)
        host.master_address = address
        old = host.master
        host.master = MasterClient(address, reconnect_timeout=3.0)
        if host.checkpointer is not None:
            host.checkpointer.pause()
            host.checkpointer.master = host.master
            host.checkpointer.resume()
        old.close()

    # -- a parameter server ---------------------------------------------------
    def recover_ps(self, partitions: int | list[int], reason: str
                   ) -> dict[str, Any] | None:
        """Restarts the lost server process of `partitions` (a partition, or
        the list of those it held) from the latest automatic checkpoint, as
        one process holding them all; the master goes back to it, the other
        servers keep their state (see the module doc). Returns the record of
        the recovery, or None if it was interrupted (another server died
        meanwhile: the next check recovers that one). Raises RecoveryFailed."""
        host = self.host
        held = [partitions] if isinstance(partitions, int) else sorted(partitions)
        first = held[0]
        if len(held) == 1 and self._backup_ready(first):
            return self.fail_over(first, reason)
        self._drop_backup(first)
        started = time.time()
        host.checkpointer.pause()
        try:
            host.generation += 1
            try:
                # The newest intact one; damaged newer ones are logged, skipped.
                checkpoint = host.checkpointer.latest()
            except NoIntactCheckpointError as e:
                raise RecoveryFailed(f"parameter server {first} {reason} and cannot be "
                                     f"restored: {e}") from None
            # Paused until the master has rolled back too (see below): onto a
            # spare that is up already, or else onto a process started now.
            spare = self._onto_spare(held, checkpoint)
            if spare is not None:
                proc, address = spare
            else:
                proc, address = self._start_ps(held, checkpoint)
            for p in held:
                host.partition_procs[p] = proc
            if address != host.partition_addresses[first]:
                logging.warning("parameter server %d moved from %s to %s", first,
                                host.partition_addresses[first], address)
                for p in held:
                    host.partition_addresses[p] = address
                host.checkpointer.set_partition_addresses(host.partition_addresses)
            # Clients waiting for it find its address there (it is paused
            # until the rollback below is done), and the new generation.
            host.write_cluster_file()
            self.fence_all()
            undone = {}
            others = [j for j in range(self.num_partitions) if j not in held]
            if checkpoint is not None:
                # The master goes back to the checkpoint's progress; the other
                # servers keep their state, their task logs say what they
                # applied since. Every server is paused meanwhile: no worker
                # claims, pushes or pulls while the master still hands out
                # tasks from before the rollback.
                undone = self.rollback_and_resume(
                    checkpoint.extra.get("progress"), f"parameter server {first} {reason}",
                    prepare=lambda client: [client.pause(j) for j in others])
            host.write_cluster_file()
            return {"ps": first, "partitions": held, "reason": reason,
                    "generation": host.generation,
                    "spare": proc.name if spare is not None else None,
                    "checkpoint": getattr(checkpoint, "path", None),
                    "completions_undone": undone, "servers_kept": others,
                    "seconds": round(time.time() - started, 2), "at": time.time()}
        except (ConnectionError, ValueError) as e:
            logging.error("recovery of parameter server %d was interrupted: %s", first, e)
            return None
        finally:
            host.checkpointer.resume()

    def _onto_spare(self, held: list[int], checkpoint) -> tuple[RoleHandle, str] | None:
        """Partitions `held` restored, paused, onto a spare server process
        (`spares.py`) if one is ready; None if none is (or it failed: it is
        killed)."""
        if checkpoint is None:
            return None
        spare = self.host.spares.take()
        if spare is None:
            return None
        proc, address = spare
        try:
            restore_onto(address, held, checkpoint.path)
        except ConnectionError as e:
            logging.warning("%s; starting a process instead", e)
            proc.kill()
            proc.close()
            return None
        logging.info("parameter-server partitions %s restored onto the spare %s at %s",
                     held, proc.name, address)
        return proc, address

    def _start_ps(self, held: list[int], checkpoint) -> tuple[RoleHandle, str]:
        """A new server process of partitions `held`, from `checkpoint`
        (paused) if any. Raises RecoveryFailed."""
        host = self.host
        first = held[0]
        # Its old port locally; on a cluster it may land on another node.
        port = _port(host.partition_addresses[first]) if host.backend.keeps_addresses else 0
        args = host._ps_args(first, port, partitions=held)
        if checkpoint is not None:
            args += [f"--restore_from={checkpoint.path}", "--paused"]
        attempts = 0
        while True:
            try:
                proc, info = host._start_service(f"ps-{first}", "keras_elastic.ps", args)
                return proc, host._advertised(info["address"])
            except ProcessStartError as e:
                attempts += 1
                if attempts == 5:
                    raise RecoveryFailed(
                        f"parameter server {first} could not be restarted: {e}") from e
                time.sleep(1.0)

    def _backup_ready(self, p: int) -> bool:
        """Whether the backup of partition `p`'s server process can take its
        place: alive, and holding every call the server answered."""
        host = self.host
        backup = host.backup_procs[p] if p < len(host.backup_procs) else None
        return (backup is not None and backup.poll() is None
                and is_replicated(host.job_dir, p))

    def _drop_backup(self, p: int) -> None:
        """A backup that cannot take the place of partition `p`'s server
        process (it lacks calls the server answered) is killed: it must not
        serve that state."""
        host = self.host
        backup = host.backup_procs[p] if p < len(host.backup_procs) else None
        if backup is None:
            return
        logging.warning("the backup of parameter server %d lacks calls the server "
                        "answered (%s): killed; the server is recovered from its "
                        "checkpoint", p, f"ps-{p}.unreplicated")
        backup.kill()
        backup.close()
        host.backup_procs[p] = host.backup_addresses[p] = None

    def fail_over(self, p: int, reason: str) -> dict[str, Any]:
        """The backup of partition `p`'s server process takes its place
        (module doc); returns the record of the recovery."""
        host = self.host
        started = time.time()
        host.generation += 1
        promoted = host.backup_addresses[p]
        host.partition_procs[p] = host.backup_procs[p]
        host.partition_addresses[p] = promoted
        host.backup_procs[p] = host.backup_addresses[p] = None
        # Clients that lost the server find its backup there, and the
        # generation that fences the lost one out. (Before the automatic
        # checkpoints are paused: a save in flight retries the lost server
        # for seconds, and fails; the workers need not wait for it.)
        host.write_cluster_file()
        self.fence_all()
        seconds = round(time.time() - started, 2)
        host.checkpointer.pause()
        try:
            host.checkpointer.set_partition_addresses(host.partition_addresses)
        finally:
            host.checkpointer.resume()
        logging.warning("parameter server %d %s: its backup at %s took its place",
                        p, reason, promoted)
        return {"ps": p, "reason": reason, "generation": host.generation,
                "failover": True, "promoted": promoted, "checkpoint": None,
                "completions_undone": {},
                "servers_kept": [j for j in range(self.num_partitions) if j != p],
                "seconds": seconds, "at": time.time()}

    # -- fencing ----------------------------------------------------------------
    def fence_all(self) -> None:
        """Moves every live server (the master, each parameter server and
        its backup) into the job's generation: from now on they answer only
        its clients (and a backup only its server's forwarded calls). A
        server that does not answer is left to the next liveness check."""
        host = self.host
        targets = {"master": host.master_address, **{
            f"parameter server {p}": a for p, a in enumerate(host.partition_addresses)}, **{
            f"the backup of parameter server {p}": a
            for p, a in enumerate(host.backup_addresses) if a}}
        for name, address in targets.items():
            self.fence(address, host.generation, name)
        logging.info("every server fenced into generation %d", host.generation)

    @staticmethod
    def fence(address: str, generation: int, name: str) -> None:
        """Moves the server at `address` into `generation` (logged if it
        does not answer)."""
        channel = rpc.make_channel(address, resolver=None)
        try:
            fencing.fence(channel, generation)
        except grpc.RpcError as e:
            logging.error("could not fence %s at %s into generation %d: %s", name,
                          address, generation, e.details())
        finally:
            channel.close()

    # -- the job --------------------------------------------------------------
    def resume(self, checkpoint) -> dict[str, Any]:
        """Continues the job of the journal: the master has replayed it; the
        servers hold the latest automatic checkpoint (paused), the master goes
        back to that checkpoint's progress, then everything resumes. Returns
        what the summary records."""
        undone = self.rollback_and_resume(
            checkpoint.extra.get("progress") if checkpoint is not None else None,
            "the job is resumed")
        path = getattr(checkpoint, "path", None)
        logging.warning("resuming the job from %s; completions undone: %s",
                        path or "the start (no parameter-server checkpoint)", undone)
        return {"checkpoint": path, "completions_undone": undone}

    def rollback_and_resume(self, progress: dict | None, reason: str,
                            prepare: Callable[[PSClient], None] | None = None
                            ) -> dict[str, int]:
        """The master goes back to `progress` (after `prepare(client)` readied
        the paused servers), then every server resumes with the rollback's
        lease floor: claims of tasks handed out before it are refused. Returns
        the completions undone."""
        host = self.host
        client = PSClient(host.partition_addresses, worker_id=-1, connect_timeout=60,
                          reconnect_timeout=60)
        answer = None
        try:
            if prepare is not None:
                prepare(client)
            answer = host.master.rollback(progress, reason)
        finally:
            floor = answer.min_lease if answer is not None else 0
            for j in range(self.num_partitions):
                try:
                    client.resume(j, min_lease=floor)
                except (ConnectionError, ValueError) as e:
                    logging.error("could not resume parameter server %d: %s", j, e)
            client.close()
        return dict(answer.undone)

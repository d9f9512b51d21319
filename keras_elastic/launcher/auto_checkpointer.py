"""Automatic parameter-server checkpoints: the recovery points of a job.

The launcher keeps them in `JOB_DIR/ps_checkpoints/`:

- `init/`: each server saves its share of the initial model there when a worker
  initializes it, before any gradient can reach it; once every server's part
  is there, the manifest is written (its progress is "the start of the job").
- `ckpt-NNNNNN/`: every `every_secs` seconds and/or `every_versions` model
  versions (whichever comes first), while the model changes, and once more
  when training ends, every server saves its share through the same sharded,
  validated writer as `ShardedModelCheckpoint`; the manifest holds the master's
  progress read just before. Embedding tables are saved incrementally: a
  checkpoint holds the rows changed since the previous one (and the ids
  removed), naming it as its base, with a full save every `full_every`
  checkpoints and after any recovery; restoring reads the chain, pruning keeps
  the bases of the checkpoints kept, and a damaged link makes its successors
  damaged too (`checkpoint/integrity.py`).

Each part holds its server's task log with the variables, so a restore is
exact even though the servers do not save at the very same instant (see
`ps/task_log.py`). The newest `keep` checkpoints are kept, and `init/`
always (the recovery point of last resort; pruning it once stopped every later
automatic checkpoint, which waited for it).

Example:

```python
checkpointer = AutoCheckpointer(directory, partition_addresses, master, every_secs=30)
checkpointer.start()
...
info = checkpointer.latest()      # what a recovery restores
```
"""

from __future__ import annotations

import os
import threading
import time

from absl import logging

from keras_elastic.checkpoint import layout
from keras_elastic.checkpoint.manifest import read_manifest
from keras_elastic.checkpoint.ps_manifest import training_progress, write_ps_manifest
from keras_elastic.master.client import MasterClient
from keras_elastic.ps.checkpoint_coordinator import save_checkpoint
from keras_elastic.ps.client import PSClient

INIT = "init"


def _init_ready(init_dir: str, num_partitions: int) -> bool:
    """Whether every partition saved its share of the initial model."""
    return all(os.path.isdir(os.path.join(init_dir, f"ps-{p:03d}"))
               for p in range(num_partitions))


def _write_init_manifest(init_dir: str, num_partitions: int) -> None:
    if os.path.isfile(os.path.join(init_dir, "manifest.json")):
        return
    parts = [read_manifest(os.path.join(init_dir, f"ps-{p:03d}"))
             for p in range(num_partitions)]
    write_ps_manifest(init_dir, init_dir, parts, progress=None, sequence=0,
                      extra={"initial": True})
    logging.info("initial model of the parameter servers saved in %s", init_dir)


def latest_checkpoint(directory: str, num_partitions: int):
    """The newest intact automatic checkpoint in `directory` (the initial
    model's if no other; the job has `num_partitions` partitions), or None if
    the servers were never all initialized.
    A newer one that is damaged (a file missing, cut short or changed:
    `checkpoint/integrity.py`) is skipped and logged; the master then rolls
    back to the older one's progress, so the tasks after it are trained
    again, once.

    Raises:
        NoIntactCheckpointError: every checkpoint is damaged (each named)."""
    init_dir = os.path.join(directory, INIT)
    if _init_ready(init_dir, num_partitions):
        _write_init_manifest(init_dir, num_partitions)
    return layout.latest_intact(directory) if os.path.isdir(directory) else None


class AutoCheckpointer:
    """Saves the parameter servers periodically from a background thread."""

    def __init__(self, directory: str, partition_addresses: list[str],
                 master: MasterClient, every_secs: float = 30.0,
                 every_versions: int = 0, keep: int = 2, poll_secs: float = 0.5,
                 full_every: int = 8) -> None:
        self.directory = os.path.abspath(directory)
        self.init_dir = os.path.join(self.directory, INIT)
        os.makedirs(self.init_dir, exist_ok=True)
        # Indexed by partition: the address of the server process holding it.
        self.partition_addresses = list(partition_addresses)
        self.master = master
        self.every_secs = every_secs
        self.every_versions = every_versions
        self.keep = max(1, keep)
        self.poll_secs = poll_secs
        # Embedding tables are saved incrementally (the rows changed since the
        # previous automatic checkpoint), with a full save every `full_every`
        # (1: always full). `_chain`: (the last save's path, saves since the
        # last full one), None when the next must be full.
        self.full_every = max(1, full_every)
        self._chain: tuple[str, int] | None = None
        self._has_tables = False
        self.saves = 0
        self.periodic_saves = 0  # those made while the job trained (not its last)
        self.failures = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()  # held during a save; recovery takes it
        self._client_lock = threading.Lock()
        self._paused = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ps: PSClient | None = None
        self._last_save = time.time()
        self._last_versions: list[int] | None = None
        self._finished_saved = False
        self._init_seen = False

    # -- control ------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="ps-checkpoints")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        if self._ps is not None:
            self._ps.close()

    def pause(self) -> None:
        """No saves until `resume`; waits for a save in progress to end."""
        self._paused.set()
        with self._lock:
            pass

    def set_partition_addresses(self, partition_addresses: list[str]) -> None:
        """A restarted or moved server process listens elsewhere (a cluster
        placed it on another node): later saves of its partitions go there.
        Call it paused (`pause`)."""
        with self._client_lock:
            self.partition_addresses = list(partition_addresses)
            if self._ps is not None:
                self._ps.close()
                self._ps = None

    def resume(self) -> None:
        self._chain = None  # restored or restarted servers: the next save is full
        self._last_save = time.time()
        self._last_versions = None
        self._paused.clear()

    # -- what a recovery restores ---------------------------------------------
    def init_ready(self) -> bool:
        """Every server saved its share of the initial model (once true, for
        good: a save afterwards never waits for it again)."""
        if not self._init_seen:
            self._init_seen = _init_ready(self.init_dir, len(self.partition_addresses))
        return self._init_seen

    def _write_init_manifest(self) -> None:
        _write_init_manifest(self.init_dir, len(self.partition_addresses))

    def latest(self):
        """The newest complete automatic checkpoint (the initial model's if no
        other), or None if the servers were never all initialized."""
        return latest_checkpoint(self.directory, len(self.partition_addresses))

    def recovery_point_age(self) -> float | None:
        """Seconds since the newest automatic checkpoint (the initial model's
        included) was made; None if there is none."""
        info = layout.latest(self.directory)
        return None if info is None else max(0.0, time.time() - info.created)

    # -- the loop ---------------------------------------------------------------
    def client(self) -> PSClient:
        """A client of the job's servers (made once)."""
        return self._client()

    def _client(self) -> PSClient:
        """The client of the partitions at `partition_addresses` (made once;
        again after `set_partition_addresses`). Made outside `_client_lock`: a
        recovery's `set_partition_addresses` never waits for a connect to a
        lost server."""
        with self._client_lock:  # (`_due` runs beside `set_partition_addresses`)
            if self._ps is not None:
                return self._ps
            addresses = list(self.partition_addresses)
        # Short retries: a lost server costs a skipped save, and a
        # recovery's `pause` waits for no more than that.
        client = PSClient(addresses, worker_id=-1, connect_timeout=30,
                          reconnect_timeout=1)
        with self._client_lock:
            if self._ps is None and addresses == self.partition_addresses:
                self._ps = client
                return client
        client.close()
        raise ConnectionError("the parameter servers moved while the automatic "
                              "checkpoints connected to them")

    def _run(self) -> None:
        while not self._stop.wait(self.poll_secs):
            if self._paused.is_set():
                continue
            try:
                # Whether a save is due is read outside the lock: a recovery's
                # `pause` (it takes the lock) never waits on the status calls
                # of a tick to a server just lost, only on a save under way.
                due = self._due()
                if due is None:
                    continue
                with self._lock:
                    if self._paused.is_set():
                        continue
                    status, finished = due
                    self.save(status)
                    self._finished_saved = finished
                    self.periodic_saves += not finished
            except (ConnectionError, ValueError, OSError) as e:
                # A server being down is the launcher's business, a full
                # disk the user's: skip this one, try later.
                self.failures += 1
                self.last_error = str(e)
                age = self.recovery_point_age()
                logging.log_every_n_seconds(
                    logging.WARNING, "automatic checkpoint skipped: %s; the newest "
                    "recovery point is %s", 30, str(e).strip().splitlines()[0],
                    "none yet" if age is None else f"{age:.0f} s old")

    def _due(self) -> tuple[dict, bool] | None:
        """(the master's status to save with, whether training is finished)
        if a save is due now, else None."""
        if not self.init_ready():
            return None
        self._write_init_manifest()
        # Short deadlines: a frozen server or master costs a skipped tick.
        statuses = self._client().status_all(timeout=5)
        self._has_tables = any(s.tables for s in statuses)
        versions = [s.version for s in statuses]
        if self._last_versions is None:
            self._last_versions = versions
        changed = sum(versions) - sum(self._last_versions)
        status = self.master.job_status(timeout=5)
        training = list(status.training_datasets().values())
        finished = bool(training) and all(ds.finished for ds in training)
        if finished:
            if not self._finished_saved and changed:
                return status, True
            self._finished_saved = True
            return None
        self._finished_saved = False
        due = (self.every_secs > 0 and time.time() - self._last_save >= self.every_secs
               or self.every_versions > 0 and changed >= self.every_versions)
        return (status, False) if due and changed else None

    def save(self, status: dict | None = None):
        """Saves every server now (the master's progress first)."""
        start = time.time()
        status = status or self.master.job_status()
        progress = training_progress(status)
        name = f"ckpt-{layout.next_sequence(self.directory):06d}"
        base = ""
        if (self._has_tables and self._chain is not None
                and self._chain[1] + 1 < self.full_every
                and os.path.isdir(self._chain[0])):
            base = self._chain[0]
        try:
            info, parts = save_checkpoint(
                self._client(), self.directory, name, progress, automatic=True,
                extra={"automatic": True}, max_to_keep=self.keep, started=start,
                select=lambda c: c.name != INIT, table_base=base)
        except BaseException:
            self._chain = None  # whatever went wrong, start again from a full one
            raise
        self._chain = (info.path, self._chain[1] + 1 if base else 0)
        self._last_save = time.time()
        self._last_versions = [p.model_version for p in parts]
        self.saves += 1
        logging.info("automatic parameter-server checkpoint %s (%.2f s%s)", info.path,
                     time.time() - start,
                     f"; embedding rows changed since {os.path.basename(base)}"
                     if base else "")
        return info

"""The master's gRPC service: workers, datasets, tasks, liveness, status.

With a journal (`master/journal.py`) every change the master must not forget
(worker membership, dataset registrations, task completions with their ledger
entries and evaluation states, task failures, rollbacks) is appended under the
lock in the order it happens; the journal fsyncs it within milliseconds.
An answer that makes a change irrevocable waits until the change is on disk:
registrations, failures, rollbacks, worker exits, the end of an epoch or of
an evaluation round (END_OF_EPOCH, a task of the next epoch, a round's
result) and the status the launcher ends the job on. A task completion alone
does not wait: if the master dies before it is on disk, the task is handed
out again, and that is what happens to a report the master never answered
anyway (the parameter servers' task logs skip what was applied, evaluation
states are summed only from journaled completions). A master
restarted on the same journal replays it: the epochs, the ledger, the
evaluation rounds and the job's error are as they were; tasks that were in
flight are handed out again (the parameter servers' task logs make that exact,
see `docs/exactly_once.md`), and workers reconnect.
"""

from __future__ import annotations

import base64
import dataclasses
import threading
import time

import grpc
import numpy as np
from absl import logging

from keras_elastic.common import disk, faults, fencing
from keras_elastic.common.tensor_codec import decode_all, encode_all
from keras_elastic.master.journal import Journal
from keras_elastic.master.status import JobStatus
from keras_elastic.master.task_queue import (
    END_OF_EPOCH,
    LEDGER_FIELDS,
    MAX_MINIBATCHES_PER_TASK,
    WAIT,
    DatasetSpec,
    DatasetTasks,
    auto_records_per_task,
    sizing_warning,
    task_timeout,
)
from keras_elastic.proto import master_pb2, master_pb2_grpc

# Records are fsync'd in batches at most this far apart (or 1024 records).
# Each flush costs the handler threads GIL hand-overs; 10 ms keeps that small
# (bench/bench_master.py) and only delays answers that wait for the disk.
JOURNAL_FLUSH_SECS = 0.01

# How long one GetTask call may block before answering WAIT (the client asks
# again at once): keeps threads free and lets a dead client be noticed.
LONG_POLL_SECONDS = 2.0


class MasterServicer(master_pb2_grpc.MasterServicer):
    """All job state, under one lock; waiting requests sleep on a condition."""

    def __init__(self, heartbeat_timeout: float = 30.0, max_task_retries: int = 3,
                 max_workers: int = 0, journal_path: str | None = None,
                 progress_timeout: float = 60.0,
                 generation: fencing.Generation | None = None,
                 on_journal_error=None, min_workers: int = 1,
                 rendezvous_timeout: float = 0.0) -> None:
        self._cond = threading.Condition()
        # The start rendezvous (`_rendezvous`): no task is handed out before
        # `min_workers` workers registered or `rendezvous_timeout` seconds
        # passed, so that the workers a job starts with all train from its
        # first task (as Keras' multi-worker training and torch elastic's
        # rendezvous start together), rather than one worker running through
        # a small first epoch before a slower-starting one joins.
        self._min_workers = min_workers
        self._rendezvous_timeout = rendezvous_timeout
        self._rendezvous_met = min_workers <= 1
        # The job's generation this master serves (common/fencing.py): every
        # journal record carries it, and a replay skips records of a master
        # that was replaced (older than one already seen).
        self.generation = generation or fencing.Generation(0)
        self._datasets: dict[str, DatasetTasks] = {}
        self._workers: dict[int, dict] = {}
        self._waiting: dict[str, dict[int, int]] = {}  # dataset -> worker -> epoch
        # (worker, training dataset) -> the dataset's rollbacks when the
        # worker's loop went past an epoch (END_OF_EPOCH): a later rollback
        # reopened tasks that worker can no longer train.
        self._past_epoch: dict[tuple[int, str], int] = {}
        self._heartbeat_timeout = heartbeat_timeout
        # {worker: the limit (seconds) its hold of a task passed}.
        self._overdue: dict[int, float] = {}
        # The least time a task may be held before its worker counts as making
        # no progress (more for a dataset whose tasks are slow: task_timeout).
        self._progress_timeout = progress_timeout
        self._max_task_retries = max_task_retries
        self._max_workers = max_workers
        self._error: str | None = None
        self._last_lease = 0
        self._next_worker_id = 0
        self._lost = 0
        # The chief (`worker.cluster.is_chief`): the first worker to register,
        # for as long as it is alive or exited; when it is lost, the smallest
        # alive id. Held here so that two workers never both act as the chief
        # (a smallest-alive-id rule let worker 1 write before worker 0 had
        # registered). Rebuilt from the journal's worker records on replay.
        self._chief: int | None = None
        self._started = time.monotonic()
        self._starts = 0
        self._journal: Journal | None = None
        # The journal record that ended the last epoch or round: answers that
        # reveal the end wait for it (`_milestone`).
        self._milestone_seq = 0
        if journal_path:
            self._replay(Journal.read(journal_path), journal_path)
            self._on_journal_error = on_journal_error
            self._journal = Journal(journal_path, flush_secs=JOURNAL_FLUSH_SECS,
                                    on_error=self._journal_failed)
            self._starts += 1
            self._log({"t": "start", "time": round(time.time(), 3)})
        self._last_tick: float | None = None  # the liveness watcher's last check
        self._stop = threading.Event()
        self._monitor = threading.Thread(target=self._watch_heartbeats, daemon=True,
                                         name="master-heartbeats")
        self._monitor.start()

    def _next_lease(self) -> int:
        """Leases grow with time (microseconds), so a restarted master never
        hands out a lease below one that parameter servers have seen."""
        self._last_lease = max(self._last_lease + 1, time.time_ns() // 1000)
        return self._last_lease

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._journal is not None:
            self._journal.close()

    # -- the journal --------------------------------------------------------
    def _journal_failed(self, error: OSError) -> None:
        """The journal cannot be written: without it nothing the job does can
        be recovered, so the job fails, saying why in one line (a full disk:
        the path and the space left). A fenced journal (another master
        writes it) is the caller's business (`on_journal_error`)."""
        from keras_elastic.master.journal import JournalFencedError

        if not isinstance(error, JournalFencedError):
            with self._cond:
                self._error = self._error or self._journal_error_text(error)
                self._cond.notify_all()
        if self._on_journal_error is not None:
            self._on_journal_error(error)

    def _journal_error_text(self, error: BaseException) -> str:
        """One line for the journal's failure: the path, what went wrong, the
        space left (a full disk). Whichever caller notices first (the journal's
        thread, an append, a wait) says it the same way, from the journal's own
        error rather than the wrapper an append or a wait raises."""
        journal = self._journal
        cause = journal.error if journal is not None else None
        if cause is None:
            return str(error)  # not a failed write (a sync that timed out): its words
        if disk.is_disk_condition(cause):
            return disk.describe_write_error(journal.path, cause)
        return f"the master journal {journal.path} cannot be written: {cause}"

    def _log(self, record: dict) -> int:
        """Appends `record` (under the lock); returns what `_durable` waits for."""
        if self._journal is None:
            return 0
        try:
            return self._journal.append({**record, "g": self.generation.value})
        except OSError as e:
            # The journal stopped (a full disk; `_journal_failed` fails the
            # job): answers go on, saying the job failed, without a traceback.
            self._error = self._error or self._journal_error_text(e)
            return 0

    def _durable(self, seq: int) -> None:
        """Waits (outside the lock) until journal record `seq` is on disk."""
        if seq and self._journal is not None and self._journal.durable < seq:
            try:
                self._journal.wait(seq)
            except OSError as e:  # the journal stopped: the job has failed
                self._error = self._error or self._journal_error_text(e)

    def _milestone(self, response):
        """`response`, once the end of the last epoch or round is on disk."""
        self._durable(self._milestone_seq)
        return response

    def _replay(self, records: list[dict], path: str) -> None:
        """Rebuilds the state a journal describes (a restarted master)."""
        fence = 0
        skipped = 0
        for i, record in enumerate(records):
            kind = record.get("t")
            if record.get("g", 0) < fence:
                skipped += 1  # written by a master replaced meanwhile
                continue
            fence = max(fence, record.get("g", 0))
            try:
                if kind == "start":
                    self._starts += 1
                elif kind == "worker":
                    self._replay_worker(record)
                elif kind == "dataset":
                    spec = DatasetSpec.from_json(record["spec"])
                    ds = DatasetTasks(spec, self._max_task_retries, self._next_lease)
                    ds.warning = record.get("warning", "")
                    if record.get("resume"):
                        ds.restore_progress(record["resume_epoch"],
                                            set(record["resume_done"]))
                    self._datasets[spec.name] = ds
                    self._waiting[spec.name] = {}
                elif kind == "done":
                    entries = [dict(zip(LEDGER_FIELDS, row)) for row in record["rows"]]
                    self._datasets[record["ds"]].replay_done(
                        entries, _decode_states(record.get("states")))
                    self._last_lease = max([self._last_lease, *(
                        e.get("lease", 0) for e in entries)])
                elif kind == "failed":
                    self._datasets[record["ds"]].replay_failed(
                        record["epoch"], record["task_id"], record["worker"],
                        record["error"])
                elif kind == "rollback":
                    self._rollback(record["progress"])
                    self._last_lease = max(self._last_lease, record.get("lease", 0))
                else:
                    raise ValueError(f"unknown record kind {kind!r}")
            except (IndexError, KeyError, TypeError, ValueError) as e:
                raise ValueError(f"master journal {path}: record {i} ({kind}) cannot "
                                 f"be replayed: {type(e).__name__}: {e}") from None
        if skipped:
            logging.warning("master journal %s: %d record(s) of a replaced master "
                            "skipped (older generation than %d)", path, skipped, fence)
        self.generation.fence(fence)
        for ds in self._datasets.values():
            ds.finish_replay()
        if records:
            alive = self._alive()
            now = time.monotonic()
            for worker_id in alive:  # their heartbeats resume once they reconnect
                self._workers[worker_id]["last_seen"] = now
            logging.warning(
                "master restarted from its journal %s (%d records, start %d): %s; "
                "workers %s alive; tasks that were in flight are handed out again",
                path, len(records), self._starts + 1, ", ".join(
                    f"'{n}' at epoch {ds.epoch} with {len(ds.done)} task(s) done"
                    for n, ds in self._datasets.items()) or "no dataset", alive)

    def _replay_worker(self, record: dict) -> None:
        worker_id, state = record["id"], record["state"]
        self._next_worker_id = max(self._next_worker_id, worker_id + 1)
        if state == "alive":
            self._workers[worker_id] = {"state": "alive", "last_seen": time.monotonic(),
                                        "timings": {}, "joined": record.get("time", 0)}
        elif worker_id in self._workers:
            if state == "lost" and self._workers[worker_id]["state"] == "alive":
                self._lost += 1
            self._workers[worker_id]["state"] = state
        self._elect_chief()

    def _elect_chief(self) -> None:
        """Keeps the chief while it is alive or exited; else the smallest
        alive worker (None while there is none)."""
        chief = self._workers.get(self._chief) if self._chief is not None else None
        if chief is None or chief["state"] == "lost":
            alive = self._alive()
            self._chief = min(alive) if alive else None

    # -- workers ----------------------------------------------------------
    def _alive(self) -> list[int]:
        return [w for w, s in self._workers.items() if s["state"] == "alive"]

    def RegisterWorker(self, request, context):
        with self._cond:
            if self._error:
                return master_pb2.WorkerResponse(accepted=False, error=self._error)
            worker_id = request.worker_id
            if worker_id < 0:
                worker_id = max([self._next_worker_id - 1, *self._workers]) + 1
            self._next_worker_id = max(self._next_worker_id, worker_id + 1)
            if self._max_workers and worker_id not in self._alive() and len(
                    self._alive()) >= self._max_workers:
                return master_pb2.WorkerResponse(
                    accepted=False, worker_id=worker_id,
                    error=f"the job already has its maximum of {self._max_workers} "
                          "workers")
            previous = self._workers.get(worker_id)
            if previous and previous["state"] == "alive":
                # The same id registering again: its earlier process is gone.
                self._lose(worker_id, "re-registered")
            self._workers[worker_id] = {"state": "alive", "last_seen": time.monotonic(),
                                        "timings": {}, "joined": time.time()}
            seq = self._log({"t": "worker", "id": worker_id, "state": "alive",
                             "time": round(time.time(), 3)})
            self._elect_chief()
            logging.info("worker %d registered (%s)%s", worker_id, request.reason or "-",
                         "; the chief" if self._chief == worker_id else "")
            self._cond.notify_all()
        self._durable(seq)
        return master_pb2.WorkerResponse(accepted=True, worker_id=worker_id)

    def Heartbeat(self, request, context):
        with self._cond:
            worker = self._workers.get(request.worker_id)
            if worker is None or worker["state"] != "alive":
                return master_pb2.WorkerResponse(
                    accepted=False, error=f"worker {request.worker_id} is not part of "
                    "the job (presumed lost); restart it to rejoin")
            worker["last_seen"] = time.monotonic()
            if request.timings:
                worker["timings"] = dict(request.timings)
            if request.marks:
                marks = worker.setdefault("marks", {})
                for name, value in request.marks.items():
                    marks[name] = max(value, marks.get(name, value))
            if request.periodic:
                worker["waiting"] = dict(request.waiting)
                worker["unreachable"] = dict(request.unreachable)
            return master_pb2.WorkerResponse(accepted=True, error=self._error or "")

    def WorkerExited(self, request, context):
        seq = 0
        with self._cond:
            worker = self._workers.get(request.worker_id)
            if worker is not None and worker["state"] == "alive":
                if request.timings:
                    worker["timings"] = dict(request.timings)
                worker["state"] = "exited"
                seq = self._log({"t": "worker", "id": request.worker_id,
                                 "state": "exited"})
                for ds in self._datasets.values():
                    ds.requeue_worker(request.worker_id)
                self._forget_waiting(request.worker_id)
                self._cond.notify_all()
        self._durable(seq)
        return master_pb2.WorkerResponse(accepted=True)

    def ReportWorkerDead(self, request, context):
        with self._cond:
            seq = self._lose(request.worker_id, request.reason or "reported dead")
        self._durable(seq)
        return master_pb2.WorkerResponse(accepted=True)

    def _lose(self, worker_id: int, reason: str) -> int:
        worker = self._workers.get(worker_id)
        if worker is None or worker["state"] != "alive":
            return 0
        worker["state"] = "lost"
        self._lost += 1
        self._elect_chief()
        seq = self._log({"t": "worker", "id": worker_id, "state": "lost",
                         "reason": reason})
        requeued = sum(ds.requeue_worker(worker_id) for ds in self._datasets.values())
        self._forget_waiting(worker_id)
        logging.warning("worker %d lost (%s): %d task(s) requeued", worker_id, reason,
                        requeued)
        self._cond.notify_all()
        return seq

    def _forget_waiting(self, worker_id: int) -> None:
        for waiting in self._waiting.values():
            waiting.pop(worker_id, None)

    def _watch_heartbeats(self) -> None:
        interval = min(1.0, self._heartbeat_timeout / 4)
        while not self._stop.wait(interval):
            self.check_liveness(time.monotonic(), interval)

    def check_liveness(self, now: float, interval: float) -> list[int]:
        """Declares lost the workers silent for longer than the heartbeat
        timeout at monotonic time `now`, the watcher running every `interval`
        seconds, and those that hold a task for longer than its dataset's
        tasks take (`task_queue.task_timeout`: a deadlocked training thread
        behind a live heartbeat thread); returns their ids.

        Silence is measured on the monotonic clock (a wall-clock step is not
        silence), and only while this process ran: when the watcher wakes up
        late (the process or its machine was frozen or starved, as a paused or
        swapped-out VM is), the workers could not be heard either, so the
        stall is not counted against them."""
        last_tick, self._last_tick = self._last_tick or now, now
        stalled = now - last_tick - interval
        lost = []
        with self._cond:
            if stalled > min(5.0, self._heartbeat_timeout / 4):
                for ds in self._datasets.values():
                    ds.shift_hand_outs(stalled)
            for worker_id in self._alive():
                worker = self._workers[worker_id]
                if stalled > min(5.0, self._heartbeat_timeout / 4):
                    worker["last_seen"] += stalled
                silent = now - worker["last_seen"]
                if silent > self._heartbeat_timeout:
                    self._lose(worker_id, f"no heartbeat for {silent:.0f} s")
                    lost.append(worker_id)
            # Workers that hold a task far too long are only *named* here
            # (`overdue` in the status): they may be waiting for a server that
            # hangs, which only the launcher can tell; it decides, and reports
            # the ones to blame dead (launcher/policy.blame_overdue).
            overdue: dict[int, float] = {}
            for ds in self._datasets.values():
                limit = task_timeout(ds.durations, self._progress_timeout)
                for worker_id in ds.overdue(now, self._progress_timeout):
                    overdue[worker_id] = max(limit, overdue.get(worker_id, 0.0))
            self._overdue = overdue
        return lost

    def _touch(self, worker_id: int) -> None:
        worker = self._workers.get(worker_id)
        if worker is not None and worker["state"] == "alive":
            worker["last_seen"] = time.monotonic()

    # -- datasets and tasks ----------------------------------------------
    def _sizing_workers(self) -> int:
        """The workers an epoch's tasks are cut for: the job's maximum, or,
        without one, the workers alive now (at least one)."""
        return self._max_workers or max(1, len(self._alive()))

    @staticmethod
    def _resumed_task_size(request, context) -> int:
        """The task size a resume with done tasks must keep (0: any): their
        ids name record ranges of that size."""
        if not (request.resume and request.resume_done):
            return 0
        size = request.resume_records_per_task
        if not size and request.records_per_task == 0:
            # A checkpoint from before automatic sizing: the default then was
            # 32 minibatches per task.
            size = MAX_MINIBATCHES_PER_TASK * request.batch_size
            logging.warning(
                "dataset '%s' resumes with %d task(s) done but its checkpoint does not "
                "say their size: assuming %d records per task (32 minibatches, the "
                "default when it was saved)", request.dataset,
                len(request.resume_done), size)
        if size and request.records_per_task and request.records_per_task != size:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"dataset '{request.dataset}' resumes a checkpoint whose done tasks "
                f"were cut with {size} records per task, but this run asks for "
                f"{request.records_per_task}: the done task ids would name other "
                "records. Resume with the checkpoint's minibatches_per_task (or None, "
                "which takes the checkpoint's).")
        return size

    def RegisterDataset(self, request, context):
        """The first registration of a dataset decides its spec (the task size
        too, when the worker lets the master choose); a later one must agree,
        or is refused with an error naming the difference and both calls."""
        name = request.dataset
        for field in ("records_per_task", "batch_size", "records_per_epoch"):
            if getattr(request, field) < 0:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"dataset '{name}': {field} must be >= 0, got "
                              f"{getattr(request, field)}")
        auto = request.records_per_task == 0
        if auto and request.batch_size <= 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"dataset '{name}': records_per_task is 0 (let the master "
                          "choose) but no batch_size was given; send the batch size "
                          "or a positive records_per_task")
        shards = tuple((s.name, s.num_records) for s in request.shards)
        records_per_epoch = request.records_per_epoch
        if records_per_epoch == sum(n for _, n in shards):
            records_per_epoch = 0  # one window is the whole dataset
        spec = DatasetSpec(
            name=name, mode=request.mode, shards=shards,
            records_per_task=request.records_per_task, num_epochs=request.num_epochs,
            shuffle=request.shuffle, seed=request.seed, after=request.after_dataset,
            batch_size=request.batch_size, auto=auto,
            records_per_epoch=records_per_epoch,
            fingerprints=tuple((f.path, f.hash) for f in request.fingerprints),
            call=request.call, model=request.model)
        seq = 0
        with self._cond:
            existing = self._datasets.get(spec.name)
            if existing is None:
                workers = self._sizing_workers()
                size = self._resumed_task_size(request, context)
                if auto:
                    spec = dataclasses.replace(spec, records_per_task=size or (
                        auto_records_per_task(shards, spec.batch_size, workers,
                                              records_per_epoch)))
                try:
                    existing = DatasetTasks(spec, self._max_task_retries,
                                            self._next_lease)
                except ValueError as e:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                existing.warning = sizing_warning(spec, workers)
                if request.resume:
                    existing.restore_progress(request.resume_epoch,
                                              set(request.resume_done))
                    logging.info("dataset '%s' resumes at epoch %d with %d task(s) "
                                 "done", spec.name, request.resume_epoch,
                                 len(request.resume_done))
                self._datasets[spec.name] = existing
                self._waiting[spec.name] = {}
                seq = self._log({"t": "dataset", "spec": dataclasses.asdict(spec),
                                 "resume": request.resume,
                                 "resume_epoch": request.resume_epoch,
                                 "resume_done": list(request.resume_done),
                                 "warning": existing.warning})
                logging.info(
                    "dataset '%s' registered by worker %d: %d tasks per epoch of %s "
                    "records (%d records per task%s), %d epochs", spec.name,
                    request.worker_id, len(existing.tasks),
                    records_per_epoch or spec.num_records, spec.records_per_task,
                    f", chosen for {workers} worker(s)" if auto else "",
                    spec.num_epochs)
                if existing.warning:
                    logging.warning("%s", existing.warning)
            else:
                error = existing.spec.mismatch_error(spec, request.worker_id)
                if error:
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, error)
            response = master_pb2.RegisterDatasetResponse(
                epoch=existing.epoch, first_epoch=existing.initial_progress[0],
                num_tasks_per_epoch=len(existing.tasks),
                records_per_task=existing.spec.records_per_task,
                warning=existing.warning)
        self._durable(seq)
        return response

    def _long_poll(self, request, context, attempt, timeout_response):
        """Calls `attempt(ds)` under the lock until it returns a response, the
        state changes being signalled on the condition; after LONG_POLL_SECONDS
        answers `timeout_response` (the client asks again)."""
        deadline = time.monotonic() + LONG_POLL_SECONDS
        with self._cond:
            ds = self._datasets.get(request.dataset)
            if ds is None:
                context.abort(grpc.StatusCode.NOT_FOUND,
                              f"dataset '{request.dataset}' is not registered")
            while True:
                self._touch(request.worker_id)
                response = attempt(ds)
                if response is not None:
                    return response
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stop.is_set() or not context.is_active():
                    return timeout_response
                self._cond.wait(remaining)

    def GetTask(self, request, context):
        faults.reached("master_task")
        kinds = master_pb2.GetTaskResponse
        if request.done_task_ids:
            self._piggybacked_report(request, context)
        waiting = self._waiting.get(request.dataset, {})

        def attempt(ds):
            error = self._error or ds.error
            if error:
                waiting.pop(request.worker_id, None)
                return kinds(kind=kinds.JOB_FAILED, error=error)
            worker = self._workers.get(request.worker_id)
            if worker is None or worker["state"] != "alive":
                return kinds(kind=kinds.JOB_FAILED,
                             error=f"worker {request.worker_id} is not part of the job "
                                   "(presumed lost); restart it to rejoin")
            if not self._rendezvous():
                decision = WAIT
            elif self._before_its_turn(ds, request.epoch):
                reopened = self._reopened_behind(ds, request.worker_id)
                if reopened:
                    waiting.pop(request.worker_id, None)
                    return kinds(kind=kinds.ROLLED_BACK, error=reopened)
                decision = WAIT
            else:
                decision = ds.next_task(request.worker_id, request.epoch, waiting)
            if decision == END_OF_EPOCH:
                waiting.pop(request.worker_id, None)
                if ds.spec.mode == "training":
                    self._past_epoch[(request.worker_id, ds.spec.name)] = ds.rollbacks
                self._cond.notify_all()  # other waiters may now end too
                return kinds(kind=kinds.END_OF_EPOCH, rollbacks=ds.rollbacks)
            if decision != WAIT:
                waiting.pop(request.worker_id, None)
                tasks = [decision]
                while len(tasks) < request.max_tasks and ds.todo and (
                        request.epoch == ds.epoch):
                    tasks.append(ds.next_task(request.worker_id, request.epoch,
                                              waiting))
                protos = [master_pb2.Task(
                    task_id=task.task_id, epoch=epoch, shard=task.shard,
                    start=task.start, end=task.end, attempt=attempt_no,
                    lease=ds.lease_of(task.task_id))
                    for task, epoch, attempt_no in tasks]
                return kinds(kind=kinds.TASK, task=protos[0], more_tasks=protos[1:])
            if request.return_on_wait:
                return kinds(kind=kinds.WAIT)
            if waiting.get(request.worker_id) != request.epoch:
                waiting[request.worker_id] = request.epoch
                self._cond.notify_all()  # a holder may now be allowed to end
            return None

        return self._milestone(self._long_poll(request, context, attempt,
                                               kinds(kind=kinds.WAIT)))

    def _rendezvous(self) -> bool:
        """Whether tasks may be handed out: `min_workers` workers registered
        (ever: a replay of the journal counts them too), the job already
        made progress, or `rendezvous_timeout` seconds passed since this
        master started. Once met, for good."""
        if not self._rendezvous_met:
            waited = time.monotonic() - self._started
            if (len(self._workers) >= self._min_workers
                    or any(ds.ledger for ds in self._datasets.values())
                    or waited >= self._rendezvous_timeout):
                self._rendezvous_met = True
                logging.info("start rendezvous: %d of %d workers registered after "
                             "%.1f s; handing out tasks", len(self._workers),
                             self._min_workers, waited)
        return self._rendezvous_met

    def _reopened_behind(self, ds: DatasetTasks, worker_id: int) -> str:
        """Why worker `worker_id`, waiting for round `ds` of an evaluation,
        can never get it: a rollback since its loop went past the training
        epoch reopened tasks of it, which only a new worker's loop can train
        (every worker may be waiting here: the job would hang). "" if not."""
        train = self._datasets.get(ds.spec.after)
        seen = self._past_epoch.get((worker_id, ds.spec.after))
        if train is None or seen is None or train.rollbacks <= seen or not train.todo:
            return ""
        return (f"dataset '{train.spec.name}' was rolled back to epoch {train.epoch} (a "
                f"parameter server was recovered) after worker {worker_id} finished "
                f"that epoch, whose evaluation '{ds.spec.name}' it waits for: it exits "
                f"so that the launcher relaunches a worker to train the "
                f"{len(train.todo)} reopened task(s)")

    def _before_its_turn(self, ds: DatasetTasks, epoch: int) -> bool:
        """Round `epoch` of an evaluation waits for that training epoch's end."""
        if not ds.spec.after:
            return False
        train = self._datasets.get(ds.spec.after)
        if train is None:
            return True
        return not train.finished and train.epoch <= epoch

    def _done(self, ds: DatasetTasks, worker_id: int, task_ids: list[int],
              states: dict | None) -> int:
        """Records tasks done (held: checked by the caller), under the lock;
        returns the journal record to wait for (0: none, the epoch goes on)."""
        epoch = ds.epoch
        accepted = ds.report_done(worker_id, task_ids, states)
        if accepted:
            done = self._log({"t": "done", "ds": ds.spec.name,
                              "rows": ds.ledger_rows(len(accepted)),
                              "states": _encode_states(states)})
            if ds.epoch != epoch:  # this report ended the epoch
                self._milestone_seq = done
                return done
        return 0

    def _piggybacked_report(self, request, context) -> None:
        """The tasks a GetTask reports done, recorded before anything is handed
        out (as a ReportTask would: refused, nothing changes)."""
        task_ids, leases = list(request.done_task_ids), list(request.done_leases)
        if leases and len(leases) != len(task_ids):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"GetTask: {len(task_ids)} done task ids but {len(leases)} "
                          "leases")
        with self._cond:
            ds = self._datasets.get(request.dataset)
            if ds is None:
                context.abort(grpc.StatusCode.NOT_FOUND,
                              f"dataset '{request.dataset}' is not registered")
            refused = ds.not_held(request.worker_id, task_ids, leases)
            if refused:
                ds.late_reports += len(refused)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              ds.describe_not_held(request.worker_id, refused))
            self._done(ds, request.worker_id, task_ids, None)
            self._cond.notify_all()

    def ReportTask(self, request, context):
        seq = 0
        task_ids, leases = list(request.task_ids), list(request.leases)
        if leases and len(leases) != len(task_ids):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"ReportTask: {len(task_ids)} task ids but {len(leases)} "
                          "leases")
        with self._cond:
            ds = self._datasets.get(request.dataset)
            if ds is None:
                context.abort(grpc.StatusCode.NOT_FOUND,
                              f"dataset '{request.dataset}' is not registered")
            self._touch(request.worker_id)
            if not request.release:
                refused = ds.not_held(request.worker_id, task_ids, leases)
                if refused:
                    ds.late_reports += len(refused)
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                  ds.describe_not_held(request.worker_id, refused))
            if request.success:
                try:
                    states = dict(decode_all(request.metric_states)) or None
                except ValueError as e:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"ReportTask: bad metric states: {e}")
                seq = self._done(ds, request.worker_id, task_ids, states)
            elif request.release:
                given = ds.release(request.worker_id, task_ids, leases)
                logging.info("worker %d gave back %d task(s) of '%s': %s",
                             request.worker_id, given, ds.spec.name,
                             request.error or "-")
            else:
                for task_id in task_ids:
                    seq = self._log({"t": "failed", "ds": ds.spec.name,
                                     "epoch": ds.epoch, "task_id": task_id,
                                     "worker": request.worker_id,
                                     "error": request.error})
                    ds.report_failed(request.worker_id, task_id, request.error)
                self._milestone_seq = seq  # may have failed the job
                if ds.error:
                    logging.error("%s", ds.error)
            self._cond.notify_all()
        self._durable(seq)
        return master_pb2.ReportTaskResponse()

    def GetResult(self, request, context):
        """Summed states of a complete round; long-polls while it runs."""

        def attempt(ds):
            error = self._error or ds.error
            if error:
                return master_pb2.GetResultResponse(error=error)
            if request.epoch in ds.results:
                num_tasks, sums = ds.results[request.epoch]
                return master_pb2.GetResultResponse(
                    ready=True, num_tasks=num_tasks,
                    states=list(encode_all(sums.items())))
            return None

        return self._milestone(self._long_poll(
            request, context, attempt, master_pb2.GetResultResponse(ready=False)))

    # -- status -----------------------------------------------------------
    def status(self, include_ledger: bool = False) -> dict:
        with self._cond:
            timings: dict[str, float] = {}
            for worker in self._workers.values():
                for phase, seconds in worker["timings"].items():
                    timings[phase] = timings.get(phase, 0.0) + seconds
            datasets = {}
            for name, ds in self._datasets.items():
                datasets[name] = ds.status()
                if include_ledger:
                    datasets[name]["ledger"] = list(ds.ledger)
            errors = [self._error] + [ds.error for ds in self._datasets.values()]
            error = next((e for e in errors if e), None)
            return {
                "uptime": time.monotonic() - self._started,
                "master_restarts": max(0, self._starts - 1),
                "error": error,
                "workers": {
                    "alive": sorted(self._alive()),
                    "lost": self._lost,
                    "lost_ids": sorted(w for w, s in self._workers.items()
                                       if s["state"] == "lost"),
                    "overdue": {w: limit for w, limit in self._overdue.items()
                                if w in self._alive()},
                    "marks": {w: dict(self._workers[w]["marks"]) for w in self._alive()
                              if self._workers[w].get("marks")},
                    "waiting": {w: dict(self._workers[w]["waiting"])
                                for w in self._alive() if self._workers[w].get("waiting")},
                    "unreachable": {w: dict(self._workers[w]["unreachable"])
                                    for w in self._alive()
                                    if self._workers[w].get("unreachable")},
                    "exited": sorted(w for w, s in self._workers.items()
                                     if s["state"] == "exited"),
                    "registered": len(self._workers),
                    "chief": self._chief,
                },
                "datasets": datasets,
                "tasks_done": sum(d["tasks_done_total"] for d in datasets.values()),
                "requeued": sum(ds.requeued for ds in self._datasets.values()),
                "timings": timings,
            }

    def rollback(self, progress: dict | None, reason: str = "") -> tuple[dict, int]:
        """Training datasets go back to `progress` ({dataset: {"epoch",
        "done_task_ids"}}, a parameter-server checkpoint's; None: to where they
        started). Returns ({dataset: completions undone}, the lease floor: every
        lease handed out before is below it, every later one above)."""
        with self._cond:
            undone = self._rollback(progress)
            # Every lease handed out from now on is above this one and every
            # earlier one below: the servers refuse claims of the earlier ones.
            floor = self._next_lease()
            seq = self._log({"t": "rollback", "progress": progress, "reason": reason,
                             "lease": floor})
            self._cond.notify_all()
        self._durable(seq)
        logging.warning("rolled back to %s (%s): completions undone %s",
                        "the start" if progress is None else "a checkpoint",
                        reason or "-", undone)
        return undone, floor

    def _rollback(self, progress: dict | None) -> dict:
        undone = {}
        for name, ds in self._datasets.items():
            if ds.spec.mode != "training":
                continue
            point = (progress or {}).get(name)
            if point is None:
                undone[name] = ds.rollback()
            else:
                undone[name] = ds.rollback(int(point["epoch"]),
                                           set(point["done_task_ids"]))
        return undone

    def Rollback(self, request, context):
        progress = {p.dataset: {"epoch": p.epoch, "done_task_ids": list(p.done_task_ids),
                                "records_per_task": p.records_per_task}
                    for p in request.progress} or None
        undone, floor = self.rollback(progress, request.reason)
        return master_pb2.RollbackResponse(undone=undone, min_lease=floor)

    def GetStatus(self, request, context):
        response = JobStatus.from_dict(self.status(
            include_ledger=request.include_ledger)).to_proto()
        if self._journal is not None:  # the launcher ends the job on it
            self._durable(self._journal.appended)
        return response


def _encode_states(states: dict[str, np.ndarray] | None) -> dict | None:
    if not states:
        return None
    return {name: [str(v.dtype), list(v.shape), base64.b64encode(
        np.ascontiguousarray(v).tobytes()).decode()] for name, v in states.items()}


def _decode_states(encoded: dict | None) -> dict[str, np.ndarray] | None:
    if not encoded:
        return None
    return {name: np.frombuffer(base64.b64decode(data), dtype=np.dtype(dtype)
                                ).reshape(shape).copy()
            for name, (dtype, shape, data) in encoded.items()}

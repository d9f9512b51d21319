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

The servicer is the gRPC adapter over plain objects it calls under its one
lock: the workers, the chief and their liveness (`master/membership.py`), each
dataset's tasks, epochs, ledger and task sizing (`master/task_queue.py`), the
journal and its replay (`master/journal.py`).
"""

from __future__ import annotations

import dataclasses
import threading
import time

import grpc
from absl import logging

from keras_elastic.common import errors, faults, fencing
from keras_elastic.common.tensor_codec import decode_all, encode_all
from keras_elastic.master.journal import Journal, JournalReplay, encode_states
from keras_elastic.master.membership import Membership, StartRendezvous
from keras_elastic.master.status import JobStatus
from keras_elastic.master.task_queue import (
    END_OF_EPOCH,
    WAIT,
    DatasetSpec,
    DatasetTasks,
    LeaseClock,
    overdue_workers,
    resumed_task_size,
    rollback_training,
    size_tasks,
    sizing_warning,
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
        # The job's generation this master serves (common/fencing.py): every
        # journal record carries it, and a replay skips records of a master
        # that was replaced (older than one already seen).
        self.generation = generation or fencing.Generation(0)
        self._membership = Membership(max_workers, heartbeat_timeout)
        self._leases = LeaseClock()
        self._datasets: dict[str, DatasetTasks] = {}
        self._waiting: dict[str, dict[int, int]] = {}  # dataset -> worker -> epoch
        # (worker, training dataset) -> the dataset's rollbacks when the
        # worker's loop went past an epoch (END_OF_EPOCH): a later rollback
        # reopened tasks that worker can no longer train.
        self._past_epoch: dict[tuple[int, str], int] = {}
        # The least time a task may be held before its worker counts as making
        # no progress (more for a dataset whose tasks are slow: task_timeout).
        self._progress_timeout = progress_timeout
        self._max_task_retries = max_task_retries
        self._error: str | None = None
        self._started = time.monotonic()
        self._rendezvous = StartRendezvous(min_workers, rendezvous_timeout,
                                           self._started)
        self._starts = 0
        self._journal: Journal | None = None
        self._on_journal_error = on_journal_error
        # The journal record that ended the last epoch or round: answers that
        # reveal the end wait for it (`_milestone`).
        self._milestone_seq = 0
        if journal_path:
            replay = JournalReplay(max_task_retries, self._membership, self._leases,
                                   self._datasets)
            replay.run(Journal.read(journal_path), journal_path, self.generation)
            self._starts = replay.starts
            self._waiting = {name: {} for name in self._datasets}
            self._journal = Journal(journal_path, flush_secs=JOURNAL_FLUSH_SECS,
                                    on_error=self._journal_failed)
            self._starts += 1
            self._log({"t": "start", "time": round(time.time(), 3)})
        self._stop = threading.Event()
        self._monitor = threading.Thread(target=self._watch_heartbeats, daemon=True,
                                         name="master-heartbeats")
        self._monitor.start()

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
        """One line for the journal's failure (`Journal.describe_failure`),
        whichever caller notices it first."""
        journal = self._journal
        return journal.describe_failure(error) if journal is not None else str(error)

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

    # -- workers ----------------------------------------------------------
    def RegisterWorker(self, request, context):
        members = self._membership
        with self._cond:
            if self._error:
                return master_pb2.WorkerResponse(accepted=False, error=self._error)
            worker_id = members.assign_id(request.worker_id)
            if request.HasField("replaces") and request.replaces != worker_id:
                # The launcher saw its process end: lost now, as its report
                # (on its way) would make it.
                self._lose(request.replaces, f"replaced by worker {worker_id}")
            refusal = members.refusal(worker_id)
            if refusal:
                return master_pb2.WorkerResponse(accepted=False, worker_id=worker_id,
                                                 error=refusal)
            if members.is_alive(worker_id):
                # The same id registering again: its earlier process is gone.
                self._lose(worker_id, "re-registered")
            members.join(worker_id, time.monotonic(), joined=time.time())
            seq = self._log({"t": "worker", "id": worker_id, "state": "alive",
                             "time": round(time.time(), 3)})
            logging.info("worker %d registered (%s)%s", worker_id, request.reason or "-",
                         "; the chief" if members.chief == worker_id else "")
            self._cond.notify_all()
        self._durable(seq)
        return master_pb2.WorkerResponse(accepted=True, worker_id=worker_id)

    def Heartbeat(self, request, context):
        with self._cond:
            if not self._membership.heartbeat(
                    request.worker_id, time.monotonic(), timings=request.timings,
                    marks=request.marks, waits=(
                        request.waiting, request.unreachable, request.reached)
                    if request.periodic else None):
                return master_pb2.WorkerResponse(
                    accepted=False, error=errors.presumed_lost(request.worker_id))
            return master_pb2.WorkerResponse(accepted=True, error=self._error or "")

    def WorkerExited(self, request, context):
        seq = 0
        with self._cond:
            if self._membership.exit(request.worker_id, request.timings):
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
        """Worker `worker_id` (if alive) is lost: journaled, its tasks
        requeued (under the lock); returns the record to wait for."""
        if not self._membership.lose(worker_id):
            return 0
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
        interval = min(1.0, self._membership.heartbeat_timeout / 4)
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
        stalled = self._membership.stall(now, interval)
        lost = []
        with self._cond:
            if stalled:
                for ds in self._datasets.values():
                    ds.shift_hand_outs(stalled)
                self._membership.excuse(stalled)
            for worker_id, silent in self._membership.silent(now):
                self._lose(worker_id, f"no heartbeat for {silent:.0f} s")
                lost.append(worker_id)
            # Workers that hold a task far too long are only *named* here
            # (`overdue` in the status): they may be waiting for a server that
            # hangs, which only the launcher can tell; it decides, and reports
            # the ones to blame dead (launcher/policy.blame_overdue).
            self._membership.overdue = overdue_workers(
                self._datasets.values(), now, self._progress_timeout)
        return lost

    def _touch(self, worker_id: int) -> None:
        self._membership.touch(worker_id, time.monotonic())

    # -- datasets and tasks ----------------------------------------------
    @staticmethod
    def _dataset_spec(request, context) -> DatasetSpec:
        """The spec a RegisterDataset asks for (its task size 0 when the
        master is to choose it); a malformed request is refused."""
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
        return DatasetSpec(
            name=name, mode=request.mode, shards=shards,
            records_per_task=request.records_per_task, num_epochs=request.num_epochs,
            shuffle=request.shuffle, seed=request.seed, after=request.after_dataset,
            batch_size=request.batch_size, auto=auto,
            records_per_epoch=records_per_epoch,
            fingerprints=tuple((f.path, f.hash) for f in request.fingerprints),
            call=request.call, model=request.model)

    def _add_dataset(self, spec: DatasetSpec, request,
                     context) -> tuple[DatasetTasks, int]:
        """Registers the dataset of `spec` (its first registration, under the
        lock), its tasks sized for the job's workers; returns it and the
        journal record to wait for."""
        workers = self._membership.sizing_workers()
        try:
            resumed = resumed_task_size(
                spec.name, len(request.resume_done) if request.resume else 0,
                request.resume_records_per_task, request.records_per_task,
                request.batch_size)
        except ValueError as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        spec = size_tasks(spec, workers, resumed)
        try:
            ds = DatasetTasks(spec, self._max_task_retries, self._leases.next)
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        ds.warning = sizing_warning(spec, workers)
        if request.resume:
            ds.restore_progress(request.resume_epoch, set(request.resume_done))
            logging.info("dataset '%s' resumes at epoch %d with %d task(s) "
                         "done", spec.name, request.resume_epoch,
                         len(request.resume_done))
        self._datasets[spec.name] = ds
        self._waiting[spec.name] = {}
        seq = self._log({"t": "dataset", "spec": dataclasses.asdict(spec),
                         "resume": request.resume,
                         "resume_epoch": request.resume_epoch,
                         "resume_done": list(request.resume_done),
                         "warning": ds.warning})
        logging.info(
            "dataset '%s' registered by worker %d: %d tasks per epoch of %s "
            "records (%d records per task%s), %d epochs", spec.name,
            request.worker_id, len(ds.tasks),
            spec.records_per_epoch or spec.num_records, spec.records_per_task,
            f", chosen for {workers} worker(s)" if spec.auto else "",
            spec.num_epochs)
        if ds.warning:
            logging.warning("%s", ds.warning)
        return ds, seq

    def RegisterDataset(self, request, context):
        """The first registration of a dataset decides its spec (the task size
        too, when the worker lets the master choose); a later one must agree,
        or is refused with an error naming the difference and both calls."""
        spec = self._dataset_spec(request, context)
        seq = 0
        with self._cond:
            existing = self._datasets.get(spec.name)
            if existing is None:
                existing, seq = self._add_dataset(spec, request, context)
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
            if not self._membership.is_alive(request.worker_id):
                return kinds(kind=kinds.JOB_FAILED,
                             error=errors.presumed_lost(request.worker_id))
            if not self._rendezvous_ready():
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
                return self._hand_out(ds, request, decision, waiting)
            if request.return_on_wait:
                return kinds(kind=kinds.WAIT)
            if waiting.get(request.worker_id) != request.epoch:
                waiting[request.worker_id] = request.epoch
                self._cond.notify_all()  # a holder may now be allowed to end
            return None

        return self._milestone(self._long_poll(request, context, attempt,
                                               kinds(kind=kinds.WAIT)))

    @staticmethod
    def _hand_out(ds: DatasetTasks, request, first, waiting):
        """The answer handing out task `first` (`next_task`'s) and, up to
        `request.max_tasks`, more of the same epoch."""
        tasks = [first]
        while len(tasks) < request.max_tasks and ds.todo and request.epoch == ds.epoch:
            tasks.append(ds.next_task(request.worker_id, request.epoch, waiting))
        protos = [master_pb2.Task(
            task_id=task.task_id, epoch=epoch, shard=task.shard, start=task.start,
            end=task.end, attempt=attempt_no, lease=ds.lease_of(task.task_id))
            for task, epoch, attempt_no in tasks]
        return master_pb2.GetTaskResponse(kind=master_pb2.GetTaskResponse.TASK,
                                          task=protos[0], more_tasks=protos[1:])

    def _rendezvous_ready(self) -> bool:
        """Whether tasks may be handed out (the start rendezvous is met)."""
        return self._rendezvous.met or self._rendezvous.ready(
            len(self._membership.workers),
            lambda: any(ds.ledger for ds in self._datasets.values()), time.monotonic())

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
                              "states": encode_states(states)})
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
                "workers": self._membership.status(),
                "datasets": datasets,
                "tasks_done": sum(d["tasks_done_total"] for d in datasets.values()),
                "requeued": sum(ds.requeued for ds in self._datasets.values()),
                "timings": self._membership.timings(),
            }

    def rollback(self, progress: dict | None, reason: str = "") -> tuple[dict, int]:
        """Training datasets go back to `progress` ({dataset: {"epoch",
        "done_task_ids"}}, a parameter-server checkpoint's; None: to where they
        started). Returns ({dataset: completions undone}, the lease floor: every
        lease handed out before is below it, every later one above)."""
        with self._cond:
            undone = rollback_training(self._datasets, progress)
            # Every lease handed out from now on is above this one and every
            # earlier one below: the servers refuse claims of the earlier ones.
            floor = self._leases.next()
            seq = self._log({"t": "rollback", "progress": progress, "reason": reason,
                             "lease": floor})
            self._cond.notify_all()
        self._durable(seq)
        logging.warning("rolled back to %s (%s): completions undone %s",
                        "the start" if progress is None else "a checkpoint",
                        reason or "-", undone)
        return undone, floor

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

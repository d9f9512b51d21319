"""The worker's (and launcher's) view of the master.

Example:

>>> import numpy as np
>>> import keras_elastic as ke
>>> from keras_elastic.master.server import MasterServer
>>> server = MasterServer()                  # a master in this process
>>> client = MasterClient(server.address, worker_id=0)
>>> client.register_worker()                 # this worker's id
0
>>> data = ke.ElasticDataset((np.zeros((8, 2)), np.zeros(8)), batch_size=4)
>>> client.register_dataset(data.registration(1)).num_tasks_per_epoch
2
>>> task = client.get_task("training", epoch=0)
>>> task.shard, task.start, task.end           # records 0-3 of the arrays
('arrays', 0, 4)
>>> server.stop()
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc
from absl import logging

from keras_elastic.common import cluster_env, errors, rpc
from keras_elastic.master.status import JobStatus
from keras_elastic.proto import master_pb2, master_pb2_grpc

# `get_task(..., return_on_wait=True)`: the master says to wait.
WAIT = "wait"

class JobRolledBackError(errors.ClusterError, RuntimeError):
    """The job went back (a recovery) past the end of this worker's loop."""


class JobFailedError(errors.ClusterError, RuntimeError):
    """The master failed the job (for example a task failed too often)."""


class WorkerLostError(JobFailedError):
    """The job presumed this worker lost (its heartbeats stopped for
    --heartbeat_timeout, or it was cut off from a server the others reach)
    and gave its tasks to others: nothing it sends counts any more. A new
    process joins as a new worker: the launcher starts one for a worker it
    launched, and `keras-elastic join` starts its command again (a launched
    or joined worker that dies of this error exits with status 3,
    `common/job_end.EXIT_LOST`)."""


def _job_failed(error: str) -> JobFailedError:
    """The error for the master's answer `error` (a refusal of a worker it
    presumed lost: `WorkerLostError`)."""
    return (WorkerLostError(error) if errors.PRESUMED_LOST in error
            else JobFailedError(error))


class JobMismatchError(errors.JobError, ValueError):
    """This worker's script differs from the job's: its arrays, its call of
    fit/evaluate/predict, or the model compiled (the master quotes both).
    Running the same script again cannot fix it (the launcher fails the job
    at once: launcher/policy.py)."""


class TaskNotHeldError(errors.ClusterError, ValueError):
    """The master refused a task report: the worker no longer holds the task
    (it was handed out again, e.g. after the master restarted)."""


class MasterClient:
    """Calls the master; turns gRPC failures into errors naming the master."""

    def __init__(self, address: str, worker_id: int = -1,
                 connect_timeout: float = 60.0,
                 reconnect_timeout: float | None = None) -> None:
        self.address = address
        self.worker_id = worker_id
        # Training dataset -> its rollbacks when this worker's loop last
        # reached the end of an epoch of it (the master's END_OF_EPOCH).
        self.rollbacks_seen: dict[str, int] = {}
        # How long calls keep retrying a master that cannot be reached.
        self.reconnect_timeout = (connect_timeout if reconnect_timeout is None
                                  else reconnect_timeout)
        self._channel = rpc.make_channel(address)
        rpc.wait_ready(self._channel, address, "master", connect_timeout)
        self._stub = master_pb2_grpc.MasterStub(self._channel)
        self._heartbeat_stop = threading.Event()
        self._marks: dict[str, int] = {}  # set_mark: sent with every heartbeat
        self._heartbeat_thread: threading.Thread | None = None

    def _call(self, method: str, request, timeout: float | None = 60.0):
        deadline = None if timeout is None else cluster_env.call_deadline(timeout)
        try:
            return rpc.retry_unreachable(
                lambda: getattr(self._stub, method)(request, timeout=deadline),
                f"the master at {self.address}", self.reconnect_timeout)
        except grpc.RpcError as e:
            code = e.code()
            if rpc.is_unreachable(e) or code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise ConnectionError(
                    f"master at {self.address} did not answer {method}: "
                    f"{e.details()}") from None
            if code == grpc.StatusCode.FAILED_PRECONDITION and (
                    method == "ReportTask" or getattr(request, "done_task_ids", None)):
                raise TaskNotHeldError(e.details()) from None
            if code == grpc.StatusCode.FAILED_PRECONDITION and (
                    method == "RegisterDataset"):
                raise JobMismatchError(e.details()) from None
            if code in (grpc.StatusCode.INVALID_ARGUMENT,
                        grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
                raise ValueError(e.details()) from None
            raise

    # -- workers ----------------------------------------------------------
    def register_worker(self, reason: str = "", replaces: int | None = None) -> int:
        """Registers this worker (`replaces`: the worker the launcher started
        it to replace, lost first if still counted alive); its id."""
        response = self._call("RegisterWorker", master_pb2.WorkerRequest(
            worker_id=self.worker_id, reason=reason, replaces=replaces))
        if not response.accepted:
            raise JobFailedError(f"the master at {self.address} refused worker "
                                 f"{response.worker_id}: {response.error}")
        self.worker_id = response.worker_id
        return self.worker_id

    def start_heartbeats(self, interval: float = 2.0,
                         timings: Callable[[], dict[str, float]] | None = None,
                         waits: Callable[[], tuple[dict[str, float],
                                                   dict[str, float]]] | None = None,
                         reached: Callable[[], dict[str, float]] | None = None
                         ) -> None:
        """Sends heartbeats from a daemon thread, with the cumulative phase
        `timings`, `waits`: the servers this worker waits on and those it
        cannot reach (`PSClient.waits`), and `reached`: how long ago each
        server last answered it (`PSClient.reached`)."""
        if self._heartbeat_thread is not None:
            return

        def beat() -> None:
            while not self._heartbeat_stop.wait(interval):
                waiting, unreachable = waits() if waits else ({}, {})
                answered = reached() if reached else {}
                try:
                    self._stub.Heartbeat(master_pb2.WorkerRequest(
                        worker_id=self.worker_id, marks=dict(self._marks),
                        timings=timings() if timings else {}, waiting=waiting,
                        unreachable=unreachable, reached=answered, periodic=True),
                        timeout=interval * 5)
                except grpc.RpcError as e:
                    logging.log_every_n_seconds(
                        logging.WARNING, "heartbeat to master %s failed: %s", 30,
                        self.address, e.details())
                    if rpc.is_unreachable(e):
                        # Refused for an old generation, or the master moved:
                        # the cluster file says where and which, also while
                        # this worker's own thread makes no call (a script's
                        # work after fit) that would look it up.
                        rpc.refresh_all()

        self._heartbeat_thread = threading.Thread(target=beat, daemon=True,
                                                  name="ke-heartbeat")
        self._heartbeat_thread.start()

    def set_mark(self, name: str, value: int = 1) -> None:
        """Reports that this worker reached milestone `name` (`value`: a count
        that only goes up), at once and with every later heartbeat; other
        workers read it in `job_status().workers.marks`."""
        self._marks[name] = max(int(value), self._marks.get(name, int(value)))
        self._call("Heartbeat", master_pb2.WorkerRequest(
            worker_id=self.worker_id, marks={name: self._marks[name]}))

    def worker_exited(self, timings: dict[str, float] | None = None) -> None:
        self._heartbeat_stop.set()
        request = master_pb2.WorkerRequest(worker_id=self.worker_id,
                                           timings=timings or {})
        try:
            # Retried for a few seconds: a master refusing this worker's old
            # generation (a recovery since: the cluster file has the new one),
            # or restarting. Else the master would hold this worker alive
            # until its heartbeats time out.
            rpc.retry_unreachable(lambda: self._stub.WorkerExited(request, timeout=10),
                                  f"the master at {self.address}", 5.0)
        except grpc.RpcError:
            pass  # the master may already be gone at the end of a job

    def report_worker_dead(self, worker_id: int, reason: str,
                           timeout: float = 60.0) -> None:
        self._call("ReportWorkerDead", master_pb2.WorkerRequest(
            worker_id=worker_id, reason=reason), timeout=timeout)

    # -- data -------------------------------------------------------------
    def register_dataset(self, request: master_pb2.RegisterDatasetRequest
                         ) -> master_pb2.RegisterDatasetResponse:
        """Registers a dataset (`ElasticDataset.registration`); returns the
        job's answer: the epoch in progress and the task size in force (hand
        it to `ElasticDataset.registered`). A warning of the master (too few
        tasks per epoch for the job's workers) is logged here. A registration
        that differs from the job's raises ValueError naming the difference."""
        request.worker_id = self.worker_id
        response = self._call("RegisterDataset", request)
        if response.warning:
            logging.warning("keras_elastic: %s", response.warning)
        return response

    def get_task(self, dataset: str, epoch: int,
                 stop: threading.Event | None = None,
                 return_on_wait: bool = False) -> master_pb2.Task | str | None:
        """Returns the next task, or None at the end of this worker's epoch.

        Blocks (long-polling the master) while the master says to wait, or,
        with `return_on_wait`, returns `WAIT` at once.
        """
        got = self.get_tasks(dataset, epoch, 1, stop, return_on_wait)
        return got[0] if isinstance(got, list) else got

    def get_tasks(self, dataset: str, epoch: int, max_tasks: int,
                  stop: threading.Event | None = None,
                  return_on_wait: bool = False,
                  done: list[master_pb2.Task] | None = None
                  ) -> list[master_pb2.Task] | str | None:
        """Like `get_task`, but up to `max_tasks` tasks at once (a list).

        `done`: tasks this worker finished, reported with this request (one
        call instead of a `report_tasks` and a `get_tasks`). If the master
        refuses that report (a task no longer held), `TaskNotHeldError` is
        raised and nothing was handed out: report them one by one with
        `report_tasks`, which says which.
        """
        ids = [t.task_id for t in done or ()]
        leases = [t.lease for t in done or ()]
        while True:
            if stop is not None and stop.is_set():
                if ids:  # still to be reported
                    self.report_tasks(dataset, ids, leases=leases)
                return None
            response = self._call("GetTask", master_pb2.GetTaskRequest(
                worker_id=self.worker_id, dataset=dataset, epoch=epoch,
                return_on_wait=return_on_wait, max_tasks=max_tasks,
                done_task_ids=ids, done_leases=leases))
            ids, leases = [], []  # recorded: a repeated request must not repeat them
            kind = response.kind
            if kind == master_pb2.GetTaskResponse.TASK:
                return [response.task, *response.more_tasks]
            if kind == master_pb2.GetTaskResponse.END_OF_EPOCH:
                self.rollbacks_seen[dataset] = response.rollbacks
                return None
            if kind == master_pb2.GetTaskResponse.ROLLED_BACK:
                raise JobRolledBackError(response.error)
            if kind == master_pb2.GetTaskResponse.WAIT and return_on_wait:
                return WAIT
            if kind == master_pb2.GetTaskResponse.JOB_FAILED:
                raise _job_failed(response.error)

    def report_tasks(self, dataset: str, task_ids: list[int], success: bool = True,
                     error: str = "", metric_states=None,
                     leases: list[int] | None = None) -> list[int]:
        """Reports tasks done (or failed); returns those the master refused
        because this worker no longer holds them (logged: another hand-out of
        the task counts instead). `metric_states` are summed once: if the
        master refuses some of the tasks, they go with the first one it
        accepts."""
        try:
            self._call("ReportTask", master_pb2.ReportTaskRequest(
                worker_id=self.worker_id, dataset=dataset, task_ids=task_ids,
                success=success, error=error, metric_states=metric_states or [],
                leases=leases or []))
            return []
        except TaskNotHeldError as e:
            if len(task_ids) == 1:
                logging.warning("worker %d: the master refused a report: %s",
                                self.worker_id, e)
                return list(task_ids)
        refused = []
        for i, task_id in enumerate(task_ids):  # the others are still ours
            not_held = self.report_tasks(dataset, [task_id], success, error,
                                         metric_states=metric_states,
                                         leases=[leases[i]] if leases else None)
            if not not_held:
                metric_states = None  # summed with this task
            refused += not_held
        return refused

    def release_tasks(self, dataset: str, task_ids: list[int], reason: str,
                      leases: list[int] | None = None) -> None:
        """Gives tasks back to the master (they are handed out again); with
        `leases`, only those hand-outs (not a later one of the same task)."""
        self._call("ReportTask", master_pb2.ReportTaskRequest(
            worker_id=self.worker_id, dataset=dataset, task_ids=task_ids,
            success=False, release=True, error=reason, leases=leases or []))

    def rollback(self, progress: dict | None, reason: str = ""
                 ) -> master_pb2.RollbackResponse:
        """Training goes back to a parameter-server checkpoint's `progress`
        ({dataset: {"epoch", "done_task_ids", "records_per_task"}}, as
        `checkpoint.ps_manifest.training_progress` gives it; None: to the
        start). The launcher calls it after restoring the servers. The answer
        has `undone` (dataset -> completions undone) and `min_lease`."""
        response = self._call("Rollback", master_pb2.RollbackRequest(
            reason=reason, progress=[master_pb2.DatasetProgress(
                dataset=name, epoch=int(p["epoch"]),
                done_task_ids=[int(t) for t in p["done_task_ids"]],
                records_per_task=int(p.get("records_per_task") or 0))
                for name, p in (progress or {}).items()]))
        return response

    def get_result(self, dataset: str, epoch: int, wait: bool = True
                   ) -> tuple[int, dict] | None:
        """Blocks until round `epoch` of `dataset` is complete; returns
        `(num_tasks, {state name: summed array})`. With `wait=False`, asks
        once (the master answers within a few seconds) and returns None if
        the round is not complete yet."""
        from keras_elastic.common.tensor_codec import decode_all

        while True:
            response = self._call("GetResult", master_pb2.GetResultRequest(
                worker_id=self.worker_id, dataset=dataset, epoch=epoch))
            if response.error:
                raise _job_failed(response.error)
            if response.ready:
                return response.num_tasks, dict(decode_all(response.states))
            if not wait:
                return None

    def wait_for_epoch(self, dataset: str, epoch: int, poll: float = 0.05) -> None:
        """Blocks until `dataset` has reached `epoch` (or finished)."""
        import time

        # The rollbacks as of this worker's last end of an epoch of `dataset`:
        # one since then (also before this wait) reopened tasks it is past.
        rollbacks = self.rollbacks_seen.get(dataset)
        while True:
            status = self.job_status()
            if status.error:
                raise _job_failed(status.error)
            ds = status.datasets.get(dataset)
            if ds is None:
                raise ValueError(f"dataset '{dataset}' is not registered")
            if ds.epoch >= epoch or ds.finished:
                return
            if rollbacks is None:
                rollbacks = ds.rollbacks
            elif ds.rollbacks > rollbacks and ds.todo:
                # A recovery reopened tasks this worker's loop is past: it
                # cannot train them any more, a new worker can.
                raise JobRolledBackError(
                    f"dataset '{dataset}' was rolled back to epoch {ds.epoch} (a "
                    f"parameter server was recovered) after this worker finished "
                    f"its {epoch} epoch(s): it exits so that the launcher relaunches "
                    f"a worker to train the {ds.todo} reopened task(s)")
            time.sleep(poll)

    def job_status(self, include_ledger: bool = False, timeout: float = 10.0
                   ) -> JobStatus:
        """The job's status (`master/status.py`); with `include_ledger`, every
        completed task of each dataset."""
        response = self._call("GetStatus", master_pb2.StatusRequest(
            include_ledger=include_ledger), timeout=timeout)
        return JobStatus.from_proto(response, include_ledger)

    def status(self, include_ledger: bool = False, timeout: float = 10.0) -> dict:
        """`job_status()` as a JSON-ready dict (what `summary.json` holds)."""
        return self.job_status(include_ledger, timeout).to_dict()

    def close(self) -> None:
        self._heartbeat_stop.set()
        if self._heartbeat_thread is not None:
            # A call on a closed channel can crash grpc (seen in grpc 1.85):
            # the heartbeat thread finishes its call first.
            self._heartbeat_thread.join(timeout=15)
        self._channel.close()

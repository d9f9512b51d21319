"""The job's status as the master reports it: typed, on the wire and here.

`MasterServicer.status()` builds it as a dict (the form the launcher writes to
`summary.json` and `keras-elastic status` prints); `GetStatus` sends it as a
`StatusResponse` message (`to_proto`), and `MasterClient.job_status()` gives
a `JobStatus` (`from_proto`), whose `to_dict()` is that dict again.

Example:

>>> status = JobStatus.from_dict({
...     "uptime": 1.5, "master_restarts": 0, "error": None,
...     "workers": {"alive": [0], "lost": 0, "exited": [], "registered": 1},
...     "datasets": {}, "tasks_done": 0, "requeued": 0, "timings": {}})
>>> status.workers.alive, status.error
([0], None)
>>> JobStatus.from_proto(status.to_proto()) == status
True
"""

from __future__ import annotations

import dataclasses
from typing import Any

from keras_elastic.proto import master_pb2

# A ledger entry's fields (one completed task), as `DatasetTasks` records them.
LEDGER_KEYS = ("epoch", "task_id", "worker", "attempt", "lease", "shard", "start",
               "end", "time")


@dataclasses.dataclass(frozen=True)
class DatasetStatus:
    """One dataset of the job: where it is, and its tasks."""

    mode: str
    epoch: int
    num_epochs: int
    tasks_per_epoch: int
    records_per_epoch: int
    records_per_task: int
    todo: int
    doing: int
    done: int
    tasks_done_total: int
    requeued: int
    released: int
    late_reports: int
    rollbacks: int
    finished: bool
    done_task_ids: list[int]
    doing_by_worker: dict[str, int]
    # Rollbacks that reopened the dataset after it had finished.
    reopened_after_finish: int = 0
    # Every completed task (asked for with include_ledger), else None.
    ledger: list[dict] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.ledger is None:
            del data["ledger"]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> DatasetStatus:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})

    def to_proto(self) -> master_pb2.DatasetStatus:
        data = self.to_dict()
        ledger = data.pop("ledger", None) or []
        return master_pb2.DatasetStatus(
            **data, ledger=[master_pb2.LedgerEntry(**e) for e in ledger])

    @classmethod
    def from_proto(cls, m: master_pb2.DatasetStatus,
                   include_ledger: bool = False) -> DatasetStatus:
        ledger = None
        if include_ledger:
            ledger = []
            for e in m.ledger:
                entry = {k: getattr(e, k) for k in LEDGER_KEYS}
                if e.rolled_back:
                    entry["rolled_back"] = True
                ledger.append(entry)
        # Every field by its name (a field added to both is carried without
        # another list to keep in step); repeated and map fields as Python's.
        values = {f.name: getattr(m, f.name) for f in dataclasses.fields(cls)
                  if f.name != "ledger"}
        values.update(done_task_ids=list(m.done_task_ids),
                      doing_by_worker=dict(m.doing_by_worker))
        return cls(**values, ledger=ledger)


@dataclasses.dataclass(frozen=True)
class WorkersStatus:
    alive: list[int]
    lost: int
    exited: list[int]
    registered: int
    lost_ids: list[int] = dataclasses.field(default_factory=list)
    overdue: dict[int, float] = dataclasses.field(default_factory=dict)
    # Milestones each alive worker reported (`MasterClient.set_mark`).
    marks: dict[int, dict[str, int]] = dataclasses.field(default_factory=dict)
    # The servers each alive worker waits on: {worker: {"ps-<i>": seconds its
    # oldest call to it has gone unanswered}} (`WorkerRequest.waiting`).
    waiting: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
    # Of those, the servers their calls could not reach (UNAVAILABLE, retried).
    unreachable: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
    # The servers that answered each alive worker: seconds since the last
    # answer (`WorkerRequest.reached`).
    reached: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
    # The worker that writes the job's outputs (`worker.cluster.is_chief`);
    # None while no worker is alive or done.
    chief: int | None = None

    def mark(self, worker: int, name: str) -> int | None:
        """The value `worker` reported for mark `name`, None if none."""
        return self.marks.get(worker, {}).get(name)

    def to_proto(self) -> master_pb2.WorkersStatus:
        data = dataclasses.asdict(self)
        data["marks"] = {w: master_pb2.WorkerMarks(values=v)
                         for w, v in self.marks.items()}
        for field in ("waiting", "unreachable", "reached"):
            data[field] = {w: master_pb2.WorkerWaits(seconds=v)
                           for w, v in getattr(self, field).items()}
        data["chief"] = -1 if self.chief is None else self.chief
        return master_pb2.WorkersStatus(**data)


@dataclasses.dataclass(frozen=True)
class JobStatus:
    """The job: its workers, its datasets, whether it failed (`error`)."""

    uptime: float
    master_restarts: int
    error: str | None
    workers: WorkersStatus
    datasets: dict[str, DatasetStatus]
    tasks_done: int
    requeued: int
    timings: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["datasets"] = {n: ds.to_dict() for n, ds in self.datasets.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict) -> JobStatus:
        return cls(uptime=data["uptime"], master_restarts=data["master_restarts"],
                   error=data["error"], workers=WorkersStatus(**{
                       **data["workers"], "overdue": {
                           int(w): float(s) for w, s in
                           data["workers"].get("overdue", {}).items()},
                       "marks": {int(w): {k: int(v) for k, v in m.items()} for w, m in
                                 data["workers"].get("marks", {}).items()},
                       **{field: {int(w): {k: float(v) for k, v in m.items()}
                                  for w, m in data["workers"].get(field, {}).items()}
                          for field in ("waiting", "unreachable", "reached")}}),
                   datasets={n: DatasetStatus.from_dict(d)
                             for n, d in data["datasets"].items()},
                   tasks_done=data["tasks_done"], requeued=data["requeued"],
                   timings=dict(data["timings"]))

    def to_proto(self) -> master_pb2.StatusResponse:
        return master_pb2.StatusResponse(
            uptime=self.uptime, master_restarts=self.master_restarts,
            error=self.error or "",
            workers=self.workers.to_proto(),
            datasets={n: ds.to_proto() for n, ds in self.datasets.items()},
            tasks_done=self.tasks_done, requeued=self.requeued, timings=self.timings)

    @classmethod
    def from_proto(cls, m: master_pb2.StatusResponse,
                   include_ledger: bool = False) -> JobStatus:
        w = m.workers
        return cls(uptime=m.uptime, master_restarts=m.master_restarts,
                   error=m.error or None,
                   workers=WorkersStatus(alive=list(w.alive), lost=w.lost,
                                         exited=list(w.exited), registered=w.registered,
                                         lost_ids=list(w.lost_ids),
                                         overdue=dict(w.overdue),
                                         marks={i: dict(m.values)
                                                for i, m in w.marks.items()},
                                         waiting={i: dict(m.seconds)
                                                  for i, m in w.waiting.items()},
                                         unreachable={i: dict(m.seconds) for i, m
                                                      in w.unreachable.items()},
                                         reached={i: dict(m.seconds) for i, m
                                                  in w.reached.items()},
                                         chief=None if w.chief < 0 else w.chief),
                   datasets={n: DatasetStatus.from_proto(d, include_ledger)
                             for n, d in m.datasets.items()},
                   tasks_done=m.tasks_done, requeued=m.requeued,
                   timings=dict(m.timings))

    def training_datasets(self) -> dict[str, DatasetStatus]:
        return {n: ds for n, ds in self.datasets.items() if ds.mode == "training"}

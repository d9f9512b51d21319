"""The job's workers: who is in it, which one is the chief, who went silent.

Plain bookkeeping, no gRPC, no threads and no clock of its own (the caller
passes the monotonic time `now`): `master/servicer.py` calls it under its lock,
journals the changes and requeues a lost worker's tasks; `master/journal.py`
rebuilds it from the journal's worker records (`restore`).

- A worker registers (`join`) and stays *alive* while it is heard from (a
  heartbeat, a task call: `heartbeat`, `touch`); it *exits* when it says so
  (`exit`) and is *lost* when reported dead, replaced by a process
  registering with its id, or silent for longer than the heartbeat timeout
  (`silent`). A lost worker rejoins only by registering again.
- Silence is measured on the monotonic clock, and only while the master ran:
  when the liveness watcher wakes up late (`stall`: the process or its machine
  was frozen), the stall is not counted against the workers (`excuse`).
- The chief (`worker.cluster.is_chief`) is the first worker to register, for
  as long as it is alive or exited; when it is lost, the smallest alive id.
  Held here so that two workers never both act as the chief.
- The start rendezvous (`StartRendezvous`): no task is handed out before the
  job's first workers registered, or a timeout passed.

Example:

>>> members = Membership(max_workers=2, heartbeat_timeout=30.0)
>>> members.join(members.assign_id(0), now=0.0)      # started by the launcher
>>> members.join(members.assign_id(-1), now=0.0)     # `keras-elastic join`
>>> members.alive(), members.chief
([0, 1000], 0)
>>> members.refusal(2)
'the job already has its maximum of 2 workers'
>>> members.heartbeat(1000, now=20.0)
True
>>> members.silent(now=31.0)
[(0, 31.0)]
>>> members.lose(0), members.chief
(True, 1000)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from absl import logging

ALIVE, EXITED, LOST = "alive", "exited", "lost"
# The ids the master gives workers that register without one (`keras-elastic
# join`) count from here, apart from those the launcher gives the workers it
# starts (from 0): the two never meet. (They did: a launched worker
# relaunched as worker 1 met a joined worker 1 the job had lost, and the
# launcher killed its new worker as lost, twice, and failed the job.)
JOINED_IDS_FROM = 1000


@dataclasses.dataclass
class WorkerRecord:
    """What the master knows of one worker."""

    state: str  # ALIVE, EXITED or LOST
    last_seen: float  # monotonic time it was last heard from
    joined: float = 0.0  # wall-clock time it registered (0: not known)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    # Milestones it reached (name -> value, only going up), for others to wait on.
    marks: dict[str, int] = dataclasses.field(default_factory=dict)
    # The servers its calls wait on, and those it cannot reach (seconds).
    waiting: dict[str, float] = dataclasses.field(default_factory=dict)
    unreachable: dict[str, float] = dataclasses.field(default_factory=dict)
    # The servers that answered it: seconds since the last answer.
    reached: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.state == ALIVE


class Membership:
    """The job's workers (`workers`: id -> `WorkerRecord`), the chief, the
    count of workers lost, and which workers are overdue with a task."""

    def __init__(self, max_workers: int = 0, heartbeat_timeout: float = 30.0) -> None:
        self.max_workers = max_workers
        self.heartbeat_timeout = heartbeat_timeout
        self.workers: dict[int, WorkerRecord] = {}
        self.next_id = 0  # above every id seen
        self.lost = 0  # workers lost, ever
        self.chief: int | None = None
        # {worker: the limit (seconds) its hold of a task passed}: set by the
        # liveness check, shown in the status (the launcher decides).
        self.overdue: dict[int, float] = {}
        self._last_tick: float | None = None  # the liveness watcher's last check

    # -- who is in the job ------------------------------------------------
    def alive(self) -> list[int]:
        """The alive workers' ids, in the order they registered."""
        return [w for w, record in self.workers.items() if record.alive]

    def is_alive(self, worker_id: int) -> bool:
        record = self.workers.get(worker_id)
        return record is not None and record.alive

    def sizing_workers(self) -> int:
        """The workers an epoch's tasks are cut for: the job's maximum, or,
        without one, the workers alive now (at least one)."""
        return self.max_workers or max(1, len(self.alive()))

    # -- changes ------------------------------------------------------------
    def assign_id(self, requested: int) -> int:
        """The id of a worker registering with `requested` (< 0: the next
        free one from JOINED_IDS_FROM, above every such id the job has
        seen)."""
        worker_id = requested
        if worker_id < 0:
            worker_id = max([JOINED_IDS_FROM - 1, self.next_id - 1, *self.workers]) + 1
        self.next_id = max(self.next_id, worker_id + 1)
        return worker_id

    def refusal(self, worker_id: int) -> str:
        """Why worker `worker_id` may not join now ("" if it may)."""
        alive = self.alive()
        if self.max_workers and worker_id not in alive and len(alive) >= self.max_workers:
            return f"the job already has its maximum of {self.max_workers} workers"
        return ""

    def join(self, worker_id: int, now: float, joined: float = 0.0) -> None:
        """Worker `worker_id` is alive from `now` on, with a fresh record (a
        caller replacing an alive one loses it first: `lose`)."""
        self.workers[worker_id] = WorkerRecord(ALIVE, last_seen=now, joined=joined)
        self.elect_chief()

    def heartbeat(self, worker_id: int, now: float,
                  timings: Mapping[str, float] | None = None,
                  marks: Mapping[str, int] | None = None,
                  waits: tuple[Mapping[str, float], ...] | None = None
                  ) -> bool:
        """Worker `worker_id` was heard at `now`; its timings (if given)
        replace the last, its marks only go up, and `waits` (waiting,
        unreachable[, reached]), a periodic heartbeat's, replace the last. False if it
        is not alive (not part of the job)."""
        record = self.workers.get(worker_id)
        if record is None or not record.alive:
            return False
        record.last_seen = now
        if timings:
            record.timings = dict(timings)
        for name, value in (marks or {}).items():
            record.marks[name] = max(value, record.marks.get(name, value))
        if waits is not None:
            record.waiting, record.unreachable = dict(waits[0]), dict(waits[1])
            record.reached = dict(waits[2]) if len(waits) > 2 else {}
        return True

    def touch(self, worker_id: int, now: float) -> None:
        """Worker `worker_id` (if alive) was heard from at `now`."""
        record = self.workers.get(worker_id)
        if record is not None and record.alive:
            record.last_seen = now

    def exit(self, worker_id: int, timings: Mapping[str, float] | None = None) -> bool:
        """Worker `worker_id` exited (it stays the chief if it was); False if it
        was not alive."""
        record = self.workers.get(worker_id)
        if record is None or not record.alive:
            return False
        if timings:
            record.timings = dict(timings)
        record.state = EXITED
        return True

    def lose(self, worker_id: int) -> bool:
        """Worker `worker_id` is lost (a new chief if it was the chief);
        False if it was not alive."""
        record = self.workers.get(worker_id)
        if record is None or not record.alive:
            return False
        record.state = LOST
        self.lost += 1
        self.elect_chief()
        return True

    def restore(self, worker_id: int, state: str, now: float, joined: float = 0.0) -> None:
        """Replays a journaled change of worker `worker_id` to `state`."""
        self.next_id = max(self.next_id, worker_id + 1)
        if state == ALIVE:
            self.workers[worker_id] = WorkerRecord(ALIVE, last_seen=now, joined=joined)
        elif worker_id in self.workers:
            record = self.workers[worker_id]
            if state == LOST and record.alive:
                self.lost += 1
            record.state = state
        self.elect_chief()

    def elect_chief(self) -> None:
        """Keeps the chief while it is alive or exited; else the smallest
        alive worker (None while there is none)."""
        chief = self.workers.get(self.chief) if self.chief is not None else None
        if chief is None or chief.state == LOST:
            alive = self.alive()
            self.chief = min(alive) if alive else None

    # -- liveness -----------------------------------------------------------
    def stall(self, now: float, interval: float) -> float:
        """The liveness watcher's tick at `now`, it running every `interval`
        seconds: how long it woke up late, if that was a stall of the master
        (more than 5 s or a quarter of the heartbeat timeout), else 0."""
        last_tick, self._last_tick = self._last_tick or now, now
        stalled = now - last_tick - interval
        return stalled if stalled > min(5.0, self.heartbeat_timeout / 4) else 0.0

    def excuse(self, seconds: float) -> None:
        """The master stalled for `seconds`: no worker could be heard then."""
        for worker_id in self.alive():
            self.workers[worker_id].last_seen += seconds

    def silent(self, now: float) -> list[tuple[int, float]]:
        """(id, seconds silent) of the alive workers not heard from for longer
        than the heartbeat timeout at `now`."""
        found = []
        for worker_id in self.alive():
            silent = now - self.workers[worker_id].last_seen
            if silent > self.heartbeat_timeout:
                found.append((worker_id, silent))
        return found

    def heard_all(self, now: float) -> None:
        """Every alive worker counts as heard at `now` (a restarted master:
        their heartbeats resume once they reconnect)."""
        for worker_id in self.alive():
            self.workers[worker_id].last_seen = now

    # -- status -------------------------------------------------------------
    def timings(self) -> dict[str, float]:
        """Seconds per phase, summed over the workers' last timings."""
        total: dict[str, float] = {}
        for record in self.workers.values():
            for phase, seconds in record.timings.items():
                total[phase] = total.get(phase, 0.0) + seconds
        return total

    def status(self) -> dict:
        """The "workers" part of the job's status (`master/status.py`)."""
        alive = self.alive()
        records = self.workers
        return {
            "alive": sorted(alive),
            "lost": self.lost,
            "lost_ids": sorted(w for w, r in records.items() if r.state == LOST),
            "overdue": {w: limit for w, limit in self.overdue.items() if w in alive},
            "marks": {w: dict(records[w].marks) for w in alive if records[w].marks},
            "waiting": {w: dict(records[w].waiting) for w in alive
                        if records[w].waiting},
            "unreachable": {w: dict(records[w].unreachable) for w in alive
                            if records[w].unreachable},
            "reached": {w: dict(records[w].reached) for w in alive
                        if records[w].reached},
            "exited": sorted(w for w, r in records.items() if r.state == EXITED),
            "registered": len(records),
            "chief": self.chief,
        }


class StartRendezvous:
    """No task is handed out before `min_workers` workers registered (ever: a
    replay of the journal counts them too), the job already made progress, or
    `timeout` seconds passed since the master started at monotonic time
    `started`; once met, for good. So the workers a job starts with all train
    from its first task (as Keras' multi-worker training and torch elastic's
    rendezvous start together), rather than one worker running through a
    small first epoch before a slower-starting one joins.

    >>> rendezvous = StartRendezvous(min_workers=2, timeout=60.0, started=0.0)
    >>> rendezvous.ready(registered=1, progressed=lambda: False, now=10.0)
    False
    >>> rendezvous.ready(registered=2, progressed=lambda: False, now=11.0)
    True
    """

    def __init__(self, min_workers: int, timeout: float, started: float) -> None:
        self.min_workers = min_workers
        self.timeout = timeout
        self.started = started
        self.met = min_workers <= 1

    def ready(self, registered: int, progressed: Callable[[], bool], now: float) -> bool:
        """Whether tasks may be handed out at `now`, `registered` workers having
        registered; `progressed()` says whether the job made progress."""
        if not self.met:
            waited = now - self.started
            if registered >= self.min_workers or progressed() or waited >= self.timeout:
                self.met = True
                logging.info("start rendezvous: %d of %d workers registered after "
                             "%.1f s; handing out tasks", registered, self.min_workers,
                             waited)
        return self.met

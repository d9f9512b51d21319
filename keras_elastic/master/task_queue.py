"""Tasks of one dataset: cut, handed out per epoch, requeued, accounted.

Pure bookkeeping, no gRPC and no threads: `master/servicer.py` calls it under
its lock. The rules:

- A task is a record range `[start, end)` of one shard. Every epoch has the
  same tasks (same ids), unless epochs are windows (below); with `shuffle`
  their order changes per epoch.
- Windowed epochs (`records_per_epoch` R > 0, for `steps_per_epoch`), as
  Keras takes arrays with `steps_per_epoch`: epochs continue through the
  dataset's records taken in shard order, R records each, and an epoch that
  reaches the end of the records ends there (shorter); the next one starts
  over from the first record. So with R at least the dataset's size every
  epoch is the whole dataset. Each window is cut into tasks from its start (a
  task never crosses a shard). The tasks of an epoch (and their ids, 0, 1, ... in
  window order) depend on the spec and the epoch only, so `tasks` is the
  current epoch's list and done task ids are per epoch, as before.
- Task size: `records_per_task`, or, when the workers let the master choose
  (`auto`), `auto_records_per_task`: at least `TASKS_PER_WORKER` tasks per
  worker, 1 to `MAX_MINIBATCHES_PER_TASK` minibatches per task.
- Epoch barrier: a worker asks for tasks of epoch `e`. While `e` has tasks to
  hand out it gets one. When none are left, the worker's stream for `e` ends
  (END_OF_EPOCH) once every task still in flight belongs to a worker that is
  itself waiting for more: nothing new can come in `e` except requeues, and
  the held tasks only finish when their workers' streams end. Otherwise the
  worker waits, so a task requeued from a lost worker goes to a worker still in
  `e`. Epoch `e` is complete when all of its tasks are done; only then do tasks
  of `e + 1` exist.
- A task is done once; a report from a worker that no longer owns it (it was
  presumed lost and the task went elsewhere) is ignored and counted.
- A task that fails `max_task_retries` times fails the job with an error naming
  the task, its shard, its records and the last cause. A worker may also give a
  task back (*release* it: not a failure), and it is handed out again.
- Every hand-out carries a *lease*, larger than every lease before it (the
  servicer's clock): the parameter servers accept pushes for a task only from
  its newest lease (see `ps/task_log.py`).
- Rollback: when the parameter servers go back to a checkpoint, the dataset
  goes back to that checkpoint's progress; the completions after it are marked
  `rolled_back` in the ledger, and their tasks are handed out again.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import random
import time
from collections import deque
from collections.abc import Iterable, Sequence

import numpy as np
from absl import logging


@dataclasses.dataclass(frozen=True)
class Task:
    task_id: int
    shard: str
    start: int
    end: int

    @property
    def num_records(self) -> int:
        return self.end - self.start

    def describe(self) -> str:
        return f"task {self.task_id} ({self.shard} records [{self.start}, {self.end}))"


# Automatic task size: at least this many tasks per worker in an epoch, so a
# worker that finishes early finds work and a lost worker's share is small...
TASKS_PER_WORKER = 4
# ... but never more than this many minibatches per task (nor less than one).
MAX_MINIBATCHES_PER_TASK = 32


@dataclasses.dataclass
class DatasetSpec:
    """What a worker registers: identical on every worker of a job.

    `auto`: the workers let the master choose `records_per_task` (a multiple
    of `batch_size`); in a worker's registration `records_per_task` is then 0
    and the job's value applies. `records_per_epoch` > 0: windowed epochs
    (see the module's docstring). `fingerprints`: `(path, hash)` of each
    in-memory array, empty for files. `call`: the user's call that
    registered it, quoted by mismatch errors; never compared.
    """

    name: str
    mode: str
    shards: tuple[tuple[str, int], ...]
    records_per_task: int
    num_epochs: int  # 0: unbounded
    shuffle: bool = False
    seed: int = 0
    after: str = ""  # round e waits for epoch e of this dataset
    batch_size: int = 0  # 0: not given (then never compared)
    auto: bool = False
    records_per_epoch: int = 0  # 0: the whole dataset
    fingerprints: tuple[tuple[str, int], ...] = ()
    call: str = ""
    model: str = ""  # the model as compiled ("" : not said, never compared)

    @classmethod
    def from_json(cls, record: dict) -> DatasetSpec:
        """The spec `dataclasses.asdict` wrote into the journal."""
        record = dict(record)
        record["shards"] = tuple(tuple(s) for s in record["shards"])
        record["fingerprints"] = tuple(tuple(f) for f in record.get("fingerprints", ()))
        return cls(**record)

    @property
    def num_records(self) -> int:
        """Records of the whole dataset."""
        return sum(n for _, n in self.shards)

    def mismatch(self, other: DatasetSpec) -> str | None:
        """Describes how `other` (a worker's registration) differs from this
        spec (the job's), or None.

        Example:

        >>> job = DatasetSpec("train", "training", (("a", 10),), 4, 3)
        >>> job.mismatch(DatasetSpec("train", "training", (("a", 10),), 4, 5))
        'num_epochs is 5 on this worker but 3 in the job'
        """
        found = self._difference(other)
        return found[1] if found else None

    def mismatch_error(self, other: DatasetSpec, worker_id: int) -> str | None:
        """The error for a worker whose registration `other` differs from this
        spec: the difference, both calls (when described) and what to do; None
        if they agree."""
        found = self._difference(other)
        if found is None:
            return None
        field, diff = found
        text = (f"dataset '{self.name}' of worker {worker_id} differs from the one "
                f"registered in the job: {diff}.")
        if self.call or other.call:
            text += (f" The job's dataset was registered by "
                     f"{self.call or '(a call not described)'}; worker {worker_id} "
                     f"called {other.call or '(a call not described)'}.")
        if field == "model":
            return text + (
                " Every worker must compile the model the same way (optimizer, loss, "
                "metrics) and set the same layers trainable before each call.")
        if field == "fingerprints":
            return text + (
                " The arrays must be built the same way on every worker: seed the "
                "randomness that makes or shuffles them (e.g. "
                "np.random.default_rng(0)), or load them from the same files.")
        return text + (
            " Every worker must build the same ElasticDataset (same data, batch_size, "
            "minibatches_per_task, epochs, steps per epoch, shuffle and seed).")

    def _difference(self, other: DatasetSpec) -> tuple[str, str] | None:
        """`(field, description)` of the first difference, or None."""
        fields = ["mode", "batch_size", "records_per_task", "records_per_epoch",
                  "num_epochs", "shuffle", "seed", "after"]
        for field in fields:
            mine, theirs = getattr(self, field), getattr(other, field)
            if field == "batch_size" and not (mine and theirs):
                continue  # a client that does not say
            if field == "records_per_task" and other.auto:
                continue  # the worker takes the job's
            if mine != theirs:
                hint = (" (the master chose the job's: leave minibatches_per_task=None "
                        "on every worker)" if field == "records_per_task" and self.auto
                        else "")
                return field, (f"{field} is {theirs!r} on this worker but {mine!r} in "
                               f"the job{hint}")
        if self.model and other.model and self.model != other.model:
            return "model", (f"the model is {other.model} on this worker but "
                             f"{self.model} in the job")
        if self.shards != other.shards:
            mine = dict(self.shards)
            for shard, n in other.shards:
                if mine.get(shard) != n:
                    return "shards", (f"shard {shard} has {n} records on this worker "
                                      f"but {mine.get(shard)} in the job")
            return "shards", (f"the job's dataset has {len(self.shards)} shards, this "
                              f"worker's {len(other.shards)}")
        if self.fingerprints and other.fingerprints:
            mine = dict(self.fingerprints)
            theirs = dict(other.fingerprints)
            for path, value in other.fingerprints:
                if path not in mine:
                    return "fingerprints", (
                        f"this worker's data has an array `{path}` that the job's has "
                        f"not (the job's arrays: {', '.join(mine)})")
                if mine[path] != value:
                    return "fingerprints", (
                        f"the array `{path}` holds other values on this worker than "
                        f"in the job (content fingerprint {value:016x} here, "
                        f"{mine[path]:016x} in the job)")
            missing = [p for p in mine if p not in theirs]
            if missing:
                return "fingerprints", (
                    f"the job's data has array(s) {', '.join(f'`{p}`' for p in missing)}"
                    " that this worker's has not")
        return None


def count_tasks(shards: tuple[tuple[str, int], ...], records_per_task: int,
                records_per_epoch: int = 0) -> int:
    """Tasks in an epoch with tasks of `records_per_task` records (for a
    window of `records_per_epoch` records: the fewest, without the extra task
    a window crossing into another shard makes).

    Example:

    >>> count_tasks((("a", 100), ("b", 30)), 32)
    5
    """
    if records_per_epoch:
        return -(-records_per_epoch // records_per_task)
    return sum(-(-n // records_per_task) for _, n in shards)


def auto_records_per_task(shards: tuple[tuple[str, int], ...], batch_size: int,
                          num_workers: int, records_per_epoch: int = 0) -> int:
    """The task size the master chooses: the largest multiple of `batch_size`,
    from 1 to `MAX_MINIBATCHES_PER_TASK` minibatches (and no more than the
    largest shard or the window holds), that still cuts an epoch into
    `TASKS_PER_WORKER` tasks per worker (one minibatch if none does).

    Example:

    >>> auto_records_per_task((("a", 60000),), 128, num_workers=1)  # 32 batches
    4096
    >>> auto_records_per_task((("a", 60000),), 128, num_workers=8)  # 32 tasks
    1920
    >>> auto_records_per_task((("a", 10),), 32, num_workers=2)      # tiny
    32
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    wanted = TASKS_PER_WORKER * max(1, num_workers)
    # A task larger than the largest shard (or the window) has no more records.
    longest = records_per_epoch or max((n for _, n in shards), default=0)
    most = max(1, min(MAX_MINIBATCHES_PER_TASK, -(-longest // batch_size)))
    for minibatches in range(most, 0, -1):
        size = minibatches * batch_size
        if count_tasks(shards, size, records_per_epoch) >= wanted:
            return size
    return batch_size


def sizing_warning(spec: DatasetSpec, num_workers: int) -> str:
    """A warning when an epoch of `spec` has fewer tasks than `num_workers`
    (some workers would idle), saying what to set; "" if it has enough.

    Example:

    >>> spec = DatasetSpec("train", "training", (("a", 1000),), 512, 1,
    ...                    batch_size=16)
    >>> sizing_warning(spec, 4)[:60]
    "dataset 'train': minibatches_per_task=32 (512 records per ta"
    """
    records = spec.records_per_epoch or spec.num_records
    tasks = count_tasks(spec.shards, spec.records_per_task, spec.records_per_epoch)
    if tasks >= num_workers or not records:
        return ""
    batch = spec.batch_size
    if spec.auto or (batch and spec.records_per_task <= batch):
        return (f"dataset '{spec.name}': an epoch of {records} records is only {tasks} "
                f"task(s) of one minibatch (batch_size={batch}) for up to "
                f"{num_workers} workers: some workers will idle. Use a smaller "
                "batch_size or fewer workers (--max_workers).")
    if batch:
        given = (f"minibatches_per_task={spec.records_per_task // batch} "
                 f"({spec.records_per_task} records per task)")
        auto = auto_records_per_task(spec.shards, batch, num_workers,
                                     spec.records_per_epoch)
        fitting = [m for m in range(1, spec.records_per_task // batch)
                   if count_tasks(spec.shards, m * batch,
                                  spec.records_per_epoch) >= num_workers]
        fix = ("ElasticDataset(minibatches_per_task=None) (the default) to let the "
               f"master choose ({auto // batch} here)")
        if fitting:
            fix += f", or minibatches_per_task={fitting[-1]} at most"
    else:
        given = f"records_per_task={spec.records_per_task}"
        fix = "a smaller task size"
    return (f"dataset '{spec.name}': {given} cuts an epoch of {records} records into "
            f"{tasks} task(s), fewer than the job's {num_workers} workers: some "
            f"workers will idle. Set {fix}.")


def resumed_task_size(name: str, num_done: int, resumed: int, records_per_task: int,
                      batch_size: int) -> int:
    """The task size a resume of dataset `name` with `num_done` done tasks must
    keep (0: any), its checkpoint saying `resumed` records per task (0: not
    said) and this run asking for `records_per_task` (0: the master chooses):
    the done tasks' ids name record ranges of that size. Raises ValueError when
    this run asks for another size.

    >>> resumed_task_size("train", num_done=3, resumed=64, records_per_task=0,
    ...                   batch_size=16)
    64
    """
    if not num_done:
        return 0
    size = resumed
    if not size and records_per_task == 0:
        # A checkpoint from before automatic sizing: the default then was
        # 32 minibatches per task.
        size = MAX_MINIBATCHES_PER_TASK * batch_size
        logging.warning(
            "dataset '%s' resumes with %d task(s) done but its checkpoint does not "
            "say their size: assuming %d records per task (32 minibatches, the "
            "default when it was saved)", name, num_done, size)
    if size and records_per_task and records_per_task != size:
        raise ValueError(
            f"dataset '{name}' resumes a checkpoint whose done tasks "
            f"were cut with {size} records per task, but this run asks for "
            f"{records_per_task}: the done task ids would name other "
            "records. Resume with the checkpoint's minibatches_per_task (or None, "
            "which takes the checkpoint's).")
    return size


def size_tasks(spec: DatasetSpec, num_workers: int, resumed: int = 0) -> DatasetSpec:
    """`spec` with its task size chosen, when its workers let the master choose
    (`auto`): a resumed checkpoint's size (`resumed`, see `resumed_task_size`)
    or `auto_records_per_task` for `num_workers`; else `spec` as it is."""
    if not spec.auto:
        return spec
    return dataclasses.replace(spec, records_per_task=resumed or auto_records_per_task(
        spec.shards, spec.batch_size, num_workers, spec.records_per_epoch))


def cut_tasks(shards: tuple[tuple[str, int], ...], records_per_task: int) -> list[Task]:
    """Cuts every shard into ranges of `records_per_task` records."""
    if records_per_task <= 0:
        raise ValueError(f"records_per_task must be positive, got {records_per_task}")
    tasks = []
    for shard, n in shards:
        for start in range(0, n, records_per_task):
            tasks.append(Task(len(tasks), shard, start, min(start + records_per_task, n)))
    return tasks


def window_tasks(shards: tuple[tuple[str, int], ...], records_per_task: int,
                 records_per_epoch: int, epoch: int) -> list[Task]:
    """The tasks of epoch `epoch` of a windowed dataset (R =
    `records_per_epoch`): the records in shard order taken R at a time, the
    window that reaches their end cut there, the one after starting over
    (Keras' `steps_per_epoch` on arrays), cut into tasks of
    `records_per_task` from the window's start; a task never crosses a
    shard. Ids are 0, 1, ... in window order.

    Example (10 records, windows of 6: epochs cover 0-5, 6-9, 0-5, ...):

    >>> [(t.shard, t.start, t.end) for t in window_tasks(
    ...     (("a", 5), ("b", 5)), 4, 6, epoch=1)]
    [('b', 1, 5)]
    >>> [(t.shard, t.start, t.end) for t in window_tasks(
    ...     (("a", 5), ("b", 5)), 4, 6, epoch=2)]
    [('a', 0, 4), ('a', 4, 5), ('b', 0, 1)]
    """
    if records_per_task <= 0:
        raise ValueError(f"records_per_task must be positive, got {records_per_task}")
    if records_per_epoch <= 0:
        raise ValueError(f"records_per_epoch must be positive, got {records_per_epoch}")
    filled = [(shard, n) for shard, n in shards if n > 0]
    total = sum(n for _, n in filled)
    if not total:
        return []
    starts = [0, *itertools.accumulate(n for _, n in filled)][:-1]
    windows = -(-total // records_per_epoch)  # per pass over the records
    position = epoch % windows * records_per_epoch
    left = min(records_per_epoch, total - position)
    tasks: list[Task] = []
    while left > 0:
        i = bisect.bisect_right(starts, position) - 1
        shard, n = filled[i]
        offset = position - starts[i]
        size = min(records_per_task, left, n - offset)
        tasks.append(Task(len(tasks), shard, offset, offset + size))
        left -= size
        position = (position + size) % total
    return tasks


# Decisions of `next_task` other than a task.
WAIT = "wait"
END_OF_EPOCH = "end_of_epoch"


@dataclasses.dataclass
class _InFlight:
    task: Task
    epoch: int
    worker: int
    attempt: int
    lease: int = 0
    given_at: float = 0.0  # time.monotonic() of the hand-out (0: unknown)


# A worker holding a task for longer than this many times the dataset's mean
# task duration (and twice its longest), and never less than the caller's
# floor, makes no progress (ElasticDL requeued tasks past 3x the mean).
STUCK_FACTOR = 4.0
# Completed tasks a dataset needs before its durations are a yardstick.
STUCK_MIN_SAMPLES = 4


def task_timeout(durations: Sequence[float], floor: float) -> float | None:
    """How long a task of a dataset whose completed tasks took `durations`
    (seconds, hand-out to report) may be held before its worker counts as
    making no progress; None while there are too few completions to judge.

    >>> task_timeout([1.0, 1.2, 0.8], floor=30)   # too few yet
    >>> task_timeout([1.0, 1.2, 0.8, 1.0], floor=30)
    30
    >>> task_timeout([20.0, 10.0, 12.0, 14.0], floor=30)
    56.0
    """
    if len(durations) < STUCK_MIN_SAMPLES:
        return None
    mean = sum(durations) / len(durations)
    return max(floor, STUCK_FACTOR * mean, 2 * max(durations))


class _Counter:
    """Leases when nobody gives a lease source: 1, 2, 3..."""

    def __init__(self) -> None:
        self.last = 0

    def __call__(self) -> int:
        self.last += 1
        return self.last


class LeaseClock:
    """The master's leases: they grow with time (microseconds), so a
    restarted master never hands out a lease below one that parameter
    servers have seen (`observe` the leases a journal names)."""

    def __init__(self) -> None:
        self.last = 0

    def next(self) -> int:
        self.last = max(self.last + 1, time.time_ns() // 1000)
        return self.last

    def observe(self, lease: int) -> None:
        self.last = max(self.last, lease)


# The fields of a ledger entry (one completed task), in journal-row order.
LEDGER_FIELDS = ("epoch", "task_id", "worker", "attempt", "lease", "shard", "start",
                 "end", "time")


class DatasetTasks:
    """State of one registered dataset."""

    def __init__(self, spec: DatasetSpec, max_task_retries: int = 3,
                 next_lease=None) -> None:
        self.spec = spec
        self._next_lease = next_lease or _Counter()
        if spec.records_per_epoch < 0:
            raise ValueError(f"dataset '{spec.name}': records_per_epoch must be >= 0, "
                             f"got {spec.records_per_epoch}")
        # Every epoch's tasks, unless epochs are windows (`tasks_of`).
        self._all_tasks = cut_tasks(spec.shards, spec.records_per_task)
        if not self._all_tasks:
            raise ValueError(f"dataset '{spec.name}' has no records")
        self.tasks: list[Task] = self._all_tasks  # the current epoch's
        self.warning = ""  # the task-size warning workers get with registration
        self.max_task_retries = max_task_retries
        self.epoch = 0
        self.todo: deque[tuple[Task, int]] = deque()  # (task, attempt)
        self.doing: dict[int, _InFlight] = {}  # task_id -> in flight (current epoch)
        self.done: set[int] = set()
        self.failures: dict[tuple[int, int], int] = {}  # (epoch, task_id) -> failures
        # Seconds from hand-out to report of the last completed tasks.
        self.durations: deque[float] = deque(maxlen=200)
        self.ledger: list[dict] = []  # one entry per completed task
        self.requeued = 0
        self.released = 0
        self.late_reports = 0
        self.rollbacks = 0
        # Rollbacks that reopened the dataset once it had finished.
        self.reopened_after_finish = 0
        self.error: str | None = None
        # Where the dataset started (a resume point): a rollback to the initial
        # model goes back there.
        self.initial_progress: tuple[int, frozenset[int]] = (0, frozenset())
        # Evaluation: per epoch (round), the element-wise sum of the metric
        # states reported with its tasks, and how many tasks reported.
        self.sums: dict[int, dict[str, np.ndarray]] = {}
        self.results: dict[int, tuple[int, dict[str, np.ndarray]]] = {}
        self._start_epoch(0)

    # -- epochs -----------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.spec.num_epochs > 0 and self.epoch >= self.spec.num_epochs

    def tasks_of(self, epoch: int) -> list[Task]:
        """The tasks of `epoch` (ids index this list)."""
        if not self.spec.records_per_epoch:
            return self._all_tasks
        if epoch == self.epoch and self.tasks is not self._all_tasks:
            return self.tasks
        return window_tasks(self.spec.shards, self.spec.records_per_task,
                            self.spec.records_per_epoch, epoch)

    def _start_epoch(self, epoch: int) -> None:
        self.tasks = self.tasks_of(epoch)
        self.epoch = epoch
        self.done = set()
        self.doing = {}
        order = list(self.tasks)
        if self.spec.shuffle:
            random.Random(self.spec.seed * 1_000_003 + epoch).shuffle(order)
        self.todo = deque() if self.finished else deque((t, 0) for t in order)

    def _maybe_complete_epoch(self) -> bool:
        if not self.finished and not self.todo and not self.doing:
            self.results[self.epoch] = (len(self.done), self.sums.pop(self.epoch, {}))
            self._start_epoch(self.epoch + 1)
            return True
        return False

    @property
    def untouched(self) -> bool:
        """No task of the current epoch was handed out yet."""
        return not self.doing and not self.done and len(self.todo) == len(self.tasks)

    def skip_to(self, epoch: int) -> None:
        """Evaluation rounds need not be consecutive (validation_freq)."""
        if epoch > self.epoch and self.untouched:
            self._start_epoch(epoch)

    def restore_progress(self, epoch: int, done_task_ids: set[int]) -> None:
        """Starts at `epoch` with `done_task_ids` already done (resume)."""
        self.initial_progress = (epoch, frozenset(done_task_ids))
        self._set_progress(epoch, done_task_ids)

    def _set_progress(self, epoch: int, done_task_ids: set[int]) -> None:
        self._start_epoch(epoch)
        self.done = set(done_task_ids)
        self.todo = deque((t, a) for t, a in self.todo if t.task_id not in self.done)
        self._maybe_complete_epoch()

    def rollback(self, epoch: int | None = None,
                 done_task_ids: set[int] | None = None) -> int:
        """Goes back to `epoch` with `done_task_ids` done (None: where the
        dataset started). Tasks in flight are handed out again (with new
        leases); completions after that point are marked rolled back. Returns
        how many completions were undone."""
        if epoch is None:
            epoch, done_task_ids = self.initial_progress
        done_task_ids = set(done_task_ids or ())
        was_finished = self.finished
        attempts = {t: f.attempt + 1 for t, f in self.doing.items()}
        undone = 0
        for entry in self.ledger:
            if entry.get("rolled_back"):
                continue
            if entry["epoch"] > epoch or (entry["epoch"] == epoch
                                          and entry["task_id"] not in done_task_ids):
                entry["rolled_back"] = True
                undone += 1
        self.results = {e: r for e, r in self.results.items() if e < epoch}
        self.sums = {e: r for e, r in self.sums.items() if e < epoch}
        self._set_progress(epoch, done_task_ids)
        self.todo = deque((t, max(a, attempts.get(t.task_id, 0))) for t, a in self.todo)
        self.rollbacks += 1
        if was_finished and not self.finished:
            self.reopened_after_finish += 1
        return undone

    # -- handing out ------------------------------------------------------
    def next_task(self, worker: int, epoch: int, waiting: dict[int, int]
                  ) -> tuple[Task, int, int] | str:
        """Returns `(task, epoch, attempt)`, WAIT or END_OF_EPOCH.

        `waiting` maps the workers now blocked in a request for this dataset to
        the epoch they ask for (the caller maintains it).
        """
        if epoch < self.epoch or self.finished:
            return END_OF_EPOCH
        if epoch > self.epoch and self.spec.num_epochs == 0:
            self.skip_to(epoch)
        if epoch > self.epoch:
            # The worker's stream for the current epoch ended early and the epoch
            # is not complete: it may only take requeued tasks of that epoch.
            if self.todo:
                return self._hand_out(worker)
            return WAIT
        if self.todo:
            return self._hand_out(worker)
        if not self.doing:
            # Cannot happen with the completion check on report; be safe.
            self._maybe_complete_epoch()
            return END_OF_EPOCH
        holders = {f.worker for f in self.doing.values()}
        if all(w == worker or waiting.get(w) == self.epoch for w in holders):
            return END_OF_EPOCH
        return WAIT

    def _hand_out(self, worker: int) -> tuple[Task, int, int]:
        task, attempt = self.todo.popleft()
        self.doing[task.task_id] = _InFlight(task, self.epoch, worker, attempt,
                                             self._next_lease(), time.monotonic())
        return task, self.epoch, attempt

    def lease_of(self, task_id: int) -> int:
        """The lease of a task in flight."""
        return self.doing[task_id].lease

    # -- reports ----------------------------------------------------------
    def not_held(self, worker: int, task_ids: list[int],
                 leases: list[int] | None = None) -> list[int]:
        """The tasks of `task_ids` that `worker` does not hold (with that
        lease, where `leases` gives one)."""
        leases = list(leases or ()) or [0] * len(task_ids)
        refused = []
        for task_id, lease in zip(task_ids, leases):
            flight = self.doing.get(task_id)
            if flight is None or flight.worker != worker or (lease and
                                                             flight.lease != lease):
                refused.append(task_id)
        return refused

    def describe_not_held(self, worker: int, task_ids: list[int]) -> str:
        parts = []
        for task_id in task_ids:
            flight = self.doing.get(task_id)
            if task_id < 0 or task_id >= len(self.tasks):
                why = "no such task"
            elif task_id in self.done:
                why = "already done"
            elif flight is None:
                why = "not handed out (requeued)"
            elif flight.worker != worker:
                why = f"held by worker {flight.worker}"
            else:
                why = "handed out to it again since (another lease)"
            parts.append(f"task {task_id}: {why}")
        return (f"worker {worker} does not hold these tasks of dataset "
                f"'{self.spec.name}' (epoch {self.epoch}): {'; '.join(parts)}; "
                "nothing was recorded")

    def ledger_rows(self, count: int) -> list[list]:
        """The last `count` ledger entries as rows of `LEDGER_FIELDS` (compact
        journal records)."""
        return [[e[f] for f in LEDGER_FIELDS] for e in self.ledger[-count:]]

    def report_done(self, worker: int, task_ids: list[int],
                    states: dict[str, np.ndarray] | None = None) -> list[int]:
        """Marks tasks done; returns those accepted (owned by `worker`).

        `states` (evaluation) are the metric states of these tasks: added to the
        epoch's sums only if the report is accepted, so a task counts once.
        """
        accepted = []
        for task_id in task_ids:
            flight = self.doing.get(task_id)
            if flight is None or flight.worker != worker:
                self.late_reports += 1
                continue
            del self.doing[task_id]
            self.done.add(task_id)
            if flight.given_at:
                self.durations.append(max(0.0, time.monotonic() - flight.given_at))
            self.ledger.append({
                "epoch": flight.epoch, "task_id": task_id, "worker": worker,
                "attempt": flight.attempt, "lease": flight.lease,
                "shard": flight.task.shard, "start": flight.task.start,
                "end": flight.task.end, "time": round(time.time(), 3)})
            accepted.append(task_id)
        if accepted and states:
            sums = self.sums.setdefault(self.epoch, {})
            for name, value in states.items():
                sums[name] = sums[name] + value if name in sums else value.copy()
        self._maybe_complete_epoch()
        return accepted

    # -- journal replay (a restarted master) -------------------------------
    def replay_done(self, entries: list[dict],
                    states: dict[str, np.ndarray] | None = None) -> None:
        """Re-applies a journaled report: the tasks of `entries` (ledger
        entries) were done, with `states` (evaluation) summed once. The
        tasks to do are filtered once, by `finish_replay` (a journal holds
        one record per report: filtering per record would be quadratic)."""
        for entry in entries:
            epoch, task_id = int(entry["epoch"]), int(entry["task_id"])
            if epoch > self.epoch:
                self.skip_to(epoch)  # evaluation rounds need not be consecutive
            if epoch != self.epoch:
                raise ValueError(f"a completion of task {task_id} in epoch {epoch} "
                                 f"while dataset '{self.spec.name}' is at epoch "
                                 f"{self.epoch}")
            if not 0 <= task_id < len(self.tasks) or task_id in self.done:
                raise ValueError(f"a completion of task {task_id} of epoch {epoch} "
                                 f"of dataset '{self.spec.name}', which is not to do")
            self.done.add(task_id)
            self.ledger.append(dict(entry))
        if entries and states:
            sums = self.sums.setdefault(self.epoch, {})
            for name, value in states.items():
                sums[name] = sums[name] + value if name in sums else value.copy()
        if len(self.done) == len(self.tasks):
            self.todo.clear()
            self._maybe_complete_epoch()

    def finish_replay(self) -> None:
        """Drops the tasks done during replay from the tasks to do."""
        self.todo = deque((t, a) for t, a in self.todo if t.task_id not in self.done)

    def replay_failed(self, epoch: int, task_id: int, worker: int, error: str) -> None:
        """Re-applies a journaled task failure (its count of failures)."""
        key = (epoch, task_id)
        self.failures[key] = self.failures.get(key, 0) + 1
        self.requeued += 1
        if self.failures[key] >= self.max_task_retries:
            task = self.tasks_of(epoch)[task_id]
            self.error = (
                f"dataset '{self.spec.name}': {task.describe()} of epoch {epoch} "
                f"failed {self.failures[key]} times; last error, on worker {worker}: "
                f"{error}")

    def report_failed(self, worker: int, task_id: int, error: str) -> None:
        flight = self.doing.get(task_id)
        if flight is None or flight.worker != worker:
            self.late_reports += 1
            return
        del self.doing[task_id]
        key = (flight.epoch, task_id)
        self.failures[key] = self.failures.get(key, 0) + 1
        if self.failures[key] >= self.max_task_retries:
            self.error = (
                f"dataset '{self.spec.name}': {flight.task.describe()} of epoch "
                f"{flight.epoch} failed {self.failures[key]} times; last error, on "
                f"worker {worker}: {error}")
            return
        self.todo.appendleft((flight.task, flight.attempt + 1))
        self.requeued += 1

    def release(self, worker: int, task_ids: list[int],
                leases: list[int] | None = None) -> int:
        """The worker gives tasks back (not a failure): they go to the front of
        the queue. Returns how many it held (with that lease, if given)."""
        held = set(task_ids) - set(self.not_held(worker, task_ids, leases))
        given = [self.doing[t] for t in task_ids if t in held]
        for flight in sorted(given, key=lambda f: -f.task.task_id):
            del self.doing[flight.task.task_id]
            self.todo.appendleft((flight.task, flight.attempt + 1))
        self.released += len(given)
        self.late_reports += len(task_ids) - len(given)
        return len(given)

    def overdue(self, now: float, floor: float) -> dict[int, tuple[int, float]]:
        """{worker: (task_id, seconds held)} of the workers holding a task past
        `task_timeout` at monotonic time `now` (their oldest such task)."""
        timeout = task_timeout(self.durations, floor)
        if timeout is None:
            return {}
        out: dict[int, tuple[int, float]] = {}
        for flight in self.doing.values():
            held = now - flight.given_at if flight.given_at else 0.0
            if held > timeout and held > out.get(flight.worker, (0, 0.0))[1]:
                out[flight.worker] = (flight.task.task_id, held)
        return out

    def shift_hand_outs(self, seconds: float) -> None:
        """The master did not run for `seconds` (a stall): hand-out times move
        with it, so the stall is not counted as the workers' lack of progress."""
        for flight in self.doing.values():
            if flight.given_at:
                flight.given_at += seconds

    def requeue_worker(self, worker: int) -> int:
        """Puts the tasks of a lost worker back in front of the queue."""
        lost = [f for f in self.doing.values() if f.worker == worker]
        for flight in sorted(lost, key=lambda f: -f.task.task_id):
            del self.doing[flight.task.task_id]
            self.todo.appendleft((flight.task, flight.attempt + 1))
        self.requeued += len(lost)
        return len(lost)

    # -- status -----------------------------------------------------------
    def status(self) -> dict:
        return {
            "mode": self.spec.mode,
            "epoch": self.epoch,
            "num_epochs": self.spec.num_epochs,
            "tasks_per_epoch": len(self.tasks),  # of the current epoch
            "records_per_epoch": self.spec.records_per_epoch or self.spec.num_records,
            "records_per_task": self.spec.records_per_task,
            "todo": len(self.todo),
            "doing": len(self.doing),
            "done": len(self.done),
            "tasks_done_total": sum(not e.get("rolled_back") for e in self.ledger),
            "requeued": self.requeued,
            "released": self.released,
            "late_reports": self.late_reports,
            "rollbacks": self.rollbacks,
            "reopened_after_finish": self.reopened_after_finish,
            "finished": self.finished,
            "done_task_ids": sorted(self.done),
            "doing_by_worker": {str(w): sum(f.worker == w for f in self.doing.values())
                                for w in {f.worker for f in self.doing.values()}},
        }


def rollback_training(datasets: dict[str, DatasetTasks],
                      progress: dict | None) -> dict[str, int]:
    """Sends the training datasets back to `progress` ({dataset: {"epoch",
    "done_task_ids"}}, None: to where they started); returns {dataset:
    completions undone}."""
    undone = {}
    for name, ds in datasets.items():
        if ds.spec.mode != "training":
            continue
        point = (progress or {}).get(name)
        if point is None:
            undone[name] = ds.rollback()
        else:
            undone[name] = ds.rollback(int(point["epoch"]), set(point["done_task_ids"]))
    return undone


def overdue_workers(datasets: Iterable[DatasetTasks], now: float,
                    floor: float) -> dict[int, float]:
    """{worker: the limit (seconds) its hold passed} of the workers holding a
    task of `datasets` longer than its dataset's tasks take (`task_timeout`,
    never less than `floor`) at monotonic time `now`."""
    overdue: dict[int, float] = {}
    for ds in datasets:
        limit = task_timeout(ds.durations, floor)
        for worker_id in ds.overdue(now, floor):
            overdue[worker_id] = max(limit, overdue.get(worker_id, 0.0))
    return overdue

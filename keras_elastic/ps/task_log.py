"""What one parameter server has applied: element ranges per task, with leases.

Pure Python, no TensorFlow: `ps/store.py` keeps one `TaskLog` and changes it
under the same lock, and in the same step, as the variables, so the log is
always exactly the set of elements whose gradients the variables contain. It is
saved and restored with the variables (a parameter-server checkpoint holds it).

The rules (see `docs/exactly_once.md`):

- A task is `(dataset, epoch, task_id)`. Its elements are numbered in the order
  `dataset_fn` produces them for the task's records.
- The master gives every hand-out of a task a *lease*, larger than any lease
  given before. A worker *claims* the task on every server with its lease
  before pushing: the claim returns the ranges already applied (and their
  fingerprint), and from then on only that lease may push for the task. A claim
  or push with an older lease is refused (a worker presumed lost, or a push
  from before a rollback).
- A push names, per task, the element range its gradient contains. It is
  applied only if every range is disjoint from what the task already has; a
  push whose ranges are all already applied is a duplicate (a retry whose reply
  was lost) and is acknowledged without being applied again.
- A train step may update the model more than once (a GAN's step applies a
  discriminator optimizer, then a generator optimizer): each optimizer apply
  of a step is an *update* with a name ("" for the model's optimizer's first
  apply, "d_optimizer", "g_optimizer#1", ... see `worker/remote_optimizer.py`),
  and the log keeps the applied ranges of each update of a task apart. The
  same elements pushed by two updates of one step are two different facts.

Example:

>>> log = TaskLog()
>>> log.claim(("train", 0, 3), lease=7)
{}
>>> r = Range(("train", 0, 3), lease=7, start=0, end=32, fingerprint=5)
>>> log.check([r]) is None
True
>>> log.record([r])
>>> log.claim(("train", 0, 3), lease=9)
{'': Applied(ranges=[(0, 32)], fingerprint=5)}
>>> log.check([r])
'fenced'
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from keras_elastic.common import errors

TaskKey = tuple[str, int, int]  # (dataset, epoch, task_id)
MASK64 = (1 << 64) - 1

# Outcomes of `TaskLog.check` other than None (apply).
DUPLICATE = "duplicate"
FENCED = "fenced"
OVERLAP = "overlap"


@dataclasses.dataclass(frozen=True)
class Range:
    """Elements `[start, end)` of one task in a push, and their fingerprint."""

    task: TaskKey
    lease: int
    start: int
    end: int
    fingerprint: int = 0
    update: str = ""  # which optimizer apply of the step ("": the model's first)


class Applied(NamedTuple):
    """What one update of a task has applied: sorted, disjoint, merged ranges
    and the sum of their elements' fingerprints (None when unknown)."""

    ranges: list[tuple[int, int]]
    fingerprint: int | None


@dataclasses.dataclass
class _Entry:
    lease: int
    # update -> sorted, disjoint, merged ranges
    applied: dict[str, list[tuple[int, int]]] = dataclasses.field(default_factory=dict)
    # update -> sum of the fingerprints of the elements applied, mod 2**64;
    # None when unknown (restored from parts that disagree): not checked then.
    fingerprint: dict[str, int | None] = dataclasses.field(default_factory=dict)

    def snapshot(self) -> dict[str, Applied]:
        return {u: Applied(list(r), self.fingerprint.get(u, 0))
                for u, r in sorted(self.applied.items()) if r}


def _merge(intervals: list[tuple[int, int]], start: int, end: int
           ) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    placed = False
    for a, b in intervals:
        if b < start or placed and a > end:
            out.append((a, b))
        elif a > end:
            out.append((start, end))
            out.append((a, b))
            placed = True
        else:
            start, end = min(a, start), max(b, end)
    if not placed:
        out.append((start, end))
    return sorted(out)


def _overlaps(intervals: list[tuple[int, int]], start: int, end: int) -> int:
    """Number of elements of `[start, end)` inside `intervals`."""
    return sum(max(0, min(b, end) - max(a, start)) for a, b in intervals)


class TaskLog:
    """Applied element ranges of every live task on one server."""

    def __init__(self) -> None:
        self._entries: dict[TaskKey, _Entry] = {}
        # dataset -> oldest epoch still tracked; older pushes are refused.
        self._min_epoch: dict[str, int] = {}
        # Leases below this were handed out before the job last rolled back:
        # their claims are refused (a worker may still hold such a task of a
        # later epoch; claiming it would retire the epochs being redone).
        self.min_lease = 0

    def __len__(self) -> int:
        return len(self._entries)

    def claim(self, task: TaskKey, lease: int) -> dict[str, Applied]:
        """Takes `task` for `lease`; returns what each update of it has applied
        ({} when nothing).

        Raises `StaleLeaseError` if a newer lease holds the task already or its
        epoch is no longer tracked.
        """
        dataset, epoch, _ = task
        if lease < self.min_lease:
            raise StaleLeaseError(f"task {_describe(task)}: its lease ({lease}) was "
                                  "handed out before the job rolled back")
        if epoch < self._min_epoch.get(dataset, -1):
            raise StaleLeaseError(f"task {_describe(task)}: epoch {epoch} is over on "
                                  "this server")
        entry = self._entries.get(task)
        if entry is None:
            entry = self._entries[task] = _Entry(lease)
            self._prune(dataset, epoch)
        elif lease < entry.lease:
            raise StaleLeaseError(f"task {_describe(task)} is held by a newer lease "
                                  f"({entry.lease} > {lease})")
        entry.lease = lease
        return entry.snapshot()

    def _prune(self, dataset: str, epoch: int) -> None:
        """A task of `epoch` is claimed: epochs before `epoch - 1` are complete."""
        floor = epoch - 1
        if floor <= self._min_epoch.get(dataset, -1):
            return
        self._min_epoch[dataset] = floor
        for key in [k for k in self._entries if k[0] == dataset and k[1] < floor]:
            del self._entries[key]

    def check(self, ranges: list[Range]) -> str | None:
        """None if a push with `ranges` may be applied, else DUPLICATE, FENCED
        or OVERLAP. Changes nothing."""
        duplicates = 0
        for r in ranges:
            entry = self._entries.get(r.task)
            if entry is None or entry.lease != r.lease:
                return FENCED
            inside = _overlaps(entry.applied.get(r.update, ()), r.start, r.end)
            if inside == r.end - r.start:
                duplicates += 1
            elif inside:
                return OVERLAP
        if ranges and duplicates == len(ranges):
            return DUPLICATE
        if duplicates:
            return OVERLAP
        return None

    def record(self, ranges: list[Range]) -> None:
        """Adds `ranges` (checked by `check`) to their tasks."""
        for r in ranges:
            entry = self._entries[r.task]
            entry.applied[r.update] = _merge(entry.applied.get(r.update, []),
                                             r.start, r.end)
            fingerprint = entry.fingerprint.get(r.update, 0)
            if fingerprint is not None:
                entry.fingerprint[r.update] = (fingerprint + r.fingerprint) & MASK64

    def applied(self, task: TaskKey, update: str = "") -> list[tuple[int, int]]:
        """The ranges update `update` of `task` has applied."""
        entry = self._entries.get(task)
        return list(entry.applied.get(update, [])) if entry else []

    # -- checkpoints ------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "min_epoch": dict(self._min_epoch),
            "min_lease": self.min_lease,
            # [dataset, epoch, task, lease, {update: ranges}, {update: fingerprint}]
            "tasks": [[d, e, t, entry.lease,
                       {u: [list(a) for a in r] for u, r in entry.applied.items()},
                       {u: None if f is None else str(f)
                        for u, f in entry.fingerprint.items()}]
                      for (d, e, t), entry in sorted(self._entries.items())],
        }

    @classmethod
    def from_json(cls, data: dict | None) -> TaskLog:
        log = cls()
        if not data:
            return log
        log._min_epoch = {k: int(v) for k, v in data.get("min_epoch", {}).items()}
        log.min_lease = int(data.get("min_lease", 0))
        for d, e, t, lease, applied, fp in data.get("tasks", []):
            if not isinstance(applied, dict):  # one update (before updates had names)
                applied, fp = {"": applied}, {"": fp}
            log._entries[(d, int(e), int(t))] = _Entry(
                int(lease),
                {u: [(int(a), int(b)) for a, b in r] for u, r in applied.items()},
                {u: None if f is None else int(f) & MASK64 for u, f in fp.items()})
        return log

    @classmethod
    def intersection(cls, logs: list[TaskLog]) -> tuple[TaskLog, int]:
        """The log of a server restored from parts that several servers saved
        (a checkpoint restored onto another number of servers): per task, the
        elements every part applied. Returns it and the number of elements some
        parts had applied and others not (those may now be applied twice to
        some variables: only tasks in flight at the save have any)."""
        out = cls()
        if not logs:
            return out, 0
        differing = 0
        keys = set().union(*(log._entries for log in logs))
        for key in keys:
            entries = [log._entries.get(key) for log in logs]
            known = [e for e in entries if e is not None]
            updates = set().union(*(e.applied for e in known))
            merged = _Entry(max(e.lease for e in known))
            for update in sorted(updates):
                parts = [e.applied.get(update, []) if e else [] for e in entries]
                applied = parts[0]
                for theirs in parts[1:]:
                    common = [(max(a, c), min(b, d)) for a, b in applied
                              for c, d in theirs if min(b, d) > max(a, c)]
                    differing += (sum(b - a for a, b in applied)
                                  + sum(b - a for a, b in theirs)
                                  - 2 * sum(b - a for a, b in common))
                    applied = common
                if applied:
                    fps = {e.fingerprint.get(update, 0) for e in known
                           if e.applied.get(update, []) == applied}
                    merged.applied[update] = list(applied)
                    merged.fingerprint[update] = fps.pop() if len(fps) == 1 else None
            if merged.applied or len(known) == len(entries):
                out._entries[key] = merged
        for log in logs:
            out.min_lease = max(out.min_lease, log.min_lease)
            for dataset, epoch in log._min_epoch.items():
                out._min_epoch[dataset] = max(epoch, out._min_epoch.get(dataset, -1))
        return out, differing


def check_ranges(ranges: list[Range]) -> None:
    """Raises ValueError unless `ranges` could come from a worker's push: every
    range non-empty and non-negative, and the ranges of one task disjoint.
    Checked before anything is applied (see `ParameterStore.push`).

    >>> check_ranges([Range(("t", 0, 3), lease=7, start=5, end=2)])
    Traceback (most recent call last):
    ...
    ValueError: task 3 of epoch 0 of dataset 't': element range [5, 2) is empty or negative
    """
    spans: dict[TaskKey, list[tuple[int, int]]] = {}
    for r in ranges:
        if not 0 <= r.start < r.end:
            raise ValueError(f"task {_describe(r.task)}: element range [{r.start}, "
                             f"{r.end}) is empty or negative")
        spans.setdefault(r.task, []).append((r.start, r.end))
    for task, intervals in spans.items():
        intervals.sort()
        for (a, b), (c, d) in zip(intervals, intervals[1:]):
            if c < b:
                raise ValueError(f"task {_describe(task)}: element ranges [{a}, {b}) "
                                 f"and [{c}, {d}) of one push overlap")


class StaleLeaseError(errors.ClusterError, ValueError):
    """A claim or push from a hand-out of a task that is no longer current."""


def _describe(task: TaskKey) -> str:
    dataset, epoch, task_id = task
    return f"{task_id} of epoch {epoch} of dataset '{dataset}'"

"""Replaying a task that was partly applied before (exactly-once updates).

When a worker claims a task, every parameter server says which of the task's
elements its variables already contain (see `ps/task_log.py`). Usually none.
After a failure some may: the task's previous worker died mid-task, or its
push reached some servers and not others, or the servers rolled back to a
checkpoint taken mid-task. Then:

- the *frontier* is the end of the last element any server has applied: the
  shared pipeline skips every element before it (`dataset_fn` runs again on
  the task's records and the elements are skipped by position);
- before the frontier, the elements some servers lack are *caught up*: the
  model's train step runs on them again (on the current model) and each server
  applies each update of the step only where it lacks those elements;
- the skipped elements are checked against the servers' fingerprints of what
  they applied: if `dataset_fn` now gives other elements (it is not
  deterministic), that is an error, not a silent double count.

The catch-up runs on the training thread between two steps (a Keras callback
calls `TaskStream.run_replays`), never inside the input pipeline.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging

from keras_elastic.data.errors import NondeterministicDatasetError  # noqa: F401 (re-exported)
from keras_elastic.data.fingerprint import element_fingerprint, mix
from keras_elastic.ps.client import TaskClaim


@dataclasses.dataclass(frozen=True)
class ReplayPlan:
    frontier: int
    # (start, end, servers that lack elements [start, end) for some update)
    segments: tuple[tuple[int, int, tuple[int, ...]], ...]

    @property
    def needed(self) -> bool:
        return self.frontier > 0


def plan_replay(claims: list[TaskClaim],
                participants: set[tuple[int, str]] | None = None) -> ReplayPlan:
    """What to skip and what to catch up, from each server's applied ranges.

    `participants`: the (server, update) pairs that must hold every element
    of the task: those the worker's step pushes to (`ModelSync.updates`).
    Every pair that applied some element of the task is one too; None: every
    server for update "" (a step with one optimizer apply).

    >>> a = TaskClaim([(0, 48)], 0)
    >>> b = TaskClaim([(0, 32)], 0)
    >>> plan_replay([a, b])
    ReplayPlan(frontier=48, segments=((32, 48, (1,)),))
    """
    applied = {(i, u): a.ranges for i, c in enumerate(claims)
               for u, a in c.updates.items()}
    pairs = set(applied) | (set(participants) if participants is not None
                            else {(i, "") for i in range(len(claims))})
    frontier = max((end for r in applied.values() for _, end in r), default=0)
    points = sorted({0, frontier} | {x for r in applied.values() for a in r for x in a})
    segments: list[tuple[int, int, tuple[int, ...]]] = []
    for lo, hi in zip(points, points[1:]):
        if lo >= frontier:
            break
        need = tuple(sorted({i for i, u in pairs if not any(
            a <= lo and hi <= b for a, b in applied.get((i, u), ()))}))
        if not need:
            continue
        if segments and segments[-1][1] == lo and segments[-1][2] == need:
            segments[-1] = (segments[-1][0], hi, need)
        else:
            segments.append((lo, hi, need))
    return ReplayPlan(frontier, tuple(segments))


@dataclasses.dataclass
class Replay:
    """A claimed task whose first `plan.frontier` elements are skipped by the
    pipeline and handled here."""

    seq: int
    task: Any  # master_pb2.Task
    records: Any
    claims: list[TaskClaim]
    plan: ReplayPlan


class Replayer:
    """Checks and catches up replays for one model and `ElasticDataset`.

    Catching up runs the model's own compiled train step
    (`TrainFunction.replay`) on the task's elements again, in batches that
    never straddle a point where some server's applied ranges start or end:
    every update of the step is pushed, and each server applies it only
    where it lacks those elements (elsewhere it is a duplicate, acknowledged
    and ignored). So a step with several optimizer applies (a GAN's) is
    caught up as exactly as Keras' default step.
    """

    def __init__(self, model, dataset, sync, runtime, stream=None) -> None:
        self.model = model
        self.dataset = dataset
        self.sync = sync
        self.runtime = runtime
        self.stream = stream  # the training TaskStream (its tasks given back)

    # -- the elements of a task, again --------------------------------------
    def _elements(self, records) -> tf.data.Dataset:
        ds = self.dataset
        return ds.elements_of(records)

    def _check(self, replay: Replay) -> None:
        """The first `frontier` elements are those the servers applied."""
        ds = self.dataset
        frontier = replay.plan.frontier
        fingerprint = element_fingerprint if ds.deterministic else (
            lambda e: tf.constant(0, tf.int64))
        fps = np.fromiter(
            (int(f) for f in self._elements(replay.records).take(frontier).map(
                lambda *e: fingerprint(e[0] if len(e) == 1 else e)).as_numpy_iterator()),
            dtype=np.int64)
        where = _describe(replay.task)
        if len(fps) < frontier:
            raise NondeterministicDatasetError(
                f"{where}: the parameter servers already applied {frontier} elements "
                f"of this task, but dataset_fn {_fn(ds)} now gives only {len(fps)} for "
                "its records. dataset_fn must give the same elements for the same "
                "records every time (see ElasticDataset's `deterministic`).")
        if not ds.deterministic:
            return
        mixed = mix(np.arange(frontier), fps)
        for server, claim in enumerate(replay.claims):
            for ranges, expected in claim.updates.values():
                if expected is None or not ranges:
                    continue
                mask = np.zeros(frontier, bool)
                for a, b in ranges:
                    mask[a:b] = True
                with np.errstate(over="ignore"):
                    mine = int(np.sum(mixed[mask], dtype=np.uint64))
                if mine != expected:
                    raise NondeterministicDatasetError(
                        f"{where}: dataset_fn {_fn(ds)} gave other elements for this "
                        f"task's records than when parameter server {server} applied "
                        f"elements {ranges} of it (their fingerprints differ). "
                        "Replaying it would train some records twice and others "
                        "never. Make dataset_fn deterministic (seed its shuffles and "
                        "random ops), or, if it only augments each record at random "
                        "(same records, same order), pass "
                        "ElasticDataset(deterministic=False).")

    # -- catching up ----------------------------------------------------------
    def run(self, replay: Replay) -> bool:
        """Checks the replayed elements and catches up the servers that lack
        some. Returns False if a server refused (the task is no longer ours)."""
        self._check(replay)
        self.runtime.ensure_traced()
        participants = {(s, u) for u, servers in self.sync.updates.items()
                        for s in servers}
        plan = plan_replay(replay.claims, participants or None)
        ds = self.dataset
        fingerprint = element_fingerprint if ds.deterministic else (
            lambda e: tf.constant(0, tf.int64))
        seq = tf.constant(replay.seq, tf.int64)
        stream = self.stream
        for lo, hi, _ in plan.segments:
            elements = self._elements(replay.records).enumerate().skip(lo).take(hi - lo)
            tagged = elements.map(lambda i, e: (tf.stack([seq, i, fingerprint(e)]), e))
            for tags, batch in ds.batch_tagged_elements(tagged):
                self.runtime.replay(tags.numpy(), batch)
                if stream is not None and replay.seq in stream.dead():
                    logging.warning("%s: catching up was refused", _describe(replay.task))
                    return False
        if plan.segments:
            logging.info("%s: skipped %d elements already applied, caught up %s",
                         _describe(replay.task), plan.frontier,
                         [(lo, hi, list(s)) for lo, hi, s in plan.segments])
        return True


def _describe(task) -> str:
    return (f"task {task.task_id} of epoch {task.epoch} ({task.shard} records "
            f"[{task.start}, {task.end}))")


def _fn(dataset) -> str:
    fn = dataset.dataset_fn
    return repr(getattr(fn, "__qualname__", fn)) if fn is not None else "(none)"

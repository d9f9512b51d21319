"""Replaying a task that was partly applied before (exactly-once updates).

When a worker claims a task, every parameter server says which of the task's
elements its variables already contain (see `ps/task_log.py`). Usually none.
After a failure some may: the task's previous worker died mid-task, or its
push reached some servers and not others, or the servers rolled back to a
checkpoint taken mid-task. Then:

- the *frontier* is the end of the last element any server has applied: the
  shared pipeline skips every element before it (`dataset_fn` runs again on
  the task's records and the elements are skipped by position);
- before the frontier, the elements some servers lack are *caught up*: their
  gradients are computed again (on the current model) and pushed to those
  servers only;
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
from keras.src.trainers.data_adapters import data_adapter_utils

from keras_elastic.data.fingerprint import element_fingerprint, mix, range_fingerprint
from keras_elastic.layers.embedding import embedding_step
from keras_elastic.proto import ps_pb2
from keras_elastic.ps.client import TaskClaim
from keras_elastic.worker.model_sync import sum_rows, training_loss


class NondeterministicDatasetError(RuntimeError):
    """`dataset_fn` gave other elements for the same records than before."""


@dataclasses.dataclass(frozen=True)
class ReplayPlan:
    frontier: int
    # (start, end, servers that lack elements [start, end))
    segments: tuple[tuple[int, int, tuple[int, ...]], ...]

    @property
    def needed(self) -> bool:
        return self.frontier > 0


def plan_replay(claims: list[TaskClaim]) -> ReplayPlan:
    """What to skip and what to catch up, from each server's applied ranges.

    >>> a = TaskClaim([(0, 48)], 0)
    >>> b = TaskClaim([(0, 32)], 0)
    >>> plan_replay([a, b])
    ReplayPlan(frontier=48, segments=((32, 48, (1,)),))
    """
    frontier = max((end for c in claims for _, end in c.applied), default=0)
    points = sorted({0, frontier} | {x for c in claims for r in c.applied for x in r})
    segments: list[tuple[int, int, tuple[int, ...]]] = []
    for lo, hi in zip(points, points[1:]):
        if lo >= frontier:
            break
        need = tuple(i for i, c in enumerate(claims)
                     if not any(a <= lo and hi <= b for a, b in c.applied))
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
    """Checks and catches up replays for one model and `ElasticDataset`."""

    def __init__(self, model, dataset, sync) -> None:
        self.model = model
        self.dataset = dataset
        self.sync = sync
        self._grads = None
        self._grad_keys: list[str] = []

    # -- the elements of a task, again --------------------------------------
    def _elements(self, records) -> tf.data.Dataset:
        ds = self.dataset
        return ds._apply_dataset_fn(tf.data.Dataset.from_tensor_slices(records))

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
            if claim.fingerprint is None or not claim.applied:
                continue
            mask = np.zeros(frontier, bool)
            for a, b in claim.applied:
                mask[a:b] = True
            with np.errstate(over="ignore"):
                mine = int(np.sum(mixed[mask], dtype=np.uint64))
            if mine != claim.fingerprint:
                raise NondeterministicDatasetError(
                    f"{where}: dataset_fn {_fn(ds)} gave other elements for this "
                    f"task's records than when parameter server {server} applied "
                    f"elements {claim.applied} of it (their fingerprints differ). "
                    "Replaying it would train some records twice and others never. "
                    "Make dataset_fn deterministic (seed its shuffles and random "
                    "ops), or, if it only augments each record at random (same "
                    "records, same order), pass ElasticDataset(deterministic=False).")

    # -- catching up ----------------------------------------------------------
    def _grad_fn(self):
        if self._grads is None:
            model, sync = self.model, self.sync

            @tf.function
            def grads_of(data):
                x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
                with tf.GradientTape() as tape, embedding_step(tape) as lookups:
                    _, loss = training_loss(model, x, y, sample_weight)
                    loss = model.optimizer.scale_loss(loss)
                n = len(sync.trainable)
                grads = tape.gradient(loss, sync.trainable + [r for _, _, r in lookups])
                pairs = [(k, g) for k, g in zip(sync.trainable_keys, grads[:n])
                         if g is not None]
                rows = [(layer.table_name, ids, g) for (layer, ids, _), g in zip(
                    lookups, grads[n:]) if g is not None]
                self._grad_keys = [k for k, _ in pairs]
                self._grad_tables = [name for name, _, _ in rows]
                return [tf.convert_to_tensor(g) for _, g in pairs] + [
                    t for _, ids, g in rows for t in (ids, tf.convert_to_tensor(g))]

            self._grads = grads_of
        return self._grads

    def run(self, replay: Replay) -> bool:
        """Checks the replayed elements and catches up the servers that lack
        some. Returns False if a server refused (the task is no longer ours)."""
        self._check(replay)
        task, ds = replay.task, self.dataset
        fingerprint = element_fingerprint if ds.deterministic else (
            lambda e: tf.constant(0, tf.int64))
        for lo, hi, servers in replay.plan.segments:
            elements = self._elements(replay.records).enumerate().skip(lo).take(hi - lo)
            tagged = elements.map(lambda i, e: (tf.stack([i, fingerprint(e)]), e))
            batched = ds._batch_untagged_pairs(tagged)
            for tags, batch in batched:
                tags = tags.numpy()
                start, end = int(tags[0, 0]), int(tags[-1, 0]) + 1
                grads = self._grad_fn()(batch)
                n = len(self._grad_keys)
                values = {k: g.numpy() for k, g in zip(self._grad_keys, grads[:n])}
                sparse = sum_rows(self._grad_tables, grads[n:])
                reply = self.sync.ps.exchange(values, {}, [ps_pb2.TaskRange(
                    dataset=ds.name, epoch=task.epoch, task_id=task.task_id,
                    lease=task.lease, start=start, end=end,
                    fingerprint=range_fingerprint(tags[:, 0], tags[:, 1]))],
                    targets=list(servers), sparse=sparse)
                self.sync.take(reply.values)
                if not reply.accepted:
                    logging.warning("%s: catching up was refused (%s)",
                                    _describe(task), reply.refusals())
                    return False
        if replay.plan.segments:
            logging.info("%s: skipped %d elements already applied, caught up %s",
                         _describe(task), replay.plan.frontier,
                         [(lo, hi, list(s)) for lo, hi, s in replay.plan.segments])
        return True


def _describe(task) -> str:
    return (f"task {task.task_id} of epoch {task.epoch} ({task.shard} records "
            f"[{task.start}, {task.end}))")


def _fn(dataset) -> str:
    fn = dataset.dataset_fn
    return repr(getattr(fn, "__qualname__", fn)) if fn is not None else "(none)"

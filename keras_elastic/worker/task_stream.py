"""The task-fed generator behind a worker's shared `tf.data` pipeline.

One `TaskStream` per `ElasticDataset` and worker. Each time the pipeline is
iterated (one Keras epoch) `generator()` asks the master for tasks of that
epoch, reads each task's records and yields them with the task's sequence
number `seq` (increasing, local to this worker). The pipeline tags every
element with its `seq`, keeps elements in order and batches across tasks.

Completion rule (exact even when `dataset_fn` filters or expands records):
after a batch whose largest tag is `s` has been trained, every task with
`seq < s` has had all of its elements trained; when the stream is exhausted,
all of them have. `mark_trained(s)` and `finish_epoch()` report exactly those
tasks to the master, once.

Exactly-once updates (training): before yielding a task the stream *claims*
it on the parameter servers with the master's lease, which says what they
already applied of it. The pipeline then skips that many elements, and a
`Replay` (see `worker/replay.py`) is queued to check them and catch up any
server that lacks some; the task is not reported before its replay ran. A
task whose push a server refused (its lease is no longer current, or the
gradient was too stale) is *abandoned*: its elements still in the pipeline are
dropped from their batches before the step (`worker/train_function.py`), it
is never reported done, and it goes back to the master.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Protocol

import numpy as np
from absl import logging

from keras_elastic.common import faults
from keras_elastic.common.timing import PhaseTimer
from keras_elastic.data.fingerprint import range_fingerprint
from keras_elastic.data.source import DataSource
from keras_elastic.master.client import WAIT, MasterClient
from keras_elastic.proto import ps_pb2
from keras_elastic.worker.replay import Replay, plan_replay


class TrainingHooks(Protocol):
    """What a training stream asks of the model it feeds (exactly-once
    updates; `worker/session.py` implements it)."""

    def claim(self, task: Any) -> list | None:
        """Claims `task` on every server: what each applied of it (a list of
        `TaskClaim`), or None if a newer hand-out holds it."""

    def replay(self, replay: Replay) -> bool:
        """Catches up the servers that lack some of a task's elements; False
        if a server refused (the task is no longer this worker's)."""

    def flush(self) -> None:
        """Every gradient pushed so far is applied (before tasks are reported)."""

    def report_states(self) -> list | None:
        """The metric states to send with the next report of tasks done."""


class TaskStream:
    """The tasks of one dataset as this worker's pipeline reads them.

    `hooks` (training only): the model's `TrainingHooks`. `segmented`
    (training only): the stream ends a segment rather than block while it
    holds tasks (see `end_segment`)."""

    def __init__(self, master: MasterClient, dataset: str, source: DataSource,
                 timer: PhaseTimer, start_epoch: int = 0,
                 shuffle_records: bool = False, seed: int = 0,
                 hooks: TrainingHooks | None = None, segmented: bool = False) -> None:
        self.master = master
        self.dataset = dataset
        self.source = source
        self.timer = timer
        self.epoch = start_epoch
        self.shuffle_records = shuffle_records
        self.seed = seed
        self._lock = threading.Lock()
        self._outstanding: collections.OrderedDict = collections.OrderedDict()  # seq->Task
        self._next_seq = 0
        self._exhausted = False
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self.hooks = hooks
        self._replays: dict[int, Any] = {}  # seq -> Replay not yet run
        self._dead: set[int] = set()        # seqs abandoned
        # Training streams end a *segment* rather than block while holding
        # tasks; `end_segment()` then reports them and the epoch goes on.
        self.segmented = segmented
        self._segment_break = False

    # -- epochs -----------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration of the pipeline serves."""
        self.epoch = epoch

    def stop(self) -> None:
        """Makes a generator blocked on the master return."""
        self._stop.set()

    # -- the generator ----------------------------------------------------
    def generator(self):
        """Yields `(seq, skip, records)` per task of the current epoch: the
        pipeline drops the task's first `skip` elements (already applied)."""
        epoch = self.epoch
        self._exhausted = False
        self._segment_break = False
        self._stop.clear()
        try:
            while True:
                start = time.perf_counter()
                # Training: never block on the master while holding tasks whose
                # elements may sit in a partial batch (the master may be waiting
                # for exactly those): end the segment instead (see end_segment).
                holding = self.segmented and bool(self._outstanding)
                task = self.master.get_task(self.dataset, epoch, stop=self._stop,
                                            return_on_wait=holding)
                if task == WAIT:
                    self._segment_break = True
                    return
                if task is None:
                    break
                try:
                    records = self.source.read(task.shard, task.start, task.end)
                except Exception as e:  # reported to the master, which retries
                    logging.error("worker %d: reading %s [%d, %d) failed: %s",
                                  self.master.worker_id, task.shard, task.start,
                                  task.end, e)
                    self.master.report_tasks(self.dataset, [task.task_id],
                                             success=False,
                                             error=f"{type(e).__name__}: {e}")
                    continue
                if self.shuffle_records:
                    # The same order on every attempt: a replay skips by position.
                    rng = np.random.default_rng((self.seed, task.epoch, task.task_id))
                    order = rng.permutation(task.end - task.start)
                    records = _take(records, order)
                replay = None
                if self.hooks is not None:
                    claims = self.hooks.claim(task)
                    if claims is None:
                        # The servers refuse this hand-out (a newer one holds the
                        # task): give it back, the master decides again.
                        logging.warning("worker %d: the parameter servers refused the "
                                        "claim of task %d of epoch %d; giving it back",
                                        self.master.worker_id, task.task_id, task.epoch)
                        self.master.release_tasks(self.dataset, [task.task_id],
                                                  "claim refused", [task.lease])
                        continue
                    plan = plan_replay(claims)
                    if plan.needed:
                        replay = Replay(-1, task, records, claims, plan)
                    faults.reached("after_claim")
                with self._lock:
                    seq = self._next_seq
                    self._next_seq += 1
                    self._outstanding[seq] = task
                    if replay is not None:
                        replay.seq = seq
                        self._replays[seq] = replay
                self.timer.add("get_batch", time.perf_counter() - start)
                skip = replay.plan.frontier if replay is not None else 0
                yield np.int64(seq), np.int64(skip), records
        except BaseException as e:
            self.error = e
            raise
        self._exhausted = True

    # -- completion -------------------------------------------------------
    def mark_trained(self, max_seq: int) -> None:
        """A batch holding an element of task `max_seq` has been trained."""
        self._report(lambda seq: seq < max_seq)

    def finish_epoch(self) -> None:
        """The pipeline was exhausted and every batch trained: report the rest."""
        if self._exhausted:
            self.run_replays()
            if self.hooks is not None:
                self.hooks.flush()  # buffered gradients applied before the report
            faults.reached("epoch_end")
            self._report(lambda seq: True)

    def end_segment(self) -> bool:
        """The pipeline ran out and every batch was trained. If the stream only
        ended a segment (the epoch goes on), reports its tasks and returns True:
        the caller iterates the pipeline again, continuing the same epoch."""
        if not self._segment_break:
            return False
        self._segment_break = False
        self.run_replays()
        if self.hooks is not None:
            self.hooks.flush()
        faults.reached("epoch_end")
        self._report(lambda seq: True)
        return True

    def _report(self, is_done) -> None:
        with self._lock:
            done = [s for s in self._outstanding
                    if is_done(s) and s not in self._replays]
            tasks = [self._outstanding.pop(s) for s in done]
        if tasks:
            states = self.hooks.report_states() if self.hooks is not None else None
            self.master.report_tasks(self.dataset, [t.task_id for t in tasks],
                                     success=True, leases=[t.lease for t in tasks],
                                     metric_states=states)

    # -- exactly-once updates (training) ----------------------------------
    def run_replays(self) -> None:
        """Runs the pending replays (on the training thread, between steps)."""
        while self._replays:
            with self._lock:
                seq, replay = next(iter(self._replays.items()))
            ok = self.hooks.replay(replay) if self.hooks is not None else True
            with self._lock:
                self._replays.pop(seq, None)
            if not ok:
                self.abandon([seq], "catching up was refused")

    def dead(self) -> frozenset:
        """The seqs given back so far."""
        with self._lock:
            return frozenset(self._dead)

    def has_dead(self) -> bool:
        """Whether any task was given back (a cheap check per step)."""
        return bool(self._dead)

    def live_mask(self, seqs: np.ndarray) -> np.ndarray:
        """1.0 for elements of tasks still ours, 0.0 for abandoned ones."""
        if not self._dead:
            return np.ones(len(seqs), np.float32)
        return (~np.isin(seqs, list(self._dead))).astype(np.float32)

    def batch_ranges(self, tags: np.ndarray, update: str = ""
                     ) -> tuple[list, list[int]]:
        """The `TaskRange`s of a batch's elements of live tasks for update
        `update` of the step (see worker/step_context.py), and their seqs.

        `tags` is the batch's `[seq, position, fingerprint]` per element; a
        task's elements in a batch are consecutive.
        """
        slices = self.batch_slices(tags)
        return [ps_pb2.TaskRange(
            dataset=self.dataset, epoch=task.epoch, task_id=task.task_id,
            lease=task.lease, start=start, end=end, fingerprint=fingerprint,
            update=update) for _, task, start, end, fingerprint in slices], [
            s[0] for s in slices]

    def batch_slices(self, tags: np.ndarray) -> list[tuple]:
        """`(seq, task, start, end, fingerprint)` of each live task's elements
        in a batch (`batch_ranges` without the protos)."""
        seqs, positions, fps = tags[:, 0], tags[:, 1], tags[:, 2]
        cuts = np.flatnonzero(np.diff(seqs)) + 1
        slices = []
        with self._lock:
            for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(seqs)]):
                seq = int(seqs[lo])
                task = self._outstanding.get(seq)
                if task is None or seq in self._dead:
                    continue
                start, end = int(positions[lo]), int(positions[hi - 1]) + 1
                if end - start != hi - lo:
                    raise RuntimeError(f"elements of task {task.task_id} are not "
                                       f"consecutive in a batch ({start}..{end})")
                slices.append((seq, task, start, end,
                               range_fingerprint(positions[lo:hi], fps[lo:hi])))
        return slices

    def abandon(self, seqs: list[int], reason: str) -> None:
        """Gives up tasks whose pushes were refused: their remaining elements
        are masked, and the master hands them out again."""
        with self._lock:
            tasks = [self._outstanding.pop(s) for s in seqs if s in self._outstanding]
            self._dead.update(seqs)
            for s in seqs:
                self._replays.pop(s, None)
        if not tasks:
            return
        logging.warning("worker %d: giving back %d task(s) (%s): %s",
                        self.master.worker_id, len(tasks), reason,
                        [t.task_id for t in tasks])
        try:
            self.master.release_tasks(self.dataset, [t.task_id for t in tasks], reason,
                                      [t.lease for t in tasks])
        except (ConnectionError, ValueError) as e:  # the master requeues them anyway
            logging.warning("could not give the tasks back: %s", e)

    def report_one(self, seq: int, metric_states=None) -> None:
        """Reports the task of `seq` done, with its metric states (evaluation)."""
        with self._lock:
            task = self._outstanding.pop(seq, None)
        if task is not None:
            self.master.report_tasks(self.dataset, [task.task_id], success=True,
                                     metric_states=metric_states, leases=[task.lease])

    def report_through(self, before: int | None) -> None:
        """Reports every task with `seq < before` (None: all, if exhausted)."""
        if before is None:
            self.finish_epoch()
        else:
            self.mark_trained(before)

    def pending(self, before: int | None) -> list:
        """`(seq, Task)` not yet reported with `seq < before`; `before=None`: all
        of them once the stream is exhausted (else none)."""
        with self._lock:
            if before is None:
                return list(self._outstanding.items()) if self._exhausted else []
            return [(s, t) for s, t in self._outstanding.items() if s < before]

    def task_of(self, seq: int):
        """The master's `Task` behind `seq` (None once reported)."""
        with self._lock:
            return self._outstanding.get(seq)


def _take(records: Any, order: np.ndarray) -> Any:
    if isinstance(records, dict):
        return {k: _take(v, order) for k, v in records.items()}
    if isinstance(records, (list, tuple)):
        items = [_take(v, order) for v in records]
        if hasattr(records, "_fields"):  # a namedtuple takes its fields apart
            return type(records)(*items)
        return type(records)(items)
    return records[order]

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
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import numpy as np
from absl import logging

from keras_elastic.common.timing import PhaseTimer
from keras_elastic.data.source import DataSource
from keras_elastic.master.client import MasterClient


class TaskStream:
    def __init__(self, master: MasterClient, dataset: str, source: DataSource,
                 timer: PhaseTimer, start_epoch: int = 0,
                 shuffle_records: bool = False, seed: int = 0) -> None:
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

    # -- epochs -----------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration of the pipeline serves."""
        self.epoch = epoch

    def stop(self) -> None:
        """Makes a generator blocked on the master return."""
        self._stop.set()

    # -- the generator ----------------------------------------------------
    def generator(self):
        """Yields `(seq, records)` per task of the current epoch."""
        epoch = self.epoch
        self._exhausted = False
        self._stop.clear()
        try:
            while True:
                start = time.perf_counter()
                task = self.master.get_task(self.dataset, epoch, stop=self._stop)
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
                    rng = np.random.default_rng(
                        (self.seed, task.epoch, task.task_id, task.attempt))
                    order = rng.permutation(task.end - task.start)
                    records = _take(records, order)
                with self._lock:
                    seq = self._next_seq
                    self._next_seq += 1
                    self._outstanding[seq] = task
                self.timer.add("get_batch", time.perf_counter() - start)
                yield np.int64(seq), records
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
            self._report(lambda seq: True)

    def _report(self, is_done) -> None:
        with self._lock:
            done = [s for s in self._outstanding if is_done(s)]
            task_ids = [self._outstanding.pop(s).task_id for s in done]
        if task_ids:
            self.master.report_tasks(self.dataset, task_ids, success=True)

    def report_one(self, seq: int, metric_states=None) -> None:
        """Reports the task of `seq` done, with its metric states (evaluation)."""
        with self._lock:
            task = self._outstanding.pop(seq, None)
        if task is not None:
            self.master.report_tasks(self.dataset, [task.task_id], success=True,
                                     metric_states=metric_states)

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
        return type(records)(_take(v, order) for v in records)
    return records[order]

"""How a train step's updates reach the parameter servers: three exchanges, one
interface.

`ModelSync` (worker/model_sync.py) holds one `Exchange`, chosen by where the
servers are and by `model.compile(..., exchange=...)`:

- `SyncExchange` (the default, servers over gRPC): the step sends its update
  and waits for the reply, whose values it assigns before going on; with one
  worker its updates are exactly Keras' (tests/test_training_inprocess.py);
- `PipelinedExchange` (`exchange="pipelined"`, servers over gRPC): the step's
  push travels while the next step computes (worker/push_pipeline.py: at most
  one in flight, the task accounting exact);
- `InProcessExchange` (an embedded cluster: the store in this process holds
  the model's own variables and optimizers): nothing is sent; before the step
  the store's task log says which of the step's updates may apply
  (`allow`), and the step applies them itself with Keras' own optimizer
  (worker/remote_optimizer.py).

Every exchange answers `begin_step` (before a step computes), `send` (an
update of the step, from inside it), `finish` (take the reply of what is in
flight: the epoch's end, a pull) and `drop` (forget it: `fit` failed).

Example (the choice; the exchanges themselves run in every training test):

>>> exchange_class(shared=True, mode="pipelined").__name__
'InProcessExchange'
>>> exchange_class(shared=False, mode="pipelined").__name__
'PipelinedExchange'
>>> exchange_class(shared=False, mode="sync").__name__
'SyncExchange'
>>> exchange_class(shared=False, mode="async")
Traceback (most recent call last):
...
ValueError: exchange must be one of ('sync', 'pipelined'), got 'async'
>>> InProcessExchange(sync=None).send(None, "", None, 0.0)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
RuntimeError: update '': with the store in this process the train step applies ...
"""

from __future__ import annotations

import abc
import dataclasses
import time
from typing import Any

import numpy as np

from keras_elastic.common import faults
from keras_elastic.ps.task_log import Range
from keras_elastic.ps.update import Update
from keras_elastic.worker.push_pipeline import PushPipeline

MODES = ("sync", "pipelined")


class Exchange(abc.ABC):
    """One model's way to the servers (see the module doc). `sync`: the
    `ModelSync` that makes and holds it (its servers, its training stream, the
    values it holds, its timer)."""

    # The step applies its updates itself (after `allow`), sending nothing.
    applies_in_step = False

    def __init__(self, sync: Any) -> None:
        self.sync = sync

    def begin_step(self) -> None:
        """The step begins computing."""
        return  # (nothing to do by default)

    def allow(self, tags: np.ndarray) -> list[bool]:
        """Before a step: whether each of its updates may apply, for a step
        that applies them itself; [] where nothing is decided before the step
        (the servers decide at each push)."""
        return []

    @abc.abstractmethod
    def send(self, update: Update, name: str, tags: np.ndarray, started: float
             ) -> list[np.ndarray]:
        """Sends the step's update `name` (its elements' tags: `tags`, their
        task ranges added here); returns every variable's value for the step
        to assign. `started`: when the step handed the update over (the push
        phase's start)."""

    def finish(self) -> bool:
        """Takes the reply of the push in flight, if any (True)."""
        return False

    def drop(self) -> None:
        """Waits for the push in flight, ignoring its outcome."""
        return  # (nothing to do by default)

    @property
    def completed_seq(self) -> int | None:
        """The largest task seq of a batch whose push returned (None: every
        step's push returns within the step)."""
        return None

    def reset(self) -> None:
        """A new training stream begins (its seqs start at 0)."""
        return  # (nothing to do by default)


class SyncExchange(Exchange):
    """Push and wait, in the step."""

    def send(self, update: Update, name: str, tags: np.ndarray, started: float
             ) -> list[np.ndarray]:
        sync = self.sync
        live: list[int] = []
        if sync.stream is not None:
            ranges, live = sync.stream.batch_ranges(tags, name)
            update = (dataclasses.replace(update, ranges=ranges) if ranges
                      else update.without_training())  # every task given back
        reply = sync.ps.send(update)
        faults.reached("after_push")
        if not reply.accepted:
            sync.stream.abandon(live, f"push refused: {reply.refusals()}")
        t_pushed = time.perf_counter()
        sync.timer.add("push", t_pushed - started)
        sync.take_values(reply.values)
        sync.timer.add("pull", time.perf_counter() - t_pushed)
        return sync.values_of_all()


class PipelinedExchange(Exchange):
    """Step k's push travels while step k+1 computes (worker/push_pipeline.py)."""

    def __init__(self, sync: Any) -> None:
        super().__init__(sync)
        self.pipeline = PushPipeline()
        self._completed_seq = -1
        # The tasks given back when the step began (`begin_step`).
        self._dead_at_mark: frozenset = frozenset()

    @property
    def completed_seq(self) -> int:
        return self._completed_seq

    def reset(self) -> None:
        self._completed_seq = -1

    def begin_step(self) -> None:
        if self.sync.stream is not None:
            self._dead_at_mark = self.sync.stream.dead()

    def send(self, update: Update, name: str, tags: np.ndarray, started: float
             ) -> list[np.ndarray]:
        """Waits for the previous push, sends this one on the pipeline's
        thread, returns the newest values that arrived."""
        sync = self.sync
        self.finish()
        live: list[int] = []
        max_seq = int(tags[:, 0].max()) if len(tags) and not sync.replaying else -1
        if sync.stream is not None:
            ranges, live = sync.stream.batch_ranges(tags, name)
            given_back = sync.stream.dead() - self._dead_at_mark
            if given_back and np.isin(tags[:, 0], list(given_back)).any():
                # Live when the step began, given back since (the previous push
                # was refused): the gradient holds elements that are no longer
                # ours. Push none of it; the batch's other tasks go back too
                # (their elements here are not applied).
                sync.stream.abandon(live, "a task of the batch was given back "
                                    "while its step ran")
                ranges, live = [], []
            update = (dataclasses.replace(update, ranges=ranges) if ranges
                      else update.without_training())
        self.pipeline.submit(lambda: sync.ps.send(update), max_seq, live)
        sync.timer.add("push", time.perf_counter() - started)
        # This worker's non-trainable values are the newest (its push is on the
        # way): keep them rather than the previous reply's.
        return [update.assigns[k] if k in update.assigns else v
                for k, v in zip(sync.keys, sync.values_of_all())]

    def finish(self) -> bool:
        """Takes the reply of the push in flight: its values, its refusals (the
        tasks go back to the master), the tasks it completes."""
        sync = self.sync
        t = time.perf_counter()
        done = self.pipeline.finish()
        if done is None:
            return False
        faults.reached("after_push")
        if not done.reply.accepted and sync.stream is not None:
            sync.stream.abandon(done.live, f"push refused: {done.reply.refusals()}")
        sync.take_values(done.reply.values)
        self._completed_seq = max(self._completed_seq, done.max_seq)
        sync.timer.add("push", time.perf_counter() - t)
        return True

    def drop(self) -> None:
        self.pipeline.drop()


class InProcessExchange(Exchange):
    """The store in this process holds the model's own variables: the step
    applies its updates itself, each once the task log allows it."""

    applies_in_step = True

    def send(self, update: Update, name: str, tags: np.ndarray, started: float
             ) -> list[np.ndarray]:
        """Never called: the step applies its updates itself
        (`RemoteOptimizer._apply_in_step`); a call is a bug of the caller."""
        raise RuntimeError(f"update '{name}': with the store in this process the "
                           "train step applies its updates itself; nothing is sent")

    def allow(self, tags: np.ndarray) -> list[bool]:
        """The task log's word on each update of the step (in the step's
        order), each allowed one logged. False: a duplicate (a replay's
        elements some update applied before) or refused (the batch's tasks
        are given back)."""
        sync = self.sync
        stream = sync.stream
        allowed = []
        slices = stream.batch_slices(tags) if stream is not None else None
        live = [s[0] for s in slices or ()]
        for update, keys in sync.update_keys.items():
            if slices is not None and not slices:
                allowed.append(False)  # every element belongs to an abandoned task
                continue
            dataset = stream.dataset if stream is not None else ""
            refusal = sync.local_store.record_local_push(
                [Range((dataset, task.epoch, task.task_id), task.lease, start, end,
                       fingerprint, update)
                 for _, task, start, end, fingerprint in slices or ()], keys)
            if refusal is not None and refusal != "duplicate":
                stream.abandon(live, f"push refused: {{0: '{refusal}'}}")
            allowed.append(refusal is None)
        faults.reached("after_push")
        return allowed


def exchange_class(shared: bool, mode: str) -> type[Exchange]:
    """The exchange of a model whose store is in this process (`shared`) or
    not, compiled with `exchange=mode` ("pipelined" has no push to overlap
    with a store in this process)."""
    if mode not in MODES:
        raise ValueError(f"exchange must be one of {MODES}, got {mode!r}")
    if shared:
        return InProcessExchange
    return PipelinedExchange if mode == "pipelined" else SyncExchange

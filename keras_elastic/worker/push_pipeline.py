"""The pipelined exchange: step k's push travels while step k+1 computes.

With `model.compile(..., exchange="pipelined")` the train step does not wait
for its push's reply. `ModelSync.hand_over` hands the push to this pipeline's
thread and returns at once with the newest values that have *arrived* (those
of the previous push's reply), so:

- at most one push is in flight: step k waits for push k-1's reply before it
  sends push k (staleness at most 1, on top of asynchronous SGD's);
- the task accounting stays exact: a task is reported to the master only
  after the reply of the push holding its last elements
  (`ModelSync.completed_seq`), a refused push gives its tasks back when its
  reply arrives, and a batch whose elements were weighed as live when its
  step began but whose task was given back since is not pushed at all (its
  tasks are given back too: the parameter servers' ledger keeps what was
  applied, and the next worker to claim them trains the rest);
- `ModelSync.flush()` waits for the push in flight; the epoch's end, a
  segment's end, replays, pulls (evaluation, the end of `fit`) call it first.

The synchronous exchange (the default) pushes and waits in the step: with one
worker its updates are exactly Keras' (tests/test_training_inprocess.py).

Example:

>>> pipeline = PushPipeline()
>>> pipeline.submit(lambda: "reply", max_seq=3, live=[0, 1, 2, 3])
>>> pipeline.finish().reply
'reply'
>>> pipeline.finish() is None  # nothing in flight
True
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass
class Done:
    """A push whose reply arrived: the reply, the largest task seq of its batch,
    and the seqs of the live tasks it carried."""

    reply: Any
    max_seq: int
    live: list[int]


class PushPipeline:
    """One push at a time on a background thread."""

    def __init__(self) -> None:
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._inflight: tuple[concurrent.futures.Future, int, list[int]] | None = None

    @property
    def busy(self) -> bool:
        """A push is in flight."""
        return self._inflight is not None

    def submit(self, push: Callable[[], Any], max_seq: int, live: list[int]) -> None:
        """Starts `push()` on the pipeline's thread (call `finish` first)."""
        if self._inflight is not None:
            raise RuntimeError("a push is already in flight: finish() it first")
        self._inflight = (self.then(push), max_seq, live)

    def then(self, work: Callable[[], Any]) -> concurrent.futures.Future:
        """Runs `work()` on the pipeline's thread after what is queued there
        (the push in flight): a lookup ahead sees that push applied.

        >>> pipeline = PushPipeline()
        >>> pipeline.then(lambda: 7).result()
        7
        """
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="keras_elastic_push")
        return self._executor.submit(work)

    def finish(self) -> Done | None:
        """Waits for the push in flight; its reply (None if there was none).
        An error of the push is raised here."""
        if self._inflight is None:
            return None
        future, max_seq, live = self._inflight
        self._inflight = None
        return Done(future.result(), max_seq, live)

    def drop(self) -> None:
        """Waits for the push in flight and ignores its outcome (a `fit` ending
        on an error): the servers' ledger knows what it applied."""
        if self._inflight is not None:
            future = self._inflight[0]
            self._inflight = None
            concurrent.futures.wait([future])

    def close(self) -> None:
        self.drop()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

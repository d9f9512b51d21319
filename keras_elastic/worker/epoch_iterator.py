"""Keras' TF epoch iterator, adapted to epochs whose length the master decides.

Keras remembers the number of batches of the first epoch of a dataset of
unknown size and stops every later epoch after that many (and warns "Your
input ran out of data" each epoch). An elastic worker's epochs differ in
length (it gets however many tasks it gets), so this iterator never remembers
a count: every epoch runs until the task stream ends.

A training stream may also end a *segment* of an epoch (it must not block on
the master while tasks it holds sit in a partial batch): the pipeline runs out,
the tasks are reported, and the epoch goes on over a new iterator of the same
pipeline. `SegmentedIterator` carries that through Keras' fit loop: the
elastic train function (`worker/train_function.py`) takes batches from it
with `next()`, which switches to the next segment when one runs out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import tensorflow as tf
from keras.src.backend.tensorflow import trainer as tf_trainer


class SegmentedIterator:
    """The iterator of one epoch made of one or more segments.

    `next_segment()` asks `on_end` (the stream's `end_segment`) whether the
    epoch goes on; if so it starts a new iterator over the pipeline.
    """

    def __init__(self, dataset, on_end: Callable[[], bool]) -> None:
        self._dataset = dataset
        self._on_end = on_end
        self.current = iter(dataset)

    def next_segment(self) -> bool:
        if not self._on_end():
            return False
        self.current = iter(self._dataset)
        return True

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            try:
                return next(self.current)
            except (StopIteration, tf.errors.OutOfRangeError):
                if not self.next_segment():
                    raise StopIteration from None


class ElasticEpochIterator(tf_trainer.TFEpochIterator):
    # {id(tf.data.Dataset): on_end} of the training pipelines made of segments.
    segmented: dict[int, Callable[[], bool]] = {}

    def _on_end(self) -> Callable[[], bool] | None:
        dataset = getattr(self.data_adapter, "_dataset", None)
        return self.segmented.get(id(dataset)) if dataset is not None else None

    def _enumerate_iterator(self):
        on_end = self._on_end()
        if on_end is None or self.steps_per_epoch:
            yield from super()._enumerate_iterator()
            return
        self.data_adapter.on_epoch_begin()
        iterator = SegmentedIterator(self._get_iterator(), on_end)
        step = -self.steps_per_execution
        while True:
            step += self.steps_per_execution
            self._steps_seen = step + self.steps_per_execution
            yield step, step + self.steps_per_execution - 1, iterator

    @contextlib.contextmanager
    def catch_stop_iteration(self):
        try:
            yield
            self.tf_sync()
        except (StopIteration, tf.errors.OutOfRangeError):
            self._current_iterator = None
            self._num_batches = None
            self.data_adapter.on_epoch_end()


@contextlib.contextmanager
def elastic_epochs(segmented: dict[int, Callable[[], bool]] | None = None):
    """Within this context, Keras' fit/evaluate/predict use `ElasticEpochIterator`.

    `segmented`: `{id(pipeline): on_end}` for training pipelines whose epochs
    may be made of segments (the model's train function must take batches
    with `next()`: see `worker/train_function.py`).
    """
    original = tf_trainer.TFEpochIterator
    iterator_class = type("ElasticEpochIterator", (ElasticEpochIterator,),
                          {"segmented": dict(segmented or {})})
    tf_trainer.TFEpochIterator = iterator_class
    try:
        yield
    finally:
        tf_trainer.TFEpochIterator = original

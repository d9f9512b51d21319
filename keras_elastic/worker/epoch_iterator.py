"""Keras' TF epoch iterator, adapted to epochs whose length the master decides.

Keras remembers the number of batches of the first epoch of a dataset of
unknown size and stops every later epoch after that many (and warns "Your
input ran out of data" each epoch). An elastic worker's epochs differ in
length (it gets however many tasks it gets), so this iterator never remembers
a count: every epoch runs until the task stream ends.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf
from keras.src.backend.tensorflow import trainer as tf_trainer


class ElasticEpochIterator(tf_trainer.TFEpochIterator):
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
def elastic_epochs():
    """Within this context, Keras' fit/evaluate/predict use `ElasticEpochIterator`."""
    original = tf_trainer.TFEpochIterator
    tf_trainer.TFEpochIterator = ElasticEpochIterator
    try:
        yield
    finally:
        tf_trainer.TFEpochIterator = original

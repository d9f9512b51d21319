"""A Keras callback that reports trained tasks to the master.

Added by `ke.Model.fit` in front of the user's callbacks; users never create
it. After each batch it reads the largest task tag the train step has seen
and reports the tasks that are now complete (see `TaskStream`).
"""

from __future__ import annotations

import time

import keras

from keras_elastic.worker.task_stream import TaskStream


class TaskReporter(keras.callbacks.Callback):
    def __init__(self, stream: TaskStream, trained_seq, sync=None,
                 validate=None) -> None:
        super().__init__()
        self.stream = stream
        self._sync = sync
        self._validate = validate  # epoch -> val_* logs (elastic validation)
        self._trained_seq = trained_seq  # tf.Variable set by the train step
        self._batch_start = 0.0
        self._last_seq = -1

    def on_epoch_begin(self, epoch, logs=None):
        self.stream.set_epoch(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        self._batch_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self._sync is not None and self._sync.t_data > self._batch_start:
            self.stream.timer.add("input_wait", self._sync.t_data - self._batch_start)
        self.stream.run_replays()
        if self._sync is not None and self._sync.pipelined:
            # Only batches whose push has returned count as trained.
            seq = self._sync.completed_seq
        else:
            seq = int(self._trained_seq.numpy())
        if seq > self._last_seq:
            self._last_seq = seq
            self.stream.mark_trained(seq)

    def finish_epoch(self) -> None:
        """The epoch's data ran out (not a stop mid-epoch): all tasks trained."""
        if not self.model.stop_training:
            self.stream.finish_epoch()

    def on_epoch_end(self, epoch, logs=None):
        self.finish_epoch()
        if self._validate is not None and not self.model.stop_training:
            # First callback of the list: later ones (History, EarlyStopping,
            # ModelCheckpoint, the progress bar) see the val_* entries.
            val_logs = self._validate(epoch)
            if val_logs and logs is not None:
                logs.update(val_logs)

"""The train function Keras' `fit` calls for an elastic model.

Keras' `fit` loop calls `model.train_function(iterator)` once per step (or
per `steps_per_execution` steps). For an elastic `fit` it is a
`TrainFunction`:

1. takes the next batch of the task-fed pipeline: `(tags, data)`, where
   `tags[i] = [seq, position, fingerprint]` says which task (and which of its
   elements) element `i` is (see `dataset.py`);
2. drops the elements of tasks this worker gave back since they entered the
   pipeline (their pushes were refused: the servers never take them from this
   worker again; the master hands the tasks out anew), or skips the batch if
   none is left;
3. runs the compiled step: the model's own `train_step(data)` (Keras' or the
   user's), traced inside a `StepContext` holding `tags`, so that every
   optimizer apply in it pushes to the servers with the batch's task ranges
   (`worker/remote_optimizer.py`);
4. records the largest task seq trained (the `TaskReporter` reports every
   task whose elements are all trained).

A model with `ke.layers.Embedding` tables and Keras' default step gets the
same step with its tables' rows looked up in one exchange and their
gradients pushed with the dense ones (`embedding_step`). With the pipelined
exchange the train function takes each batch one step ahead, so that its
rows are looked up while the step before it computes
(`TableLookups.look_ahead`): the lookup leaves the step's critical path. A
step of the user's own cannot take the gradient of rows that are not
variables: such a model gets an error naming the layer.

Catching up a task that some servers applied only in part
(`worker/replay.py`) runs the same compiled step on the task's elements
again: the servers apply each update only where it is new, so any step,
with any number of optimizers, is caught up exactly.

Example (what `fit` does):

```python
runtime = TrainFunction(model, sync, stream, tf_dataset.element_spec)
model.train_function = runtime      # Keras' fit loop calls runtime(iterator)
```
"""

from __future__ import annotations

import functools
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_elastic.common import keras_compat, step_context
from keras_elastic.common.keras_compat import SegmentedIterator, uses_keras_train_step
from keras_elastic.layers.embedding import embedding_step


class TrainFunction:
    """`model.train_function` during an elastic `fit` (see the module doc)."""

    def __init__(self, model: keras.Model, sync: Any, stream: Any,
                 element_spec: Any = None) -> None:
        self.model = model
        self.sync = sync
        self.stream = stream
        self.element_spec = element_spec
        self.trained_seq = -1      # largest task seq of a batch trained
        self.last_logs: Any = None
        self.replaying = False
        # (iterator, the next batch, its lookup ahead): taken one step early.
        self._held: tuple | None = None
        if sync.tables and uses_keras_train_step(model):
            step = self._table_step
        else:
            step = model.train_step
        self._step_fn = step
        self._compiled = tf.function(self._traced_step, reduce_retracing=True)

    # -- the compiled step ------------------------------------------------
    def _traced_step(self, tags, data, allowed):
        if isinstance(data, tuple) and len(data) == 1:
            data = data[0]  # `fit(x)` without labels: the step gets x, as in Keras
        with step_context.stepping(self, tags, allowed) as context:
            if not self.sync.local:
                context.bases = self.sync.non_trainable_values()
            return self._step_fn(data)

    def _table_step(self, data):
        """Keras' default train step, with the rows of the model's server
        tables looked up first (in one exchange) and their gradients pushed
        with the model optimizer's update."""
        model, sync = self.model, self.sync
        x, y, sample_weight = keras_compat.unpack_x_y_sample_weight(data)
        prefetched = sync.lookups.prefetch(x)
        with tf.GradientTape() as tape, embedding_step(tape, prefetched) as lookups:
            if keras_compat.call_has_training_arg(model):
                y_pred = model(x, training=True)
            else:
                y_pred = model(x)
            loss = keras_compat.compute_loss(model, x, y, y_pred, sample_weight)
            keras_compat.loss_tracker(model).update_state(
                loss, sample_weight=tf.shape(
                    next(i for i in tf.nest.flatten(x) if i is not None))[0])
            loss = model.optimizer.scale_loss(loss)
        trainable = list(model.trainable_weights)
        grads = tape.gradient(loss, trainable + [rows for _, _, rows in lookups])
        step_context.current().row_grads = [
            (layer.table_name, ids, g) for (layer, ids, _), g in zip(
                lookups, grads[len(trainable):]) if g is not None]
        model.optimizer.apply(grads[:len(trainable)], trainable)
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def ensure_traced(self) -> None:
        """Traces the step once (without running it) if it never ran: what
        the step's updates are (`ModelSync.updates`) is known from then on."""
        if self.sync.updates or self.element_spec is None:
            return
        tags_spec, data_spec = self.element_spec
        self._compiled.get_concrete_function(tags_spec, data_spec,
                                             tf.TensorSpec([None], tf.bool))

    def _allowed(self, tags: np.ndarray) -> tf.Tensor:
        """What the task log says of each update of the step, when the step
        applies them itself (a store in this process: `ModelSync.local`)."""
        if not self.sync.local:
            return _nothing()
        if not self.sync.update_keys:
            self.ensure_traced()
        return tf.constant(self.sync.local_allow(tags), tf.bool)

    # -- what Keras calls ---------------------------------------------------
    def __call__(self, iterator):
        logs = None
        for k in range(max(1, int(getattr(self.model, "steps_per_execution", 1) or 1))):
            try:
                tags, data = self._take(iterator)
            except (StopIteration, tf.errors.OutOfRangeError):
                if k == 0:
                    raise StopIteration from None
                break
            logs = self.run(tags, data)
        return logs

    def _take(self, iterator):
        """The next batch of `iterator`. With the pipelined exchange and
        server tables, the one after it is taken too (held by the iterator)
        and its rows' lookup started (`TableLookups.look_ahead`), within the
        pipeline's current segment only: the end of a segment (which reports
        its tasks) is reached only by the step that needs the batch after
        it."""
        held, self._held = self._held, None
        if held is not None and held[0] is iterator and not isinstance(
                iterator, SegmentedIterator):
            batch, ahead = held[1], held[2]
        else:
            batch = next(iterator)
            ahead = held[2] if held is not None and held[1] is batch else None
        if self.sync.pipelined and self.sync.tables:
            if isinstance(iterator, SegmentedIterator):
                following = iterator.peek(segment_only=True)
            else:
                try:
                    following = next(iterator)
                except (StopIteration, tf.errors.OutOfRangeError):
                    following = None
            if following is not None:
                self._held = (iterator, following,
                              self.sync.lookups.look_ahead(following[1]))
        self.sync.lookups.rows_ahead = ahead
        return batch

    def run(self, tags, data):
        """One step on one batch of the pipeline."""
        self.sync.data_ready()
        tags_np = tags.numpy()
        seqs = tags_np[:, 0]  # (an eager slice of the tensor costs more)
        if self.stream is not None and self.stream.has_dead():
            keep = self.stream.live_mask(seqs).astype(bool)
            if not keep.all():
                if not keep.any():
                    return self.last_logs if self.last_logs is not None else {}
                where = np.flatnonzero(keep)
                tags, data = take_rows(tags, where), take_rows(data, where)
                tags_np, seqs = tags_np[where], seqs[where]
        self.sync.prepare_step()
        allowed = self._allowed(tags_np)
        if self.sync.refresh_due:
            # Traced first (seconds, the first time), so that the gradient is
            # of the servers' values as they are when the step runs.
            self._compiled.get_concrete_function(tags, data, allowed)
            self.sync.refresh()
        self.sync.begin_step()
        logs = self._compiled(tags, data, allowed)
        if not self.sync.pipelined and len(seqs):
            self.trained_seq = max(self.trained_seq, int(seqs.max()))
        self.last_logs = logs
        return logs

    def replay(self, tags, data) -> None:
        """Runs the step on elements of a task being caught up (between steps,
        on the training thread): metrics are left as they were (those
        elements were counted when first trained), updates already applied
        are duplicates the servers ignore."""
        metrics = [(v, v.numpy()) for v in self.model.metrics_variables]
        self.replaying = self.sync.replaying = True
        try:
            self.sync.prepare_step()
            allowed = self._allowed(tags)
            self.sync.begin_step()
            self._compiled(tf.constant(tags), data, allowed)
            self.sync.flush()
        finally:
            self.replaying = self.sync.replaying = False
            for variable, value in metrics:
                variable.assign(value)


@functools.cache
def _nothing() -> tf.Tensor:
    """`allowed` when updates go to the servers (made on first use: importing
    this module starts no TensorFlow runtime, so a warm process can fork
    after it; launcher/warm/)."""
    return tf.constant([], tf.bool)


def take_rows(nest: Any, rows: np.ndarray) -> Any:
    """The elements `rows` of each batched component of `nest` (dense,
    ragged or sparse), in order."""
    index = tf.constant(rows, tf.int64)

    def take(t):
        if t is None:
            return None
        if isinstance(t, tf.SparseTensor):
            batch = int(t.dense_shape[0])
            new_row = np.full(batch, -1, np.int64)
            new_row[rows] = np.arange(len(rows))
            indices = t.indices.numpy()
            mapped = new_row[indices[:, 0]]
            kept = mapped >= 0
            indices = np.concatenate([mapped[kept, None], indices[kept, 1:]], axis=1)
            shape = t.dense_shape.numpy().copy()
            shape[0] = len(rows)
            return tf.SparseTensor(indices, tf.boolean_mask(t.values, kept), shape)
        return tf.gather(t, index)

    return tf.nest.map_structure(take, nest)

"""A Keras callback that reports trained tasks to the master.

Added by `ke.Model.fit` in front of the user's callbacks; users never create
it. After each batch it reads the largest task tag the train step has seen
and reports the tasks that are now complete (see `TaskStream`).

It also makes the epoch's training metrics the job's: each report of tasks
done carries the change of this worker's metric states (loss total and count,
metric totals, ...) since its previous report, the master sums them per epoch
as it sums evaluation states, and at the end of the epoch every worker loads
the sums and logs their `result()`. So `loss` and the metrics in the epoch's
logs (the progress line, `History`, `EarlyStopping`, the CLI's "final
metrics") are those of every batch the job trained in the epoch, on whichever
worker: the same on every worker, also on one that trained no batch of the
epoch (its own metrics would read 0.0).
"""

from __future__ import annotations

import time

import keras
import numpy as np
from absl import logging

from keras_elastic.common.tensor_codec import encode_all
from keras_elastic.worker.metric_states import is_additive, state_variables
from keras_elastic.worker.task_stream import TaskStream


class TaskReporter(keras.callbacks.Callback):
    def __init__(self, stream: TaskStream, trained_seq, sync=None,
                 job_metrics: JobMetrics | None = None) -> None:
        super().__init__()
        self.stream = stream
        self._sync = sync
        self._trained_seq = trained_seq  # () -> largest task seq trained
        self._batch_start = 0.0
        self._last_seq = -1
        self.epoch = 0  # the epoch running (or last run)
        self._epoch_ended = False  # its tasks all reported (`end_training_epoch`)
        # The last epoch's logs as the callbacks saw them (the job's figures).
        self._last_epoch_logs: dict | None = None
        # The stream's training hooks send its states with each report.
        self.job_metrics = job_metrics if job_metrics is not None else JobMetrics()

    def set_model(self, model):
        super().set_model(model)
        self.job_metrics.model = model

    def on_train_begin(self, logs=None):
        self.job_metrics.active = True

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch, self._epoch_ended = epoch, False
        self.stream.set_epoch(epoch)
        self.job_metrics.start_epoch()
        if self._sync is not None:
            self._sync.refresh_due = True

    def on_train_batch_begin(self, batch, logs=None):
        self._batch_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.job_metrics.learn_names(logs)
        self.job_metrics.note_logs(logs)
        if self._sync is not None and self._sync.t_data > self._batch_start:
            self.stream.timer.add("input_wait", self._sync.t_data - self._batch_start)
        self.stream.run_replays()
        if self._sync is not None and self._sync.pipelined:
            # Only batches whose push has returned count as trained.
            seq = self._sync.completed_seq
        else:
            seq = self._trained_seq()
        if seq > self._last_seq:
            self._last_seq = seq
            self.stream.mark_trained(seq)

    def on_test_begin(self, logs=None):
        # Keras' own validation (a validation_data that is not an
        # ElasticDataset) runs before on_epoch_end and resets the metrics:
        # keep the epoch's training states for the last report.
        self.job_metrics.freeze()

    def give_back_unfinished(self) -> None:
        """The fit stopped in the middle of an epoch (`model.stop_training`:
        TerminateOnNaN, a callback): this worker trains none of the tasks it
        still holds, so they go back to the master for the other workers
        (the job's epoch, which they wait on, needs them), the push in flight
        first: the task logs then hold every element applied, which the next
        holder skips."""
        if self._epoch_ended:
            return
        self._epoch_ended = True
        if self._sync is not None:
            self._sync.flush()
        held = [seq for seq, _ in self.stream.pending(float("inf"))]
        self.stream.abandon(held, "the fit stopped (model.stop_training)")

    def end_training_epoch(self) -> None:
        """The epoch's training is over on this worker: unless it stopped
        mid-epoch, its data ran out and every task is reported (once per
        epoch: before the epoch's validation, which waits for the job's epoch
        to end, or else at the epoch's end)."""
        if not self._epoch_ended and not self.model.stop_training:
            self._epoch_ended = True
            self.stream.finish_epoch()

    def on_epoch_end(self, epoch, logs=None):
        self.end_training_epoch()
        if not self.model.stop_training and logs is not None:
            # First callback of the list: later ones (History, EarlyStopping,
            # ModelCheckpoint, the progress bar) see the job's numbers, in
            # Keras' order: the training logs, then the validation's (a
            # worker that trained no batch of the epoch has only the latter).
            # Only the training logs are tied to the job's metrics: after
            # Keras' validation the metrics hold the validation's results, so
            # a worker that trained no batch had its `val_loss` equal to the
            # metric `loss` and logged the job's training loss under it.
            training = {k: v for k, v in logs.items() if not k.startswith("val_")}
            job = self.job_metrics.job_logs(self.stream, epoch, training)
            merged = {**job, **{k: v for k, v in logs.items() if k not in job}}
            logs.clear()
            logs.update(merged)
            self._last_epoch_logs = dict(merged)
        self.job_metrics.end_epoch()
        if self._sync is not None and not self.model.stop_training:
            # The epoch is over for the job: the model and its optimizers hold
            # the servers' values, which the next callbacks (ModelCheckpoint,
            # BackupAndRestore) save.
            self._sync.pull()
            self._sync.pull_optimizer_state()

    def on_train_end(self, logs=None):
        self.job_metrics.active = False
        if logs is not None and self._last_epoch_logs is not None:
            # Keras passes on_train_end its own last epoch logs (this worker's
            # batches), not the callbacks' copy this reporter gave the job's
            # figures: every callback after it sees the job's last epoch logs.
            logs.clear()
            logs.update(self._last_epoch_logs)


# Keys of the reports' sums that carry a train_step's own logs (`note_logs`):
# no metric state is named so.
OTHER_LOG = "keras_elastic.log/"
OTHER_LOG_COUNT = "keras_elastic.log_count/"


class JobMetrics:
    """A worker's share of the epoch's training metric states, sent with its
    task reports, and the job's metrics from the master's sums.

    The shares are differences of the states since the previous report
    (float64, or int64 for integer states): summed over a worker's reports
    they give its states at its last report exactly, and summed over workers
    the job's. Only additive states (`aggregation="sum"`, every Keras metric)
    can be summed; with another one the worker keeps its own numbers, with a
    warning.
    """

    def __init__(self) -> None:
        self.model: keras.Model | None = None
        self._sent: dict[str, np.ndarray] = {}
        self._frozen: dict[str, np.ndarray] | None = None
        self._in_epoch = False
        self._warned = False
        self.active = False  # between the fit's on_train_begin and on_train_end
        self._renamed: dict[str, str] = {}  # log key -> metric name (learn_names)
        self._learning, self._tries = True, 0
        # The last batch's logs that are no metric's (a train_step's own
        # values): sent as (value, 1) beside the states (`note_logs`).
        self._other_logs: dict[str, float] = {}
        self._metric_names: set[str] | None = None  # note_logs: read once an epoch

    def report_states(self) -> list | None:
        """What to send with a report of tasks done: the states' change since
        the previous report while training runs, else None."""
        if not self.active or self.model is None:
            return None
        return self.states_since_last_report()

    def variables(self) -> list[tuple[str, object]] | None:
        """`(key, variable)` of the model's metric states (keys as evaluation
        uses them), or None if one of them is not additive."""
        out = []
        for key, variable, metric in state_variables(self.model):
            if not is_additive(variable):
                if not self._warned:
                    self._warned = True
                    logging.warning(
                        "metric '%s' has a state with aggregation='%s', which "
                        "cannot be summed over workers: each worker logs its own "
                        "training metrics", metric.name, variable.aggregation)
                return None
            out.append((key, variable))
        return out

    def note_logs(self, logs: dict | None) -> None:
        """Keeps the batch's scalar logs that are no metric's result (nor tied
        to one by `learn_names`): a custom train_step's own values. Sent with
        the reports as their value and a count of 1, so that the job's sums
        give every worker their mean over the workers' last batches: a worker
        that trained no batch of the epoch logs them too (Keras logs a
        train_step's values at each epoch's end)."""
        if not logs or self.model is None:
            return
        if self._metric_names is None:  # (built by the epoch's 1st batch, before)
            self._metric_names = set(self.model.get_metrics_result())
        for key, value in logs.items():
            if (key not in self._metric_names and key not in self._renamed
                    and (value := _scalar(value)) is not None):
                self._other_logs[key] = value

    def _read(self) -> dict[str, np.ndarray] | None:
        variables = self.variables()
        if variables is None:
            return None
        out = {}
        for key, variable in variables:
            value = np.asarray(keras.ops.convert_to_numpy(variable.value))
            out[key] = value.astype(np.float64 if value.dtype.kind == "f" else np.int64)
        for key, value in self._other_logs.items():
            out[OTHER_LOG + key] = np.float64(value)
            out[OTHER_LOG_COUNT + key] = np.int64(1)
        return out

    def start_epoch(self) -> None:
        """Keras has just reset the metrics."""
        self._sent, self._frozen, self._in_epoch = {}, None, True
        self._other_logs, self._metric_names = {}, None

    def end_epoch(self) -> None:
        self._frozen, self._in_epoch = None, False

    def freeze(self) -> None:
        """Keeps the states as they are now for the epoch's remaining reports
        (the epoch's training is over; an evaluation is about to reset them)."""
        if self._in_epoch and self._frozen is None:
            self._frozen = self._read()

    def states_since_last_report(self) -> list | None:
        """The encoded change of the states since the previous report (only
        the states that changed); None if nothing changed or not additive."""
        current = self._frozen if self._frozen is not None else self._read()
        if current is None:
            return None
        delta = {}
        for key, value in current.items():
            previous = self._sent.get(key)
            change = value if previous is None else value - previous
            if np.any(change):
                delta[key] = change
        self._sent = dict(current)
        return list(encode_all(delta.items())) if delta else None

    def job_logs(self, stream: TaskStream, epoch: int,
                 logs: dict | None = None) -> dict[str, float]:
        """The job's training metrics of `epoch`, once the master has closed
        it (the workers holding its last tasks report them); {} if the states
        cannot be summed, or no worker sent any, or tasks of the epoch went
        back to the master's queue meanwhile (a worker left: this one trains
        them in its next pass instead of waiting for a replacement, and logs
        its own numbers for the epoch)."""
        variables = self.variables()
        if variables is None:
            return {}
        while True:
            result = stream.master.get_result(stream.dataset, epoch, wait=False)
            if result is not None:
                break
            ds = stream.master.job_status().datasets.get(stream.dataset)
            if ds is not None and (ds.epoch > epoch or ds.finished):
                # (An epoch's result is kept as it ends: none for an epoch
                # over means one before a resume; never wait for it. Asked
                # again: the epoch may have ended since the first ask.)
                result = stream.master.get_result(stream.dataset, epoch, wait=False)
                if result is None:
                    return {}
                break
            if ds is not None and ds.epoch == epoch and ds.todo > 0:
                logging.warning(
                    "epoch %d: %d task(s) went back to the master's queue (a worker "
                    "left); this worker trains them now and logs its own training "
                    "metrics for the epoch", epoch + 1, ds.todo)
                return {}
        sums = result[1]
        if not sums:
            return {}
        return self.from_sums(sums, logs)

    def learn_names(self, logs: dict | None) -> None:
        """Learns, from a batch's logs, which metric each log of another name
        is: a train_step of the model's own may log a metric under another
        name (`{"loss": self.total_loss_tracker.result()}`), and right after
        the step such a log equals that metric's result. Learnt once, so an
        epoch in which this worker trained no batch (Keras then ends it with
        the previous epoch's last logs) still gets the job's value."""
        if not self._learning or not logs or self.model is None:
            return
        mine = {k: _scalar(v) for k, v in self.model.get_metrics_result().items()}
        self._renamed.update(_ties(logs, mine, self._renamed))
        self._tries += 1
        if self._tries >= 20 or all(k in mine or k in self._renamed for k in logs):
            self._learning = False  # nothing (more) to learn, or ambiguous

    def from_sums(self, sums: dict, logs: dict | None = None) -> dict[str, float]:
        """The model's metric results with its states set to the job's `sums`
        (keys as `variables()` gives them), and the logs of other names that
        `learn_names` (or, failing that, their value now) ties to a metric."""
        mine = {k: _scalar(v) for k, v in self.model.get_metrics_result().items()}
        renamed = {**self._renamed, **_ties(logs or {}, mine, self._renamed)}
        for key, variable in self.variables() or ():
            value = sums.get(key)
            variable.assign(np.zeros(variable.shape, variable.dtype) if value is None
                            else np.asarray(value).astype(variable.dtype))
        out = {k: float(v) if np.ndim(v) == 0 else v
               for k, v in self.model.get_metrics_result().items()}
        for key, name in renamed.items():
            if name in out:
                out[key] = out[name]
        for key, total in sums.items():
            if not key.startswith(OTHER_LOG):
                continue
            name = key[len(OTHER_LOG):]
            count = sums.get(OTHER_LOG_COUNT + name)
            if count is not None and int(count) > 0:
                out.setdefault(name, float(total) / int(count))
        return out


def _ties(logs: dict, mine: dict[str, float | None],
          known: dict[str, str]) -> dict[str, str]:
    """{log key: metric name} for the logs not named after a metric (nor in
    `known`) whose value equals exactly one metric's result in `mine` among
    the metrics not logged under their own name."""
    out = {}
    for key, value in logs.items():
        if key in mine or key in known:
            continue
        value = _scalar(value)
        same = [m for m, r in mine.items() if m not in logs and r is not None
                and r == value]
        if value is not None and len(same) == 1:
            out[key] = same[0]
    return out


def _scalar(value) -> float | None:
    """`value` as a float if it is a scalar number, else None."""
    try:
        array = np.asarray(keras.ops.convert_to_numpy(value))
    except (TypeError, ValueError):
        return None
    return float(array) if array.ndim == 0 and array.dtype.kind in "fiu" else None

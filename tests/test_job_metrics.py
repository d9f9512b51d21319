"""The epoch's job-wide training metrics on a worker (`JobMetrics`), in process.

A train_step of the model's own may log a metric under another name
(keras-io's VAE logs `{"loss": self.total_loss_tracker.result()}`). A worker
that trained no batch in an epoch ends it, in Keras' loop, with the previous
epoch's last logs, and its trackers were reset: the log's value then ties it to
no metric, so the tie must have been learnt from an earlier batch. (A CI run's
2-worker VAE job logged worker 0's stale 294.09 as the job's loss, while the
other worker logged the job's 281.48 = reconstruction 278.42 + KL 3.06.)
"""

import keras
import numpy as np
import pytest

from keras_elastic.worker.metric_states import state_variables
from keras_elastic.worker.task_reporter import JobMetrics


class Tracked(keras.Model):
    """Logs its total under "loss" and its tracker as "total_loss"."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)
        self.total = keras.metrics.Mean(name="total_loss")
        self.part = keras.metrics.Mean(name="part_loss")

    def call(self, x):
        return self.dense(x)

    @property
    def metrics(self):
        return [self.total, self.part]

    def train_step(self, data):
        x, y = data
        loss = keras.ops.mean(keras.ops.square(self(x) - y))
        self.total.update_state(loss + 1.0)
        self.part.update_state(loss)
        return {"loss": self.total.result(), "part_loss": self.part.result()}


class Learn(keras.callbacks.Callback):
    def __init__(self, metrics):
        super().__init__()
        self.job = metrics

    def on_train_batch_end(self, batch, logs=None):
        self.job.learn_names(logs)


def job_sums(model, total, count):
    """The master's sums: the total tracker at (total, count), the part at (3, 1)."""
    sums = {}
    for key, variable, metric in state_variables(model):
        if metric.name == "total_loss":
            sums[key] = np.float64(total if "total" in variable.name else count)
        else:
            sums[key] = np.float64(3.0 if "total" in variable.name else 1.0)
    return sums


@pytest.fixture
def trained():
    model = Tracked()
    model.compile(optimizer="sgd")
    learned = JobMetrics()
    learned.model = model
    x = np.random.default_rng(0).normal(size=(32, 3)).astype("float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=[Learn(learned)])
    return model, learned


def test_a_renamed_log_gets_the_job_value_in_an_epoch_with_no_batch(trained):
    model, learned = trained
    model.reset_metrics()  # the next epoch began; this worker trained no batch of it
    stale = {"loss": 294.09, "part_loss": 290.0}
    out = learned.from_sums(job_sums(model, total=281.5 * 4, count=4), stale)
    assert out["loss"] == pytest.approx(281.5) and out["total_loss"] == out["loss"]
    assert out["part_loss"] == pytest.approx(3.0)


def test_without_a_learnt_name_a_stale_log_is_not_guessed(trained):
    model, _ = trained
    model.reset_metrics()
    unlearned = JobMetrics()
    unlearned.model = model
    out = unlearned.from_sums(job_sums(model, total=10.0, count=4),
                              {"loss": 294.09, "part_loss": 290.0})
    assert "loss" not in out  # the caller keeps its own log; no wrong tie is made
    assert out["total_loss"] == pytest.approx(2.5)


def test_a_log_that_equals_its_metric_now_is_still_tied_without_learning(trained):
    model, _ = trained
    unlearned = JobMetrics()
    unlearned.model = model
    now = float(model.get_metrics_result()["total_loss"])
    out = unlearned.from_sums(job_sums(model, total=10.0, count=4), {"loss": now})
    assert out["loss"] == pytest.approx(2.5)


class Constant(keras.Model):
    """keras' trainer_test CustomTrainTestStepModel: its train_step logs a
    value that is no metric's ("my_custom_metric": 10.0)."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        logs = super().train_step(data)
        logs["my_custom_metric"] = 10.0
        return logs


def test_a_train_steps_own_log_reaches_a_worker_that_trained_no_batch():
    """A worker that trained no batch of the epoch (the others took every
    task) ends it with Keras' empty logs; the job's logs it takes must still
    have the train_step's own values (keras' trainer_test
    test_fit_with_custom_train_step failed on such a worker with KeyError:
    'my_custom_metric'). Each worker sends its last batch's value with a
    count; every worker logs their mean."""
    model = Constant()
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    trained = JobMetrics()
    trained.model = model
    trained.start_epoch()

    class Note(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            trained.learn_names(logs)
            trained.note_logs(logs)

    x = np.random.default_rng(0).normal(size=(32, 3)).astype("float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=[Note()])
    sums = trained._read()  # its reports' states, summed by the master
    assert "keras_elastic.log/my_custom_metric" in sums
    assert "keras_elastic.log/loss" not in sums and "keras_elastic.log/mae" not in sums
    idle = JobMetrics()  # the worker that trained no batch
    idle.model = model
    model.reset_metrics()
    out = idle.from_sums(sums, {})
    assert out["my_custom_metric"] == pytest.approx(10.0)
    assert set(out) >= {"loss", "mae", "my_custom_metric"}
    # Two workers' last values: their mean, on every worker.
    both = dict(sums)
    both["keras_elastic.log/my_custom_metric"] = np.float64(10.0 + 12.0)
    both["keras_elastic.log_count/my_custom_metric"] = np.int64(2)
    assert idle.from_sums(both, {})["my_custom_metric"] == pytest.approx(11.0)

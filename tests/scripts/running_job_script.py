"""A two-epoch-or-more job that stops for the test at its first epoch's end.

Every worker, at the end of epoch 0, writes `<wait_dir>/ready-<id>` and waits
for `<wait_dir>/go` (written by the test once it has looked at the running
job: `keras-elastic status`). Besides: two `keras.callbacks.TensorBoard`s with a
worker-own validation (a `tf.data.Dataset` as `validation_data`), one as an
elastic job gives
it (`<tb_dir>/per_worker`) and one with `keras_elastic_per_worker = False`
(`<tb_dir>/keras_layout`); an `EarlyStopping` on the epoch's training loss,
which must stop every worker at the same epoch; and each worker's logs of
every epoch in `<wait_dir>/logs-<id>.json` (tests/test_running_job.py).
"""

import json
import os
import sys
import time

import keras
import tensorflow as tf
from absl import app, flags

import keras_elastic as ke

# tests/ on sys.path, for tests/support/.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support.tfrecord_data import NUM_FEATURES, make_arrays  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("wait_dir", None, "Where the ready/go files are.")
flags.DEFINE_string("tb_dir", None, "TensorBoard log dirs' parent.")
flags.DEFINE_integer("epochs", 6, "Epochs (EarlyStopping ends it sooner).")


def worker_id() -> str:
    return os.environ["KERAS_ELASTIC_WORKER_ID"]


class WaitAtFirstEpochEnd(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch != 0:
            return
        open(os.path.join(FLAGS.wait_dir, f"ready-{worker_id()}"), "w").close()
        go = os.path.join(FLAGS.wait_dir, "go")
        deadline = time.monotonic() + 300
        while not os.path.exists(go):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{go} never came")
            time.sleep(0.1)


class RecordLogs(keras.callbacks.Callback):
    def __init__(self, early_stopping):
        super().__init__()
        self.early_stopping = early_stopping
        self.epochs = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append({k: float(v) for k, v in (logs or {}).items()
                            if k != "learning_rate"})

    def on_train_end(self, logs=None):
        with open(os.path.join(FLAGS.wait_dir, f"logs-{worker_id()}.json"), "w") as f:
            json.dump({"epochs": self.epochs,
                       "stopped_epoch": self.early_stopping.stopped_epoch}, f)


def main(argv):
    del argv
    keras.utils.set_random_seed(0)
    x, y = make_arrays(512)
    xv, yv = make_arrays(64, seed=1)
    model = ke.Sequential([keras.Input((NUM_FEATURES,)),
                           keras.layers.Dense(8, activation="relu"),
                           keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    train = ke.ElasticDataset((x, y), batch_size=16, minibatches_per_task=4)
    per_worker = keras.callbacks.TensorBoard(os.path.join(FLAGS.tb_dir, "per_worker"))
    keras_layout = keras.callbacks.TensorBoard(
        os.path.join(FLAGS.tb_dir, "keras_layout"))
    keras_layout.keras_elastic_per_worker = False
    # The loss goes down by far less than 10 an epoch: no epoch after the first
    # improves on it, so patience=2 stops training after epoch 2 (0-based).
    early_stopping = keras.callbacks.EarlyStopping(monitor="loss", min_delta=10.0,
                                                   patience=2)
    validation = tf.data.Dataset.from_tensor_slices((xv, yv)).batch(32)
    model.fit(train, epochs=FLAGS.epochs, verbose=2, validation_data=validation,
              callbacks=[per_worker, keras_layout, early_stopping,
                         WaitAtFirstEpochEnd(), RecordLogs(early_stopping)])


if __name__ == "__main__":
    app.run(main)

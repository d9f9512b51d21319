"""A worker program for the multi-process tests (run by `keras-elastic run`).

Trains a small model on TFRecord shards; writes its pid to the job dir so a
test can kill it, and (worker 0 or --all_write) its final weights and the
parameter servers' status.
"""

import json
import os
import time

import keras
import numpy as np
import tensorflow as tf
from absl import app, flags

import keras_elastic as ke

FLAGS = flags.FLAGS
flags.DEFINE_string("data", None, "TFRecord pattern.")
flags.DEFINE_integer("epochs", 1, "Epochs.")
flags.DEFINE_integer("batch_size", 32, "Batch size.")
flags.DEFINE_integer("minibatches_per_task", 4, "Minibatches per task.")
flags.DEFINE_float("sleep_per_batch", 0.0, "Seconds to sleep after each batch.")
flags.DEFINE_string("output", None, "Where worker 0 writes weights (.npz).")
flags.DEFINE_integer("exit_code", 0, "Exit with this code right away (crash tests).")
flags.DEFINE_string("checkpoint_dir", None, "Save a checkpoint every epoch here.")
flags.DEFINE_string("barrier", None, "EPOCH:N: at the end of epoch EPOCH (0-based; "
                    "-1: before training) wait until N workers joined the job (tests "
                    "drive a job's moments with it instead of racing it).")
flags.DEFINE_string("late_worker", None, "ID:EPOCH: worker ID calls fit only once the "
                    "job's training reached epoch EPOCH (0-based): the others trained "
                    "the epochs before while it was busy elsewhere.")
flags.DEFINE_bool("write_history", False, "Each worker writes its fit's History to "
                  "history-<worker id>.json in the job directory.")
flags.DEFINE_integer("hidden", 16, "Units of the hidden layer (a larger model "
                     "makes the parameter servers' work the larger share).")
flags.DEFINE_enum("optimizer", "sgd", ["sgd", "adam"], "The optimizer.")
flags.DEFINE_bool("slow_second_save", False, "The 2nd save stalls in the sharding "
                  "callback (on the parameter server) after writing a marker file.")


class SlowSecondSave(tf.train.experimental.ShardingCallback):
    """Runs on the parameter server (shipped with cloudpickle)."""

    def __init__(self, marker_dir):
        self.marker_dir = marker_dir

    @property
    def description(self):
        return "all in one shard; the second save stalls"

    def __call__(self, shardable_tensors):
        first = os.path.join(self.marker_dir, "first-save")
        if os.path.exists(first):
            open(os.path.join(self.marker_dir, "saving"), "w").close()
            time.sleep(120)
        open(first, "w").close()
        shard = {}
        for t in shardable_tensors:
            shard.setdefault(t.checkpoint_key, {})[t.slice_spec] = t.tensor
        return [shard]


def joined(cluster) -> set[int]:
    """The workers that joined the job so far: alive, or since exited or lost
    (a worker scaled down before this one reached its barrier counts)."""
    workers = cluster.master.status()["workers"]
    return {*workers["alive"], *workers["exited"], *workers["lost_ids"]}


def wait_for_workers(cluster, count: int) -> None:
    deadline = time.monotonic() + 300
    while len(joined(cluster)) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"--barrier: {count} workers never joined")
        time.sleep(0.1)


def wait_for_epoch(cluster, dataset: str, epoch: int) -> None:
    """Until `dataset` is registered and at `epoch` or later."""
    deadline = time.monotonic() + 300
    while True:
        ds = cluster.master.job_status().datasets.get(dataset)
        if ds is not None and (ds.epoch >= epoch or ds.finished):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"--late_worker: '{dataset}' never reached epoch {epoch}")
        time.sleep(0.1)


def main(argv):
    del argv
    import sys

    # tests/ on sys.path, for tests/support/.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from support.tfrecord_data import dataset_fn

    if FLAGS.exit_code:
        print("crashing on purpose", flush=True)
        os._exit(FLAGS.exit_code)
    job_dir = os.environ.get("KERAS_ELASTIC_JOB_DIR")
    cluster = ke.worker.get_cluster()
    if job_dir:
        with open(os.path.join(job_dir, f"pid-{cluster.worker_id}"), "w") as f:
            f.write(str(os.getpid()))
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8,))
    h = keras.layers.Dense(FLAGS.hidden, activation="relu")(inputs)
    h = keras.layers.BatchNormalization()(h)
    outputs = keras.layers.Dense(2, activation="softmax")(h)
    model = ke.Model(inputs, outputs)
    optimizer = (keras.optimizers.Adam(0.001) if FLAGS.optimizer == "adam"
                 else keras.optimizers.SGD(0.05))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    callbacks = []
    if FLAGS.barrier:
        at, count = (int(v) for v in FLAGS.barrier.split(":"))
        if at < 0:
            wait_for_workers(cluster, count)
        else:
            callbacks.append(keras.callbacks.LambdaCallback(
                on_epoch_end=lambda epoch, logs: epoch == at and wait_for_workers(
                    cluster, count)))
    if FLAGS.sleep_per_batch:
        callbacks.append(keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda b, logs: time.sleep(FLAGS.sleep_per_batch)))
    if FLAGS.checkpoint_dir:
        callbacks.append(ke.callbacks.ShardedModelCheckpoint(
            FLAGS.checkpoint_dir, sharding_callback=SlowSecondSave(
                os.environ["KERAS_ELASTIC_JOB_DIR"]) if FLAGS.slow_second_save else None))
        if FLAGS.slow_second_save:
            # What the first checkpoint holds: the servers' values at the end
            # of epoch 1, which the model holds after it (one worker).
            callbacks.append(keras.callbacks.LambdaCallback(
                on_epoch_end=lambda epoch, logs: epoch == 0 and np.savez(
                    os.path.join(job_dir, "epoch-1.npz"), *model.get_weights())))
    if FLAGS.late_worker:
        late, epoch = (int(v) for v in FLAGS.late_worker.split(":"))
        if cluster.worker_id == late:
            wait_for_epoch(cluster, "training", epoch)
    history = model.fit(ke.ElasticDataset(FLAGS.data, dataset_fn=dataset_fn,
                                          batch_size=FLAGS.batch_size,
                                          minibatches_per_task=FLAGS.minibatches_per_task),
                        epochs=FLAGS.epochs, verbose=2, callbacks=callbacks)
    if FLAGS.write_history:
        with open(os.path.join(job_dir, f"history-{cluster.worker_id}.json"), "w") as f:
            json.dump({"epoch": history.epoch, "history": history.history}, f)
    if FLAGS.output and cluster.worker_id == 0:
        np.savez(FLAGS.output, *model.get_weights())
        with open(FLAGS.output + ".ps.json", "w") as f:
            json.dump([s.to_dict() for s in cluster.ps.status_all()], f)


if __name__ == "__main__":
    app.run(main)

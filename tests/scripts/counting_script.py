"""The counting model: a worker program whose weights count applied gradients.

Every weight `c_k` of the model gets gradient -1 per record (loss = minus the
sum over the batch of `x0 * sum_k c_k`, with x0 = 1), and SGD with learning rate
1 adds 1 per record whose gradient is applied: after the job every weight
equals the number of record gradients applied, which exactly-once training
makes `epochs x records` (divided by grads_to_wait, whose updates average).

Run by `keras-elastic run` in the exactly-once tests; workers write the final
weights and the parameter servers' status as JSON to `--output` (each
worker that finishes; they all end with the same model).
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
flags.DEFINE_integer("epochs", 2, "Epochs.")
flags.DEFINE_integer("batch_size", 16, "Batch size.")
flags.DEFINE_integer("minibatches_per_task", 4, "Minibatches per task.")
flags.DEFINE_integer("weights", 8, "Counting weights (spread over the servers).")
flags.DEFINE_integer("vector", 0, "Elements of one more counting weight, a vector "
                     "(large enough, it is split over the servers: "
                     "--ps_partition_bytes).")
flags.DEFINE_integer("table_rows", 0, "Ids of one more counting weight, an embedding "
                     "table on the servers (ke.layers.Embedding, dim 1): record i's "
                     "gradient counts on row i % table_rows (0: no table).")
flags.DEFINE_integer("admit_after", 0, "The table's admit_after.")
flags.DEFINE_bool("table_in_graph", False, "--step=keras: the table is a layer of the "
                  "functional model (its ids computed from the inputs), not of the "
                  "Counting layer: the step looks its rows up before the forward "
                  "pass, and with --exchange=pipelined one batch ahead.")
flags.DEFINE_integer("max_rows", 0, "The table's max_rows (0: none).")
flags.DEFINE_float("sleep_per_batch", 0.0, "Seconds to sleep after each batch.")
flags.DEFINE_integer("stop_worker", -1, "This worker sets model.stop_training after "
                     "--stop_after_batches batches of its first epoch (as "
                     "TerminateOnNaN does), holding the tasks it claimed.")
flags.DEFINE_integer("stop_after_batches", 1, "See --stop_worker.")
flags.DEFINE_string("output", None, "Finishing workers write weights and PS status here.")
flags.DEFINE_enum("exchange", "sync", ["sync", "pipelined"], "compile(exchange=...).")
flags.DEFINE_string("hold_dir", None, "Each worker, after its 2nd batch, writes "
                    "<hold_dir>/held-<id> and waits for <hold_dir>/go: a test holds "
                    "the job mid-task while it acts, instead of racing it.")
flags.DEFINE_bool("validate", False, "Validate on the data after each epoch.")
flags.DEFINE_bool("filter_odd", False, "dataset_fn drops records with an odd id "
                  "(tasks' element counts then differ from their record counts).")
flags.DEFINE_enum("step", "keras", ["keras", "custom", "two_optimizers"],
                  "keras: Keras' own train_step; custom: a train_step of the model's "
                  "own; two_optimizers: a train_step applying two optimizers, each "
                  "to half of the weights (a GAN's step shape).")


def make_table():
    return ke.layers.Embedding(
        FLAGS.table_rows, 1, embeddings_initializer="zeros", name="table",
        admit_after=FLAGS.admit_after, max_rows=FLAGS.max_rows or None)


class Counting(keras.layers.Layer):
    def build(self, input_shape):
        self.counts = [self.add_weight(shape=(), initializer="zeros", name=f"c{k}")
                       for k in range(FLAGS.weights)]
        self.vector = (self.add_weight(shape=(FLAGS.vector,), initializer="zeros",
                                       name="vector") if FLAGS.vector else None)
        self.table = (make_table() if FLAGS.table_rows and not FLAGS.table_in_graph
                      else None)

    def call(self, x):
        total = tf.add_n([c for c in self.counts])
        if self.vector is not None:  # each element's gradient: -1 per record
            total += tf.reduce_sum(self.vector)
        if self.table is not None:  # row i % table_rows: -1 per record i
            ids = tf.cast(x[:, 1], tf.int64) % FLAGS.table_rows
            return x[:, :1] * (total + self.table(ids))
        return x[:, :1] * total


class CountingModel(keras.Model):
    """The counting model with a train_step of its own (issue 23): with
    `two`, a second optimizer of its own `compile` updates half the weights,
    so every step makes two updates."""

    def __init__(self, two: bool):
        super().__init__()
        self.counting = Counting()
        self.two = two

    def call(self, x):
        return self.counting(x)

    def compile(self, optimizer, b_optimizer=None, **kwargs):
        super().compile(optimizer=optimizer, **kwargs)
        self.b_optimizer = b_optimizer

    def train_step(self, data):
        x, _ = data
        counts = self.counting.counts
        half = len(counts) // 2 if self.two else len(counts)
        with tf.GradientTape() as tape:
            loss = -tf.reduce_sum(self(x, training=True)[:, 0])
        grads = tape.gradient(loss, counts)
        self.optimizer.apply(grads[:half], counts[:half])
        if self.two:
            self.b_optimizer.apply_gradients(zip(grads[half:], counts[half:]))
        return {"loss": loss}


class MinusSum(keras.losses.Loss):
    def __init__(self):
        super().__init__(reduction="sum", name="minus_sum")

    def call(self, y_true, y_pred):
        return -y_pred[:, 0]


def dataset_fn(records, mode):
    spec = {"x": tf.io.FixedLenFeature([2], tf.float32),
            "y": tf.io.FixedLenFeature([], tf.int64)}
    parsed = records.map(lambda r: tf.io.parse_single_example(r, spec))
    if FLAGS.filter_odd:
        parsed = parsed.filter(lambda e: tf.equal(tf.cast(e["x"][1], tf.int64) % 2, 0))
    return parsed.map(lambda e: (e["x"], e["y"]))


def write_data(directory: str, records: int, shards: int) -> list[str]:
    """TFRecord shards of `records` records: x = [1, id], y = 0."""
    os.makedirs(directory, exist_ok=True)
    files = []
    per = records // shards
    for s in range(shards):
        path = os.path.join(directory, f"count-{s:02d}.tfrecord")
        with tf.io.TFRecordWriter(path) as w:
            for i in range(s * per, (s + 1) * per):
                w.write(tf.train.Example(features=tf.train.Features(feature={
                    "x": tf.train.Feature(float_list=tf.train.FloatList(
                        value=[1.0, float(i)])),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[0])),
                })).SerializeToString())
        files.append(path)
    return files


def main(argv):
    del argv
    cluster = ke.worker.get_cluster()
    job_dir = os.environ.get("KERAS_ELASTIC_JOB_DIR")
    if job_dir:
        with open(os.path.join(job_dir, f"pid-{cluster.worker_id}"), "w") as f:
            f.write(str(os.getpid()))
    if FLAGS.step == "keras":
        inputs = keras.Input((2,))
        outputs = Counting()(inputs)
        if FLAGS.table_rows and FLAGS.table_in_graph:
            # Row i % table_rows: -1 per record i, as in Counting.call.
            ids = keras.ops.mod(keras.ops.cast(inputs[:, 1], "int64"), FLAGS.table_rows)
            outputs = outputs + inputs[:, :1] * make_table()(ids)
        model = ke.Model(inputs, outputs)
        model.compile(optimizer=keras.optimizers.SGD(1.0), loss=MinusSum(),
                      exchange=FLAGS.exchange)
    else:
        model = ke.wrap(CountingModel(two=FLAGS.step == "two_optimizers"))
        model.compile(optimizer=keras.optimizers.SGD(1.0),
                      b_optimizer=keras.optimizers.SGD(1.0), exchange=FLAGS.exchange)
    callbacks = []
    if FLAGS.hold_dir:
        def hold(batch, logs):
            if batch != 1:
                return
            open(os.path.join(FLAGS.hold_dir, f"held-{cluster.worker_id}"), "w").close()
            go, deadline = os.path.join(FLAGS.hold_dir, "go"), time.monotonic() + 600
            while not os.path.exists(go) and time.monotonic() < deadline:
                time.sleep(0.05)
        callbacks.append(keras.callbacks.LambdaCallback(on_train_batch_end=hold))
    if FLAGS.sleep_per_batch:
        callbacks.append(keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda b, logs: __import__("time").sleep(
                FLAGS.sleep_per_batch)))
    if FLAGS.stop_worker == cluster.worker_id:
        trained = [0]

        def stop(batch, logs):
            trained[0] += 1
            if trained[0] == FLAGS.stop_after_batches:
                print(f"worker {cluster.worker_id}: stop_training after "
                      f"{trained[0]} batch(es)", flush=True)
                model.stop_training = True
        callbacks.append(keras.callbacks.LambdaCallback(on_train_batch_end=stop))
    validation = None
    if FLAGS.validate:
        validation = ke.ElasticDataset(FLAGS.data, dataset_fn=dataset_fn,
                                       batch_size=FLAGS.batch_size,
                                       minibatches_per_task=FLAGS.minibatches_per_task,
                                       mode="evaluation", name="validation")
    model.fit(ke.ElasticDataset(FLAGS.data, dataset_fn=dataset_fn,
                                batch_size=FLAGS.batch_size,
                                minibatches_per_task=FLAGS.minibatches_per_task),
              epochs=FLAGS.epochs, verbose=2, callbacks=callbacks,
              validation_data=validation)
    if FLAGS.output:
        # Every worker that finishes writes the final model (the same for all;
        # worker 0 may have been killed).
        layer = model.counting if FLAGS.step != "keras" else next(
            m for m in model.layers if hasattr(m, "counts"))
        counts = [float(np.asarray(c)) for c in layer.counts]
        if getattr(layer, "vector", None) is not None:
            counts += np.asarray(layer.vector).tolist()
        temp = f"{FLAGS.output}.{cluster.worker_id}.tmp"
        table = None
        table_layer = (model.get_layer("table") if FLAGS.table_in_graph and
                       FLAGS.table_rows else getattr(layer, "table", None))
        if table_layer is not None:
            # Every row (read without making any: ids without a row read 0).
            rows = cluster.ps.lookup({table_layer.table_name: np.arange(
                FLAGS.table_rows, dtype=np.int64)}, create=False)
            table = rows[table_layer.table_name][:, 0].tolist()
        with open(temp, "w") as f:
            servers = [s.to_dict() for s in cluster.ps.status_all()]
            json.dump({"counts": counts, "ps": servers, "worker": cluster.worker_id,
                       "table": table}, f)
        os.replace(temp, FLAGS.output)


if __name__ == "__main__":
    app.run(main)

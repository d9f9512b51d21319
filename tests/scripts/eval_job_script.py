"""A worker program for the multi-process evaluation/prediction tests."""

import json
import os
import sys
import time

import keras
from absl import app, flags

import keras_elastic as ke

FLAGS = flags.FLAGS
flags.DEFINE_enum("job", "evaluate", ["evaluate", "predict", "fit"], "What to run.")
flags.DEFINE_string("data", None, "TFRecord pattern.")
flags.DEFINE_string("weights", None, "Initial weights (.weights.h5).")
flags.DEFINE_string("output", None, "Results (evaluate/fit) or output_dir (predict).")
flags.DEFINE_integer("epochs", 2, "fit: epochs.")
flags.DEFINE_float("sleep_per_batch", 0.0, "Seconds to sleep after each batch.")


def build_model():
    keras.utils.set_random_seed(2)
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, activation="relu")(inputs)
    model = ke.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(h))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="binary_crossentropy",
                  metrics=["accuracy", keras.metrics.AUC(name="auc"),
                           keras.metrics.Precision(name="precision")])
    return model


def main(argv):
    del argv
    # tests/ on sys.path, for tests/support/.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from support.tfrecord_data import dataset_fn

    cluster = ke.worker.get_cluster()
    job_dir = os.environ.get("KERAS_ELASTIC_JOB_DIR")
    if job_dir:
        with open(os.path.join(job_dir, f"pid-{cluster.worker_id}"), "w") as f:
            f.write(str(os.getpid()))
    model = build_model()
    if FLAGS.weights:
        model.load_weights(FLAGS.weights)
    sleep = [keras.callbacks.LambdaCallback(
        on_test_batch_end=lambda b, logs: time.sleep(FLAGS.sleep_per_batch),
        on_predict_batch_end=lambda b, logs: time.sleep(FLAGS.sleep_per_batch),
        on_train_batch_end=lambda b, logs: time.sleep(FLAGS.sleep_per_batch),
    )] if FLAGS.sleep_per_batch else []
    if FLAGS.job == "evaluate":
        logs = model.evaluate(
            ke.ElasticDataset(FLAGS.data, dataset_fn=dataset_fn, batch_size=20,
                              minibatches_per_task=2, mode="evaluation"),
            return_dict=True, callbacks=sleep, verbose=0)
        result = logs
    elif FLAGS.job == "predict":
        model.predict(ke.ElasticDataset(FLAGS.data, dataset_fn=lambda r, m: dataset_fn(
            r, m).map(lambda x, y: x), batch_size=20, minibatches_per_task=2,
            mode="prediction", output_dir=FLAGS.output), callbacks=sleep, verbose=0)
        return
    else:
        history = model.fit(
            ke.ElasticDataset(FLAGS.data, dataset_fn=dataset_fn, batch_size=16,
                              minibatches_per_task=4),
            validation_data=ke.ElasticDataset(FLAGS.data, dataset_fn=dataset_fn,
                                              batch_size=40, minibatches_per_task=2,
                                              mode="evaluation", name="validation"),
            epochs=FLAGS.epochs, callbacks=sleep, verbose=2)
        result = history.history
    with open(f"{FLAGS.output}.worker{cluster.worker_id}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    app.run(main)

"""The digits model on TFDS and ArrayRecord data, as every worker of a job runs it.

Trains on `--train`, validates after each epoch on `--validation`, then
evaluates on `--evaluate`, and writes the metrics to `--output` (every worker
that trained; they all get the job's numbers). Each names a source:

- `tfds_dir:PATH`: the KeDigits TFDS dataset (tests/support/tfds_digits.py) read from
  the directory of its prepared version, without the builder's code;
- `tfds:DATA_DIR`: the same by its registered name, `data_dir=DATA_DIR`;
- `files:PATTERN`: plain ArrayRecord (or TFRecord) files of serialized
  examples in examples/digits' format, parsed by its `model_def.dataset_fn`.

TFDS sources are decoded with the dataset's features (`as_supervised`).
"""

import json
import os
import sys

import keras
from absl import app, flags

import keras_elastic as ke

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [TESTS, os.path.join(os.path.dirname(TESTS), "examples", "digits")]
import model_def  # noqa: E402  (examples/digits/model_def.py)
import support.tfds_digits  # noqa: E402, F401  (registers the ke_digits builder)

FLAGS = flags.FLAGS
flags.DEFINE_string("train", None, "Training source: tfds_dir:, tfds: or files:.")
flags.DEFINE_string("validation", None, "Validation source (the same forms).")
flags.DEFINE_string("evaluate", None, "Source evaluated after training.")
flags.DEFINE_integer("epochs", 5, "Epochs.")
flags.DEFINE_float("sleep_per_batch", 0.0, "Seconds to sleep after each batch.")
flags.DEFINE_string("output", None, "Metrics as JSON.")


def source(spec: str, split: str, **kwargs) -> ke.ElasticDataset:
    """The `ElasticDataset` a `--train`/`--validation`/`--evaluate` names."""
    kind, _, where = spec.partition(":")
    if kind == "tfds_dir":
        return ke.ElasticDataset.from_tfds(where, split=split, as_supervised=True,
                                           **kwargs)
    if kind == "tfds":
        return ke.ElasticDataset.from_tfds("ke_digits", split=split, data_dir=where,
                                           as_supervised=True, **kwargs)
    if kind == "files":
        return ke.ElasticDataset(where, dataset_fn=model_def.dataset_fn, **kwargs)
    raise ValueError(f"unknown source {spec!r}")


def main(argv):
    del argv
    keras.utils.set_random_seed(0)
    cluster = ke.worker.get_cluster()
    train = source(FLAGS.train, "train", batch_size=32, minibatches_per_task=8,
                   shuffle=True)
    validation = source(FLAGS.validation, "validation", batch_size=128,
                        minibatches_per_task=1, mode="evaluation", name="validation")
    final = source(FLAGS.evaluate, "validation", batch_size=128, minibatches_per_task=1,
                   mode="evaluation", name="final")
    # The rate decays over the job (on the parameter servers, by their step
    # count): the last epochs settle instead of wandering around 0.95.
    steps = FLAGS.epochs * -(-train.source.num_records() // train.batch_size)
    rate = keras.optimizers.schedules.CosineDecay(model_def.LEARNING_RATE, steps,
                                                  alpha=0.1)
    model = ke.wrap(model_def.custom_model(learning_rate=rate))
    callbacks = []
    if FLAGS.sleep_per_batch:
        callbacks.append(keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda b, logs: __import__("time").sleep(
                FLAGS.sleep_per_batch)))
    history = model.fit(train, epochs=FLAGS.epochs, verbose=2, callbacks=callbacks,
                        validation_data=validation)
    loss, accuracy = model.evaluate(final, verbose=0)
    if FLAGS.output and history.history:  # not a worker that came after the end
        temp = f"{FLAGS.output}.{cluster.worker_id}.tmp"
        with open(temp, "w") as f:
            json.dump({"history": {k: [float(x) for x in v]
                                   for k, v in history.history.items()},
                       "final_accuracy": float(accuracy),
                       "sources": [d.source.describe()
                                   for d in (train, validation, final)],
                       "worker": cluster.worker_id}, f)
        os.replace(temp, FLAGS.output)


if __name__ == "__main__":
    app.run(main)

"""Trains a small classifier on scikit-learn's handwritten digits, elastically.

The same script runs as a plain process (an embedded master and parameter
server start inside it) or as every worker of a job started by the launcher:

```
python examples/digits/train.py
keras-elastic run --num_workers 2 --num_ps 1 -- python examples/digits/train.py
```

It writes the data first if it is missing (`prepare_data.py`), trains on an
`ElasticDataset` of the training shards, then reports the accuracy on the
validation shards.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time

import keras
from absl import app, flags, logging

import keras_elastic as ke

# prepare_data.py sits beside this script (run as `python examples/digits/train.py`).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_def  # noqa: E402
import prepare_data  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", prepare_data.DEFAULT_DIR,
                    "Directory of the train-*/validation-* TFRecord shards.")
flags.DEFINE_integer("epochs", 8, "Passes over the training data.")
flags.DEFINE_integer("batch_size", 32, "Examples per minibatch.")
flags.DEFINE_integer("minibatches_per_task", 8,
                     "Minibatches per task the master hands out.")
flags.DEFINE_float("learning_rate", model_def.LEARNING_RATE, "Adam's learning rate.")
flags.DEFINE_string("checkpoint_dir", None,
                    "Save a sharded checkpoint here after every epoch (and resume "
                    "from the latest one).")
flags.DEFINE_string("output", None,
                    "Write the final metrics here as JSON (worker 0 only).")
flags.DEFINE_enum("exchange", "sync", ["sync", "pipelined"],
                  "How the workers exchange with the parameter servers: 'sync' waits "
                  "for each push; 'pipelined' overlaps it with the next step.")
flags.DEFINE_bool("prepare", True, "Write the data first if it is missing.")
flags.DEFINE_integer("num_shards", 2, "Training shards to write when preparing.")

def training_data(data_dir: str, batch_size: int,
                  minibatches_per_task: int) -> ke.ElasticDataset:
    return ke.ElasticDataset(prepare_data.file_pattern(data_dir, "train"),
                             dataset_fn=model_def.dataset_fn, batch_size=batch_size,
                             minibatches_per_task=minibatches_per_task, shuffle=True)


def validation_data(data_dir: str, name: str = "validation") -> ke.ElasticDataset:
    """The validation shards, evaluated by all workers together: every worker
    gets the same, exact metrics."""
    return ke.ElasticDataset(prepare_data.file_pattern(data_dir, "validation"),
                             dataset_fn=model_def.dataset_fn, batch_size=128,
                             minibatches_per_task=1, mode="evaluation", name=name)



def write_json(path: str, payload: dict) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".metrics.", suffix=".tmp")
    os.chmod(tmp, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=1)
    os.replace(tmp, path)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    keras.utils.set_random_seed(0)
    if FLAGS.prepare:
        prepare_data.prepare(FLAGS.data_dir, FLAGS.num_shards)
    train = training_data(FLAGS.data_dir, FLAGS.batch_size, FLAGS.minibatches_per_task)
    logging.info("%s", train.describe())
    # The job's steps: every worker's batches of every epoch.
    steps = FLAGS.epochs * math.ceil(train.source.num_records() / FLAGS.batch_size)
    model = ke.wrap(model_def.custom_model(FLAGS.learning_rate, decay_steps=steps),
                    exchange=FLAGS.exchange)
    callbacks = []
    if FLAGS.checkpoint_dir:
        callbacks.append(ke.callbacks.ShardedModelCheckpoint(
            FLAGS.checkpoint_dir, restore_on_start=True))  # resumes a run

    started = time.perf_counter()
    history = model.fit(train, epochs=FLAGS.epochs, verbose=2, callbacks=callbacks,
                        validation_data=validation_data(FLAGS.data_dir))
    train_seconds = time.perf_counter() - started

    val_loss, val_accuracy = model.evaluate(
        validation_data(FLAGS.data_dir, name="final_validation"), verbose=0)
    print(f"validation accuracy: {val_accuracy:.4f} (loss {val_loss:.4f}) after "
          f"{FLAGS.epochs} epochs, {train_seconds:.1f} s of training", flush=True)
    if FLAGS.output and ke.worker.is_chief():
        write_json(FLAGS.output, {
            "val_accuracy": float(val_accuracy), "val_loss": float(val_loss),
            "epochs": FLAGS.epochs, "train_seconds": train_seconds,
            "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        })
        logging.info("wrote metrics to %s", FLAGS.output)


if __name__ == "__main__":
    app.run(main)

"""Trains a DeepFM click-through-rate model on synthetic Criteo-shaped data,
elastically, with its embedding tables on the parameter servers.

The same script runs as a plain process (an embedded master and parameter
server start inside it) or as every worker of a job started by the launcher:

```
python examples/ctr/train.py
keras-elastic run --num_workers 2 --num_ps 2 -- python examples/ctr/train.py
```

It writes the data first if it is missing (`prepare_data.py`), trains on an
`ElasticDataset` of the training shards and evaluates the model on the
validation shards after every epoch (all workers together), reporting the
validation AUC next to the AUC of the true model the labels were drawn from.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import keras
from absl import app, flags, logging

import keras_elastic as ke

# prepare_data.py sits beside this script (run as `python examples/ctr/train.py`).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_def  # noqa: E402
import prepare_data  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", prepare_data.DEFAULT_DIR,
                    "Directory of the train-*/validation-* TFRecord shards.")
flags.DEFINE_integer("epochs", 3, "Passes over the training data.")
flags.DEFINE_integer("batch_size", 512, "Examples per minibatch.")
flags.DEFINE_integer("minibatches_per_task", 8,
                     "Minibatches per task the master hands out.")
flags.DEFINE_float("learning_rate", model_def.LEARNING_RATE, "Adagrad's learning rate.")
flags.DEFINE_integer("admit_after", model_def.ADMIT_AFTER, "Training batches an id "
                     "must be seen in before it gets rows (0: at once).")
flags.DEFINE_integer("max_rows", model_def.MAX_ROWS, "Rows per table over the "
                     "parameter servers, the least recently used removed past it "
                     "(0: no bound).")
flags.DEFINE_string("checkpoint_dir", None,
                    "Save a sharded checkpoint here after every epoch (and resume "
                    "from the latest one).")
flags.DEFINE_string("output", None,
                    "Write the final metrics here as JSON (worker 0 only).")
flags.DEFINE_bool("prepare", True, "Write the data first if it is missing.")
flags.DEFINE_integer("num_train", 200_000, "Training records to write when preparing.")
flags.DEFINE_integer("num_validation", 20_000,
                     "Validation records to write when preparing.")
flags.DEFINE_integer("num_shards", 4, "Training shards to write when preparing.")
flags.DEFINE_integer("seed", 0, "Seed of the data to write when preparing.")


def training_data(data_dir: str, batch_size: int,
                  minibatches_per_task: int) -> ke.ElasticDataset:
    return ke.ElasticDataset(prepare_data.file_pattern(data_dir, "train"),
                             dataset_fn=model_def.dataset_fn, batch_size=batch_size,
                             minibatches_per_task=minibatches_per_task, shuffle=True)


def validation_data(data_dir: str, batch_size: int) -> ke.ElasticDataset:
    """The validation shards, evaluated by all workers together: every worker
    gets the same, exact metrics."""
    return ke.ElasticDataset(prepare_data.file_pattern(data_dir, "validation"),
                             dataset_fn=model_def.dataset_fn, batch_size=batch_size,
                             minibatches_per_task=4, mode="evaluation",
                             name="validation")



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
        prepare_data.prepare(FLAGS.data_dir, FLAGS.num_train, FLAGS.num_validation,
                             FLAGS.num_shards, FLAGS.seed)
    train = training_data(FLAGS.data_dir, FLAGS.batch_size, FLAGS.minibatches_per_task)
    logging.info("%s", train.describe())
    model = ke.wrap(model_def.custom_model(FLAGS.learning_rate,
                                           admit_after=FLAGS.admit_after,
                                           max_rows=FLAGS.max_rows or None))
    callbacks = []
    if FLAGS.checkpoint_dir:
        callbacks.append(ke.callbacks.ShardedModelCheckpoint(
            FLAGS.checkpoint_dir, restore_on_start=True))  # resumes a run

    started = time.perf_counter()
    history = model.fit(train, epochs=FLAGS.epochs, verbose=2, callbacks=callbacks,
                        validation_data=validation_data(FLAGS.data_dir,
                                                        FLAGS.batch_size))
    train_seconds = time.perf_counter() - started

    val_auc = float(history.history["val_auc"][-1])
    val_loss = float(history.history["val_loss"][-1])
    metadata = prepare_data.read_metadata(FLAGS.data_dir) or {}
    true_auc = metadata.get("true_validation_auc")
    print(f"validation AUC: {val_auc:.4f} (loss {val_loss:.4f}; the true model's AUC: "
          f"{true_auc if true_auc is None else format(true_auc, '.4f')}) after "
          f"{FLAGS.epochs} epochs, {train_seconds:.1f} s of training", flush=True)
    if FLAGS.output and ke.worker.is_chief():
        write_json(FLAGS.output, {
            "val_auc": val_auc, "val_loss": val_loss, "true_val_auc": true_auc,
            "epochs": FLAGS.epochs, "train_seconds": train_seconds,
            "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        })
        logging.info("wrote metrics to %s", FLAGS.output)


if __name__ == "__main__":
    app.run(main)

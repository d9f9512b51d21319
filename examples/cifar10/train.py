"""Trains ElasticDL's CIFAR-10 model (seed 000's setting) with keras-elastic.

Batch 128, 32 minibatches per task, SGD 0.1, the `cifar10_functional_api`
model (see `model.py`). The data is tensorflow-datasets' "cifar10" when it is
installed and already prepared under `--data_dir` (this script never
downloads); otherwise `--synthetic` writes CIFAR-shaped synthetic TFRecords in
ElasticDL's record layout and trains on them.

```
python examples/cifar10/train.py --synthetic
keras-elastic run --num_workers 2 --num_ps 1 -- python examples/cifar10/train.py --synthetic
```
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

from absl import app, flags, logging

import keras_elastic as ke

# model.py and data.py sit beside this script.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data as cifar10_data  # noqa: E402
import model as cifar10  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", os.path.join(tempfile.gettempdir(),
                                             "keras_elastic_examples", "cifar10"),
                    "TFDS data dir to look for a prepared cifar10 in; synthetic "
                    "records go to its 'synthetic' subdirectory.")
flags.DEFINE_bool("synthetic", False,
                  "Without prepared TFDS cifar10, train on synthetic CIFAR-shaped "
                  "records (written on first use).")
flags.DEFINE_integer("num_records", 8192, "Synthetic records to write.")
flags.DEFINE_integer("num_shards", 2, "Synthetic TFRecord files to write.")
flags.DEFINE_integer("epochs", 1, "Passes over the training data.")
flags.DEFINE_integer("batch_size", 128, "Examples per minibatch (seed 000: 128).")
flags.DEFINE_integer("minibatches_per_task", 32,
                     "Minibatches per task (seed 000: 32).")
flags.DEFINE_float("learning_rate", 0.1, "SGD learning rate (ElasticDL: 0.1).")


def training_data() -> ke.ElasticDataset:
    """The TFDS train split if prepared, else synthetic records (with --synthetic)."""
    found = cifar10_data.tfds_train_files(FLAGS.data_dir)
    if found is not None:
        files, features = found
        logging.info("training on TFDS cifar10: %d files under %s", len(files),
                     FLAGS.data_dir)
        dataset_fn = cifar10.make_dataset_fn(
            parse=cifar10_data.make_tfds_parse(features))
    elif FLAGS.synthetic:
        logging.info("no prepared TFDS cifar10 under %s: using %d synthetic records "
                     "(--synthetic)", FLAGS.data_dir, FLAGS.num_records)
        files = cifar10_data.write_synthetic(
            os.path.join(FLAGS.data_dir, "synthetic"), FLAGS.num_records,
            FLAGS.num_shards)
        dataset_fn = cifar10.dataset_fn
    else:
        sys.exit(f"examples/cifar10/train.py: no prepared TFDS cifar10 under "
                 f"--data_dir={FLAGS.data_dir} (this example never downloads it); "
                 "pass --synthetic to train on synthetic CIFAR-shaped records instead")
    return ke.ElasticDataset(files, dataset_fn=dataset_fn, batch_size=FLAGS.batch_size,
                             minibatches_per_task=FLAGS.minibatches_per_task)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    train = training_data()
    logging.info("%s", train.describe())
    model = ke.wrap(cifar10.custom_model())
    model.compile(optimizer=cifar10.optimizer(FLAGS.learning_rate), loss=cifar10.loss(),
                  metrics=["accuracy"])
    started = time.perf_counter()
    history = model.fit(train, epochs=FLAGS.epochs, verbose=2)
    seconds = time.perf_counter() - started
    last = {k: v[-1] for k, v in history.history.items() if v}
    print(f"trained {FLAGS.epochs} epoch(s) in {seconds:.1f} s; last epoch on this "
          "worker: " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(last.items())),
          flush=True)


if __name__ == "__main__":
    app.run(main)

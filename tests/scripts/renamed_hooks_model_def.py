"""A --model_def module whose ElasticDL hooks have other names.

`keras-elastic train --feed=zoo_feed --loss=zoo_loss --optimizer=zoo_optimizer
--eval_metrics_fn=zoo_metrics --callbacks=zoo_callbacks` must use these; the
hooks of the default names fail the job if anything calls them. Each worker's
`zoo_callbacks()` records what it saw in `$RENAMED_HOOKS_OUT/worker-<id>.json`
(tests/test_readme_flags.py). Loaded with `--model_zoo=tests/scripts`: the
zoo's parent, tests/, is then on `sys.path`, so tests/support/ imports.
"""

import json
import os

import keras
from support.tfrecord_data import parse

LEARNING_RATE = 0.0625


def custom_model():
    keras.utils.set_random_seed(4)
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(h))


def zoo_feed(records, mode):
    parsed = records.map(parse)
    if mode == "prediction":
        return parsed.map(lambda x, y: x)
    return parsed


def zoo_loss(labels, predictions):
    return keras.losses.sparse_categorical_crossentropy(labels, predictions)


def zoo_optimizer():
    return keras.optimizers.SGD(LEARNING_RATE, momentum=0.5)


def zoo_metrics():
    def hits(labels, predictions):
        return keras.ops.cast(keras.ops.equal(
            keras.ops.cast(labels, "int64"),
            keras.ops.argmax(predictions, axis=-1)), "float32")
    return {"hits": hits}


class Record(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        optimizer = self.model.optimizer
        worker = os.environ["KERAS_ELASTIC_WORKER_ID"]
        path = os.path.join(os.environ["RENAMED_HOOKS_OUT"], f"worker-{worker}.json")
        with open(path, "w") as f:
            json.dump({"optimizer": type(optimizer).__name__,
                       "learning_rate": float(optimizer.learning_rate),
                       "momentum": optimizer.momentum,
                       "logs": sorted(logs or {})}, f)


def zoo_callbacks():
    return [Record()]


def _default_hook(*args, **kwargs):
    raise AssertionError("a hook of the default name was used, not the renamed one")


feed = dataset_fn = loss = optimizer = eval_metrics_fn = callbacks = _default_hook

"""`keras.callbacks.TensorBoard` in an elastic job: one run per worker.

Every worker of a launched job runs the user's callbacks, so a TensorBoard
callback given to `fit` would have every worker process write into the same
`log_dir/train` run (their scalars interleaved, each at its own steps).
`ke.Model.fit` hands the callback to Keras through `per_worker`, which keeps
the user's callback (its options, its state) and changes only where it writes:

```
<log_dir>/worker-<id>/train/       each worker's own training scalars (and
                                   graph, histograms, profile) in its own run
<log_dir>/worker-<id>/validation/  its own validation scalars when fit's
                                   validation_data is Keras' own (neither an
                                   ElasticDataset nor NumPy arrays)
<log_dir>/validation/              the job's validation scalars (an elastic
                                   validation_data, the same on every worker),
                                   written once, by the chief
                                   (`ke.worker.is_chief`) at the epoch's end
```

`tensorboard --logdir <log_dir>` then shows `worker-0/train`,
`worker-1/train`, ... and `validation` side by side. The worker also records
the log dir in `JOB_DIR/tensorboard.json`; the launcher's summary prints the
`tensorboard` command. A plain (embedded) process keeps Keras' layout. Set
`callback.keras_elastic_per_worker = False` to keep it in a job too.

Example:

>>> import os
>>> import keras
>>> import numpy as np
>>> import keras_elastic as ke
>>> model = ke.wrap(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
>>> model.compile(optimizer="sgd", loss="mse")
>>> x, y = np.zeros((8, 2)), np.zeros(8)
>>> tb = keras.callbacks.TensorBoard("logs")
>>> _ = model.fit(x, y, validation_data=(x, y), callbacks=[tb], verbose=0)
>>> sorted(os.listdir("logs"))         # a plain process: Keras' layout
['train', 'validation']
"""

from __future__ import annotations

import json
import os
import tempfile

import keras
from absl import logging

from keras_elastic.common import cluster_env

LOG_DIR_FILE = "tensorboard.json"  # in the job directory; read by the launcher
VALIDATION_RUN = "validation"
_HOOKS = ("on_batch_begin", "on_batch_end", "on_epoch_begin", "on_train_batch_begin",
          "on_train_batch_end", "on_test_batch_begin", "on_test_batch_end",
          "on_predict_batch_begin", "on_predict_batch_end", "on_train_begin",
          "on_train_end", "on_predict_begin", "on_predict_end")


def per_worker(callbacks, cluster, elastic_validation: bool):
    """`callbacks` with every `keras.callbacks.TensorBoard` writing to its
    worker's runs (see the module docstring); unchanged in an embedded
    cluster."""
    if not callbacks or cluster.embedded:
        return callbacks
    out, log_dirs = [], []
    for callback in callbacks:
        if (isinstance(callback, keras.callbacks.TensorBoard)
                and getattr(callback, "keras_elastic_per_worker", True)):
            callback = PerWorkerTensorBoard(callback, cluster, elastic_validation)
            log_dirs.append(callback.root)
        out.append(callback)
    if log_dirs:
        record_log_dirs(log_dirs)
    return out


class PerWorkerTensorBoard(keras.callbacks.Callback):
    """Runs a TensorBoard callback with its runs moved to the worker's own
    directory; the job's validation scalars go to the chief only."""

    def __init__(self, tensorboard: keras.callbacks.TensorBoard, cluster,
                 elastic_validation: bool) -> None:
        super().__init__()
        self.tensorboard = tensorboard
        self.cluster = cluster
        self.elastic_validation = elastic_validation
        self.root = os.path.abspath(tensorboard.log_dir)
        self.worker_dir = os.path.join(self.root, f"worker-{cluster.worker_id}")
        # Forward every hook the callback implements (the others stay Keras'
        # defaults, so Keras may still dispatch batches asynchronously).
        for name in _HOOKS:
            setattr(self, name, getattr(tensorboard, name))
        self.async_safe = getattr(tensorboard, "async_safe", False)

    def set_params(self, params):
        super().set_params(params)
        self.tensorboard.set_params(params)

    def set_model(self, model):
        super().set_model(model)
        tensorboard = self.tensorboard
        # Keras derives the run directories from log_dir in set_model (and may
        # write the model summary there at once): point it at the worker's
        # directory for that call, leave the user's log_dir as it was.
        log_dir = tensorboard.log_dir
        tensorboard.log_dir = self.worker_dir
        try:
            tensorboard.set_model(model)
        finally:
            tensorboard.log_dir = log_dir
        if self.elastic_validation:
            tensorboard._val_dir = os.path.join(self.root, VALIDATION_RUN)

    def on_test_begin(self, logs=None):
        # The job's validation (the same on every worker) goes to the
        # `validation` run once: only the chief opens it.
        self._writes_validation = not self.elastic_validation or self._chief()
        if self._writes_validation:
            self.tensorboard.on_test_begin(logs)

    def on_test_end(self, logs=None):
        if getattr(self, "_writes_validation", True):
            self.tensorboard.on_test_end(logs)

    def on_epoch_end(self, epoch, logs=None):
        if logs and self.elastic_validation and any(
                k.startswith("val_") for k in logs) and not self._chief():
            logs = {k: v for k, v in logs.items() if not k.startswith("val_")}
        self.tensorboard.on_epoch_end(epoch, logs)

    def _chief(self) -> bool:
        from keras_elastic.worker.cluster import is_chief

        try:
            return is_chief(self.cluster)
        except ConnectionError as e:  # the master is restarting: skip this once
            logging.warning("keras_elastic: TensorBoard: cannot tell the chief (%s); "
                            "validation scalars of this epoch not written here", e)
            return False


def record_log_dirs(log_dirs: list[str]) -> None:
    """Adds `log_dirs` to `JOB_DIR/tensorboard.json` (`{"log_dirs": [...]}`)."""
    env = cluster_env.read()
    job_dir = env.job_dir if env is not None else None
    if not job_dir or not os.path.isdir(job_dir):
        return
    path = os.path.join(job_dir, LOG_DIR_FILE)
    try:
        with open(path) as f:
            known = list(json.load(f).get("log_dirs", []))
    except (OSError, ValueError, AttributeError):
        known = []
    merged = known + [d for d in log_dirs if d not in known]
    if merged == known:
        return
    try:
        fd, tmp = tempfile.mkstemp(dir=job_dir, prefix=f".{LOG_DIR_FILE}.")
        with os.fdopen(fd, "w") as f:
            json.dump({"log_dirs": merged}, f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as e:
        logging.warning("keras_elastic: cannot record the TensorBoard log dir in %s: "
                        "%s", path, e)

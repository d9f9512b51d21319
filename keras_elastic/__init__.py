"""keras-elastic: elastic, fault-tolerant parameter-server training for Keras 3.

Turn a Keras training script into an elastic job with three changes:

```python
import keras_elastic as ke

train = ke.ElasticDataset("data/train-*.tfrecord", dataset_fn=parse,
                          batch_size=128)
model = ke.wrap(model)            # or ke.Model(...) / ke.Sequential([...])
model.fit(train, epochs=3)
```

Run the script as it is (an embedded master and parameter server start in the
process, over gRPC on 127.0.0.1), or as a multi-process job that survives the
loss of workers: `keras-elastic run --num_workers 2 --num_ps 1 -- python
train.py`.
"""

from __future__ import annotations

import importlib
import importlib.util

__version__ = "0.1.0"

# A process started by the launcher enters its job: it dies with the launcher
# (common/launcher_tie.py) and its random generators start from the job's
# seed, so that every worker builds the same data (common/seeding.py). A warm
# process (launcher/warm/) makes the same call once it knows its role.
from keras_elastic.common.role_env import enter_job as _enter_job  # noqa: E402

_enter_job()

# Imported on first use, so that the launcher and the master start without
# TensorFlow.
_LAZY_ATTRS = {
    "ElasticDataset": "keras_elastic.dataset",
    "Model": "keras_elastic.model",
    "Sequential": "keras_elastic.model",
    "wrap": "keras_elastic.model",
}
# Every subpackage: `ke.prediction.read_predictions(...)` works after a bare
# `import keras_elastic as ke` (tests/test_readme.py checks each `ke.x.y` that
# README.md and docs/ use, in a fresh process).
_LAZY_MODULES = ("batching", "callbacks", "checkpoint", "common", "data", "jobs",
                 "launcher", "layers", "master", "prediction", "proto", "ps", "worker")


def __getattr__(name: str):
    if name in _LAZY_ATTRS:
        return getattr(importlib.import_module(_LAZY_ATTRS[name]), name)
    if name in _LAZY_MODULES:
        return importlib.import_module(f"keras_elastic.{name}")
    if not name.startswith("_") and importlib.util.find_spec(
            f"keras_elastic.{name}") is not None:  # a module: ke.dataset, ke.model
        return importlib.import_module(f"keras_elastic.{name}")
    raise AttributeError(f"module 'keras_elastic' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY_ATTRS) + list(_LAZY_MODULES))


__all__ = ["ElasticDataset", "Model", "Sequential", "wrap", "batching", "callbacks",
           "checkpoint", "data", "layers", "prediction", "worker", "__version__"]

"""ElasticDL's import paths for model-zoo modules, active only while one loads.

ElasticDL model-zoo modules import a few names from the `elasticdl` package:

```python
from elasticdl.python.common.constants import Mode
from elasticdl.python.common.log_utils import default_logger as logger
from elasticdl.python.elasticdl.callbacks import LearningRateScheduler
from elasticdl.python.worker.prediction_outputs_processor import (
    BasePredictionOutputsProcessor)
```

`elasticdl_imports()` serves these modules (and their parent packages) from a
meta-path finder while `keras-elastic train | evaluate | predict` imports the
`--model_def` module, then removes the finder and every `elasticdl*` entry it
put in `sys.modules`: nothing named `elasticdl` is importable before or after,
in this process or any other (the module keeps the objects it imported). A real
`elasticdl` installation is shadowed only during that import.

`RecordIODataReader` (ElasticDL's CTR modules import it at the top for their
optional `custom_data_reader` hook) imports, and says to use TFRecord files if
constructed. Other `elasticdl` modules (ElasticDL's own Embedding layer,
feature columns, the CSV and ODPS readers, ...) raise an ImportError saying
what to use instead.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Iterator

from keras_elastic.common.errors import DataError

# ElasticDL's constants (elasticdl/python/common/constants.py), plain strings
# as in ElasticDL: `mode` arguments given to dataset_fn/feed are these values.


class Mode:
    TRAINING = "training"
    EVALUATION = "evaluation"
    PREDICTION = "prediction"


class JobType:
    TRAINING_ONLY = "training_only"
    EVALUATION_ONLY = "evaluation_only"
    PREDICTION_ONLY = "prediction_only"
    TRAINING_WITH_EVALUATION = "training_with_evaluation"


class MetricsDictKey:
    MODEL_OUTPUT = "output"
    LABEL = "label"


class SaveModelConfig:
    SAVED_MODEL_PATH = "saved_model_path"


class MaxComputeConfig:
    PROJECT_NAME = "MAXCOMPUTE_PROJECT"
    ACCESS_ID = "MAXCOMPUTE_AK"
    ACCESS_KEY = "MAXCOMPUTE_SK"
    ENDPOINT = "MAXCOMPUTE_ENDPOINT"
    TUNNEL_ENDPOINT = "MAXCOMPUTE_TUNNEL_ENDPOINT"


class BasePredictionOutputsProcessor:
    """ElasticDL's base class of `PredictionOutputsProcessor`: `process(
    predictions, worker_id)` gets each prediction task's outputs."""

    def process(self, predictions, worker_id):  # pragma: no cover - abstract
        raise NotImplementedError


def _learning_rate_scheduler_class():
    import keras

    class LearningRateScheduler(keras.callbacks.Callback):
        """ElasticDL's `LearningRateScheduler(schedule)`: the learning rate is
        `schedule(model_version)`. keras-elastic applies it on the parameter
        servers, keyed on their model version (see jobs/zoo_hooks.py); the
        callback itself does nothing on the worker."""

        def __init__(self, schedule):
            super().__init__()
            self.schedule = schedule

    return LearningRateScheduler


class RecordIODataReader:
    """ElasticDL's RecordIO reader, importable so that a module naming it in
    its optional `custom_data_reader` hook loads; keras-elastic never calls
    that hook (it reads TFRecord or ArrayRecord files), and using the reader
    says so."""

    def __init__(self, *args, **kwargs):
        raise DataError(
            "RecordIO is not a keras-elastic data format: convert the data to "
            "TFRecord files and give them as --training_data, --validation_data or "
            "--prediction_data (the module's feed/dataset_fn parses them)")


def _is_odps_configured() -> bool:
    return False


class _ODPSWriter:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            "ODPS (MaxCompute) tables are not a keras-elastic data source: predictions "
            "go to --output (NumPy parts) or to your PredictionOutputsProcessor")


# Module name -> function filling the module's namespace.
def _constants(m):
    m.Mode, m.JobType, m.MetricsDictKey = Mode, JobType, MetricsDictKey
    m.SaveModelConfig, m.MaxComputeConfig = SaveModelConfig, MaxComputeConfig


def _log_utils(m):
    m.default_logger = logging.getLogger("elasticdl")
    m.get_logger = lambda name="elasticdl", **_: logging.getLogger(name)


def _callbacks(m):
    m.LearningRateScheduler = _learning_rate_scheduler_class()


def _processor(m):
    m.BasePredictionOutputsProcessor = BasePredictionOutputsProcessor


def _recordio_reader(m):
    m.RecordIODataReader = RecordIODataReader


def _odps_io(m):
    m.is_odps_configured = _is_odps_configured
    m.ODPSWriter = _ODPSWriter


MODULES = {
    "elasticdl.python.common.constants": _constants,
    "elasticdl.python.common.log_utils": _log_utils,
    "elasticdl.python.elasticdl.callbacks": _callbacks,
    "elasticdl.python.worker.prediction_outputs_processor": _processor,
    "elasticdl.python.data.odps_io": _odps_io,
    "elasticdl.python.data.reader.recordio_reader": _recordio_reader,
}
PACKAGES = {"elasticdl", "elasticdl.python", "elasticdl.python.common",
            "elasticdl.python.elasticdl", "elasticdl.python.worker",
            "elasticdl.python.data", "elasticdl.python.data.reader"}

# What to use instead of ElasticDL modules keras-elastic does not provide.
INSTEAD = {
    "elasticdl.python.elasticdl.layers": "keras_elastic.layers.Embedding (its table "
    "lives on the parameter servers), or keras.layers.Embedding",
    "elasticdl.python.elasticdl.feature_column": "Keras preprocessing layers "
    "(keras.layers.Hashing, StringLookup, IntegerLookup, Discretization, "
    "Normalization) in the model",
    "elasticdl.python.data.reader": "TFRecord files (--training_data takes file "
    "patterns or a directory); convert RecordIO/CSV/ODPS data to TFRecord",
    "elasticdl_preprocessing": "Keras preprocessing layers",
}


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        fill = MODULES.get(module.__name__)
        if fill is not None:
            fill(module)


class ElasticDLFinder(importlib.abc.MetaPathFinder):
    """Serves `MODULES` and `PACKAGES`; refuses other `elasticdl.*` names."""

    def find_spec(self, fullname, path=None, target=None):
        root = fullname.split(".")[0]
        if root not in ("elasticdl", "elasticdl_preprocessing"):
            return None
        if fullname in PACKAGES or fullname in MODULES:
            spec = importlib.machinery.ModuleSpec(fullname, _Loader(),
                                                  is_package=fullname in PACKAGES)
            if fullname in PACKAGES:
                spec.submodule_search_locations = []
            return spec
        instead = next((v for k, v in INSTEAD.items()
                        if fullname == k or fullname.startswith(k + ".")), None)
        provided = ", ".join(sorted(MODULES))
        raise ImportError(
            f"keras-elastic runs ElasticDL model-zoo modules with its own stand-ins "
            f"for {provided}; '{fullname}' is not one of them"
            + (f": use {instead} instead" if instead else ""), name=fullname)


@contextlib.contextmanager
def elasticdl_imports() -> Iterator[None]:
    """While active, `import elasticdl.python.common.constants` (and the other
    `MODULES`) give keras-elastic's stand-ins."""
    finder = ElasticDLFinder()
    shadowed = {k: v for k, v in sys.modules.items() if _ours(k)}
    for name in shadowed:
        del sys.modules[name]
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [k for k in sys.modules if _ours(k)]:
            del sys.modules[name]
        sys.modules.update(shadowed)


def _ours(name: str) -> bool:
    root = name.split(".")[0]
    return root in ("elasticdl", "elasticdl_preprocessing")


"""Flags of `keras-elastic train | evaluate | predict` and their checks.

The same flags go to the launcher (which checks them before starting any
process) and to every worker (`python -m keras_elastic.jobs`).
"""

from __future__ import annotations

import glob
import os

from absl import flags

from keras_elastic.jobs.model_def import check_model_def

FLAGS = flags.FLAGS
JOB_TYPES = ("train", "evaluate", "predict")

# Flags forwarded from the launcher to every worker.
WORKER_FLAGS = ("model_def", "training_data", "validation_data", "prediction_data",
                "num_epochs", "minibatch_size", "num_minibatches_per_task",
                "evaluation_steps", "checkpoint_dir", "output", "shuffle")


def define_job_flags() -> None:
    flags.DEFINE_string("model_def", None, "module:function returning a compiled "
                        "Keras model; the module also defines dataset_fn(records, "
                        "mode) and may define callbacks.")
    flags.DEFINE_string("training_data", None, "TFRecord file pattern(s), "
                        "comma-separated.")
    flags.DEFINE_string("validation_data", None, "TFRecord file pattern(s) for "
                        "evaluation.")
    flags.DEFINE_string("prediction_data", None, "TFRecord file pattern(s) to predict.")
    flags.DEFINE_integer("num_epochs", 1, "Training epochs.")
    flags.DEFINE_integer("minibatch_size", 64, "Batch size.")
    flags.DEFINE_integer("num_minibatches_per_task", 32, "Minibatches per task.")
    flags.DEFINE_integer("evaluation_steps", 0, "Evaluate every N model versions "
                         "while training (0: after every epoch).")
    flags.DEFINE_string("checkpoint_dir", None, "train: save checkpoints here; "
                        "evaluate/predict: load the latest from here.")
    flags.DEFINE_string("output", None, "train: export the final model (.keras); "
                        "evaluate: write metrics (JSON); predict: output directory.")
    flags.DEFINE_bool("shuffle", False, "Shuffle tasks and records each epoch.")


def patterns(value: str | None) -> list[str]:
    return [p for p in (value or "").split(",") if p]


def _check_data(flag: str, value: str | None) -> None:
    for pattern in patterns(value):
        if not glob.glob(pattern):
            raise ValueError(f"--{flag}: no file matches '{pattern}'")


def validate(job: str) -> None:
    """Raises ValueError naming the flag at fault."""
    if not FLAGS.model_def:
        raise ValueError("--model_def is required (module:function)")
    check_model_def(FLAGS.model_def)
    data = {"training_data": FLAGS.training_data,
            "validation_data": FLAGS.validation_data,
            "prediction_data": FLAGS.prediction_data}
    needed = {"train": "training_data", "evaluate": "validation_data",
              "predict": "prediction_data"}[job]
    if not data[needed]:
        raise ValueError(f"`keras-elastic {job}` needs --{needed}")
    allowed = {"train": {"training_data", "validation_data"},
               "evaluate": {"validation_data"}, "predict": {"prediction_data"}}[job]
    extra = sorted(k for k, v in data.items() if v and k not in allowed)
    if extra:
        raise ValueError(f"`keras-elastic {job}` does not take --{extra[0]}: the job "
                         "type follows from the data flags (train: --training_data "
                         "[--validation_data]; evaluate: --validation_data; predict: "
                         "--prediction_data)")
    for name, value in data.items():
        _check_data(name, value)
    for name in ("num_epochs", "minibatch_size", "num_minibatches_per_task"):
        if getattr(FLAGS, name) < 1:
            raise ValueError(f"--{name} must be at least 1, got {getattr(FLAGS, name)}")
    if FLAGS.evaluation_steps < 0:
        raise ValueError(f"--evaluation_steps must be >= 0, got {FLAGS.evaluation_steps}")
    if FLAGS.evaluation_steps and not FLAGS.validation_data:
        raise ValueError("--evaluation_steps needs --validation_data")
    if job in ("evaluate", "predict"):
        if not FLAGS.checkpoint_dir:
            raise ValueError(f"`keras-elastic {job}` needs --checkpoint_dir: the model "
                             "is loaded from its latest checkpoint")
        if not _has_checkpoint(FLAGS.checkpoint_dir):
            raise ValueError(f"--checkpoint_dir={FLAGS.checkpoint_dir} holds no complete "
                             "checkpoint (no */manifest.json)")
    if job == "predict" and not FLAGS.output:
        raise ValueError("`keras-elastic predict` needs --output (the directory the "
                         "predictions are written to)")


def _has_checkpoint(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, "manifest.json")) or bool(
        glob.glob(os.path.join(directory, "*", "manifest.json")))


def worker_args(job: str) -> list[str]:
    """The flags to pass to `python -m keras_elastic.jobs`."""
    args = [f"--job={job}"]
    for name in WORKER_FLAGS:
        value = getattr(FLAGS, name)
        if value is None:
            continue
        if isinstance(value, bool):
            args.append(f"--{name}" if value else f"--no{name}")
        else:
            args.append(f"--{name}={value}")
    return args

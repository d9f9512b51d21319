"""Flags of `keras-elastic train | evaluate | predict` and their checks.

The same flags go to the launcher (which checks them before starting any
process) and to every worker (`python -m keras_elastic.jobs`).
"""

from __future__ import annotations

import glob
import os

from absl import flags, logging

from keras_elastic.jobs.model_def import (
    _top_level_names,
    check_model_def,
    parse_model_params,
)

FLAGS = flags.FLAGS
JOB_TYPES = ("train", "evaluate", "predict")

# Flags forwarded from the launcher to every worker.
WORKER_FLAGS = ("model_def", "model_zoo", "model_params", "training_data",
                "validation_data", "prediction_data", "num_epochs", "minibatch_size",
                "num_minibatches_per_task", "evaluation_steps", "checkpoint_dir",
                "checkpoint_steps", "keep_checkpoint_max", "output", "shuffle",
                "exchange", "log_level", "feed", "loss", "optimizer", "eval_metrics_fn",
                "callbacks", "prediction_outputs_processor", "ps_embeddings_above",
                "ps_embedding_admit_after", "ps_embedding_max_rows",
                "ps_embedding_ttl_versions")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# ElasticDL flags with another name here: rewritten before parsing.
ALIASES = {"num_ps_pods": "num_ps", "relaunch_on_worker_failure": "max_worker_restarts",
           "checkpoint_dir_for_init": "checkpoint_dir"}

_IMAGE = ("keras-elastic runs the model zoo from this machine's Python environment, "
          "without a Docker image: drop it (on Kubernetes, run the job on a KubeRay "
          "cluster whose image holds the model zoo: --backend ray, see docs/ray.md)")
_RESOURCES = ("processes have no resource requests on this machine; with --backend "
              "ray use --worker_resources, --ps_resources and --master_resources "
              "(JSON, e.g. '{\"CPU\": 2, \"GPU\": 1}')")
_PRIORITY = ("no pod priorities: roles are processes or Ray actors; use "
             "--min_workers/--max_workers for an elastic number of workers")
_K8S = ("no Kubernetes objects are made: the job runs here, or on a Ray cluster with "
        "--backend ray --ray_address (docs/ray.md has a KubeRay RayJob manifest)")
_INTERNAL = ("an ElasticDL internal with no counterpart: keras-elastic always hands out "
             "tasks from its master, relaunches lost workers (--max_worker_restarts, "
             "--max_task_retries) and finds them by heartbeat (--heartbeat_timeout)")
_READER = ("keras-elastic reads TFRecord files: give file patterns or a directory as "
           "--training_data/--validation_data/--prediction_data (convert RecordIO, "
           "CSV or ODPS data to TFRecord)")

# ElasticDL flags that cannot apply, and what to use instead.
REFUSED = {
    "image_name": _IMAGE, "worker_image": _IMAGE, "image_base": _IMAGE,
    "base_image": _IMAGE, "docker_image_repository": _IMAGE,
    "docker_base_url": _IMAGE, "docker_tlscert": _IMAGE, "docker_tlskey": _IMAGE,
    "image_pull_policy": _IMAGE, "extra_pypi_index": _IMAGE, "local_pkg_dir": _IMAGE,
    "master_resource_request": _RESOURCES, "master_resource_limit": _RESOURCES,
    "worker_resource_request": _RESOURCES, "worker_resource_limit": _RESOURCES,
    "ps_resource_request": _RESOURCES, "ps_resource_limit": _RESOURCES,
    "master_pod_priority": _PRIORITY, "worker_pod_priority": _PRIORITY,
    "ps_pod_priority": _PRIORITY,
    "volume": "paths are used as they are: every process (and, with --backend ray, "
    "every node) must see --training_data, --checkpoint_dir and --job_dir",
    "namespace": _K8S, "cluster_spec": _K8S, "cluster_spec_json": _K8S, "yaml": _K8S,
    "force_use_kube_config_file": _K8S, "restart_policy": _K8S,
    "job_name": "use --job_dir: the job's directory names it (logs, ledger, "
    "cluster.json)",
    "envs": "set environment variables where you run keras-elastic: every process "
    "of the job inherits them",
    "populate_env_names": "every process of the job inherits the launcher's "
    "environment",
    "log_file_path": "every process's log is in --job_dir",
    "aux_params": "no auxiliary parameters: see `keras-elastic train --help`",
    "custom_data_reader": _READER, "data_reader_params": _READER,
    "get_model_steps": "workers take the newest model from the parameter servers "
    "at every step",
    "sync_version_tolerance": "the parameter servers drop gradients more than "
    "4 x --grads_to_wait versions old",
    "lr_staleness_modulation": "not available: use --grads_to_wait=N to average N "
    "gradients per update",
    "log_loss_steps": "Keras logs the loss every epoch (verbose=2); add a Keras "
    "callback in callbacks() for more",
    "max_step": "use --num_epochs",
    "need_elasticdl_job_service": _INTERNAL, "need_task_manager": _INTERNAL,
    "need_pod_manager": _INTERNAL, "task_fault_tolerance": _INTERNAL,
    "relaunch_timeout_worker": _INTERNAL, "job_command": _INTERNAL,
    "need_tf_config": _INTERNAL, "job_type": "the subcommand is the job type "
    "(train, evaluate, predict), with the data flags",
    "master_addr": _INTERNAL, "ps_addrs": _INTERNAL, "port": _INTERNAL,
}


def _flag_name(arg: str) -> str | None:
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    return arg.lstrip("-").split("=", 1)[0]


def _value(args: list[str], i: int) -> str:
    if "=" in args[i]:
        return args[i].split("=", 1)[1]
    return args[i + 1] if i + 1 < len(args) else ""


def rewrite_elasticdl_args(args: list[str]) -> list[str]:
    """ElasticDL's flags in `args` (before `--`): aliases rewritten; a
    ValueError saying what to use instead for those that cannot apply."""
    out = []
    names = [_flag_name(a) for a in args]
    for i, (arg, name) in enumerate(zip(args, names)):
        if name is None:
            out.append(arg)
            continue
        base = name[2:] if name.startswith("no") and name[2:] in REFUSED else name
        if base in REFUSED:
            raise ValueError(f"--{base} (an ElasticDL flag) does not apply: "
                             f"{REFUSED[base]}")
        if name in ALIASES:
            target = ALIASES[name]
            if name == "num_ps_pods" and _value(args, i).strip() == "0":
                raise ValueError("--num_ps_pods=0 (ElasticDL's AllReduce) does not "
                                 "apply: keras-elastic trains with parameter servers; "
                                 "use --num_ps=N (N >= 1)")
            if target in names and _value(args, names.index(target)) != _value(args, i):
                raise ValueError(f"--{name} (ElasticDL) is --{target} here, which is "
                                 "given too with another value: give one (a training "
                                 "job resumes from --checkpoint_dir and saves there)"
                                 if target == "checkpoint_dir" else
                                 f"--{name} (ElasticDL) is --{target} here, which is "
                                 "given too with another value: give one")
            arg = "--" + target + arg[arg.index(name) + len(name):]
        out.append(arg)
    return out


def define_job_flags() -> None:
    flags.DEFINE_string("model_def", None, "module:function returning a Keras model "
                        "(compiled, or compiled from the module's ElasticDL hooks: "
                        "loss, optimizer, eval_metrics_fn); the module also defines "
                        "dataset_fn(records, mode) (or ElasticDL's dataset_fn/feed("
                        "dataset, mode, metadata)) and may define callbacks. With "
                        "--model_zoo: ElasticDL's dotted package.module.function.")
    flags.DEFINE_string("model_zoo", None, "ElasticDL's model zoo: the directory "
                        "--model_def=package.module.function is in "
                        "(DIR/package/module.py), or the module's .py file.")
    flags.DEFINE_string("model_params", None, "ElasticDL: keyword arguments of the "
                        "model function, 'a=1; b=\"x\"'.")
    flags.DEFINE_string("feed", None, "ElasticDL: the name of the dataset function "
                        "in the module (default: dataset_fn, else feed).")
    flags.DEFINE_string("loss", "loss", "ElasticDL: the name of loss(labels, "
                        "predictions) in the module (used if the model is not "
                        "compiled).")
    flags.DEFINE_string("optimizer", "optimizer", "ElasticDL: the name of "
                        "optimizer() in the module.")
    flags.DEFINE_string("eval_metrics_fn", "eval_metrics_fn", "ElasticDL: the name "
                        "of eval_metrics_fn() in the module.")
    flags.DEFINE_string("callbacks", "callbacks", "ElasticDL: the name of the "
                        "callbacks (a list, or a function returning one) in the "
                        "module.")
    flags.DEFINE_string("prediction_outputs_processor", "PredictionOutputsProcessor",
                        "ElasticDL: the class (or object) in the module whose "
                        "process(predictions, worker_id) gets each prediction "
                        "task's outputs.")
    flags.DEFINE_string("distribution_strategy", "ParameterServerStrategy",
                        "ElasticDL: only ParameterServerStrategy applies.")
    flags.DEFINE_bool("use_async", False, "ElasticDL: asynchronous SGD (then "
                      "--grads_to_wait is 1, as in ElasticDL).")
    flags.DEFINE_enum("log_level", None, list(LOG_LEVELS) + [
        lv.lower() for lv in LOG_LEVELS], "ElasticDL: the logging level of the "
                      "launcher and every process (default INFO).")
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
    flags.DEFINE_string("checkpoint_dir", None, "train: the directory (with or "
                        "without a trailing slash) checkpoints are saved into "
                        "(ckpt-0001, ...) and resumed from (its latest; one of another "
                        "model fails the job, naming each difference); "
                        "evaluate/predict: load the latest from here, or this "
                        "checkpoint (ElasticDL's --checkpoint_dir_for_init means the "
                        "same).")
    flags.DEFINE_integer("checkpoint_steps", 0, "ElasticDL: save a checkpoint every "
                         "this many batches of the saving worker (0: every epoch).")
    flags.DEFINE_integer("keep_checkpoint_max", 0, "ElasticDL: checkpoints to keep "
                         "(0: all).")
    flags.DEFINE_string("output", None, "train: export the final model (.keras); "
                        "evaluate: write metrics (JSON); predict: output directory.")
    flags.DEFINE_bool("shuffle", False, "Shuffle tasks and records each epoch.")
    flags.DEFINE_integer("ps_embeddings_above", None,
                         "Every keras.layers.Embedding of the module's model with at "
                         "least this many rows becomes a ke.layers.Embedding: its "
                         "table lives on the parameter servers, rows looked up and "
                         "updated per batch (ke.wrap(model, ps_embeddings_above=...)); "
                         "unset: none is; 0: all are.", lower_bound=0)
    flags.DEFINE_integer("ps_embedding_admit_after", None, "With --ps_embeddings_above: "
                         "an id gets a row only once seen in this many training "
                         "batches (ke.layers.Embedding(admit_after=...)).",
                         lower_bound=0)
    flags.DEFINE_integer("ps_embedding_max_rows", None, "With --ps_embeddings_above: "
                         "at most this many rows per table over all servers, the least "
                         "recently used removed (max_rows=...).", lower_bound=1)
    flags.DEFINE_integer("ps_embedding_ttl_versions", None, "With "
                         "--ps_embeddings_above: rows unused for this many model "
                         "versions are removed (ttl_versions=...).", lower_bound=1)
    flags.DEFINE_enum("exchange", "sync", ["sync", "pipelined"],
                      "train: 'sync' waits for each push to the parameter servers; "
                      "'pipelined' sends it while the next step computes "
                      "(compile(exchange=...)).")


def patterns(value: str | None) -> list[str]:
    return [p for p in (value or "").split(",") if p]


def _check_data(flag: str, value: str | None) -> None:
    """The data files exist and are in a format the workers read (checked
    here, before any process starts: see common/file_formats.py)."""
    from keras_elastic.common.file_formats import FileFormatError, check_data_files

    files: list[str] = []
    for pattern in patterns(value):
        if not glob.glob(pattern):
            raise ValueError(f"--{flag}: no file matches '{pattern}'")
        if os.path.isdir(pattern):
            found = worker_data(pattern)
            if not found:
                raise ValueError(f"--{flag}: the directory {pattern} holds no file")
        else:
            found = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [
                pattern]
            directory = next((p for p in found if os.path.isdir(p)), None)
            if directory is not None:
                raise ValueError(f"--{flag}: '{pattern}' matches the directory "
                                 f"{directory}: give a directory as it is (its files "
                                 "are the data), or a pattern that matches files")
        files.extend(f for f in found if f not in files)
    if files:
        try:
            check_data_files(files)
        except FileFormatError as e:
            raise ValueError(f"--{flag}: {e}") from None


def validate(job: str) -> None:
    """Raises ValueError naming the flag at fault."""
    if not FLAGS.model_def:
        raise ValueError("--model_def is required (module:function)")
    path = check_model_def(FLAGS.model_def, FLAGS.model_zoo, FLAGS.feed)
    if FLAGS.distribution_strategy not in ("", "ParameterServerStrategy"):
        raise ValueError(
            f"--distribution_strategy={FLAGS.distribution_strategy} does not apply: "
            "keras-elastic trains with parameter servers (ParameterServerStrategy); "
            "choose their number with --num_ps" + (
                " and run --num_workers=1 for one worker" if
                FLAGS.distribution_strategy == "Local" else ""))
    if FLAGS.use_async and FLAGS.grads_to_wait > 1:
        logging.warning("--use_async: --grads_to_wait is set to 1 (asynchronous SGD)")
        FLAGS.grads_to_wait = 1
    if FLAGS.model_params:
        parse_model_params(FLAGS.model_params)
    given = [f"--ps_embedding_{k}" for k in ("admit_after", "max_rows", "ttl_versions")
             if getattr(FLAGS, f"ps_embedding_{k}") is not None]
    if given and FLAGS.ps_embeddings_above is None:
        raise ValueError(f"{', '.join(given)} apply to the tables --ps_embeddings_above "
                         "puts on the parameter servers: give --ps_embeddings_above too")
    _check_hook_flags(path)
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
    for name in ("checkpoint_steps", "keep_checkpoint_max"):
        if getattr(FLAGS, name) < 0:
            raise ValueError(f"--{name} must be >= 0, got {getattr(FLAGS, name)}")
    for name in ("num_epochs", "minibatch_size", "num_minibatches_per_task"):
        if getattr(FLAGS, name) < 1:
            raise ValueError(f"--{name} must be at least 1, got {getattr(FLAGS, name)}")
    if FLAGS.evaluation_steps < 0:
        raise ValueError(f"--evaluation_steps must be >= 0, got {FLAGS.evaluation_steps}")
    if FLAGS.evaluation_steps and not FLAGS.validation_data:
        raise ValueError("--evaluation_steps needs --validation_data")
    if job == "train" and FLAGS.checkpoint_dir:
        check_train_checkpoint_dir(FLAGS.checkpoint_dir)
    if job in ("evaluate", "predict"):
        if not FLAGS.checkpoint_dir:
            raise ValueError(f"`keras-elastic {job}` needs --checkpoint_dir: the model "
                             "is loaded from its latest checkpoint")
        if not _has_checkpoint(FLAGS.checkpoint_dir):
            raise ValueError(f"--checkpoint_dir={FLAGS.checkpoint_dir} holds no complete "
                             "checkpoint (no */manifest.json)")
    if job == "predict" and not FLAGS.output and (
            FLAGS.prediction_outputs_processor not in _top_level_names(path)):
        raise ValueError("`keras-elastic predict` needs --output (the directory the "
                         "predictions are written to) or a PredictionOutputsProcessor "
                         "in the module")


# Flags naming an ElasticDL hook of the module (the default names may be absent).
HOOK_FLAGS = ("loss", "optimizer", "eval_metrics_fn", "callbacks",
              "prediction_outputs_processor")


def _check_hook_flags(path: str) -> None:
    """A hook named on the command line (`--loss=my_loss`) must be in the
    module: a typo would otherwise leave it silently unused."""
    names = _top_level_names(path)
    for flag in HOOK_FLAGS:
        value = getattr(FLAGS, flag)
        default = FLAGS[flag].default
        if value and value != default and value not in names:
            raise ValueError(f"--{flag}={value}: the module {path} does not define "
                             f"'{value}' (the default is '{default}')")


def check_train_checkpoint_dir(path: str) -> None:
    """`keras-elastic train --checkpoint_dir`: a directory (new or existing,
    with or without a trailing slash) that the job saves its checkpoints into
    and resumes from; a file or a single checkpoint is a ValueError saying
    what to give instead.

    Example:

    >>> check_train_checkpoint_dir("new-job-ckpts")   # nothing there yet: fine
    >>> open("a-file", "w").close()
    >>> check_train_checkpoint_dir("a-file")
    Traceback (most recent call last):
    ...
    ValueError: --checkpoint_dir=a-file is a file, not a directory: ...
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"--checkpoint_dir={path} is a file, not a directory: a "
                         "training job saves its checkpoints (ckpt-0001, ...) into "
                         "--checkpoint_dir; give a directory")
    if os.path.isfile(os.path.join(path, "manifest.json")):
        parent = os.path.dirname(os.path.abspath(path))
        raise ValueError(
            f"--checkpoint_dir={path} is a checkpoint itself (it holds manifest."
            "json), not a directory of checkpoints: a training job saves into "
            "--checkpoint_dir and resumes from the latest checkpoint in it. To "
            f"resume from the latest checkpoint beside it, give --checkpoint_dir="
            f"{parent}/; to train afresh, give a new directory")


def worker_data(flag_value: str | None) -> list[str]:
    """The files or patterns of a data flag; a directory (ElasticDL's usual
    form) stands for the files in it."""
    out = []
    for pattern in patterns(flag_value):
        if os.path.isdir(pattern):
            out.extend(sorted(p for p in glob.glob(os.path.join(pattern, "*"))
                              if os.path.isfile(p) and not os.path.basename(
                                  p).startswith(".")))
        else:
            out.append(pattern)
    return out


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
        if name == "model_zoo" or (name == "model_def" and ":" not in value and
                                   not FLAGS.model_zoo):
            from keras_elastic.jobs.model_def import zoo_dir

            if name == "model_zoo":
                value = os.path.abspath(value)
            elif zoo_dir(value, None):  # ElasticDL's form: the zoo is here
                args.append(f"--model_zoo={os.getcwd()}")
        if isinstance(value, bool):
            args.append(f"--{name}" if value else f"--no{name}")
        else:
            args.append(f"--{name}={value}")
    return args

"""The worker program of `keras-elastic train | evaluate | predict`."""

from __future__ import annotations

import json
import os

from absl import flags, logging

from keras_elastic.jobs.job_flags import FLAGS, worker_data


def define_flags() -> None:
    from keras_elastic.jobs.job_flags import JOB_TYPES, define_job_flags

    flags.DEFINE_enum("job", None, list(JOB_TYPES), "The job type.")
    define_job_flags()


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def _set_log_level() -> None:
    if FLAGS.log_level:
        level = FLAGS.log_level.lower()
        logging.set_verbosity("fatal" if level == "critical" else level)


# ElasticDL hooks keras-elastic never uses, and why.
NEVER_USED = {
    "custom_data_reader": "keras-elastic reads TFRecord or ArrayRecord files: give "
    "them as --training_data/--validation_data/--prediction_data",
    "CustomDataReader": "keras-elastic reads TFRecord or ArrayRecord files: give "
    "them as --training_data/--validation_data/--prediction_data",
    "prepare_data_for_a_single_file": "it converts raw files to records for "
    "ElasticDL's data tools; keras-elastic reads TFRecord files as they are: "
    "convert the data before the job",
}


def unused_hooks(module, compiled_by_user: bool, dataset_fn_name: str,
                 schedule_source: str | None,
                 compile_hooks: tuple[str, ...] = ("loss", "optimizer",
                                                   "eval_metrics_fn"),
                 feed: str | None = None) -> list[tuple[str, str]]:
    """`(hook, why)` for each ElasticDL hook the module defines that this job
    does not use. `compile_hooks`: the names of loss, optimizer and
    eval_metrics_fn (--loss, ...); `feed`: --feed.

    Example:

    >>> import types
    >>> module = types.SimpleNamespace(loss=lambda labels, outputs: 0.0,
    ...                                feed=lambda dataset, mode, metadata: dataset)
    >>> unused_hooks(module, True, "feed", None)
    [('loss', 'the model function returned a compiled model (its own loss, ...')]
    """
    from keras_elastic.jobs.model_def import dataset_fn_names

    unused = []
    if compiled_by_user:
        unused += [(n, "the model function returned a compiled model (its own "
                    "loss, optimizer and metrics are used)") for n in compile_hooks
                   if hasattr(module, n)]
    for name in dict.fromkeys((*dataset_fn_names(feed), "dataset_fn", "feed")):
        if name != dataset_fn_name and callable(getattr(module, name, None)):
            unused.append((name, f"'{dataset_fn_name}' is the dataset function "
                           f"(--feed={name} uses this one instead)"))
    if schedule_source and schedule_source != "learning_rate_scheduler" and callable(
            getattr(module, "learning_rate_scheduler", None)):
        unused.append(("learning_rate_scheduler", "callbacks() returns ElasticDL's "
                       "LearningRateScheduler, whose schedule is applied instead"))
    unused += [(n, why) for n, why in NEVER_USED.items() if hasattr(module, n)]
    return unused


def module_callbacks(module, name: str = "callbacks") -> list:
    """The module's `callbacks()` (a function returning a list, or a list) as
    a list. A function that returns None (ElasticDL's cifar10 model zoo makes
    its LearningRateScheduler and forgets the `return`) gives no callback,
    with a warning; anything else that is not a list is a TypeError naming
    the hook.

    Example:

    >>> import types
    >>> import keras
    >>> module = types.SimpleNamespace(callbacks=lambda: [
    ...     keras.callbacks.LearningRateScheduler(lambda epoch: 0.1 / (epoch + 1))])
    >>> [type(c).__name__ for c in module_callbacks(module)]
    ['LearningRateScheduler']
    """
    import keras

    value = getattr(module, name, None)
    if callable(value):
        value = value()
        if value is None:
            logging.warning("--model_def: the module's %s() returned None, so the job "
                            "has none of its callbacks (a callback it makes and does "
                            "not return, such as a LearningRateScheduler, is not "
                            "applied): return a list", name)
            return []
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, keras.callbacks.Callback):
        return [value]
    raise TypeError(f"--model_def: the module's {name} must be a list of Keras "
                    f"callbacks, or a function returning one; got "
                    f"{type(value).__name__}")


def _learning_rate_schedule(module, callbacks: list):
    """ElasticDL's `learning_rate_scheduler(model_version)` of the module, or
    the schedule of its LearningRateScheduler callback (then taken out of
    `callbacks`); None if neither."""
    from keras_elastic.jobs import elasticdl_compat

    schedule = getattr(module, "learning_rate_scheduler", None)
    source = "learning_rate_scheduler"
    for callback in list(callbacks):
        if type(callback).__module__ == elasticdl_compat.__name__ and hasattr(
                callback, "schedule"):
            callbacks.remove(callback)
            schedule = callback.schedule
            source = "from callbacks(): LearningRateScheduler"
    return (schedule, source) if callable(schedule) else (None, None)


def _compile(module, model, optimizer_override=None) -> bool:
    """Compiles `model` from the module's ElasticDL hooks unless it is compiled
    already; returns True if the user had compiled it."""
    from keras_elastic.jobs import zoo_hooks

    if getattr(model, "compiled", False):
        if optimizer_override is not None:
            model.optimizer = optimizer_override(model.optimizer)
        return True
    missing = [n for n in (FLAGS.loss, FLAGS.optimizer)
               if not callable(getattr(module, n, None))]
    if missing:
        raise ValueError(f"--model_def {FLAGS.model_def} returned a model that is not "
                         f"compiled, and the module does not define {missing[0]}(): "
                         "compile the model in it, or define loss(labels, "
                         "predictions) and optimizer() (ElasticDL's hooks)")
    optimizer = getattr(module, FLAGS.optimizer)()
    if optimizer_override is not None:
        optimizer = optimizer_override(optimizer)
    metrics_fn = getattr(module, FLAGS.eval_metrics_fn, None)
    metrics = zoo_hooks.eval_metrics(metrics_fn() if callable(metrics_fn) else None,
                                     zoo_hooks.output_names(model))
    zoo_hooks.zoo_model(model, getattr(module, FLAGS.loss), metrics)
    model.compile(optimizer=optimizer, loss=None)
    return False


def _build(model, dataset) -> None:
    """Builds an unbuilt (subclassed) model from the dataset's spec, without
    data, so that a checkpoint can be restored into it."""
    from keras_elastic.common import keras_compat

    if model.built and all(layer.built for layer in keras_compat.all_layers(model)):
        return
    if dataset.mode == "prediction":
        x, _, _ = keras_compat.unpack_x_y_sample_weight(dataset.batched_spec)
        keras_compat.build_from_input_spec(model, x)
    else:
        keras_compat.symbolic_build(model, dataset.batched_spec)


def checkpoint_directory(flag_value: str) -> str:
    """`--checkpoint_dir` as the directory `ShardedModelCheckpoint` saves into:
    always a directory (a trailing separator), never a checkpoint name in its
    parent, with or without a trailing slash on the command line.

    Example:

    >>> checkpoint_directory("out/ckpt")
    'out/ckpt/'
    """
    return os.path.join(flag_value, "")


def _checkpoint_options() -> dict:
    """ElasticDL's --checkpoint_steps and --keep_checkpoint_max."""
    # --checkpoint_dir resumes a train job from its latest checkpoint.
    options: dict = {"max_to_keep": FLAGS.keep_checkpoint_max or None,
                     "restore_on_start": True}
    if FLAGS.checkpoint_steps:
        options["save_freq"] = FLAGS.checkpoint_steps
    return options


def main(argv) -> None:
    del argv
    _set_log_level()
    import keras_elastic as ke
    from keras_elastic.jobs import zoo_hooks
    from keras_elastic.jobs.model_def import (
        dataset_fn_names,
        load_model_def,
        parse_model_params,
    )

    module, model_fn, module_dataset_fn = load_model_def(
        FLAGS.model_def, FLAGS.model_zoo, FLAGS.feed)
    dataset_fn_name = next(n for n in dataset_fn_names(FLAGS.feed)
                           if getattr(module, n, None) is module_dataset_fn)
    model = model_fn(**parse_model_params(FLAGS.model_params))
    dataset_fn = zoo_hooks.keras2_single_input(
        zoo_hooks.elastic_dataset_fn(module_dataset_fn), model)
    callbacks = module_callbacks(module, FLAGS.callbacks)
    cluster = ke.worker.get_cluster()

    def dataset(flag_value: str, mode: str, name: str, **kw):
        return ke.ElasticDataset(worker_data(flag_value), dataset_fn=dataset_fn,
                                 batch_size=FLAGS.minibatch_size,
                                 minibatches_per_task=FLAGS.num_minibatches_per_task,
                                 mode=mode, name=name, **kw)

    schedule, source = _learning_rate_schedule(module, callbacks)
    training = override = None
    if FLAGS.job == "train":
        training = dataset(FLAGS.training_data, "training", "training",
                           shuffle=FLAGS.shuffle)
        if schedule is not None:
            rate = zoo_hooks.tabulate_schedule(
                schedule, zoo_hooks.max_model_versions(training, FLAGS.num_epochs))
            logging.info("learning_rate_scheduler (%s): the parameter servers apply "
                         "%s", source, zoo_hooks.describe_rate(rate))

            def override(optimizer):
                return zoo_hooks.with_learning_rate(optimizer, rate)
    compiled_by_user = _compile(module, model, override)
    for name, why in unused_hooks(
            module, compiled_by_user, dataset_fn_name, source,
            (FLAGS.loss, FLAGS.optimizer, FLAGS.eval_metrics_fn), FLAGS.feed):
        logging.warning("--model_def: the module's '%s' is not used: %s", name, why)
    options = {k: getattr(FLAGS, f"ps_embedding_{k}")
               for k in ("admit_after", "max_rows", "ttl_versions")
               if getattr(FLAGS, f"ps_embedding_{k}") is not None}
    model = ke.wrap(model, exchange=FLAGS.exchange,
                    ps_embeddings_above=FLAGS.ps_embeddings_above,
                    ps_embedding_options=options or None)

    if FLAGS.job == "train":
        validation = (dataset(FLAGS.validation_data, "evaluation", "validation")
                      if FLAGS.validation_data else None)
        if validation is not None and FLAGS.evaluation_steps:
            callbacks.append(ke.callbacks.PeriodicEvaluation(
                validation, every_n_versions=FLAGS.evaluation_steps))
            validation = None
        if FLAGS.checkpoint_dir:
            callbacks.append(ke.callbacks.ShardedModelCheckpoint(
                checkpoint_directory(FLAGS.checkpoint_dir), **_checkpoint_options()))
        try:
            history = model.fit(
                training, epochs=FLAGS.num_epochs, validation_data=validation,
                callbacks=callbacks, verbose=2)
        except ke.checkpoint.ModelMismatchError as e:
            # The resume of --checkpoint_dir, in the command line's terms (the
            # last line is what the launcher quotes when the job fails).
            raise ke.checkpoint.ModelMismatchError(
                f"{e}\n--checkpoint_dir={FLAGS.checkpoint_dir} holds a checkpoint of "
                f"another model ({e.path}; {len(e.differences)} variable(s) differ, "
                f"e.g. {e.differences[0]}): resume it with the --model_def and "
                "--model_params it was saved with, or give a new --checkpoint_dir "
                "to train afresh", e.path, e.differences) from None
        # The chief (held by the master: worker 0 unless it was lost) writes
        # the job's outputs once.
        if ke.worker.is_chief(cluster):
            logging.info("final metrics: %s",
                         {k: v[-1] for k, v in history.history.items()})
            if FLAGS.output:
                ke.checkpoint.export_keras(model, FLAGS.output)
                logging.info("exported the trained model to %s", FLAGS.output)
        return
    if FLAGS.job == "evaluate":
        data = dataset(FLAGS.validation_data, "evaluation", "evaluation")
    else:
        processor = getattr(module, FLAGS.prediction_outputs_processor, None)
        if isinstance(processor, type):
            processor = processor()
        writer = None
        if processor is not None:
            from keras_elastic.prediction.writer import NumpyWriter

            writer = zoo_hooks.ProcessorWriter(
                processor, cluster.worker_id,
                NumpyWriter(FLAGS.output) if FLAGS.output else None)
        data = dataset(FLAGS.prediction_data, "prediction", "prediction",
                       output_dir=None if writer else FLAGS.output, output_writer=writer)
    _build(model, data)
    info = ke.checkpoint.restore_model(model, FLAGS.checkpoint_dir)
    logging.info("restored %s (epoch %s)", info.path, info.epoch)
    if FLAGS.job == "evaluate":
        logs = model.evaluate(data, return_dict=True, verbose=2)
        print("evaluation: " + " - ".join(f"{k}: {v:.4f}" for k, v in logs.items()),
              flush=True)
        if FLAGS.output and ke.worker.is_chief(cluster):
            _write_json(FLAGS.output, logs)
    else:
        model.predict(data, verbose=2)
        if FLAGS.output:
            print(f"predictions written to {FLAGS.output}", flush=True)

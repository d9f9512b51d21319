"""The worker program of `keras-elastic train | evaluate | predict`."""

from __future__ import annotations

import json
import os

from absl import flags, logging

from keras_elastic.jobs.job_flags import FLAGS, patterns


def define_flags() -> None:
    from keras_elastic.jobs.job_flags import JOB_TYPES, define_job_flags

    flags.DEFINE_enum("job", None, list(JOB_TYPES), "The job type.")
    define_job_flags()


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def main(argv) -> None:
    del argv
    import keras_elastic as ke
    from keras_elastic.jobs.model_def import load_model_def

    module, model_fn = load_model_def(FLAGS.model_def)
    model = model_fn()
    if not getattr(model, "compiled", False):
        raise ValueError(f"--model_def {FLAGS.model_def} must return a compiled model "
                         "(call model.compile(...) in it)")
    model = ke.wrap(model)
    user_callbacks = getattr(module, "callbacks", None)
    callbacks = list(user_callbacks() if callable(user_callbacks) else (
        user_callbacks or []))
    cluster = ke.worker.get_cluster()

    def dataset(flag_value: str, mode: str, name: str, **kw):
        return ke.ElasticDataset(patterns(flag_value), dataset_fn=module.dataset_fn,
                                 batch_size=FLAGS.minibatch_size,
                                 minibatches_per_task=FLAGS.num_minibatches_per_task,
                                 mode=mode, name=name, **kw)

    if FLAGS.job == "train":
        validation = (dataset(FLAGS.validation_data, "evaluation", "validation")
                      if FLAGS.validation_data else None)
        if validation is not None and FLAGS.evaluation_steps:
            callbacks.append(ke.callbacks.PeriodicEvaluation(
                validation, every_n_versions=FLAGS.evaluation_steps))
            validation = None
        if FLAGS.checkpoint_dir:
            callbacks.append(ke.callbacks.ShardedModelCheckpoint(FLAGS.checkpoint_dir))
        history = model.fit(
            dataset(FLAGS.training_data, "training", "training", shuffle=FLAGS.shuffle),
            epochs=FLAGS.num_epochs, validation_data=validation, callbacks=callbacks,
            verbose=2)
        if cluster.worker_id == 0:
            logging.info("final metrics: %s",
                         {k: v[-1] for k, v in history.history.items()})
            if FLAGS.output:
                ke.checkpoint.export_keras(model, FLAGS.output)
                logging.info("exported the trained model to %s", FLAGS.output)
        return
    info = ke.checkpoint.restore_model(model, FLAGS.checkpoint_dir)
    logging.info("restored %s (epoch %s)", info.path, info.epoch)
    if FLAGS.job == "evaluate":
        logs = model.evaluate(dataset(FLAGS.validation_data, "evaluation", "evaluation"),
                              return_dict=True, verbose=2)
        print("evaluation: " + " - ".join(f"{k}: {v:.4f}" for k, v in logs.items()),
              flush=True)
        if FLAGS.output and cluster.worker_id == 0:
            _write_json(FLAGS.output, logs)
    else:
        model.predict(dataset(FLAGS.prediction_data, "prediction", "prediction",
                              output_dir=FLAGS.output), verbose=2)
        print(f"predictions written to {FLAGS.output}", flush=True)

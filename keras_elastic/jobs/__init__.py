"""ElasticDL-style jobs without a script: `keras-elastic train | evaluate |
predict --model_def=module:function ...`.

The model definition module provides a function returning a compiled Keras
model, `dataset_fn(records, mode)`, and optionally `callbacks` (a list, or a
function returning one). The job type follows from the data flags, as in
ElasticDL: `--training_data` (plus `--validation_data`: training with
evaluation), `--validation_data` alone (evaluation), `--prediction_data`
(prediction).

ElasticDL's model zoos run too: `--model_zoo=DIR
--model_def=package.module.custom_model` with ElasticDL's hooks (loss,
optimizer, dataset_fn/feed(dataset, mode, metadata), eval_metrics_fn,
callbacks, learning_rate_scheduler, PredictionOutputsProcessor; see
`zoo_hooks.py`) and `elasticdl.*` imports served while the module loads
(`elasticdl_compat.py`); ElasticDL's flags are mapped or refused with what to
use instead (`job_flags.py`).

May import: keras_elastic (the public API), common, prediction, checkpoint,
callbacks, model, dataset. Of common: the data file checks of
`common/file_formats.py`, made at launch without TensorFlow.
`model_def.py` and `job_flags.py` import no TensorFlow, so the launcher checks
the flags before any process starts.
"""

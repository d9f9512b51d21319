"""ElasticDL-style jobs without a script: `keras-elastic train | evaluate |
predict --model_def=module:function ...`.

The model definition module provides a function returning a compiled Keras
model, `dataset_fn(records, mode)`, and optionally `callbacks` (a list, or a
function returning one). The job type follows from the data flags, as in
ElasticDL: `--training_data` (plus `--validation_data`: training with
evaluation), `--validation_data` alone (evaluation), `--prediction_data`
(prediction).

May import: keras_elastic (the public API), keras_elastic.checkpoint.
`model_def.py` and `job_flags.py` import no TensorFlow, so the launcher checks
the flags before any process starts.
"""

"""The manifest of Keras' own tests that do not pass against elastic models.

Keys are test ids relative to tests/keras_suite (`FILE::CLASS::METHOD`), or
`fnmatch` patterns of them; values are the reason. Every test of the suite
that does not run and pass is matched by exactly one entry (conftest.py fails
a test that is skipped or xfailed without one):

- `NOT_APPLICABLE`: the test cannot apply to the TensorFlow backend or to an
  elastic model (JAX- or torch-only behaviour, Keras' own skips on
  TensorFlow, input types of packages this environment and CI lack: they fail
  with Keras alone too); skipped, the reason shown.
- `DEFECTS`: a keras-elastic defect, with its cause; run as
  `xfail(strict=True)`, so a fixed defect fails its test until its entry goes.

docs/keras_tests.md lists these entries (regenerate it with
`python -m tests.keras_suite.report RECORD.json`, see report.py).
"""

from __future__ import annotations

import fnmatch

NOT_APPLICABLE: dict[str, str] = {
    # Keras' own skip markers on the TensorFlow backend (skipped with Keras alone).
    "test_trainer.py::JAXTrainerCorrectnessTest::*":
        "JAX only (Keras' skipif: backend != jax)",
    "test_trainer.py::TestTrainer::test_fit_eval_flow_for_jax_model_weights":
        "JAX only (Keras' skipif: the memory optimization exists in JAX only)",
    "test_trainer.py::TestTrainer::test_compile_eager_vs_jit_torch":
        "torch only (Keras' skipif: backend != torch)",
    "test_trainer.py::TestTrainer::test_retracing_predict":
        "Keras skips it on TensorFlow (predict_function with steps_per_execution "
        "is not optimized for tensorflow yet)",
    "test_trainer.py::TestTrainer::test_fit_with_data_adapter_py_dataset_multiprocessing*":
        "Keras skips it on TensorFlow (multiprocessing PyDataset hangs on "
        "TensorFlow)",
    "test_saving_api.py::LoadWeightsTests::test_load_weights_h5_*bfloat16*":
        "Keras skips it (bfloat16 is not supported by the legacy h5 format)",
    # Data of other backends or packages this environment (and CI) lacks: they
    # fail with Keras alone (ModuleNotFoundError).
    "test_trainer.py::TestTrainer::test_*_sparse_jax_*":
        "JAX sparse arrays as input: needs jax (not installed; a JAX input "
        "type); fails with Keras alone",
    "test_trainer.py::TestTrainer::test_fit_with_data_adapter_torch_dataloader_*":
        "a torch DataLoader as input: needs torch (not installed); fails with "
        "Keras alone",
    "test_trainer.py::TestTrainer::test_fit_with_data_adapter_grain_*":
        "a grain dataset as input: needs grain (not installed); fails with Keras "
        "alone",
    # What keras-elastic replaces.
    "test_swap_ema_weights.py::SwapEMAWeightsTest::test_swap_ema_weights_with_tf_distribute":
        "a model built in a tf.distribute.MirroredStrategy scope: keras-elastic "
        "distributes training over its workers and parameter servers itself, "
        "and fit refuses such a model with an error that says so (build it "
        "outside the strategy's scope)",
}

# In a 2-worker job only (tests/test_keras_suite_job.py), beside NOT_APPLICABLE.
_OWN_TEMP_DIRS = (
    "each worker's test writes to a temporary directory of its own "
    "(tempfile.mkdtemp), so the chief writes its own worker's path while the "
    "other worker's assertions look in theirs; the callbacks' files in a job are "
    "tested by tests/test_file_callbacks.py and tests/test_tensorboard.py")
_OWN_BATCHES = (
    "batch-level callbacks see the batches this worker trains: the job's few "
    "batches (its data is tiny) may all go to the other worker, and a NaN loss "
    "is seen by the worker whose batch made it")
JOB_NOT_APPLICABLE: dict[str, str] = {
    "test_lambda_callback.py::LambdaCallbackTest::test_lambda_callback_with_batches":
        _OWN_BATCHES,
    "test_terminate_on_nan.py::TerminateOnNaNTest::test_raise_error_*": _OWN_BATCHES,
    "test_csv_logger.py::*": _OWN_TEMP_DIRS,
    "test_backup_and_restore.py::*": _OWN_TEMP_DIRS,
    "test_model_checkpoint.py::*": _OWN_TEMP_DIRS,
    "test_tensorboard.py::*": _OWN_TEMP_DIRS,
    "test_swap_ema_weights.py::SwapEMAWeightsTest::test_swap_ema_weights_on_epoch":
        _OWN_TEMP_DIRS,
    "test_trainer.py::TestTrainer::test_steps_per_epoch_*":
        "counts the batches this process trains (its callbacks' batch hooks); in "
        "a job each worker trains its share of each epoch's batches (each batch "
        "once, on one worker: the master's ledger), so no worker's count is the "
        "epoch's",
    "test_trainer.py::TestTrainer::test_steps_per_execution_steps_count_[0-9]*":
        "counts the batches this process trains (its callbacks' batch hooks); in "
        "a job each worker trains its share of each epoch's batches (each batch "
        "once, on one worker: the master's ledger), so no worker's count is the "
        "epoch's",
    "test_trainer.py::TestTrainer::test_steps_per_execution_steps_count_without_*":
        "counts the batches this process evaluates and predicts (its callbacks' "
        "batch hooks); in a job each worker evaluates its share of the tasks",
    "test_trainer.py::TestTrainer::test_evaluate_with_custom_test_step_*":
        "a test_step of its own that logs values other than metrics: as in Keras, "
        "evaluate returns the last batch's logs (its metrics the job's); a worker "
        "that evaluated no batch of the round (the other took every task) has "
        "only the metrics to return",
    "test_trainer.py::TestTrainer::test_loss_weights":
        "asserts sequential SGD's losses to 1e-3 (two batches an epoch); in a job "
        "the other worker may compute a batch's gradient from the weights before "
        "this one's update arrives (asynchronous SGD, ElasticDL's: README, "
        "'Several workers'), which moves the loss past 1e-3 whenever the two "
        "workers each take a batch",
    "test_trainer.py::TestTrainer::test_steps_per_execution_steps_count_unknown_*":
        "fits a tf.data.Dataset, which a job refuses by design: every worker would "
        "train on all of it (README: give arrays or a ke.ElasticDataset)",
}

DEFECTS: dict[str, str] = {
}

# Known defects in a 2-worker job only: run there as strict xfails.
JOB_DEFECTS: dict[str, str] = {
}



# Keras' test modules of the areas the suite covers that it does not run,
# with the reason (shown in docs/keras_tests.md).
NOT_PORTED: dict[str, str] = {
    "keras/src/trainers/data_adapters/*_test.py":
        "they test Keras' data adapters by themselves (an adapter built from "
        "arrays, a tf.data.Dataset, a generator or a PyDataset, its batches "
        "read): no model is trained, so no model can be made elastic, and each "
        "module imports jax and torch at the top. The inputs they define reach "
        "keras-elastic through fit in trainer_test.py (`test_fit_with_data_adapter_"
        "*`: arrays, tf.data, generators, PyDataset, each with and without "
        "steps_per_epoch) and in tests/test_keras_semantics.py (lists, dicts, "
        "tf.Tensor, pandas, sparse tensors)",
}


def find(entries: dict[str, str], test_id: str) -> str | None:
    """The first key of `entries` (a test id or pattern) matching `test_id`.

    >>> find({"test_a.py::T::test_*": "why"}, "test_a.py::T::test_b")
    'test_a.py::T::test_*'
    >>> find({"test_a.py::T::test_b": "why"}, "test_a.py::T::test_c") is None
    True
    """
    for pattern in entries:
        if pattern == test_id or fnmatch.fnmatchcase(test_id, pattern):
            return pattern
    return None

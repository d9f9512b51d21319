"""keras-io's "Training & evaluation with the built-in methods" guide, plain
and elastic (issue 40): every NumPy section, with the inputs written as the
guide writes them (`keras.ops.one_hot(...)` tensors as labels, Python lists
and dicts of arrays for a model of two inputs and two outputs, a dict of
inputs and no targets, `class_weight`, `sample_weight`, `validation_split`),
custom losses and metrics, `add_loss`, and callbacks.

tests/keras_io/training_with_built_in_methods.py (plain Keras) and
training_with_built_in_methods_elastic.py (the README's change: `import
keras_elastic as ke` and each of the guide's thirteen trained models wrapped,
e.g. `model = ke.wrap(get_compiled_model())`) run as a plain process, as an
embedded elastic run and as a 2-worker job; the elastic results must stay
within the tolerances below of plain Keras' (see tests/keras_io/harness.py).
"""

import re

import pytest
from keras_io.harness import (
    EXACT,
    Tol,
    assert_close,
    check_readme_diff,
    run_embedded,
    run_job,
    run_plain,
    script_paths,
)
from keras_io.job_checks import assert_no_worker_relaunched

NAME = "training_with_built_in_methods"

# The same in every plain run: History keys (a multi-output model's per-output
# losses and metrics), shapes, the files the checkpoint callbacks write.
SAME = {
    "first_history_keys": EXACT,
    "predictions_shape": EXACT,
    "predictions_sum_to_one": EXACT,
    "true_positives_history_keys": EXACT,
    "logistic_endpoint_history_keys": EXACT,
    "lists_history_keys": EXACT,
    "dicts_history_keys": EXACT,
    "checkpoint_files": EXACT,
    "restored_from": EXACT,
}
# Plain Keras over three other seeds and this one (other initial weights and
# batch orders), per figure: first validation accuracy 0.927..0.960, test
# accuracy 0.859..0.879 and loss 0.386..0.444 (297 images); custom MSE losses
# 0.073..0.077 and 0.090..0.099; the guide's true-positives metric (it counts
# prediction/label pairs of a batch) 8500..8678; with add_loss 9.4..11.2; the
# LogisticEndpoint's one step on 3 random samples 0.685..0.716 (other data: with
# this seed's data the first step's loss is fixed); validation_split accuracy
# 0.771..0.846; class_weight loss 1.56..1.71, accuracy 0.559..0.643;
# sample_weight loss 1.59..1.82, accuracy 0.466..0.648 (one epoch from new
# weights); the two-input model on random targets, lists 10.2..19.2, dicts
# 8.7..15.4; EarlyStopping after 12..15 epochs, at validation accuracy
# 0.958..0.983; the ModelCheckpoint fit's validation loss 0.525..0.623; the
# checkpoint-every-10-batches fit's loss 1.157..1.240. Each tolerance covers
# that spread around this run's figure.
EMBEDDED = {
    **SAME,
    "first_val_accuracy": Tol(abs=0.05),
    "test_accuracy": Tol(abs=0.05),
    "test_loss": Tol(abs=0.1),
    "custom_mse_loss": Tol(rel=0.1),
    "custom_mse_class_loss": Tol(rel=0.15),
    "true_positives": Tol(rel=0.1),
    "activity_regularization_loss": Tol(rel=0.2),
    "logistic_endpoint_loss": Tol(abs=0.02),
    "validation_split_val_accuracy": Tol(abs=0.1),
    "class_weight_loss": Tol(rel=0.15),
    "class_weight_accuracy": Tol(abs=0.12),
    "sample_weight_loss": Tol(rel=0.2),
    "sample_weight_accuracy": Tol(abs=0.2),
    "lists_loss": Tol(rel=1.0),
    "dicts_loss": Tol(rel=1.0),
    "early_stopping_epochs_run": Tol(abs=3),
    "early_stopping_val_accuracy": Tol(abs=0.05),
    "checkpoint_val_loss": Tol(abs=0.15),
    # ModelCheckpoint(save_freq=10): 38 batches of 32 in the epoch, 3 files.
    "ckpt_files": EXACT,
    "ckpt_loss": Tol(rel=0.15),
}
# A 2-worker job: asynchronous updates, twice as loose. The checkpoint every 10
# batches is written by the chief only, counting the batches it trained (fewer
# than the epoch's 38): checked in `check_job`, not compared.
# The add_loss model's one epoch is the exception: its first batch's loss on
# the initial weights is about 70 (the activity term, 0.1 x the sum of 64 x 64
# fresh ReLU outputs) against an epoch mean of 7-11, and decays within a few
# batches. When both workers' first steps pull the initial weights (they
# start together; which one's first push lands first is the machines'
# timing), the epoch has two such batches of its 19 instead of one: 70 / 19
# = 3.7 more on the mean, plus the stale second push. A CI run under load
# measured 14.42 against plain's 9.74; an idle machine's jobs 10.87, 10.89.
# Its bound is the plain spread doubled (rel 0.4), and above plain that one
# batch more (0.4 of the mean): a job that lost the add_loss term (2.3) fails.
JOB = {
    **SAME,
    "first_val_accuracy": Tol(abs=0.1),
    "test_accuracy": Tol(abs=0.1),
    "test_loss": Tol(abs=0.2),
    "custom_mse_loss": Tol(rel=0.2),
    "custom_mse_class_loss": Tol(rel=0.3),
    "true_positives": Tol(rel=0.2),
    "activity_regularization_loss": Tol(rel=0.4, above_rel=0.4),
    "logistic_endpoint_loss": Tol(abs=0.04),
    "validation_split_val_accuracy": Tol(abs=0.2),
    "class_weight_loss": Tol(rel=0.3),
    "class_weight_accuracy": Tol(abs=0.24),
    "sample_weight_loss": Tol(rel=0.4),
    "sample_weight_accuracy": Tol(abs=0.3),
    "lists_loss": Tol(rel=1.0),
    "dicts_loss": Tol(rel=1.0),
    "early_stopping_epochs_run": Tol(abs=6),
    "early_stopping_val_accuracy": Tol(abs=0.1),
    "checkpoint_val_loss": Tol(abs=0.3),
    "ckpt_loss": Tol(rel=0.3),
}


def check_result(result):
    assert result["predictions_sum_to_one"], result
    assert result["checkpoint_files"] == ["mymodel_1.keras", "mymodel_2.keras"], result
    # The first make_or_restore_model() found ./ckpt empty.
    assert result["restored_from"] == [], result
    assert result["test_accuracy"] >= 0.75, result


def check_job(results, plain, tmp_path):
    # ./ckpt holds the chief's checkpoints only, each named by its loss: no
    # other worker's (temporary) files, at least one, at most Keras' three.
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert 1 <= len(names) <= plain["ckpt_files"], names
    assert all(re.fullmatch(r"model-loss=\d+\.\d\d\.keras", n) for n in names), names
    for worker, result in results.items():
        assert result["ckpt_files"] == len(names), (worker, result, names)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return run_plain(NAME, tmp_path_factory.mktemp("plain"))


def test_elastic_script_is_the_readme_change():
    check_readme_diff(*script_paths(NAME))


def test_plain_keras(plain):
    check_result(plain)
    assert plain["ckpt_files"] == 3, plain
    assert plain["lists_history_keys"] == [
        "class_output_categorical_accuracy", "class_output_loss", "loss",
        "score_output_loss", "score_output_mean_absolute_error",
        "score_output_mean_absolute_percentage_error"], plain


def test_embedded(plain, tmp_path):
    result = run_embedded(NAME, tmp_path)
    check_result(result)
    assert_close(result, plain, EMBEDDED, "embedded")


@pytest.mark.multiprocess
def test_job_of_two_workers(plain, tmp_path):
    results = run_job(NAME, tmp_path, num_workers=2)
    assert_no_worker_relaunched(tmp_path, num_workers=2)
    for worker, result in results.items():
        check_result(result)
        assert_close(result, plain, JOB, f"job {worker}")
    check_job(results, plain, tmp_path)

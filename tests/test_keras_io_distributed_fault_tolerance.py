"""keras-io's "Multi-GPU distributed training with TensorFlow": fit and
evaluate on tf.data Datasets, ModelCheckpoint("ckpt-{epoch}.keras") and
resuming from the newest checkpoint with load_model, plain and elastic
(issue 23).

tests/keras_io/distributed_fault_tolerance.py (plain Keras) and
distributed_fault_tolerance_elastic.py (the README's change: `import keras_elastic
as ke` and `model = ke.wrap(make_or_restore_model())`) run as a plain process, as an
embedded elastic run and as a 2-worker job; the elastic metrics must stay within the
tolerances below of plain Keras' (see tests/keras_io/harness.py).
"""

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

NAME = "distributed_fault_tolerance"

# 297 test and 300 validation images after 2 + 2 epochs. The guide's datasets
# are not shuffled (plain Keras gives the same figures on every run), so there
# is no spread of batch orders to measure: 0.06 (18 images) as for the other
# digit classifiers, whose batch order moves their accuracies by up to 0.03.
# The checkpoint files and the one restored must be the same.
EMBEDDED = {
    "test_accuracy": Tol(abs=0.06),
    "first_val_accuracy": Tol(abs=0.06),
    "second_val_accuracy": Tol(abs=0.06),
    "resumed_epoch_loss": Tol(abs=0.05, rel=0.3),
    "restored_from": EXACT,
    "checkpoints": EXACT,
    "epochs_run": EXACT,
}
# A 2-worker job: asynchronous updates; both workers write and read ./ckpt.
JOB = {
    "test_accuracy": Tol(abs=0.12),
    "first_val_accuracy": Tol(abs=0.12),
    "second_val_accuracy": Tol(abs=0.12),
    "resumed_epoch_loss": Tol(abs=0.1, rel=0.6),
    "restored_from": EXACT,
    "checkpoints": EXACT,
    "epochs_run": EXACT,
}


def check_result(result):
    # The second run resumed from the first one's last checkpoint: its first
    # epoch starts far below a new model's.
    assert result["restored_from"] == ["ckpt-2.keras"], result
    assert result["resumed_epoch_loss"] < 0.5 * result["first_epoch_loss"], result


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return run_plain(NAME, tmp_path_factory.mktemp("plain"))


def test_elastic_script_is_the_readme_change():
    check_readme_diff(*script_paths(NAME))


def test_plain_keras(plain):
    check_result(plain)
    assert plain["test_accuracy"] >= 0.8, plain


def test_embedded(plain, tmp_path):
    result = run_embedded(NAME, tmp_path)
    check_result(result)
    assert_close(result, plain, EMBEDDED, "embedded")


@pytest.mark.multiprocess
def test_job_of_two_workers(plain, tmp_path):
    for worker, result in run_job(NAME, tmp_path, num_workers=2).items():
        check_result(result)
        assert_close(result, plain, JOB, f"job {worker}")

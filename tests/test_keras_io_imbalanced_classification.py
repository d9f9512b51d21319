"""keras-io's "Imbalanced classification: credit card fraud detection",
plain and elastic (issue 23).

tests/keras_io/imbalanced_classification.py (plain Keras) and
imbalanced_classification_elastic.py (the README's change: `import keras_elastic as
ke` and `model = ke.wrap(build_classifier())`) run as a plain process, as an
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

NAME = "imbalanced_classification"

# Adam(1e-2) on class-weighted data swings from epoch to epoch (plain Keras'
# validation false-positive rate goes from 9% to 1% and back to 3% within its
# 6 epochs). Plain Keras from the same initial weights with three other batch
# orders: validation recall 0.85..0.98 (this run 0.945; 55 frauds, a step is
# 0.018), false-positive rate 0.009 (0.010). The files ModelCheckpoint writes
# must all be there.
EMBEDDED = {
    "val_recall": Tol(abs=0.15),
    "val_fp_rate": Tol(abs=0.05),
    "reloaded_val_recall": Tol(abs=0.15),
    "val_positives": EXACT,
    "checkpoints": EXACT,
    "epochs_run": EXACT,
}
# A 2-worker job: asynchronous updates on top of that.
JOB = {
    "val_recall": Tol(abs=0.25),
    "val_fp_rate": Tol(abs=0.1),
    "reloaded_val_recall": Tol(abs=0.25),
    "val_positives": EXACT,
    "checkpoints": EXACT,
    "epochs_run": EXACT,
}


def check_result(result):
    # The confusion counts cover the validation set; one checkpoint per epoch.
    assert result["val_tp"] + result["val_fn"] == result["val_positives"], result
    assert result["checkpoints"] == result["epochs_run"] == 6, result


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return run_plain(NAME, tmp_path_factory.mktemp("plain"))


def test_elastic_script_is_the_readme_change():
    check_readme_diff(*script_paths(NAME))


def test_plain_keras(plain):
    check_result(plain)
    assert plain["val_recall"] >= 0.8, plain
    assert plain["val_fp_rate"] <= 0.1, plain
    # The last epoch's checkpoint is the model that was validated last.
    assert plain["reloaded_val_recall"] == pytest.approx(plain["val_recall"]), plain


def test_embedded(plain, tmp_path):
    result = run_embedded(NAME, tmp_path)
    check_result(result)
    assert_close(result, plain, EMBEDDED, "embedded")


@pytest.mark.multiprocess
def test_job_of_two_workers(plain, tmp_path):
    for worker, result in run_job(NAME, tmp_path, num_workers=2).items():
        check_result(result)
        assert_close(result, plain, JOB, f"job {worker}")

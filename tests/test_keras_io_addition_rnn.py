"""keras-io's "Sequence to sequence learning for performing number addition",
plain and elastic (issue 40): data drawn from NumPy's global generator,
unseeded, as keras.io draws it, and `fit(..., epochs=1)` called in a loop with
`predict` of single samples between the calls.

tests/keras_io/addition_rnn.py (plain Keras) and addition_rnn_elastic.py (the
README's change: `import keras_elastic as ke` and `model =
ke.wrap(keras.Sequential())`, the layers added to it after) run as a plain
process, as an embedded elastic run and as a 2-worker job; the elastic
metrics must stay within the tolerances below of plain Keras' (see
tests/keras_io/harness.py). Every worker of a job runs the unseeded data code:
their arrays must be the same (one fingerprint) without the script seeding
anything.
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
from keras_io.job_checks import assert_no_worker_relaunched

NAME = "addition_rnn"

SAME = {
    "questions": EXACT,
    "train_shape": EXACT,
    "iterations": EXACT,
    "shown": EXACT,
}
# The script seeds nothing: every plain run has other questions, another
# shuffle and other initial weights. Four plain runs: last validation accuracy
# (of the answer characters) 0.515..0.568, validation loss 1.237..1.285,
# training accuracy 0.523..0.538. The tolerances are about those ranges.
EMBEDDED = {
    **SAME,
    "val_accuracy": Tol(abs=0.06),
    "val_loss": Tol(abs=0.06),
    "accuracy": Tol(abs=0.04),
}
# A 2-worker job: asynchronous updates on top of that, twice as loose.
JOB = {
    **SAME,
    "val_accuracy": Tol(abs=0.12),
    "val_loss": Tol(abs=0.12),
    "accuracy": Tol(abs=0.08),
}


def check_result(result):
    assert result["questions"] == 4000, result
    assert len(result["data_sha256"]) == 64, result
    # Better than the most common character of each answer position alone
    # ("1", "0", " ": 0.386 of the characters of 4000 questions).
    assert result["val_accuracy"] >= 0.45, result


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return run_plain(NAME, tmp_path_factory.mktemp("plain"))


def test_elastic_script_is_the_readme_change():
    check_readme_diff(*script_paths(NAME))


def test_plain_keras(plain):
    check_result(plain)


def test_embedded(plain, tmp_path):
    result = run_embedded(NAME, tmp_path)
    check_result(result)
    assert_close(result, plain, EMBEDDED, "embedded")


@pytest.mark.multiprocess
def test_job_of_two_workers(plain, tmp_path):
    results = run_job(NAME, tmp_path, num_workers=2)
    assert_no_worker_relaunched(tmp_path, num_workers=2)
    # Every worker built the same arrays from the unseeded code.
    assert len({r["data_sha256"] for r in results.values()}) == 1, results
    for worker, result in results.items():
        check_result(result)
        assert_close(result, plain, JOB, f"job {worker}")

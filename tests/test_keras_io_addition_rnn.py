"""keras-io's "Sequence to sequence learning for performing number addition",
plain and elastic (issue 40): data drawn from NumPy's global generator,
unseeded, as keras.io draws it, and `fit(..., epochs=1)` called in a loop with
`predict` of single samples between the calls.

tests/keras_io/addition_rnn.py (plain Keras) and addition_rnn_elastic.py (the
README's change: `import keras_elastic as ke` and `model =
ke.wrap(keras.Sequential())`, the layers added to it after) run as a plain
process, as an embedded elastic run and as a 2-worker job; the elastic
metrics must stay within the tolerances below of plain Keras' (see
tests/keras_io/harness.py). The plain and embedded runs get the same seed
from outside the script (below: why); the job gets the same seed as its
`--seed`, and its workers run the unseeded data code from it: their arrays
must be plain Keras' (one fingerprint) without the script seeding anything.
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
# The script seeds nothing, so two runs draw other questions, shuffles and
# weights. Measured first (2026-11-28) as 8 plain runs against 13 embedded
# ones (validation loss sd 0.022 each); the suite then drew a plain run at
# 1.423 (CI, 2026-11-29), 9 sd off that: after 8 iterations the model is in
# its fastest learning, and when it takes off varies more than 8 runs
# showed. So plain Keras and the embedded run are given the same seed from
# outside (`seed=`: the harness seeds the global generators before the
# unchanged script, as a launched worker's `import keras_elastic` does with
# the job's seed): the same questions and initial weights, and a run that
# repeats exactly on one machine (seed 1 twice: the same figures to the last
# digit), so a failure can be rerun. What still differs is the elastic
# path's own order of batches. Measured over seeds 1-7 (2026-11-29), the
# difference embedded - plain: validation loss -0.047..+0.150 (sd 0.070),
# validation accuracy -0.053..+0.039 (sd 0.033), training accuracy
# -0.015..+0.010 (sd 0.010). The bounds are 3.5 sd of those (the loss's
# first bound, 0.14, was 2 sd: seed 2 exceeds it).
SEED = 1
EMBEDDED = {
    **SAME,
    "data_sha256": EXACT,  # the same seed: the same questions
    "val_accuracy": Tol(abs=0.11),
    "val_loss": Tol(abs=0.25),
    "accuracy": Tol(abs=0.05),
}
# A 2-worker job of the same seed (`--seed`: every worker draws plain
# Keras' questions and initial weights from it): what differs is the order
# of batches over two workers and their asynchronous updates, given twice
# the embedded run's bounds. It ran unseeded until CI drew a job whose
# last epoch fell to 0.450 validation accuracy (best 0.4825) on other
# questions than the seeded plain run's; with the seed a failure reruns
# on the same data.
JOB = {
    **SAME,
    "data_sha256": EXACT,
    "val_accuracy": Tol(abs=0.22),
    "val_loss": Tol(abs=0.28),
    "accuracy": Tol(abs=0.10),
}


def check_result(result):
    assert result["questions"] == 4000, result
    assert len(result["data_sha256"]) == 64, result
    # Better than the most common character of each answer position alone
    # ("1", "0", " ": 0.386 of the characters of 4000 questions). A count
    # of correct characters over 1200: 540/1200 reads 0.44999996 in float32,
    # so the count is compared, not the float.
    assert round(result["val_accuracy"] * 1200) >= 540, result


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return run_plain(NAME, tmp_path_factory.mktemp("plain"), seed=SEED)


def test_elastic_script_is_the_readme_change():
    check_readme_diff(*script_paths(NAME))


def test_plain_keras(plain):
    check_result(plain)


def test_embedded(plain, tmp_path):
    result = run_embedded(NAME, tmp_path, seed=SEED)
    check_result(result)
    assert_close(result, plain, EMBEDDED, "embedded")


@pytest.mark.multiprocess
def test_job_of_two_workers(plain, tmp_path):
    results = run_job(NAME, tmp_path, num_workers=2, seed=SEED)
    assert_no_worker_relaunched(tmp_path, num_workers=2)
    # Every worker built plain Keras' arrays from the unseeded code.
    assert {r["data_sha256"] for r in results.values()} == {plain["data_sha256"]}, results
    for worker, result in results.items():
        check_result(result)
        assert_close(result, plain, JOB, f"job {worker}")

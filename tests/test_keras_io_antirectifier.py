"""keras-io's "Simple custom layer example: Antirectifier", plain and elastic
(issue 23).

tests/keras_io/antirectifier.py (plain Keras) and antirectifier_elastic.py (the
README's change: `import keras_elastic as ke` and `model = ke.wrap(build_model())`)
run as a plain process, as an embedded elastic run and as a 2-worker job; the
elastic metrics must stay within the tolerances below of plain Keras' (see
tests/keras_io/harness.py). The job's tolerances were checked against
asynchronous SGD's own spread on this example: measured in jobs, and
reproduced without keras_elastic by
tests/keras_io/antirectifier_async_reference.py (see JOB).
"""

import json
import os
import subprocess
import sys

import pytest
from conftest import subprocess_env
from keras_io.harness import (
    EXACT,
    SCRIPTS_DIR,
    Tol,
    assert_close,
    best_epoch_values,
    check_readme_diff,
    run_embedded,
    run_job,
    run_plain,
    script_paths,
)

NAME = "antirectifier"
REFERENCE = os.path.join(SCRIPTS_DIR, "antirectifier_async_reference.py")

# Plain Keras from the same initial weights with three other batch orders:
# test accuracy 0.889..0.899 (this run 0.906; 297 images, 0.05 is 15 of them),
# validation accuracy 0.924..0.956 (0.956; 225 images).
EMBEDDED = {
    "test_accuracy": Tol(abs=0.05),
    "val_sparse_categorical_accuracy": Tol(abs=0.06),
    "epochs_run": EXACT,
}
# A 2-worker job updates the servers asynchronously: a gradient may be
# computed on weights another worker's update has changed since. How much:
# the server's version minus the version each gradient was computed on,
# measured at every applied push (a probe in ParameterStore.push; 16 jobs,
# 2026-11-29, 2 cores, 1 to 3 jobs at once): of 1,600 updates 85% had
# staleness 0, 11% 1, 3.3% 2, 0.7% 3-6 (73-94% zero per job). A job's
# updates are nearly sequential, not the "one update late, every step" that
# keras_io/antirectifier_async_reference.py models with --staleness=1.
# Measured, final test accuracy (plain Keras: 0.906; other batch orders and
# initial weights 0.889-0.926):
# - the reference, every gradient one update late: 45 seeds 0.818-0.912,
#   median 0.879; none below 0.806 (plain - 0.10);
# - the reference replaying 3 of those jobs' measured staleness
#   (--staleness_trace, 8 seeds each): 0.875-0.912, as with none (0.875-0.916);
# - the 16 jobs: 0.842-0.906, median 0.89; validation 0.924-0.960.
# So asynchronous SGD's staleness does not make this example's final figures
# spread past 0.10: the 0.20 these bounds had (from 27 jobs of 2026-11-28:
# 0.751-0.919, 3 below 0.81) is not explained by it, and that tail did not
# recur in the 16 jobs on the code of 2026-11-29; the tighter bounds are back.
# A job past them is a finding: its staleness trace (measured as above)
# replayed by the reference tells whether asynchrony explains it.
# A 1-worker job has no stale gradient: test accuracy 0.882, validation
# 0.964, the same in every run (test_job_of_one_worker).
# The last epoch's validation accuracy (not the best epoch's) spreads more:
# 42 2-worker jobs of 2026-12-01 gave 0.871..0.969 and a loaded suite run
# 0.836 (plain 0.956: 0.12 below), with staleness measured as above (70% of
# updates 0, 26% 1, 4% 2-4); one epoch's last updates move 225 images' last
# figure by a few images either way, while the best epoch's stayed within
# 0.05. 0.15 covers that spread.
JOB = {
    "best_val_sparse_categorical_accuracy": Tol(abs=0.05),
    "test_accuracy": Tol(abs=0.10),
    "val_sparse_categorical_accuracy": Tol(abs=0.15),
    "epochs_run": EXACT,
}


def check_result(result):
    assert result["epochs_run"] == 10, result


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return run_plain(NAME, tmp_path_factory.mktemp("plain"))


def test_elastic_script_is_the_readme_change():
    check_readme_diff(*script_paths(NAME))


def test_plain_keras(plain):
    check_result(plain)
    assert plain["test_accuracy"] >= 0.85, plain
    # The harness read the best epoch from Keras' own epoch lines.
    best = plain["best_val_sparse_categorical_accuracy"]
    assert plain["val_sparse_categorical_accuracy"] <= best <= 1.0, plain


def test_best_epoch_values_reads_keras_epoch_summaries():
    output = "\n".join([
        "Epoch 1/2",
        "10/10 - 2s - 151ms/step - loss: 1.6 - sparse_categorical_accuracy: 0.41 "
        "- val_loss: 0.80 - val_sparse_categorical_accuracy: 0.8311",
        "10/10 - 1s - 9ms/step - loss: 7.1e-01 - sparse_categorical_accuracy: 0.97 "
        "- val_loss: 0.49 - val_sparse_categorical_accuracy: 0.7978",
        "RESULT {}",
    ])
    assert best_epoch_values(output) == {"best_val_sparse_categorical_accuracy": 0.8311}
    assert best_epoch_values("no epochs here") == {}


@pytest.mark.multiprocess
def test_async_reference_runs(tmp_path):
    """The reference behind JOB's tolerances runs (one seed, two epochs) and
    trains: the loss falls, with and without the stale gradient, and
    replaying a job's measured staleness."""
    trace = tmp_path / "staleness.txt"
    trace.write_text("0\n2\n0\n1\n6\n0\n")
    for staleness in ("--staleness=0", "--staleness=1", f"--staleness_trace={trace}"):
        proc = subprocess.run(
            [sys.executable, REFERENCE, "--seeds=1", "--epochs=2", staleness],
            cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
            timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = next(x for x in proc.stdout.splitlines() if x.startswith("REFERENCE "))
        (run,) = json.loads(line[len("REFERENCE "):])["runs"]
        assert run["losses"][1] < run["losses"][0], run
        assert 0.5 < run["test_accuracy"] <= 1.0, run


def test_embedded(plain, tmp_path):
    result = run_embedded(NAME, tmp_path)
    check_result(result)
    assert_close(result, plain, EMBEDDED, "embedded")


@pytest.mark.multiprocess
def test_job_of_one_worker(plain, tmp_path):
    """One worker: no asynchrony, so the job's figures are as close to plain
    Keras' as the embedded run's (the same in every run)."""
    (result,) = run_job(NAME, tmp_path, num_workers=1).values()
    check_result(result)
    assert_close(result, plain, EMBEDDED, "job of one worker")


@pytest.mark.multiprocess
def test_job_of_two_workers(plain, tmp_path):
    for worker, result in run_job(NAME, tmp_path, num_workers=2).items():
        check_result(result)
        assert_close(result, plain, JOB, f"job {worker}")

"""keras-io's "Save, serialize, and export models" guide, plain and elastic
(issue 40): `model.save` / `keras.models.load_model` during the script (the
reloaded model must predict what the trained one does), custom objects,
`save_weights` / `load_weights`, configs.

tests/keras_io/serialization_and_saving.py (plain Keras) and
serialization_and_saving_elastic.py (the README's change: `import keras_elastic
as ke`, and the guide's trained models and the two whose weights it saves
wrapped, e.g. `model = ke.wrap(get_model())`) run as a plain process, as an
embedded elastic run and as a 2-worker job; the elastic results must equal plain
Keras' (see tests/keras_io/harness.py). In a job every worker runs
`model.save("my_model.keras")` and then `load_model("my_model.keras")`: the
file must be whole when each worker reads it (README: saving writes the plain
model, with the servers' values; in a job the real path is the chief's to
write).
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

NAME = "serialization_and_saving"

# Plain Keras gives these on every run: the reloaded models predict exactly
# what the trained ones do (the same float32 weights, the same computation),
# my_model.keras holds the optimizer's state after fit's 4 batches (128 samples
# in batches of 32), load_weights restores what save_weights wrote. An elastic
# model's predictions come from the servers' values, which saving writes: the
# same numbers, so the bound is float32 rounding of one Dense layer (1e-6 on
# outputs of about 1), not a spread.
SAME = {
    "save_max_difference": Tol(abs=1e-6),
    "registered_max_difference": Tol(abs=1e-6),
    "custom_objects_max_difference": Tol(abs=1e-6),
    "scope_max_difference": Tol(abs=1e-6),
    "sequential_reload_max_difference": EXACT,
    "pretrained_max_difference": EXACT,
    "reloaded_optimizer_iterations": EXACT,
    "reloaded_custom_layers": EXACT,
    "cloned_layers": EXACT,
    "regularizer_config": EXACT,
    "variable_ordering_changed": EXACT,
    "registered_name": EXACT,
    "files": EXACT,
}


def check_result(result):
    assert result["files"] == ["custom_model.keras", "my_model.keras",
                               "my_model.weights.h5", "pretrained.weights.h5"], result
    assert result["reloaded_optimizer_iterations"] == 4, result


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return run_plain(NAME, tmp_path_factory.mktemp("plain"))


def test_elastic_script_is_the_readme_change():
    check_readme_diff(*script_paths(NAME))


def test_plain_keras(plain):
    check_result(plain)
    assert plain["save_max_difference"] == 0.0, plain


def test_embedded(plain, tmp_path):
    result = run_embedded(NAME, tmp_path)
    check_result(result)
    assert_close(result, plain, SAME, "embedded")


@pytest.mark.multiprocess
def test_job_of_two_workers(plain, tmp_path):
    results = run_job(NAME, tmp_path, num_workers=2)
    # A worker that read my_model.keras while another wrote it would crash
    # (BadZipFile) and be relaunched: each worker must finish the first time.
    assert_no_worker_relaunched(tmp_path, num_workers=2)
    for worker, result in results.items():
        check_result(result)
        assert_close(result, plain, SAME, f"job {worker}")
    # Only the files the script writes, no worker's temporary files beside them.
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "job") == plain["files"]

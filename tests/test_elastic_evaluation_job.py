"""Multi-process evaluation, validation and prediction jobs (real processes)."""

import glob
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import finish, launch, wait_for
from support.tfrecord_data import make_arrays, parse, write_shards

from keras_elastic.common import faults
from keras_elastic.prediction import read_predictions

pytestmark = pytest.mark.multiprocess

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts",
                      "eval_job_script.py")


def reference_model(weights=None):
    keras.utils.set_random_seed(2)
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(h))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="binary_crossentropy",
                  metrics=["accuracy", keras.metrics.AUC(name="auc"),
                           keras.metrics.Precision(name="precision")])
    if weights:
        model.load_weights(weights)
    return model


@pytest.fixture
def data_and_weights(tmp_path):
    x, y = make_arrays(800, seed=5)
    files = write_shards(str(tmp_path / "data"), x, y, num_shards=2)
    model = reference_model()
    model.fit(x, y, epochs=1, verbose=0)  # something better than random
    weights = str(tmp_path / "model.weights.h5")
    model.save_weights(weights)
    return files, weights, x, y


# Worker 0 holds at the end of its first task while worker 1 is killed at the
# end of its first (fault points, common/faults.py): worker 1 dies holding a
# task, which must be requeued, however fast worker 0 would have been alone.
HOLD_W0 = "task_end@1:w0=hold"
KILL_W1 = "task_end@1:w1"
# The master killed at its 6th task request (of 20 tasks and more requests):
# the round under way, restarted from its journal.
KILL_MASTER = "master_task@6:master"


def fault_env(tmp_path, *entries: str) -> dict[str, str]:
    """The environment for a job with the fault plan `entries`, each once per
    job (markers in tmp_path/faults)."""
    return {"KERAS_ELASTIC_FAULTS": ",".join(entries),
            "KERAS_ELASTIC_FAULTS_DIR": str(tmp_path / "faults")}


def kill_worker_1_holding_a_task(tmp_path) -> None:
    """Worker 0 held at its first task's end until worker 1 was killed at
    its own (see HOLD_W0)."""
    directory = str(tmp_path / "faults")
    faults.wait_held(directory, HOLD_W0, timeout=180)
    wait_for(lambda: faults.fired(directory, KILL_W1), timeout=180,
             what=f"fault {KILL_W1} (worker 1 at the end of its first task)")
    faults.release(directory, HOLD_W0)


@pytest.mark.parametrize("kill", [False, "worker", "master"])
def test_two_workers_evaluate_exactly(tmp_path, data_and_weights, kill):
    files, weights, x, y = data_and_weights
    job_dir = str(tmp_path / "job")
    out = str(tmp_path / "eval")
    plan = {"worker": (HOLD_W0, KILL_W1), "master": (KILL_MASTER,)}.get(kill, ())
    proc = launch(job_dir, SCRIPT, "--num_workers=2", background=True,
                  script_args=("--job=evaluate", f"--data={tmp_path}/data/*.tfrecord",
                               f"--weights={weights}", f"--output={out}"),
                  env=fault_env(tmp_path, *plan) if plan else None)
    try:
        if kill == "worker":
            kill_worker_1_holding_a_task(tmp_path)
        # The master (killed by its fault point) is restarted from its
        # journal: the same exact results.
        output = finish(proc, job_dir, timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    expected = reference_model(weights).evaluate(
        tf.data.TFRecordDataset(files).map(parse).batch(20), return_dict=True, verbose=0)
    results = [json.load(open(p)) for p in sorted(glob.glob(out + ".worker*.json"))]
    assert len(results) == 2  # worker 0 and one other (1, or 2 after the kill)
    for result in results:
        for name in ("loss", "accuracy", "auc", "precision"):
            assert result[name] == pytest.approx(expected[name], abs=1e-6), name
    summary = json.load(open(os.path.join(job_dir, "summary.json")))
    assert summary["datasets"]["evaluation"]["tasks_done_total"] == 20
    if kill == "worker":
        assert faults.fired(str(tmp_path / "faults"), KILL_W1)
        assert summary["workers_lost"] == 1 and summary["requeued"] >= 1, summary
    if kill == "master":
        assert "fault injection: SIGKILL at 'master_task'" in open(
            os.path.join(job_dir, "master.log")).read()
        assert summary["master_restarts"] == 1 and summary["workers_lost"] == 0, summary


def test_validation_logs_are_identical_on_every_worker(tmp_path, data_and_weights):
    files, weights, x, y = data_and_weights
    out = str(tmp_path / "fit")
    result = launch(str(tmp_path / "job"), SCRIPT, "--num_workers=2",
                    script_args=("--job=fit", f"--data={tmp_path}/data/*.tfrecord",
                                 f"--output={out}", "--epochs=2"))
    assert result.returncode == 0, result.stdout + result.stderr
    histories = [json.load(open(p)) for p in sorted(glob.glob(out + ".worker*.json"))]
    assert len(histories) == 2
    val_keys = sorted(k for k in histories[0] if k.startswith("val_"))
    assert val_keys == ["val_accuracy", "val_auc", "val_loss", "val_precision"]
    for key in val_keys:
        assert len(histories[0][key]) == 2
        assert histories[0][key] == histories[1][key], key


def test_prediction_job_with_a_killed_worker_writes_each_output_once(
        tmp_path, data_and_weights):
    files, weights, x, y = data_and_weights
    job_dir = str(tmp_path / "job")
    out = str(tmp_path / "preds")
    proc = launch(job_dir, SCRIPT, "--num_workers=2", background=True,
                  script_args=("--job=predict", f"--data={tmp_path}/data/*.tfrecord",
                               f"--weights={weights}", f"--output={out}"),
                  env=fault_env(tmp_path, HOLD_W0, KILL_W1))
    try:
        kill_worker_1_holding_a_task(tmp_path)
        output = finish(proc, job_dir, timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    predictions = read_predictions(out, num_tasks=20)
    assert predictions.shape == (800, 1)  # exactly one per record
    expected = reference_model(weights).predict(
        tf.data.TFRecordDataset(files).map(parse).map(lambda x, y: x).batch(20),
        verbose=0)
    np.testing.assert_allclose(predictions, expected, atol=1e-6)
    summary = json.load(open(os.path.join(job_dir, "summary.json")))
    assert summary["workers_lost"] == 1 and summary["requeued"] >= 1, summary

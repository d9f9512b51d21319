"""Multi-process evaluation, validation and prediction jobs (real processes)."""

import glob
import json
import os
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import job_status, launch, wait_for
from support.tfrecord_data import make_arrays, parse, write_shards

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


def kill_worker_when(job_dir, dataset, proc):
    def mid_way():
        status = job_status(job_dir)
        ds = status and status["datasets"].get(dataset)
        # Worker 1 holds a task: killing it must requeue something.
        return ds and ds["done"] >= 2 and ds["doing_by_worker"].get("1", 0) >= 1
    wait_for(mid_way, timeout=180, what=f"'{dataset}' to be under way")
    os.kill(int(open(os.path.join(job_dir, "pid-1")).read()), signal.SIGKILL)


def kill_master_when(job_dir, dataset):
    def mid_way():
        status = job_status(job_dir)
        ds = status and status["datasets"].get(dataset)
        return ds and ds["done"] >= 2 and ds["doing"] >= 1
    wait_for(mid_way, timeout=180, what=f"'{dataset}' to be under way")
    with open(os.path.join(job_dir, "cluster.json")) as f:
        os.kill(json.load(f)["master_pid"], signal.SIGKILL)


@pytest.mark.parametrize("kill", [False, "worker", "master"])
def test_two_workers_evaluate_exactly(tmp_path, data_and_weights, kill):
    files, weights, x, y = data_and_weights
    job_dir = str(tmp_path / "job")
    out = str(tmp_path / "eval")
    proc = launch(job_dir, SCRIPT, "--num_workers=2", background=True,
                  script_args=("--job=evaluate", f"--data={tmp_path}/data/*.tfrecord",
                               f"--weights={weights}", f"--output={out}",
                               f"--sleep_per_batch={0.05 if kill else 0}"))
    try:
        if kill == "worker":
            kill_worker_when(job_dir, "evaluation", proc)
        elif kill == "master":  # restarted from its journal: same exact results
            kill_master_when(job_dir, "evaluation")
        output, _ = proc.communicate(timeout=300)
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
        assert summary["workers_lost"] == 1 and summary["requeued"] >= 1
    if kill == "master":
        assert summary["master_restarts"] == 1 and summary["workers_lost"] == 0


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
                               f"--weights={weights}", f"--output={out}",
                               "--sleep_per_batch=0.05"))
    try:
        kill_worker_when(job_dir, "prediction", proc)
        output, _ = proc.communicate(timeout=300)
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
    assert summary["workers_lost"] == 1

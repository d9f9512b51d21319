"""The digits example, as a user runs it: through the launcher and the CLI.

Real data (scikit-learn's digits), real processes, the four job types of
seed 000: training-only, training-with-evaluation, evaluation-only and
prediction-only.
"""

import glob
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, subprocess_env

from keras_elastic.prediction import read_predictions

pytestmark = pytest.mark.multiprocess

DIGITS = os.path.join(REPO, "examples", "digits")
MODEL_DEF = "--model_def=examples.digits.model_def:custom_model"


def run(*args, timeout=600):
    result = subprocess.run([sys.executable, *args], cwd=REPO, env=subprocess_env(),
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    data = tmp_path_factory.mktemp("digits")
    run(os.path.join(DIGITS, "prepare_data.py"), f"--output_dir={data}",
        "--num_shards=2")
    return str(data)


# "pipelined": the push of step k travels while step k+1 computes (issue 12).
@pytest.mark.parametrize("exchange", ["sync", "pipelined"])
def test_readme_example_job_reaches_95_percent(tmp_path, digits_dir, exchange):
    out = tmp_path / "metrics.json"
    run("-m", "keras_elastic", "run", "--num_workers=2", "--num_ps=1",
        f"--job_dir={tmp_path / 'job'}", "--", sys.executable,
        os.path.join(DIGITS, "train.py"), "--epochs=8", f"--data_dir={digits_dir}",
        "--noprepare", f"--output={out}", f"--exchange={exchange}")
    metrics = json.loads(out.read_text())
    assert metrics["val_accuracy"] >= 0.95, metrics
    # Validation after every epoch, the same on both workers (identical logs).
    assert len(metrics["history"]["val_accuracy"]) == 8


def test_four_job_types_through_the_cli(tmp_path, digits_dir):
    train = f"--training_data={digits_dir}/train-*"
    validation = f"--validation_data={digits_dir}/validation-*"
    common = ["--minibatch_size=32", "--num_minibatches_per_task=8", "--num_workers=2"]
    # 1. Training only.
    run("-m", "keras_elastic", "train", MODEL_DEF, train, "--num_epochs=1", *common,
        f"--job_dir={tmp_path / 'job1'}")
    # 2. Training with evaluation after each epoch, checkpoints and an export.
    ckpt = str(tmp_path / "ckpt") + "/"
    result = run("-m", "keras_elastic", "train", MODEL_DEF, train, validation,
                 "--num_epochs=6", f"--checkpoint_dir={ckpt}",
                 f"--output={tmp_path / 'digits.keras'}", *common,
                 f"--job_dir={tmp_path / 'job2'}")
    assert "val_accuracy" in result.stdout
    assert (tmp_path / "digits.keras").exists()
    summary = json.loads((tmp_path / "job2" / "summary.json").read_text())
    assert summary["datasets"]["validation"]["tasks_done_total"] == 6 * summary[
        "datasets"]["validation"]["tasks_per_epoch"]
    # 3. Evaluation only, from the latest checkpoint.
    eval_json = tmp_path / "eval.json"
    run("-m", "keras_elastic", "evaluate", MODEL_DEF, validation,
        f"--checkpoint_dir={ckpt}", f"--output={eval_json}", *common,
        f"--job_dir={tmp_path / 'job3'}")
    metrics = json.loads(eval_json.read_text())
    assert metrics["accuracy"] >= 0.9, metrics
    # 4. Prediction only: one output per record, agreeing with the evaluation.
    preds = str(tmp_path / "preds")
    run("-m", "keras_elastic", "predict", MODEL_DEF,
        f"--prediction_data={digits_dir}/validation-*", f"--checkpoint_dir={ckpt}",
        f"--output={preds}", *common, f"--job_dir={tmp_path / 'job4'}")
    predictions = read_predictions(preds)
    from examples.digits.model_def import parse_example

    files = sorted(glob.glob(f"{digits_dir}/validation-*"))
    labels = np.array([label for _, label in tf.data.TFRecordDataset(files).map(
        parse_example).as_numpy_iterator()])  # in input order
    assert predictions.shape == (len(labels), 10)
    accuracy = float(np.mean(predictions.argmax(axis=1) == labels))
    assert accuracy == pytest.approx(metrics["accuracy"], abs=1e-6)


def test_the_export_is_written_when_worker_0_died(tmp_path, digits_dir):
    # Worker 0 is killed at its 5th push and comes back as worker 2: the
    # chief (held by the master) passes to worker 1, which logs the final
    # metrics and exports the model (a worker_id == 0 rule exported nothing).
    out = tmp_path / "digits.keras"
    result = subprocess.run(
        [sys.executable, "-m", "keras_elastic", "train", MODEL_DEF,
         f"--training_data={digits_dir}/train-*", "--num_epochs=2",
         "--minibatch_size=32", "--num_minibatches_per_task=8", "--num_workers=2",
         f"--output={out}", f"--job_dir={tmp_path / 'job'}"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env=subprocess_env(KERAS_ELASTIC_FAULTS="mid_push@5:w0",
                           KERAS_ELASTIC_FAULTS_DIR=str(tmp_path / "faults")))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "[worker-0] keras_elastic fault injection: SIGKILL at 'mid_push'" in output
    assert "worker 0 exited with code -9" in output, output[-4000:]
    final = re.findall(r"\[worker-(\d+)\][^\n]*final metrics", output)
    assert final and final[0] != "0" and len(final) == 1, (final, output[-3000:])
    assert out.exists()

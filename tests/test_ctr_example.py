"""The click-through-rate example, as a user runs it: through the launcher and
the CLI, with the embedding tables on two parameter servers.

Synthetic Criteo-shaped data whose labels come from a known logistic model:
the DeepFM must get within 0.02 of that true model's validation AUC. Real
processes, the four job types: training-only, training-with-evaluation,
evaluation-only and prediction-only.
"""

import functools
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
from sklearn.metrics import roc_auc_score

from keras_elastic.prediction import read_predictions

pytestmark = pytest.mark.multiprocess

CTR = os.path.join(REPO, "examples", "ctr")
MODEL_DEF = "--model_def=examples.ctr.model_def:custom_model"
EPOCHS = 3  # of the launcher job (a)
CLI_EPOCHS = 2  # of the CLI training job with evaluation (kept short)


def run(*args, timeout=600):
    result = subprocess.run([sys.executable, *args], cwd=REPO, env=subprocess_env(),
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def ctr_dir(tmp_path_factory):
    """A small data set: 60k training records in 4 shards, 10k for validation."""
    data = tmp_path_factory.mktemp("ctr")
    run(os.path.join(CTR, "prepare_data.py"), f"--output_dir={data}",
        "--num_train=60000", "--num_validation=10000", "--num_shards=4")
    return str(data)


@functools.cache
def validation_records(data_dir):
    """The validation records, in order, as parsed by the model's dataset_fn."""
    from examples.ctr.model_def import dataset_fn

    files = sorted(glob.glob(f"{data_dir}/validation-*.tfrecord"))
    return list(dataset_fn(tf.data.TFRecordDataset(files), "evaluation")
                .as_numpy_iterator())


def validation_labels(data_dir):
    return np.array([label for _, label in validation_records(data_dir)])


def validation_features(data_dir):
    """(dense [n, 13], cat [n, 26]) of the validation records, in order."""
    records = validation_records(data_dir)
    return (np.stack([f["dense"] for f, _ in records]),
            np.stack([f["cat"] for f, _ in records]))


@pytest.fixture(scope="module")
def true_auc(ctr_dir):
    """The AUC of the model the labels were drawn from, on the validation data."""
    true_prob = np.load(os.path.join(ctr_dir, "true_prob-validation.npy"))
    labels = validation_labels(ctr_dir)
    assert true_prob.shape == labels.shape == (10_000,)
    assert 0.2 <= labels.mean() <= 0.3  # the click rate
    auc = roc_auc_score(labels, true_prob)
    assert 0.75 <= auc <= 0.85, auc
    with open(os.path.join(ctr_dir, "metadata.json")) as f:
        metadata = json.load(f)
    assert metadata["true_validation_auc"] == pytest.approx(auc, abs=1e-9)
    return auc


@pytest.fixture(scope="module")
def script_metrics(ctr_dir, tmp_path_factory):
    """The README's job: 2 workers and 2 parameter servers run train.py."""
    tmp_path = tmp_path_factory.mktemp("ctr_run")
    out = tmp_path / "metrics.json"
    run("-m", "keras_elastic", "run", "--num_workers=2", "--num_ps=2",
        f"--job_dir={tmp_path / 'job'}", "--", sys.executable,
        os.path.join(CTR, "train.py"), f"--epochs={EPOCHS}", f"--data_dir={ctr_dir}",
        "--noprepare", f"--output={out}")
    return json.loads(out.read_text())


def test_two_workers_two_ps_get_close_to_the_true_model(script_metrics, true_auc):
    from examples.ctr import model_def, prepare_data

    assert model_def.NUM_IDS == prepare_data.NUM_IDS  # the model covers every id
    assert script_metrics["val_auc"] >= true_auc - 0.02, (true_auc, script_metrics)
    assert script_metrics["true_val_auc"] == pytest.approx(true_auc, abs=1e-9)
    # Validation after every epoch, on all workers together.
    assert len(script_metrics["history"]["val_auc"]) == EPOCHS


@pytest.fixture(scope="module")
def cli_jobs(ctr_dir, tmp_path_factory):
    """The four job types through the CLI, one after the other; their outputs."""
    tmp_path = tmp_path_factory.mktemp("ctr_cli")
    train = f"--training_data={ctr_dir}/train-*"
    validation = f"--validation_data={ctr_dir}/validation-*"
    common = ["--minibatch_size=512", "--num_minibatches_per_task=8", "--num_workers=2",
              "--num_ps=2"]
    jobs = {"dir": tmp_path}
    # 1. Training only (one epoch of one shard, to keep the test short).
    run("-m", "keras_elastic", "train", MODEL_DEF,
        f"--training_data={ctr_dir}/train-00000-*", "--num_epochs=1", *common,
        f"--job_dir={tmp_path / 'job1'}")
    # 2. Training with evaluation after each epoch, checkpoints and an export.
    ckpt = str(tmp_path / "ckpt") + "/"
    jobs["train"] = run("-m", "keras_elastic", "train", MODEL_DEF, train, validation,
                        f"--num_epochs={CLI_EPOCHS}", f"--checkpoint_dir={ckpt}",
                        f"--output={tmp_path / 'ctr.keras'}", *common,
                        f"--job_dir={tmp_path / 'job2'}").stdout
    # 3. Evaluation only, from the latest checkpoint.
    eval_json = tmp_path / "eval.json"
    run("-m", "keras_elastic", "evaluate", MODEL_DEF, validation,
        f"--checkpoint_dir={ckpt}", f"--output={eval_json}", *common,
        f"--job_dir={tmp_path / 'job3'}")
    jobs["evaluation"] = json.loads(eval_json.read_text())
    # 4. Prediction only, from the latest checkpoint.
    run("-m", "keras_elastic", "predict", MODEL_DEF,
        f"--prediction_data={ctr_dir}/validation-*", f"--checkpoint_dir={ckpt}",
        f"--output={tmp_path / 'preds'}", *common, f"--job_dir={tmp_path / 'job4'}")
    jobs["predictions"] = read_predictions(str(tmp_path / "preds"))
    return jobs


def final_val_auc(stdout):
    """The training job's last validation AUC, from the chief's "final metrics"."""
    found = re.findall(r"final metrics: .*'val_auc': ([0-9.]+)", stdout)
    assert found, stdout[-3000:]
    return float(found[-1])


def test_four_job_types_through_the_cli(cli_jobs, ctr_dir, true_auc):
    tmp_path = cli_jobs["dir"]
    # Training with evaluation: validation after every epoch, a good model.
    trained_auc = final_val_auc(cli_jobs["train"])
    assert trained_auc >= true_auc - 0.02, (trained_auc, true_auc)
    summary = json.loads((tmp_path / "job2" / "summary.json").read_text())
    assert summary["datasets"]["validation"]["tasks_done_total"] == CLI_EPOCHS * summary[
        "datasets"]["validation"]["tasks_per_epoch"]
    # The export is a plain Keras model holding the whole tables.
    import keras

    import examples.ctr.model_def  # noqa: F401  (registers the custom layers)

    exported = keras.saving.load_model(tmp_path / "ctr.keras")
    assert not any(type(layer).__module__.startswith("keras_elastic")
                   for layer in exported.layers)
    labels = validation_labels(ctr_dir)
    features = dict(zip(("dense", "cat"), validation_features(ctr_dir)))
    exported_auc = roc_auc_score(labels, exported.predict(features, batch_size=2048,
                                                          verbose=0)[:, 0])
    assert exported_auc == pytest.approx(trained_auc, abs=2e-3)
    # Evaluation only: the metrics of the compiled model.
    assert set(cli_jobs["evaluation"]) == {"loss", "auc"}
    # Prediction only: one output per record, agreeing with the evaluation.
    predictions = cli_jobs["predictions"]
    assert predictions.shape == (len(labels), 1)
    auc = roc_auc_score(labels, predictions[:, 0])
    assert auc == pytest.approx(cli_jobs["evaluation"]["auc"], abs=1e-3)


def test_evaluation_and_prediction_use_the_checkpointed_tables(cli_jobs, ctr_dir,
                                                                script_metrics):
    # The checkpoint of the last epoch is the trained model: same AUC.
    trained_auc = final_val_auc(cli_jobs["train"])
    predicted_auc = roc_auc_score(validation_labels(ctr_dir),
                                  cli_jobs["predictions"][:, 0])
    assert predicted_auc == pytest.approx(trained_auc, abs=5e-3)
    assert cli_jobs["evaluation"]["auc"] == pytest.approx(trained_auc, abs=5e-3)
    # And close to the launcher job's (one epoch more).
    assert cli_jobs["evaluation"]["auc"] == pytest.approx(script_metrics["val_auc"],
                                                          abs=0.01)


# Worker 0's 10th push held (mid-epoch) while the job's tables move from one
# server process to three (fault point, common/faults.py).
SCALE_HOLD = "after_push@10:w0=hold"


def test_tables_scaled_from_one_to_three_servers_mid_job_keep_every_row(
        ctr_dir, tmp_path):
    """The README's CTR job on one server process holding 3 partitions,
    scaled to 3 processes mid-epoch (`keras-elastic scale --num_ps 3`): the
    tables' rows move with their partitions. With admission and the row
    bound off, the tables end with one row per distinct id of the training
    data, every row once (two partitions moved to the new processes)."""
    from support.counting_jobs import through_holds

    from examples.ctr.model_def import dataset_fn

    files = sorted(glob.glob(f"{ctr_dir}/train-*.tfrecord"))
    ids = np.unique(np.concatenate([f["cat"].ravel() for f, _ in dataset_fn(
        tf.data.TFRecordDataset(files), "training").as_numpy_iterator()]))
    job_dir = tmp_path / "job"
    argv = [sys.executable, "-m", "keras_elastic", "run", "--num_workers=2",
            "--num_ps=1", "--ps_partitions=3", f"--job_dir={job_dir}", "--",
            sys.executable, os.path.join(CTR, "train.py"), "--epochs=1",
            f"--data_dir={ctr_dir}", "--noprepare", "--admit_after=0", "--max_rows=0"]
    env = subprocess_env(KERAS_ELASTIC_FAULTS=SCALE_HOLD,
                         KERAS_ELASTIC_FAULTS_DIR=str(tmp_path / "faults"))
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)

    def scale_to_three(job_dir) -> None:
        from conftest import wait_for

        run("-m", "keras_elastic", "scale", f"--job_dir={job_dir}", "--num_ps=3",
            "--wait_secs=150", timeout=200)
        wait_for(lambda: sorted(h["partitions"] for h in json.loads(
            (job_dir / "cluster.json").read_text())["ps_hosts"]) == [[0], [1], [2]],
            timeout=120, what="the partitions on three processes")

    through_holds(tmp_path, proc, [(SCALE_HOLD, scale_to_three)])
    summary = json.loads((job_dir / "summary.json").read_text())
    [scaling] = summary["ps_scaling"]
    assert (scaling["servers_before"], scaling["servers_after"]) == (1, 3), scaling
    assert len(scaling["moves"]) == 2 and not scaling["failed"], scaling
    assert summary["ps_recoveries"] == [] and summary["requeued"] == 0, summary
    tables = summary["embedding_tables"]
    assert len(tables) == 2, tables  # first_order and factors
    for name, stats in tables.items():
        assert stats["rows"] == len(ids), (name, stats, len(ids))
        assert stats["evicted"] == 0 and stats["dropped"] == 0, (name, stats)

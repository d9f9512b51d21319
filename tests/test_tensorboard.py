"""`keras.callbacks.TensorBoard` in elastic `fit` (issue 13, item 3).

In a launched job each worker writes its own run (`<log_dir>/worker-<id>`),
the job's validation scalars are written once, by the chief, to
`<log_dir>/validation`, and the launcher's summary prints the `tensorboard`
command. A plain (embedded) process keeps Keras' own layout.
"""

import glob
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, launch
from support.tfrecord_data import NUM_FEATURES, make_arrays

import keras_elastic as ke


def scalars(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} over every event file of one run."""
    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "scalars":
                    out.setdefault(value.tag, []).append(
                        (event.step, float(tf.make_ndarray(value.tensor))))
    return out


def event_files(run_dir: str) -> list[str]:
    return glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))


@pytest.mark.multiprocess
def test_two_worker_job_writes_a_run_per_worker_and_validation_once(tmp_path):
    log_dir = str(tmp_path / "logs")
    job = str(tmp_path / "job")
    result = launch(job, os.path.join(REPO, "tests", "scripts", "tensorboard_script.py"),
                    "--num_workers=2", "--num_ps=1",
                    script_args=(f"--tensorboard_dir={log_dir}", "--epochs=2"), timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    # One run per worker (one event file each: one process), none shared.
    assert sorted(os.listdir(log_dir)) == ["validation", "worker-0", "worker-1"], (
        os.listdir(log_dir))
    for worker in ("worker-0", "worker-1"):
        assert os.listdir(os.path.join(log_dir, worker)) == ["train"]
        assert len(event_files(os.path.join(log_dir, worker, "train"))) == 1
        train = scalars(os.path.join(log_dir, worker, "train"))
        assert [s for s, _ in train["epoch_loss"]] == [0, 1], train
        assert "epoch_val_accuracy" not in train and "epoch_val_loss" not in train
    # The job's validation scalars: once per epoch, by the chief (either worker),
    # equal to what every worker logged.
    validation_files = event_files(os.path.join(log_dir, "validation"))
    assert len(validation_files) == 1
    validation = scalars(os.path.join(log_dir, "validation"))
    # (evaluation_*_vs_iterations: Keras' on_test_end, which fit's validation
    # calls as in plain Keras.)
    assert sorted(validation) == ["epoch_accuracy", "epoch_loss",
                                  "evaluation_accuracy_vs_iterations",
                                  "evaluation_loss_vs_iterations"], validation
    assert [s for s, _ in validation["epoch_accuracy"]] == [0, 1]
    # Keras prints an epoch's line only on a worker that trained a batch of it
    # (on a loaded machine one worker may take all 4 tasks of an epoch): the
    # values of a worker that printed both epochs.
    logs = [[float(line.rsplit("val_accuracy: ", 1)[1].split()[0])
             for line in open(os.path.join(job, f"worker-{w}.log"))
             if "val_accuracy: " in line] for w in (0, 1)]
    logged = next((values for values in logs if len(values) == 2), None)
    assert logged is not None, logs
    np.testing.assert_allclose([v for _, v in validation["epoch_accuracy"]], logged,
                               atol=1e-4)
    # The launcher knows the log dir and prints the command.
    assert json.load(open(os.path.join(job, "tensorboard.json"))) == {
        "log_dirs": [log_dir]}
    assert f"[launcher] TensorBoard: tensorboard --logdir {log_dir}" in result.stdout


def test_embedded_fit_keeps_keras_layout(tmp_path, embedded_cluster):
    x, y = make_arrays(64)
    model = ke.Sequential([keras.Input((NUM_FEATURES,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    validation = ke.ElasticDataset((x, y), batch_size=32, mode="evaluation",
                                   name="validation")
    tensorboard = keras.callbacks.TensorBoard(str(tmp_path / "logs"))
    model.fit(ke.ElasticDataset((x, y), batch_size=16), epochs=1, verbose=0,
              validation_data=validation, callbacks=[tensorboard])
    assert sorted(os.listdir(tmp_path / "logs")) == ["train", "validation"]
    assert [s for s, _ in scalars(str(tmp_path / "logs" / "validation"))[
        "epoch_loss"]] == [0]

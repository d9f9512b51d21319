"""`keras-elastic` subcommands: flag checks happen before any process starts."""

import os
import subprocess
import sys

import pytest
from conftest import subprocess_env
from tfrecord_data import make_arrays, write_shards

TESTS = os.path.dirname(os.path.abspath(__file__))


def cli(*args, cwd=TESTS):
    return subprocess.run([sys.executable, "-m", "keras_elastic", *args],
                          env=subprocess_env(), capture_output=True, text=True,
                          timeout=60, cwd=cwd)


@pytest.fixture
def data(tmp_path):
    x, y = make_arrays(64)
    write_shards(str(tmp_path), x, y, 1)
    return str(tmp_path / "train-*.tfrecord")


@pytest.mark.parametrize("args, message", [
    ([], "--model_def is required"),
    (["--model_def=cli_model_def"], "must look like 'package.module:function'"),
    (["--model_def=no_such_module:f"], "cannot find module 'no_such_module'"),
    (["--model_def=cli_model_def:missing"],
     "module 'cli_model_def' (" + os.path.join(TESTS, "cli_model_def.py") +
     ") does not define 'missing' (the model function)"),
    (["--model_def=job_script:main"],
     "does not define 'dataset_fn' (dataset_fn(records, mode))"),
    (["--model_def=cli_model_def:custom_model"], "`keras-elastic train` needs "
     "--training_data"),
    (["--model_def=cli_model_def:custom_model", "--training_data=/nowhere/*.tfrecord"],
     "--training_data: no file matches '/nowhere/*.tfrecord'"),
    (["--model_def=cli_model_def:custom_model", "--training_data={data}",
      "--prediction_data={data}"], "`keras-elastic train` does not take "
     "--prediction_data: the job type follows from the data flags"),
    (["--model_def=cli_model_def:custom_model", "--training_data={data}",
      "--num_epochs=0"], "--num_epochs must be at least 1, got 0"),
    (["--model_def=cli_model_def:custom_model", "--training_data={data}",
      "--evaluation_steps=10"], "--evaluation_steps needs --validation_data"),
])
def test_train_flag_errors(args, message, data):
    result = cli("train", *[a.format(data=data) for a in args])
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert "started worker" not in result.stderr  # nothing was launched


def test_evaluate_and_predict_need_a_checkpoint(tmp_path, data):
    result = cli("evaluate", "--model_def=cli_model_def:custom_model",
                 f"--validation_data={data}")
    assert result.returncode == 2
    assert "needs --checkpoint_dir: the model is loaded from its latest" in result.stderr
    result = cli("evaluate", "--model_def=cli_model_def:custom_model",
                 f"--validation_data={data}", f"--checkpoint_dir={tmp_path}")
    assert f"--checkpoint_dir={tmp_path} holds no complete checkpoint" in result.stderr
    result = cli("predict", "--model_def=cli_model_def:custom_model",
                 f"--prediction_data={data}", f"--checkpoint_dir={tmp_path}",
                 f"--validation_data={data}")
    assert "`keras-elastic predict` does not take --validation_data" in result.stderr


def test_usage_and_unknown_subcommand():
    result = cli("--help")
    assert result.returncode == 0
    for name in ("run", "join", "scale", "status", "train", "evaluate", "predict"):
        assert f"  {name}" in result.stdout
    result = cli("fly")
    assert result.returncode == 2 and "unknown subcommand 'fly'" in result.stderr


def test_status_scale_and_join_need_a_job(tmp_path):
    result = cli("status", f"--job_dir={tmp_path}")
    assert result.returncode == 2
    assert f"{tmp_path}/cluster.json does not exist" in result.stderr
    result = cli("scale", f"--job_dir={tmp_path}", "--num_workers=3")
    assert "cluster.json does not exist" in result.stderr
    result = cli("join", f"--job_dir={tmp_path}")
    assert "no worker command" in result.stderr

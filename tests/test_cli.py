"""`keras-elastic` subcommands: flag checks happen before any process starts."""

import glob
import gzip
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


def test_data_files_are_checked_before_any_process_starts(tmp_path, data):
    """ElasticDL's form, a data directory, is expanded to its files; each is
    checked at launch: a file that is not a TFRecord file stops the command
    with its name and the problem, before any role starts."""
    x, y = make_arrays(32)
    train = tmp_path / "train"
    write_shards(str(train), x, y, 2)
    (train / "README.md").write_text("# the training data, as TFRecord files\n")
    result = cli("train", "--model_def=cli_model_def:custom_model",
                 f"--training_data={train}")
    assert result.returncode == 2, result.stdout + result.stderr
    assert (f"--training_data: {train}/README.md is not a TFRecord file: it looks "
            "like a text file (CSV, JSON, ...; convert it to TFRecord files). "
            "keras-elastic reads TFRecord files") in result.stderr, result.stderr
    assert "started" not in result.stderr
    (train / "README.md").unlink()
    validation = tmp_path / "validation"
    validation.mkdir()
    (validation / "val-00000.tfrecord.gz").write_bytes(
        gzip.compress(open(glob.glob(data)[0], "rb").read()))
    result = cli("train", "--model_def=cli_model_def:custom_model",
                 f"--training_data={train}", f"--validation_data={validation}/")
    assert result.returncode == 2
    assert (f"--validation_data: {validation}/val-00000.tfrecord.gz is not a TFRecord "
            "file: it looks like a gzip-compressed file") in result.stderr, result.stderr
    cut = tmp_path / "test-00000.tfrecord"
    cut.write_bytes(open(glob.glob(data)[0], "rb").read()[:-3])
    result = cli("predict", "--model_def=cli_model_def:custom_model",
                 f"--prediction_data={tmp_path}/test-*.tfrecord",
                 f"--checkpoint_dir={tmp_path}", f"--output={tmp_path}/preds")
    assert result.returncode == 2
    assert f"--prediction_data: {cut} is not a TFRecord file: record #" in result.stderr
    assert "the file is cut short" in result.stderr
    assert "started" not in result.stderr


def test_train_checkpoint_dir_is_a_directory(tmp_path, data):
    a_file = tmp_path / "ckpt.txt"
    a_file.write_text("x")
    result = cli("train", "--model_def=cli_model_def:custom_model",
                 f"--training_data={data}", f"--checkpoint_dir={a_file}")
    assert result.returncode == 2
    assert (f"--checkpoint_dir={a_file} is a file, not a directory: a training job "
            "saves its checkpoints (ckpt-0001, ...) into --checkpoint_dir") in (
        result.stderr)
    checkpoint = tmp_path / "ckpts" / "ckpt-0003"
    checkpoint.mkdir(parents=True)
    (checkpoint / "manifest.json").write_text("{}")
    result = cli("train", "--model_def=cli_model_def:custom_model",
                 f"--training_data={data}", f"--checkpoint_dir={checkpoint}")
    assert result.returncode == 2
    assert (f"--checkpoint_dir={checkpoint} is a checkpoint itself (it holds "
            "manifest.json), not a directory of checkpoints") in result.stderr
    assert f"give --checkpoint_dir={tmp_path / 'ckpts'}/;" in result.stderr
    assert "started" not in result.stderr


def test_checkpoint_directory_never_names_a_checkpoint():
    from keras_elastic.jobs.runner import checkpoint_directory

    assert checkpoint_directory("out/ckpt") == "out/ckpt/"
    assert checkpoint_directory("out/ckpt/") == "out/ckpt/"

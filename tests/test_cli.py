"""`keras-elastic` subcommands: flag checks happen before any process starts."""

import glob
import gzip
import json
import os
import subprocess
import sys

import pytest
from conftest import subprocess_env
from support.tfrecord_data import make_arrays, write_shards

TESTS = os.path.dirname(os.path.abspath(__file__))
# The --model_def modules (cli_model_def.py, job_script.py) are in tests/scripts/.
ZOO = "--model_zoo=" + os.path.join(TESTS, "scripts")


def cli(*args, cwd=TESTS, timeout=60):
    return subprocess.run([sys.executable, "-m", "keras_elastic", *args],
                          env=subprocess_env(), capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


# The installed console script (`pip install -e .`), beside this interpreter.
CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "keras-elastic")


def console_script(*args):
    if not os.path.exists(CONSOLE_SCRIPT):
        pytest.skip(f"no console script at {CONSOLE_SCRIPT} (pip install -e .)")
    return subprocess.run([CONSOLE_SCRIPT, *args], env=subprocess_env(),
                          capture_output=True, text=True, timeout=60, cwd=TESTS)


@pytest.fixture
def data(tmp_path):
    x, y = make_arrays(64)
    write_shards(str(tmp_path), x, y, 1)
    return str(tmp_path / "train-*.tfrecord")


@pytest.mark.multiprocess
@pytest.mark.parametrize("args, message", [
    ([], "--model_def is required"),
    (["--model_def=cli_model_def"], "must look like 'package.module:function'"),
    (["--model_def=no_such_module:f"], "cannot find module 'no_such_module'"),
    ([ZOO, "--model_def=cli_model_def:missing"],
     "module 'cli_model_def' (" + os.path.join(TESTS, "scripts", "cli_model_def.py") +
     ") does not define 'missing' (the model function)"),
    ([ZOO, "--model_def=job_script:main"],
     "does not define 'dataset_fn' (dataset_fn(records, mode))"),
    ([ZOO, "--model_def=cli_model_def:custom_model"], "`keras-elastic train` needs "
     "--training_data"),
    ([ZOO, "--model_def=cli_model_def:custom_model", "--training_data=/nowhere/*.tfrecord"],
     "--training_data: no file matches '/nowhere/*.tfrecord'"),
    ([ZOO, "--model_def=cli_model_def:custom_model", "--training_data={data}",
      "--prediction_data={data}"], "`keras-elastic train` does not take "
     "--prediction_data: the job type follows from the data flags"),
    ([ZOO, "--model_def=cli_model_def:custom_model", "--training_data={data}",
      "--num_epochs=0"], "--num_epochs must be at least 1, got 0"),
    ([ZOO, "--model_def=cli_model_def:custom_model", "--training_data={data}",
      "--evaluation_steps=10"], "--evaluation_steps needs --validation_data"),
])
def test_train_flag_errors(args, message, data):
    result = cli("train", *[a.format(data=data) for a in args])
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert "started worker" not in result.stderr  # nothing was launched


@pytest.mark.multiprocess
def test_evaluate_and_predict_need_a_checkpoint(tmp_path, data):
    result = cli("evaluate", ZOO, "--model_def=cli_model_def:custom_model",
                 f"--validation_data={data}")
    assert result.returncode == 2
    assert "needs --checkpoint_dir: the model is loaded from its latest" in result.stderr
    result = cli("evaluate", ZOO, "--model_def=cli_model_def:custom_model",
                 f"--validation_data={data}", f"--checkpoint_dir={tmp_path}")
    assert f"--checkpoint_dir={tmp_path} holds no complete checkpoint" in result.stderr
    result = cli("predict", ZOO, "--model_def=cli_model_def:custom_model",
                 f"--prediction_data={data}", f"--checkpoint_dir={tmp_path}",
                 f"--validation_data={data}")
    assert "`keras-elastic predict` does not take --validation_data" in result.stderr


@pytest.mark.multiprocess
def test_usage_and_unknown_subcommand():
    result = cli("--help")
    assert result.returncode == 0
    for name in ("run", "join", "scale", "status", "train", "evaluate", "predict"):
        assert f"  {name}" in result.stdout
    result = cli("fly")
    assert result.returncode == 2 and "unknown subcommand 'fly'" in result.stderr


@pytest.mark.multiprocess
def test_status_scale_and_join_need_a_job(tmp_path):
    result = cli("status", f"--job_dir={tmp_path}")
    assert result.returncode == 2
    assert f"{tmp_path}/cluster.json does not exist" in result.stderr
    result = cli("scale", f"--job_dir={tmp_path}", "--num_workers=3")
    assert "cluster.json does not exist" in result.stderr
    result = cli("join", f"--job_dir={tmp_path}")
    assert "no worker command" in result.stderr


@pytest.mark.multiprocess
def test_data_files_are_checked_before_any_process_starts(tmp_path, data):
    """ElasticDL's form, a data directory, is expanded to its files; each is
    checked at launch: a file that is not a TFRecord file stops the command
    with its name and the problem, before any role starts."""
    x, y = make_arrays(32)
    train = tmp_path / "train"
    write_shards(str(train), x, y, 2)
    (train / "README.md").write_text("# the training data, as TFRecord files\n")
    result = cli("train", ZOO, "--model_def=cli_model_def:custom_model",
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
    result = cli("train", ZOO, "--model_def=cli_model_def:custom_model",
                 f"--training_data={train}", f"--validation_data={validation}/")
    assert result.returncode == 2
    assert (f"--validation_data: {validation}/val-00000.tfrecord.gz is not a TFRecord "
            "file: it looks like a gzip-compressed file") in result.stderr, result.stderr
    cut = tmp_path / "test-00000.tfrecord"
    cut.write_bytes(open(glob.glob(data)[0], "rb").read()[:-3])
    result = cli("predict", ZOO, "--model_def=cli_model_def:custom_model",
                 f"--prediction_data={tmp_path}/test-*.tfrecord",
                 f"--checkpoint_dir={tmp_path}", f"--output={tmp_path}/preds")
    assert result.returncode == 2
    assert f"--prediction_data: {cut} is not a TFRecord file: record #" in result.stderr
    assert "the file is cut short" in result.stderr
    assert "started" not in result.stderr


@pytest.mark.multiprocess
def test_train_checkpoint_dir_is_a_directory(tmp_path, data):
    a_file = tmp_path / "ckpt.txt"
    a_file.write_text("x")
    result = cli("train", ZOO, "--model_def=cli_model_def:custom_model",
                 f"--training_data={data}", f"--checkpoint_dir={a_file}")
    assert result.returncode == 2
    assert (f"--checkpoint_dir={a_file} is a file, not a directory: a training job "
            "saves its checkpoints (ckpt-0001, ...) into --checkpoint_dir") in (
        result.stderr)
    checkpoint = tmp_path / "ckpts" / "ckpt-0003"
    checkpoint.mkdir(parents=True)
    (checkpoint / "manifest.json").write_text("{}")
    result = cli("train", ZOO, "--model_def=cli_model_def:custom_model",
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


# -- --help ---------------------------------------------------------------
SUBCOMMANDS = ("run", "train", "evaluate", "predict", "join", "scale", "status")
# A flag of each subcommand, as its --help shows it.
KNOWN_FLAG = {"run": "--num_workers=INT", "train": "--model_def=STR",
              "evaluate": "--validation_data=STR", "predict": "--prediction_data=STR",
              "join": "--job_dir=STR", "scale": "--num_workers=INT",
              "status": "--master=STR"}


def defined_flags(name):
    """The flags subcommand `name` defines (in a fresh process: absl's flags
    are global)."""
    code = ("import json; from absl import flags; from keras_elastic import cli; "
            f"cli._SUBCOMMANDS[{name!r}].define(); print(json.dumps([(f.name, "
            "f.boolean) for m, fs in flags.FLAGS.flags_by_module_dict().items() "
            "if m.startswith('keras_elastic') for f in fs]))")
    result = subprocess.run([sys.executable, "-c", code], env=subprocess_env(),
                            capture_output=True, text=True, timeout=60, check=True)
    return json.loads(result.stdout)


@pytest.mark.multiprocess
@pytest.mark.parametrize("args", [["--help"], ["-h"], ["help"]])
def test_top_level_help_lists_the_subcommands(args):
    result = console_script(*args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: keras-elastic SUBCOMMAND")
    for name in SUBCOMMANDS:
        assert f"\n  {name:9s} " in result.stdout
    assert "`keras-elastic SUBCOMMAND --help` (or -h)" in result.stdout
    assert not result.stderr


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_subcommand_help_lists_every_flag(name):
    for help_arg in ("--help", "-h"):
        result = cli(name, help_arg)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.startswith(f"usage: keras-elastic {name} "), result.stdout
        assert KNOWN_FLAG[name] in result.stdout
        assert "--verbosity" not in result.stdout  # absl's: --helpfull only
        assert "Unknown command line flag" not in result.stderr
    flag_names = defined_flags(name)
    assert [KNOWN_FLAG[name].split("=")[0][2:], False] in flag_names
    for flag, boolean in flag_names:
        assert (f"  --[no]{flag}\n" if boolean else f"  --{flag}=") in result.stdout


@pytest.mark.multiprocess
def test_run_help_shows_defaults_and_starts_nothing(tmp_path):
    job_dir = tmp_path / "job"
    result = console_script("run", f"--job_dir={job_dir}", "--help", "--",
                            sys.executable, "-c", "raise SystemExit(3)")
    assert result.returncode == 0, result.stderr
    assert "usage: keras-elastic run [flags] -- COMMAND [ARG ...]" in result.stdout
    assert "  --num_workers=INT\n      Workers to start. (default: 1)\n" in (
        result.stdout)
    assert "  --backend=local|ray\n" in result.stdout
    assert "(default: '127.0.0.1')" in result.stdout
    assert not job_dir.exists()  # no job was started
    result = cli("train", "-h")
    assert "job flags:\n  --model_def=STR" in result.stdout
    assert "launcher flags (as for `keras-elastic run`):" in result.stdout
    assert "--num_ps_pods (--num_ps)" in result.stdout


@pytest.mark.multiprocess
def test_run_flags_are_launch_configs_fields():
    """`keras-elastic run`'s flags are generated from LaunchConfig's fields:
    every field but echo_worker_output is a flag of the same name, the parsed
    flags build the config, and no flag given is the field's default."""
    code = ("import dataclasses, json, sys; from absl import flags; "
            "from keras_elastic import cli; "
            "from keras_elastic.launcher.config import LaunchConfig; "
            "cli._SUBCOMMANDS['run'].define(); flags.FLAGS(['run', *sys.argv[1:]]); "
            "config = LaunchConfig.from_flags(lambda n: getattr(flags.FLAGS, n)); "
            "print(json.dumps([config == LaunchConfig(), dataclasses.asdict(config), "
            "[f.name for f in dataclasses.fields(LaunchConfig) "
            "if f.name not in flags.FLAGS]]))")

    def parsed(*args):
        result = subprocess.run([sys.executable, "-c", code, *args],
                                env=subprocess_env(), capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout)

    default, _, not_flags = parsed()
    assert default and not_flags == ["echo_worker_output"]
    is_default, config, _ = parsed(
        "--num_workers=3", "--ps_partition_bytes=0", "--seed=7", "--notls",
        "--connect_timeout=7", "--backend=ray", '--worker_resources={"GPU": 1}')
    assert not is_default
    assert {k: config[k] for k in ("num_workers", "ps_partition_bytes", "seed", "tls",
                                   "connect_timeout", "backend", "worker_resources",
                                   "ps_resources", "num_ps")} == {
        "num_workers": 3, "ps_partition_bytes": 0, "seed": 7, "tls": False,
        "connect_timeout": 7.0, "backend": "ray", "worker_resources": {"GPU": 1},
        "ps_resources": None, "num_ps": 1}


@pytest.mark.multiprocess
def test_helpfull_adds_absl_flags():
    result = cli("run", "--helpfull")
    assert result.returncode == 0
    assert "--num_workers=INT" in result.stdout
    assert "  -v, --verbosity=INT" in result.stdout
    result = cli("--helpfull")
    assert result.returncode == 0
    assert "subcommands:" in result.stdout and "--verbosity" in result.stdout


@pytest.mark.multiprocess
@pytest.mark.parametrize("args, code, message", [
    ([], 2, "usage: keras-elastic SUBCOMMAND"),
    (["fly", "--help"], 2, "unknown subcommand 'fly'"),
    (["help", "fly"], 2, "unknown subcommand 'fly'"),
    (["rnu"], 2, "unknown subcommand 'rnu' (did you mean 'run'?)"),
    (["--num_workers=2", "run"], 2, "unknown flag '--num_workers=2' before the "
     "subcommand"),
    (["run", "--num_worker=2"], 2, "Unknown command line flag 'num_worker'"),
    (["run", "--num_worker=2"], 2, "(`keras-elastic run --help` lists its flags)"),
    (["scale", "extra"], 2, "unexpected arguments ['extra']; `keras-elastic scale` "
     "takes flags only"),
])
def test_wrong_subcommands_and_flags_fail(args, code, message):
    result = cli(*args)
    assert result.returncode == code, result.stdout + result.stderr
    assert message in result.stderr
    assert not result.stdout


def test_help_after_double_dash_belongs_to_the_command():
    from keras_elastic.cli import help_request, split_args

    flag_args, command = split_args(["--num_workers", "2", "--", "python",
                                     "train.py", "--help", "--", "-h"])
    assert flag_args == ["--num_workers", "2"]
    assert command == ["python", "train.py", "--help", "--", "-h"]
    assert help_request(flag_args) is None
    assert split_args(["-h"]) == (["-h"], [])
    assert help_request(["--job_dir=x", "-h"]) == "help"
    assert help_request(["--help", "--helpfull"]) == "helpfull"
    assert help_request(["--job_dir=--help"]) is None


@pytest.mark.multiprocess
def test_join_passes_help_to_its_command(tmp_path):
    result = cli("join", f"--job_dir={tmp_path}", "--", sys.executable, "-c", "0",
                 "--help")
    assert result.returncode == 2
    assert "cluster.json does not exist" in result.stderr
    assert "usage:" not in result.stdout + result.stderr


@pytest.mark.multiprocess
def test_run_passes_help_to_the_workers_command(tmp_path):
    job_dir = tmp_path / "job"
    result = cli("run", "--num_workers", "1", f"--job_dir={job_dir}",
                 "--progress_interval=1", "--", sys.executable, "-c",
                 "import sys; print('argv', sys.argv[1:])", "--help", timeout=180)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "usage: keras-elastic" not in result.stdout + result.stderr
    assert "argv ['--help']" in (job_dir / "worker-0.log").read_text()

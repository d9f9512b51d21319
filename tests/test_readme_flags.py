"""Every flag the README and docs/ document is given to a real command line by
some test, and the flags no other test gave are given here, each to a real job.

`test_every_documented_flag_is_given_on_a_command_line_by_a_test` keeps the list
from growing again. A flag counts as given when a test's source (parsed with
`ast`, so comments and docstrings never count) holds a string that is the flag
itself or starts with `--flag=` as an argv element: an argument of a call
(`launch(..., "--num_workers=2")`, `subprocess.run([...])`), an element of a
list or tuple (an argv, a parametrize case), or a value assigned to a name.
Strings compared with output (`assert "--tls" in result.stderr`), asserted
messages and `match=` patterns do not count, nor does a flag's name as a dict
key (`{"rows": ...}`).
"""

from __future__ import annotations

import ast
import glob
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, assert_exactly_once, launch, read_ledger, subprocess_env
from support.counting_jobs import check_exact, counting_job, write_data
from support.tfrecord_data import make_arrays, write_shards

TESTS = os.path.join(REPO, "tests")
DOCUMENTS = [os.path.join(REPO, "README.md"),
             *sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))]

# Flags the documents show that are not keras-elastic's to test, each with why.
NOT_KERAS_ELASTIC = {
    "dist": "pytest's (the README's test command)",
    "logdir": "tensorboard's (the command the launcher's summary prints)",
    "head": "`ray start --head` (docs/ray.md)",
    "address": "`ray start --address` and `ray job submit --address` (docs/ray.md)",
    "resources": "`ray start --resources` (docs/ray.md)",
    "ps_per_node": "docs/ray.md says there is no such flag",
    "restore_from": "the parameter-server process's, which the launcher passes "
                    "on a recovery (docs/exactly_once.md); the recovery tests drive it",
}
# Flags of scripts under bench/ and tools/ that only those scripts take and no
# test runs them with (each runs with --smoke: tests/test_bench_smoke_*.py).
BENCH_ONLY = {"configs", "rounds", "names", "remaining"}

_DOCUMENTED = re.compile(r"(?<![\w-])--([a-z][a-z0-9_]+)(?![\w-])")
_ARGV = re.compile(r"--([a-z][a-z0-9_]+)(?:=|$)")


def documented_flags() -> set[str]:
    text = "".join(open(path).read() for path in DOCUMENTS)
    return set(_DOCUMENTED.findall(text))


def _argv_strings(tree: ast.AST):
    """(string, node) of each string constant (an f-string by its leading
    text) that stands where a command line's element stands."""
    parent = {child: node for node in ast.walk(tree)
              for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            first = node.values[0] if node.values else None
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                continue
            text = first.value
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and not isinstance(parent.get(node), ast.JoinedStr)):
            text = node.value
        else:
            continue
        up = parent.get(node)
        if isinstance(up, ast.Call) and node in up.args:
            yield text, node
        elif isinstance(up, ast.keyword) and up.arg != "match":
            yield text, node
        elif (isinstance(up, (ast.List, ast.Tuple, ast.Set))
              and not isinstance(parent.get(up), ast.Compare)):
            yield text, node
        elif isinstance(up, (ast.Assign, ast.AnnAssign)) and up.value is node:
            yield text, node


def flags_given_by_tests(paths: list[str]) -> dict[str, list[str]]:
    """flag -> the places (path:line) where a test gives it on a command line."""
    given: dict[str, list[str]] = {}
    for path in paths:
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for text, node in _argv_strings(tree):
            match = _ARGV.match(text)
            if match:
                given.setdefault(match.group(1), []).append(
                    f"{os.path.relpath(path, REPO)}:{node.lineno}")
    return given


def test_every_documented_flag_is_given_on_a_command_line_by_a_test():
    flags = documented_flags()
    assert len(flags) > 80 and {"num_workers", "ps_checkpoint_versions",
                                "insecure", "rendezvous_timeout"} <= flags
    assert not (NOT_KERAS_ELASTIC.keys() | BENCH_ONLY) - flags, (
        "excepted flags the documents no longer show: drop them",
        sorted((NOT_KERAS_ELASTIC.keys() | BENCH_ONLY) - flags))
    given = flags_given_by_tests(glob.glob(os.path.join(TESTS, "**", "*.py"),
                                           recursive=True))
    untested = sorted(flags - given.keys() - NOT_KERAS_ELASTIC.keys() - BENCH_ONLY)
    assert untested == [], (
        f"README.md and docs/ document {untested} but no test gives them on a "
        "command line: add a test that does")


def test_a_flag_only_in_comments_messages_or_dict_keys_is_not_given(tmp_path):
    """The rule itself: what does not count, and what does."""
    source = tmp_path / "test_x.py"
    source.write_text(
        '"""--docstring=1"""\n'
        "# launch(job, '--comment=1')\n"
        "TABLE = {'rows': 4}\n"
        "def test():\n"
        "    assert '--in_output' in result.stderr\n"
        "    assert run(['--asserted_argv=1']) == ['--expected=2']\n"
        "    with pytest.raises(ValueError, match='--matched must be'):\n"
        "        pass\n"
        "    check('--a_message must be >= 0')\n"
        "    launch(job, '--argument=1', f'--fstring={x}', '--bare')\n"
        "    subprocess.run([sys.executable, '--element', '2'])\n"
        "    FLAG = '--assigned=3'\n")
    assert sorted(flags_given_by_tests([str(source)])) == [
        "argument", "asserted_argv", "assigned", "bare", "element", "fstring"]


# -- the flags no other test used ----------------------------------------------
WRITE_ENV = """
import json, os, sys
from keras_elastic.common import cluster_env
with open(sys.argv[1], "w") as f:
    json.dump({"connect_timeout": cluster_env.connect_timeout(),
               "worker": os.environ["KERAS_ELASTIC_WORKER_ID"]}, f)
"""


@pytest.mark.multiprocess
def test_connect_timeout_reaches_every_worker(tmp_path):
    """`keras-elastic run --connect_timeout=7`: how long a worker's clients
    retry an unreachable master or server, as each worker reads it."""
    script = tmp_path / "write_env.py"
    script.write_text(WRITE_ENV)
    out = tmp_path / "env.json"
    result = launch(str(tmp_path / "job"), str(script), "--num_workers=1",
                    "--connect_timeout=7", script_args=(str(out),), timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(out.read_text()) == {"connect_timeout": 7.0, "worker": "0"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(str(tmp_path_factory.mktemp("counting")))


@pytest.mark.multiprocess
def test_automatic_checkpoints_every_n_versions_and_how_many_are_kept(tmp_path, data):
    """`--ps_checkpoint_versions=16 --ps_checkpoint_secs=0`: an automatic
    checkpoint each time the model moved 16 versions (never by time);
    `--ps_checkpoints_to_keep=1`: only the newest stays (with the initial
    model's, the recovery point of last resort)."""
    out, result = counting_job(
        tmp_path, data, "--num_ps=1", "--ps_checkpoint_secs=0",
        "--ps_checkpoint_versions=16", "--ps_checkpoints_to_keep=1",
        script_args=("--sleep_per_batch=0.03",))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    check_exact(tmp_path, out, output)
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    # 2 epochs x 64 batches = 128 versions: several saves by versions, plus
    # the one at the end of training.
    assert summary["ps_checkpoints"] >= 3, summary["ps_checkpoints"]
    kept = sorted(n for n in os.listdir(tmp_path / "job" / "ps_checkpoints")
                  if not n.startswith("."))
    assert len(kept) == 2 and kept[0].startswith("ckpt-") and kept[1] == "init", kept
    manifest = json.loads((tmp_path / "job" / "ps_checkpoints" / kept[0] /
                           "manifest.json").read_text())
    assert manifest["automatic"] is True


@pytest.mark.multiprocess
def test_shuffle_gives_each_epoch_its_own_task_order(tmp_path):
    """`keras-elastic train --shuffle`: tasks (and their records) come in a
    new order each epoch; every task still runs once per epoch."""
    x, y = make_arrays(256)
    write_shards(str(tmp_path / "data"), x, y, 2)
    job_dir = tmp_path / "job"
    result = subprocess.run(
        [sys.executable, "-m", "keras_elastic", "train",
         f"--model_zoo={TESTS}/scripts",
         "--model_def=cli_model_def:custom_model",
         f"--training_data={tmp_path / 'data'}/*.tfrecord", "--num_epochs=2",
         "--minibatch_size=8", "--num_minibatches_per_task=2", "--num_workers=1",
         "--shuffle", f"--job_dir={job_dir}"],
        env=subprocess_env(), capture_output=True, text=True, timeout=300, cwd=TESTS)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ledger = read_ledger(str(job_dir))["training"]
    assert_exactly_once(ledger, num_epochs=2, tasks_per_epoch=256 // 16)
    orders = [[e["task_id"] for e in ledger if e["epoch"] == epoch] for epoch in (0, 1)]
    # One worker: tasks complete in the order they were handed out.
    assert orders[0] != sorted(orders[0]) and orders[0] != orders[1], orders


@pytest.mark.multiprocess
def test_a_job_with_the_users_own_certificate_key_and_ca(tmp_path, data):
    """`--tls_cert/--tls_key/--tls_ca`: the services serve the user's
    certificate, every client trusts the user's CA, and the job is exact."""
    from keras_elastic.common import tls

    own = tls.make_self_signed(str(tmp_path / "pki"), [])
    out, result = counting_job(
        tmp_path, data, "--num_ps=1", f"--tls_cert={own.cert}", f"--tls_key={own.key}",
        f"--tls_ca={own.cert}", epochs=1)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    check_exact(tmp_path, out, output, epochs=1)
    cluster = json.loads((tmp_path / "job" / "cluster.json").read_text())
    assert cluster["tls"]["ca"] == own.cert
    assert not (tmp_path / "job" / "tls").exists()  # nothing made for the job


@pytest.mark.multiprocess
def test_insecure_serves_clear_text_beyond_loopback(tmp_path, data):
    """`--bind=0.0.0.0 --insecure`: the launcher, which refuses clear text
    beyond loopback without it, starts the job; its services listen on every
    interface in clear text (no certificate made, none in cluster.json), and
    the job is exact."""
    out, result = counting_job(
        tmp_path, data, "--num_ps=1", "--bind=0.0.0.0", "--advertise=127.0.0.1",
        "--insecure", epochs=1)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    check_exact(tmp_path, out, output, epochs=1)
    cluster = json.loads((tmp_path / "job" / "cluster.json").read_text())
    assert not cluster.get("tls"), cluster
    assert not (tmp_path / "job" / "tls").exists()


@pytest.mark.multiprocess
def test_a_master_started_by_hand_refuses_a_host_beyond_loopback_in_clear_text(tmp_path):
    """`python -m keras_elastic.master --host=0.0.0.0` (docs/security.md): without
    KERAS_ELASTIC_TLS=1 or KERAS_ELASTIC_INSECURE=1 it exits before serving."""
    from keras_elastic.common import tls

    env = subprocess_env()
    for name in (tls.TLS_ENV, tls.INSECURE_ENV):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-m", "keras_elastic.master", "--host=0.0.0.0", "--port=0",
         f"--ready_file={tmp_path / 'ready'}"],
        env=env, capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert result.returncode != 0, result.stdout + result.stderr
    assert "refusing to serve on 0.0.0.0 without TLS" in result.stderr, result.stderr
    assert not (tmp_path / "ready").exists()


@pytest.mark.parametrize("flag, instead", [
    ("--namespace=team-a", "--backend ray --ray_address"),
    ("--envs=A=1,B=2", "set environment variables where you run keras-elastic"),
])
def test_elasticdl_kubernetes_flags_are_refused_with_what_to_do(flag, instead):
    from keras_elastic.jobs import job_flags

    with pytest.raises(ValueError) as e:
        job_flags.rewrite_elasticdl_args(["--minibatch_size=8", flag])
    assert "does not apply" in str(e.value) and instead in str(e.value), str(e.value)


@pytest.mark.multiprocess
def test_hook_renaming_flags_pick_the_modules_hooks(tmp_path):
    """`--feed --loss --optimizer --eval_metrics_fn --callbacks` name the
    module's hooks (ElasticDL's flags): the job uses those, never the hooks
    of the default names (which raise), on every worker."""
    x, y = make_arrays(256)
    write_shards(str(tmp_path / "data"), x, y, 2)
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "keras_elastic", "train",
         f"--model_zoo={TESTS}/scripts",
         "--model_def=renamed_hooks_model_def:custom_model",
         f"--training_data={tmp_path / 'data'}", f"--validation_data={tmp_path / 'data'}",
         "--num_epochs=1", "--minibatch_size=16", "--num_minibatches_per_task=2",
         "--num_workers=2", "--feed=zoo_feed", "--loss=zoo_loss",
         "--optimizer=zoo_optimizer", "--eval_metrics_fn=zoo_metrics",
         "--callbacks=zoo_callbacks", f"--job_dir={tmp_path / 'job'}"],
        env=subprocess_env(RENAMED_HOOKS_OUT=str(out)), capture_output=True, text=True,
        timeout=300, cwd=TESTS)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "default name" not in output
    seen = [json.loads((out / f"worker-{i}.json").read_text()) for i in (0, 1)]
    assert seen[0] == seen[1] == {
        "optimizer": "SGD", "learning_rate": 0.0625, "momentum": 0.5,
        "logs": ["hits", "loss", "val_hits", "val_loss"]}, seen

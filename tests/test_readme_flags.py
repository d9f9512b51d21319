"""Every flag the README documents is exercised by a test (issue 24), and the
flags no other test used are exercised here, each through a real job.

`test_every_flag_the_readme_documents_is_exercised_by_a_test` keeps the list
from growing again: a flag written in the README must appear in some test.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, assert_exactly_once, launch, read_ledger, subprocess_env
from counting_jobs import check_exact, counting_job, write_data
from tfrecord_data import make_arrays, write_shards

TESTS = os.path.join(REPO, "tests")

# Flags of the README that only the benches take: their smoke modes are
# issue 26's work ("every script under bench/ a smoke mode that a test runs").
BENCH_ONLY = {"configs", "rounds"}


def readme_flags() -> set[str]:
    text = open(os.path.join(REPO, "README.md")).read()
    return set(re.findall(r"(?<![\w-])--([a-z][a-z0-9_]+)", text))


def test_every_flag_the_readme_documents_is_exercised_by_a_test():
    flags = readme_flags()
    assert len(flags) > 50 and {"num_workers", "ps_checkpoint_versions"} <= flags
    tests = "".join(open(path).read() for path in glob.glob(
        os.path.join(TESTS, "**", "*.py"), recursive=True))
    untested = sorted(f for f in flags - BENCH_ONLY
                      if f"--{f}" not in tests and f'"{f}"' not in tests)
    assert untested == [], (
        f"the README documents {untested} but no test uses them: add a test")


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

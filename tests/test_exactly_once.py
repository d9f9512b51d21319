"""Exactly-once model updates under kills, as real process trees (issue 8).

The counting model (`counting_script.py`) has weights that count the record
gradients applied: after a job each equals `epochs x records` exactly when
every record's gradient was applied exactly once, whatever died meanwhile.
Workers are killed at precise moments by fault injection
(`KERAS_ELASTIC_FAULTS`, see `keras_elastic/common/faults.py`), parameter
servers with SIGKILL from outside.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from conftest import (
    REPO,
    assert_exactly_once,
    job_status,
    launch,
    read_ledger,
    subprocess_env,
    wait_for,
)

pytestmark = pytest.mark.multiprocess

SCRIPT = os.path.join(REPO, "tests", "counting_script.py")
RECORDS = 1024
TASKS_PER_EPOCH = 16  # 1024 records / (batch 16 x 4 minibatches per task)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("counting"))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import counting_script as c; "
            f"c.write_data(sys.argv[2], {RECORDS}, 4)")
    subprocess.run([sys.executable, "-c", code, os.path.join(REPO, "tests"),
                    directory], check=True, env=subprocess_env(), timeout=120)
    return os.path.join(directory, "*.tfrecord")


def counting_job(tmp_path, data, *flags, script_args=(), faults="", epochs=2,
                 background=False):
    out = tmp_path / "out.json"
    args = (f"--data={data}", f"--epochs={epochs}", f"--output={out}", *script_args)
    env = {"KERAS_ELASTIC_FAULTS": faults} if faults else None
    return out, launch(str(tmp_path / "job"), SCRIPT, "--num_workers=2", *flags,
                       script_args=args, env=env, background=background)


def check_exact(tmp_path, out, output: str, epochs=2, per_record=1.0) -> dict:
    """The job succeeded and every weight counts each record once per epoch."""
    assert os.path.exists(out), output[-4000:]
    result = json.loads(out.read_text())
    expected = epochs * RECORDS * per_record
    assert result["counts"] == [expected] * len(result["counts"]), (
        result, output[-4000:])
    ledger = read_ledger(str(tmp_path / "job"))["training"]
    assert_exactly_once(ledger, num_epochs=epochs, tasks_per_epoch=TASKS_PER_EPOCH)
    return result


def worker_logs(tmp_path) -> str:
    job = tmp_path / "job"
    return "".join((job / n).read_text() for n in sorted(os.listdir(job))
                   if n.startswith("worker-"))


@pytest.mark.parametrize("point, nth, num_ps, exchange", [
    ("after_claim", 3, 2, "sync"),   # a task claimed on the servers, nothing pushed
    ("mid_push", 5, 2, "sync"),      # a push reached the first server only
    ("after_push", 5, 2, "sync"),    # pushed everywhere, not reported
    ("epoch_end", 1, 2, "sync"),     # at the epoch barrier, last tasks not reported
    ("validation", 1, 2, "sync"),    # during a validation round
    # One server: the claim and the push are one call each (no partial push).
    ("after_claim", 3, 1, "sync"),
    ("after_push", 5, 1, "sync"),
    # The pipelined exchange: a push cut while the next step computes, and
    # one applied whose tasks were not reported.
    ("mid_push", 5, 2, "pipelined"),
    ("after_push", 5, 2, "pipelined"),
])
def test_worker_killed_at_any_moment_applies_every_gradient_once(
        tmp_path, data, point, nth, num_ps, exchange):
    extra = ("--validate",) if point == "validation" else ()
    extra += (f"--exchange={exchange}",)
    out, result = counting_job(
        tmp_path, data, f"--num_ps={num_ps}", "--max_worker_restarts=2",
        script_args=("--sleep_per_batch=0.03", *extra), faults=f"{point}@{nth}:w1")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    # The fault really fired, and the worker was replaced.
    assert f"SIGKILL at '{point}'" in worker_logs(tmp_path), output[-3000:]
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["workers_lost"] == 1 and summary["worker_restarts"] == 1
    check_exact(tmp_path, out, output)


def test_grads_to_wait_two_and_a_filtering_dataset_fn_with_a_push_cut_in_the_middle(
        tmp_path, data):
    # Updates average 2 pushes, and dataset_fn drops odd records (a task's
    # elements are not its records): every weight counts a quarter per record.
    out, result = counting_job(
        tmp_path, data, "--num_ps=2", "--grads_to_wait=2",
        script_args=("--sleep_per_batch=0.03", "--filter_odd"), faults="mid_push@4:w1")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "SIGKILL at 'mid_push'" in worker_logs(tmp_path)
    check_exact(tmp_path, out, output, per_record=0.25)


def _kill_ps(job_dir: str, index: int) -> int:
    with open(os.path.join(job_dir, "cluster.json")) as f:
        pid = json.load(f)["ps_pids"][index]
    os.kill(pid, signal.SIGKILL)
    return pid


def _training(job_dir: str) -> dict:
    status = job_status(job_dir)
    return (status or {}).get("datasets", {}).get("training") or {}


@pytest.mark.parametrize("num_ps, victim, when, checkpoint", [
    # 1 PS killed in the first epoch, before any automatic checkpoint: the job
    # restarts from the initial model at the start of the data.
    (1, 0, (0, 4), False),
    # One of 2 PS killed in the second epoch, after automatic checkpoints.
    (2, 1, (1, 4), True),
])
def test_parameter_server_killed_mid_epoch_job_finishes_exact(
        tmp_path, data, num_ps, victim, when, checkpoint):
    job_dir = str(tmp_path / "job")
    secs = "2" if checkpoint else "1000"
    out, proc = counting_job(
        tmp_path, data, f"--num_ps={num_ps}", f"--ps_checkpoint_secs={secs}",
        script_args=("--sleep_per_batch=0.1",), background=True)
    try:
        epoch, done = when
        wait_for(lambda: _training(job_dir).get("epoch") == epoch and
                 _training(job_dir).get("done", 0) >= done, timeout=240,
                 what=f"epoch {epoch} under way")
        if checkpoint:
            wait_for(lambda: os.path.isdir(os.path.join(
                job_dir, "ps_checkpoints", "ckpt-000001")), timeout=60,
                what="an automatic checkpoint")
        _kill_ps(job_dir, victim)
        output, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-4000:]
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["ps_restarts"] == 1, summary
    recovery = summary["ps_recoveries"][0]
    assert recovery["ps"] == victim
    if checkpoint:
        assert "ckpt-" in recovery["checkpoint"], recovery
    else:
        assert recovery["checkpoint"] is None or "init" in recovery["checkpoint"]
    result = check_exact(tmp_path, out, output)
    assert all(p["incarnation"] for p in result["ps"])


def test_parameter_server_that_keeps_dying_fails_the_job_with_its_log(tmp_path, data):
    job_dir = str(tmp_path / "job")
    _, proc = counting_job(tmp_path, data, "--num_ps=1", "--max_ps_restarts=1",
                           script_args=("--sleep_per_batch=0.1",), background=True)
    try:
        wait_for(lambda: _training(job_dir).get("done", 0) >= 2, timeout=240,
                 what="the job to start")
        first = _kill_ps(job_dir, 0)
        wait_for(lambda: json.load(open(os.path.join(job_dir, "cluster.json")))[
            "ps_pids"][0] != first and _training(job_dir), timeout=120,
            what="the parameter server to be back")
        _kill_ps(job_dir, 0)
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, output[-4000:]
    assert ("job FAILED: parameter server 0 exited with code -9 and was already "
            "restarted 1 time(s) (--max_ps_restarts=1)") in output
    assert "serving at" in output  # the tail of its log


def test_chaos_random_roles_killed_at_random_times(tmp_path, data):
    """Seeded: 4 kills of random workers and parameter servers; exact result."""
    rng = random.Random(8)
    job_dir = str(tmp_path / "job")
    out, proc = counting_job(
        tmp_path, data, "--num_ps=2", "--ps_checkpoint_secs=2",
        "--max_worker_restarts=6", "--max_ps_restarts=6",
        script_args=("--sleep_per_batch=0.1",), epochs=3, background=True)
    kills = []
    try:
        wait_for(lambda: _training(job_dir).get("done", 0) >= 2, timeout=240,
                 what="the job to start")
        for _ in range(4):
            time.sleep(rng.uniform(3.0, 7.0))
            status = job_status(job_dir)
            training = (status or {}).get("datasets", {}).get("training") or {}
            if not status or training.get("finished"):
                break
            if rng.random() < 0.5:
                alive = sorted(status["workers"]["alive"])
                if not alive:
                    continue
                victim = rng.choice(alive)
                with open(os.path.join(job_dir, "cluster.json")) as f:
                    pid = json.load(f)["worker_pids"].get(str(victim))
                if pid is None:  # just exited
                    continue
                os.kill(pid, signal.SIGKILL)
                kills.append(("worker", victim))
            else:
                victim = rng.randrange(2)
                try:
                    killed = _kill_ps(job_dir, victim)
                except ProcessLookupError:  # it died meanwhile (a job ending)
                    continue
                kills.append(("ps", victim))

                def restarted(victim=victim, killed=killed):
                    with open(os.path.join(job_dir, "cluster.json")) as f:
                        pids = json.load(f).get("ps_pids", [])
                    return (len(pids) == 2 and pids[victim] != killed
                            and job_status(job_dir) is not None)

                # The next kill only once the server is back.
                wait_for(restarted, timeout=120, what=f"ps {victim} restarted")
                time.sleep(2)
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (kills, output[-4000:])
    assert len(kills) >= 3, kills
    check_exact(tmp_path, out, output, epochs=3)


CRASH = """
import os, sys
worker = os.environ["KERAS_ELASTIC_WORKER_ID"]
sys.exit(f"crash.py: cannot open /no/such/data (worker {worker})")
"""


def test_restart_budget_is_a_hard_bound(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    result = launch(str(tmp_path / "job"), str(script), "--num_workers=2",
                    "--max_worker_restarts=3", timeout=180)
    assert result.returncode == 1
    logs = [n for n in os.listdir(tmp_path / "job") if n.startswith("worker-")]
    assert len(logs) == 2 + 3, logs  # 2 workers, exactly 3 relaunches
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["worker_restarts"] == 3
    assert "has used all 3 worker restarts" in result.stderr
    assert "crash.py: cannot open /no/such/data" in result.stderr


def test_workers_failing_the_same_way_fail_the_job_promptly(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("raise SystemExit('crash.py: model_def has no attribute "
                      "custom_model')\n")
    start = time.time()
    result = launch(str(tmp_path / "job"), str(script), "--num_workers=2",
                    "--max_worker_restarts=50", timeout=180)
    assert result.returncode == 1
    assert "the last 3 workers all failed the same way" in result.stderr
    assert "model_def has no attribute custom_model" in result.stderr
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["worker_restarts"] <= 2, summary
    assert time.time() - start < 120


def test_digits_with_a_parameter_server_killed_reaches_95_percent(tmp_path):
    digits = os.path.join(REPO, "examples", "digits")
    data_dir = tmp_path / "digits"
    subprocess.run([sys.executable, os.path.join(digits, "prepare_data.py"),
                    f"--output_dir={data_dir}", "--num_shards=2"], check=True,
                   env=subprocess_env(), timeout=300, capture_output=True)
    out = tmp_path / "metrics.json"
    job_dir = str(tmp_path / "job")
    proc = launch(job_dir, os.path.join(digits, "train.py"), "--num_workers=2",
                  "--num_ps=1", "--ps_checkpoint_secs=3",
                  script_args=("--epochs=8", f"--data_dir={data_dir}", "--noprepare",
                               f"--output={out}"), background=True)
    try:
        wait_for(lambda: _training(job_dir).get("epoch", 0) >= 3, timeout=400,
                 what="epoch 4")
        _kill_ps(job_dir, 0)
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-4000:]
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["ps_restarts"] == 1
    metrics = json.loads(out.read_text())
    assert metrics["val_accuracy"] >= 0.95, metrics

"""The counting job (`counting_script.py`) as a real process tree, for the
exactly-once tests (test_exactly_once.py: workers killed; test_exactly_once_ps.py:
parameter servers killed). A module-scoped `data` fixture in each test file
calls `write_data` once.
"""

import json
import os
import signal
import subprocess
import sys

from conftest import (
    REPO,
    assert_exactly_once,
    job_status,
    launch,
    read_ledger,
    subprocess_env,
)

SCRIPT = os.path.join(REPO, "tests", "scripts", "counting_script.py")
RECORDS = 1024
TASKS_PER_EPOCH = 16  # 1024 records / (batch 16 x 4 minibatches per task)


def write_data(directory: str) -> str:
    """The counting job's TFRecord files in `directory`; returns their glob."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import counting_script as c; "
            f"c.write_data(sys.argv[2], {RECORDS}, 4)")
    subprocess.run([sys.executable, "-c", code, os.path.join(REPO, "tests", "scripts"),
                    directory], check=True, env=subprocess_env(), timeout=120)
    return os.path.join(directory, "*.tfrecord")


def counting_job(tmp_path, data, *flags, script_args=(), faults="", epochs=2,
                 background=False, env=None):
    """`faults`: KERAS_ELASTIC_FAULTS, each entry once per job (markers in
    `tmp_path/faults`); `env`: more environment variables."""
    out = tmp_path / "out.json"
    args = (f"--data={data}", f"--epochs={epochs}", f"--output={out}", *script_args)
    env = dict(env or {})
    if faults:
        env.update(KERAS_ELASTIC_FAULTS=faults,
                   KERAS_ELASTIC_FAULTS_DIR=str(tmp_path / "faults"))
    return out, launch(str(tmp_path / "job"), SCRIPT, "--num_workers=2", *flags,
                       script_args=args, env=env or None, background=background)


def through_holds(tmp_path, proc, steps) -> str:
    """Runs the background counting job `proc` through its held fault points:
    for each `(hold entry, action)` of `steps`, once the entry holds its
    thread, `action(job_dir)`, then the held call goes on. Returns the job's
    output once it succeeded; the job is killed if anything failed first."""
    from keras_elastic.common import faults

    job_dir = tmp_path / "job"
    try:
        for hold, action in steps:
            faults.wait_held(str(tmp_path / "faults"), hold, timeout=300)
            action(job_dir)
            faults.release(str(tmp_path / "faults"), hold)
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, output[-4000:]
    return output


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


def kill_ps(job_dir: str, index: int) -> int:
    with open(os.path.join(job_dir, "cluster.json")) as f:
        pid = json.load(f)["ps_pids"][index]
    os.kill(pid, signal.SIGKILL)
    return pid


def training(job_dir: str) -> dict:
    status = job_status(job_dir)
    return (status or {}).get("datasets", {}).get("training") or {}

"""Time lost to failures: a worker and a parameter server killed during a job.

The README's digits job (real data: scikit-learn's digits, a small convnet,
2 workers, 1 parameter server) runs twice through `keras-elastic run`:

- baseline: no failure;
- faults:   one worker killed with SIGKILL in epoch `--kill_worker_epoch`, the
            parameter server killed with SIGKILL in epoch `--kill_ps_epoch`
            (automatic parameter-server checkpoints every
            `--ps_checkpoint_secs`).

Prints both wall times and the time lost (their difference), then per failure:

- worker: seconds until a replacement worker trained its first task, and the
  work redone: exactly-once training skips the elements a dead worker had
  already applied, so this is the elements caught up again (from the
  workers' logs) at the job's mean rate;
- parameter server: seconds to recover (restart + every server restored +
  the master rolled back, from the launcher's summary) and the work redone:
  the task completions the rollback undid, at the job's mean seconds per task.

And the final validation accuracy of both runs (the same model quality is
the point of exactly-once). Run from the repository root:

```
PYTHONPATH=. python bench/bench_recovery.py
PYTHONPATH=. python bench/bench_recovery.py --smoke  # both jobs, both failures, 3 epochs
```

`--smoke`: 3 epochs, the worker killed in the first, the parameter server in
the second, PS checkpoints every second (flags given on the command line are
kept): checks that both jobs run, with both failures, and that the report
prints; the figures mean nothing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from absl import app, flags, logging

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIGITS = os.path.join(REPO, "examples", "digits")

FLAGS = flags.FLAGS
flags.DEFINE_integer("epochs", 12, "Epochs of the digits job.")
flags.DEFINE_integer("kill_worker_epoch", 3, "Epoch in which a worker is killed.")
flags.DEFINE_integer("kill_ps_epoch", 7, "Epoch in which the parameter server is killed.")
flags.DEFINE_float("ps_checkpoint_secs", 5.0, "Automatic PS checkpoint period.")
flags.DEFINE_string("work_dir", None, "Where data and jobs go (default: a temp dir).")
flags.DEFINE_bool("warm_start", True, "Start the roles from a warm process (the "
                  "launcher's default); --nowarm_start: each afresh, as before.")
flags.DEFINE_bool("smoke", False, "Tiny sizes (3 epochs, the worker killed in the "
                  "first, the PS in the second; a test runs it: "
                  "tests/test_bench_smoke*.py); the figures mean nothing.")

# --smoke: the values of the flags not given on the command line.
SMOKE = {"epochs": 3, "kill_worker_epoch": 0, "kill_ps_epoch": 1,
         "ps_checkpoint_secs": 1.0}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERAS_ELASTIC_")}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def _status(job_dir: str) -> dict | None:
    from keras_elastic.common import auth
    from keras_elastic.master.client import MasterClient

    try:
        with open(os.path.join(job_dir, "cluster.json")) as f:
            cluster = json.load(f)
        os.environ[auth.TOKEN_ENV] = auth.read_token_file(job_dir)  # the job's token
        client = MasterClient(cluster["master"], connect_timeout=5)
        try:
            return client.status(include_ledger=True)
        finally:
            client.close()
    except (OSError, ValueError, ConnectionError, KeyError):
        return None


def _cluster(job_dir: str) -> dict:
    with open(os.path.join(job_dir, "cluster.json")) as f:
        return json.load(f)


def _wait_epoch(job_dir: str, epoch: int, proc: subprocess.Popen) -> dict:
    """Waits until training is a third into `epoch`; returns the status."""
    while proc.poll() is None:
        status = _status(job_dir)
        training = (status or {}).get("datasets", {}).get("training")
        if training and (training["epoch"] > epoch or training["epoch"] == epoch and
                         training["done"] >= training["tasks_per_epoch"] // 3):
            return status
        time.sleep(0.2)
    raise RuntimeError(f"the job ended before epoch {epoch}")


def run_job(work: str, name: str, data_dir: str, kills: bool) -> dict:
    job_dir = os.path.join(work, name)
    metrics = os.path.join(work, f"{name}.json")
    argv = [sys.executable, "-m", "keras_elastic", "run", f"--job_dir={job_dir}",
            "--num_workers=2", "--num_ps=1",
            f"--ps_checkpoint_secs={FLAGS.ps_checkpoint_secs}", "--progress_interval=5",
            "--warm_start" if FLAGS.warm_start else "--nowarm_start",
            "--", sys.executable, os.path.join(DIGITS, "train.py"),
            f"--epochs={FLAGS.epochs}", f"--data_dir={data_dir}", "--noprepare",
            f"--output={metrics}"]
    start = time.time()
    log = open(os.path.join(work, f"{name}.log"), "w")
    proc = subprocess.Popen(argv, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    killed: dict[str, float] = {}
    victim = None
    try:
        if kills:
            status = _wait_epoch(job_dir, FLAGS.kill_worker_epoch, proc)
            # Not worker 0: it writes the metrics at the end. (In epoch 0, as
            # with --smoke, the other worker may still be starting.)
            while not (alive := [str(w) for w in status["workers"]["alive"] if w != 0]):
                if proc.poll() is not None:
                    raise RuntimeError("the job ended before a worker other than 0 "
                                       "was alive")
                time.sleep(0.2)
                status = _status(job_dir) or status
            doing = status["datasets"]["training"]["doing_by_worker"]
            victim = max(alive, key=lambda w: doing.get(w, 0))
            os.kill(_cluster(job_dir)["worker_pids"][victim], signal.SIGKILL)
            killed["worker"] = time.time()
            _wait_epoch(job_dir, FLAGS.kill_ps_epoch, proc)
            os.kill(_cluster(job_dir)["ps_pids"][0], signal.SIGKILL)
            killed["ps"] = time.time()
        code = proc.wait(timeout=3600)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    wall = time.time() - start
    if code != 0:
        raise RuntimeError(f"job {name} failed (exit {code}); see {log.name}")
    with open(os.path.join(job_dir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(job_dir, "ledger.json")) as f:
        ledger = json.load(f)["training"]
    with open(metrics) as f:
        accuracy = json.load(f)["val_accuracy"]
    return {"job_dir": job_dir, "wall": wall, "summary": summary, "ledger": ledger,
            "killed": killed, "victim": victim, "accuracy": accuracy}


def _caught_up_elements(job_dir: str) -> int:
    total = 0
    for name in os.listdir(job_dir):
        if name.startswith("worker-"):
            with open(os.path.join(job_dir, name)) as f:
                for m in re.finditer(r"caught up \[(.*?)\]$", f.read(), re.M):
                    for lo, hi in re.findall(r"\((\d+), (\d+), \[", m.group(1)):
                        total += int(hi) - int(lo)
    return total


def _log_seconds(path: str, pattern: str) -> float:
    """The time of day (seconds) of the first line of absl log `path` that
    matches `pattern` (nan if none)."""
    with open(path) as f:
        for line in f:
            if re.search(pattern, line):
                hours, minutes, seconds = line.split()[1].split(":")
                return int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    return float("nan")


def _relaunch_times(job_dir: str) -> tuple[float, float]:
    """(the launcher saw the killed worker's death, its replacement
    registered), from the launcher's and the master's logs."""
    known = _log_seconds(os.path.join(job_dir, "launcher.log"),
                         r"worker \d+ exited with code")
    registered = _log_seconds(os.path.join(job_dir, "master.log"),
                              r"worker ([2-9]|\d\d+) registered")
    return known, registered


def main(argv):
    del argv
    if FLAGS.smoke:
        for name, value in SMOKE.items():
            if not FLAGS[name].present:
                FLAGS[name].value = value
    logging.set_verbosity(logging.WARNING)
    work = FLAGS.work_dir or tempfile.mkdtemp(prefix="bench-recovery-")
    data_dir = os.path.join(work, "digits")
    subprocess.run([sys.executable, os.path.join(DIGITS, "prepare_data.py"),
                    f"--output_dir={data_dir}", "--num_shards=2"], check=True,
                   env=_env(), capture_output=True)
    print(f"digits job, {FLAGS.epochs} epochs, 2 workers, 1 parameter server, roles "
          f"started {'warm' if FLAGS.warm_start else 'afresh'}; work dir {work}")
    base = run_job(work, "baseline", data_dir, kills=False)
    fault = run_job(work, "faults", data_dir, kills=True)
    lost = fault["wall"] - base["wall"]
    print(f"baseline: {base['wall']:.1f} s, val_accuracy {base['accuracy']:.4f}")
    print(f"faults:   {fault['wall']:.1f} s, val_accuracy {fault['accuracy']:.4f} "
          f"(a worker killed in epoch {FLAGS.kill_worker_epoch + 1}, the parameter "
          f"server in epoch {FLAGS.kill_ps_epoch + 1})")
    print(f"time lost to both failures: {lost:.1f} s "
          f"({lost / base['wall']:.1%} of the baseline)")

    ledger = base["ledger"]
    tasks = len(ledger)
    seconds_per_task = base["wall"] / max(tasks, 1) * 2  # 2 workers in parallel
    seconds_per_element = seconds_per_task / max(
        sum(e["end"] - e["start"] for e in ledger) / max(tasks, 1), 1)

    # Worker: from the kill to the replacement's first completed task.
    kill_at = fault["killed"]["worker"]
    firsts = [e["time"] for e in fault["ledger"]   # relaunched workers: ids >= 2
              if e["worker"] >= 2 and e["time"] > kill_at]
    back = (min(firsts) - kill_at) if firsts else float("nan")
    caught = _caught_up_elements(fault["job_dir"])
    print(f"worker failure: replacement trained its first task {back:.1f} s after "
          f"the kill; work redone: {caught} elements caught up "
          f"(~{caught * seconds_per_element:.2f} s); requeued tasks "
          f"{fault['summary']['requeued']}")
    known, registered = _relaunch_times(fault["job_dir"])
    print(f"worker relaunch: the replacement registered with the master "
          f"{registered - known:.2f} s after the launcher saw the death (its first "
          "task then waits for one to be free)")
    for r in fault["summary"]["ps_recoveries"]:
        undone = sum(r["completions_undone"].values())
        print(f"parameter-server failure: recovered in {r['seconds']:.1f} s from "
              f"{os.path.basename(r['checkpoint'] or 'the initial model')}; work "
              f"redone: {undone} task completions rolled back "
              f"(~{undone * seconds_per_task:.1f} s of one worker)")


if __name__ == "__main__":
    app.run(main)

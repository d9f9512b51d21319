"""What a role's start costs a job: the README's digits job with every role
started afresh (`--nowarm_start`), forked from the job's own warm process
(the default), and forked from a warm process already running on the
machine (`KERAS_ELASTIC_WARM_SOCKET`: no import at all), against the same
script run embedded (no launcher: master and server in the script's
process), in one run on the same machine.

Per run: the wall time from launch to exit, the time from launch until the
master handed out the job's first task (the workers registered, built
their model and data: training starts) and until the first task was
trained (its report in the ledger), and the launch's own share (the warm
process' imports, where there is one). Ratios against the embedded run.

```
PYTHONPATH=. python bench/bench_warm_start.py              # 8 epochs
PYTHONPATH=. python bench/bench_warm_start.py --smoke      # 1 epoch: seconds
```

`--smoke`: one epoch each; checks that the three runs work and the report
prints (a test runs it: tests/test_bench_smoke_warm_start.py); the figures
mean nothing then.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIGITS = os.path.join(REPO, "examples", "digits")

FLAGS = flags.FLAGS
flags.DEFINE_integer("epochs", 8, "Epochs of the digits job (the README's: 8).")
flags.DEFINE_integer("repeats", 1, "Runs of each kind (the figures: their median).",
                     lower_bound=1)
flags.DEFINE_string("work_dir", None, "Where data and jobs go (default: a temp dir).")
flags.DEFINE_bool("smoke", False, "One epoch, one run each (seconds); the figures "
                  "mean nothing.")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERAS_ELASTIC_")}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def _run(argv: list[str], log_path: str, env: dict | None = None) -> float:
    start = time.time()
    with open(log_path, "w") as log:
        code = subprocess.call(argv, env=dict(_env(), **(env or {})), stdout=log,
                               stderr=subprocess.STDOUT, timeout=1800)
    if code != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {code}; see {log_path}")
    return start


def run_job(work: str, name: str, data_dir: str, flag: str,
            env: dict | None = None) -> dict:
    """One 2-worker job of the digits script (`flag`: --warm_start or not)."""
    job_dir = os.path.join(work, name)
    start = _run([sys.executable, "-m", "keras_elastic", "run", f"--job_dir={job_dir}",
                  "--num_workers=2", "--num_ps=1", flag, "--",
                  sys.executable, os.path.join(DIGITS, "train.py"),
                  f"--epochs={FLAGS.epochs}", f"--data_dir={data_dir}", "--noprepare"],
                 os.path.join(work, f"{name}.log"), env)
    wall = time.time() - start
    with open(os.path.join(job_dir, "ledger.json")) as f:
        ledger = json.load(f)["training"]
    first_lease = min(e["lease"] for e in ledger) / 1e6
    first_done = min(e["time"] for e in ledger)
    warm_ready = None
    shared = False
    with open(os.path.join(work, f"{name}.log")) as f:  # the launcher's output
        for line in f:
            if "warm process" in line and " ready in " in line:
                warm_ready = float(line.split(" ready in ")[1].split()[0])
                shared = "(shared, at " in line
    if shared != bool(env and "KERAS_ELASTIC_WARM_SOCKET" in env):
        # The row would measure another path than its name says.
        raise RuntimeError(f"job {name}: the launcher {'used' if shared else 'did not use'}"
                           f" the shared warm process; see {work}/{name}.log")
    return {"wall": wall, "first_task": first_lease - start,
            "first_trained": first_done - start, "warm_ready": warm_ready}


def run_embedded(work: str, data_dir: str) -> dict:
    """The same script without a launcher (embedded master and server)."""
    start = _run([sys.executable, os.path.join(DIGITS, "train.py"),
                  f"--epochs={FLAGS.epochs}", f"--data_dir={data_dir}", "--noprepare"],
                 os.path.join(work, "embedded.log"))
    return {"wall": time.time() - start}


def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def main(argv):
    del argv
    if FLAGS.smoke:
        if not FLAGS["epochs"].present:
            FLAGS.epochs = 1
        FLAGS.repeats = 1
    work = FLAGS.work_dir or tempfile.mkdtemp(prefix="bench-warm-start-")
    data_dir = os.path.join(work, "digits")
    subprocess.run([sys.executable, os.path.join(DIGITS, "prepare_data.py"),
                    f"--output_dir={data_dir}", "--num_shards=2"], check=True,
                   env=_env(), capture_output=True)
    print(f"digits job, {FLAGS.epochs} epoch(s), 2 workers, 1 parameter server, "
          f"{FLAGS.repeats} run(s) of each (median); work dir {work}", flush=True)
    runs: dict[str, list[dict]] = {"embedded": [], "fresh": [], "warm": [],
                                   "shared": []}
    # A Unix socket's path has at most 107 bytes: not under a deep work dir.
    socket_path = os.path.join(tempfile.mkdtemp(prefix="ke-warm-"), "warm.sock")
    shared = subprocess.Popen(
        [sys.executable, "-m", "keras_elastic.launcher.warm", f"--listen={socket_path}"],
        env=_env(),
        stdout=open(os.path.join(work, "shared-warm.log"), "w"),
        stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not os.path.exists(socket_path) and time.monotonic() < deadline:
            if shared.poll() is not None:
                raise RuntimeError(f"the shared warm process exited with code "
                                   f"{shared.returncode}; see {work}/shared-warm.log")
            time.sleep(0.1)
        for i in range(FLAGS.repeats):  # interleaved: the machine's drift hits all
            runs["embedded"].append(run_embedded(work, data_dir))
            runs["fresh"].append(run_job(work, f"fresh-{i}", data_dir, "--nowarm_start"))
            runs["warm"].append(run_job(work, f"warm-{i}", data_dir, "--warm_start"))
            runs["shared"].append(run_job(work, f"shared-{i}", data_dir, "--warm_start",
                                          {"KERAS_ELASTIC_WARM_SOCKET": socket_path}))
    finally:
        shared.terminate()
        shared.wait(30)
        shutil.rmtree(os.path.dirname(socket_path), ignore_errors=True)
    embedded = _median([r["wall"] for r in runs["embedded"]])
    print(f"{'run':<10} {'wall s':>8} {'x embedded':>10} {'1st task s':>10} "
          f"{'1st trained s':>13} {'warm ready s':>12}")
    print(f"{'embedded':<10} {embedded:8.1f} {1.0:10.2f}")
    for name in ("fresh", "warm", "shared"):
        wall = _median([r["wall"] for r in runs[name]])
        first = _median([r["first_task"] for r in runs[name]])
        trained = _median([r["first_trained"] for r in runs[name]])
        ready = [r["warm_ready"] for r in runs[name] if r["warm_ready"] is not None]
        print(f"{name:<10} {wall:8.1f} {wall / embedded:10.2f} {first:10.1f} "
              f"{trained:13.1f} {(f'{_median(ready):.1f}' if ready else '-'):>12}",
              flush=True)


if __name__ == "__main__":
    app.run(main)

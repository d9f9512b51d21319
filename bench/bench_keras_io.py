"""Small jobs: the keras-io ports as 2-worker jobs against plain Keras, in one run.

A user's small Keras script made elastic with the README's
lines should run as a job about as fast as its work allows. For each port in
tests/keras_io/ (`<name>.py`, plain Keras, and `<name>_elastic.py`, the
README's change), this runs, in a fresh temporary directory each:

- plain: `python <name>.py`: the baseline, the whole script's wall time;
- job:   `keras-elastic run --num_workers 2 --num_ps 1 -- python
         <name>_elastic.py`: the launcher, a master, a parameter server and
         two workers on this machine, the whole job's wall time (start to
         summary), and the launcher's phase table (seconds summed over the
         workers: get_batch, input_wait, compute, pull, push, evaluate).

It prints one row per port: plain s, job s, job/plain, and the phases; then
the median ratio. On one machine the job's processes share its cores: two
workers each run the script's own work (its imports, data, model building)
beside the shared training, so a small script's job takes longer than the
script alone; the phases say where the rest goes.

Run from the repository root:

```
PYTHONPATH=. python bench/bench_keras_io.py                 # every port
PYTHONPATH=. python bench/bench_keras_io.py --names=mnist_convnet,addition_rnn
PYTHONPATH=. python bench/bench_keras_io.py --smoke          # one small port
```
"""

from __future__ import annotations

import glob
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags, logging

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORTS = os.path.join(REPO, "tests", "keras_io")
PHASES = ("get_batch", "input_wait", "compute", "pull", "push", "evaluate")
SMOKE_PORT = "making_new_layers_and_models_via_subclassing"

FLAGS = flags.FLAGS
flags.DEFINE_list("names", None, "The ports to run (default: every one in "
                  "tests/keras_io).")
flags.DEFINE_bool("smoke", False, f"Only {SMOKE_PORT} (seconds).")
flags.DEFINE_integer("timeout", 900, "Seconds a run may take.", lower_bound=1)
flags.DEFINE_bool("warm_start", True, "Start the jobs' roles from a warm process "
                  "(the launcher's default); --nowarm_start: each afresh, as before.")


def ports() -> list[str]:
    """The ports: `<name>.py` with a `<name>_elastic.py` beside it."""
    names = []
    for path in sorted(glob.glob(os.path.join(PORTS, "*_elastic.py"))):
        name = os.path.basename(path)[:-len("_elastic.py")]
        if os.path.exists(os.path.join(PORTS, f"{name}.py")):
            names.append(name)
    return names


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERAS_ELASTIC_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (REPO, env.get("PYTHONPATH"))))
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def run(argv: list[str], cwd: str) -> tuple[float, str]:
    """(wall seconds, output) of `argv`; a failed run raises, naming it."""
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=environment(), capture_output=True,
                          text=True, timeout=FLAGS.timeout)
    seconds = time.perf_counter() - start
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[-1:])} exited with {proc.returncode}: "
                           f"{output[-2000:]}")
    return seconds, output


def phase_table(output: str) -> dict[str, float]:
    """The launcher summary's seconds per phase (summed over workers)."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^\[launcher\]\s+get_batch \|", line) and i + 2 < len(lines):
            names = [n.strip() for n in line.split("]", 1)[1].split("|")]
            values = [float(v) for v in lines[i + 2].split("]", 1)[1].split("|")]
            return dict(zip(names, values))
    return {}


def measure(name: str) -> dict:
    """One port, plain and as a 2-worker job."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        plain_dir, job_dir = os.path.join(tmp, "plain"), os.path.join(tmp, "job")
        os.makedirs(plain_dir)
        os.makedirs(job_dir)
        plain, _ = run([sys.executable, os.path.join(PORTS, f"{name}.py")], plain_dir)
        job, output = run([sys.executable, "-m", "keras_elastic", "run",
                           "--num_workers=2", "--num_ps=1", "--rendezvous_timeout=600",
                           "--warm_start" if FLAGS.warm_start else "--nowarm_start",
                           f"--job_dir={os.path.join(job_dir, 'job')}", "--",
                           sys.executable, os.path.join(PORTS, f"{name}_elastic.py")],
                          job_dir)
    return {"name": name, "plain": plain, "job": job, "phases": phase_table(output)}


def main(argv):
    del argv
    names = [SMOKE_PORT] if FLAGS.smoke else (FLAGS.names or ports())
    unknown = sorted(set(names) - set(ports()))
    if unknown:
        raise app.UsageError(f"--names: no port {unknown} in tests/keras_io "
                             f"(there are: {', '.join(ports())})")
    print(f"{'port':<46} {'plain s':>8} {'job s':>8} {'job/plain':>9}  "
          + " ".join(f"{p:>10}" for p in PHASES), flush=True)
    ratios = []
    for name in names:
        try:
            row = measure(name)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            logging.warning("%s: skipped: %s", name, str(e)[:500])
            continue
        ratio = row["job"] / row["plain"]
        ratios.append(ratio)
        print(f"{name:<46} {row['plain']:8.1f} {row['job']:8.1f} {ratio:9.2f}  "
              + " ".join(f"{row['phases'].get(p, 0.0):10.1f}" for p in PHASES),
              flush=True)
    if ratios:
        print(f"median job/plain over {len(ratios)} port(s): "
              f"{statistics.median(ratios):.2f}", flush=True)


if __name__ == "__main__":
    app.run(main)

"""Runs the keras-io example ports plain, embedded and as a job (issue 23).

Every example is two scripts in this folder: `<name>.py` (plain Keras) and
`<name>_elastic.py`, the README's change applied: `import keras_elastic as ke`
right after `import keras`, and the model construction wrapped,
`model = ke.wrap(make_model())`. Nothing else differs
(`check_readme_diff`). Each script ends by printing one line
`RESULT {json}` with its final metrics; the runners return that dict, with
`best_<m>` added for every validation accuracy `m` its epoch lines show (the
best epoch's value, `best_epoch_values`).

- `run_plain(name, tmp_dir)`: `python <name>.py`, working directory `tmp_dir`;
- `run_embedded(name, tmp_dir)`: `python <name>_elastic.py` (an embedded master
  and parameter server start in the process);
- `run_job(name, tmp_dir, num_workers=2)`: `keras-elastic run --num_workers N
  --num_ps 1 --job_dir tmp_dir/job -- python <name>_elastic.py` (conftest.launch);
  the launcher's workers inherit its working directory, so the launcher runs
  in `tmp_dir` and every file a script writes lands there. Returns each
  worker's RESULT, read from its log (`JOB_DIR/worker-<i>.log`).

An elastic run whose `fit()` did not train on the cluster fails: keras_elastic
runs Keras' own loop in the process, with a warning, when it cannot hand the
data out in tasks (e.g. a `tf.data.Dataset` on an embedded cluster); the
metrics would then match plain Keras without proving anything.

`assert_close(result, plain, tolerances, what)` compares metrics, each with its
`Tol` (absolute + relative bound; non-numbers must be equal).

Used from pytest (tests/ on sys.path, tests/conftest.py importable).
"""

from __future__ import annotations

import contextlib
import difflib
import glob
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

from conftest import launch, subprocess_env

SCRIPTS_DIR = os.path.dirname(os.path.abspath(__file__))
RESULT_PREFIX = "RESULT "
IMPORT_KERAS = "import keras"
IMPORT_KE = "import keras_elastic as ke"
# keras_elastic's warning when fit() gets data it cannot hand out in tasks and
# runs Keras' own loop in the process instead (its wording has changed; any of
# these marks it).
KERAS_LOOP_FALLBACK = re.compile(r"fit\(\) got \S+, not an ElasticDataset"
                                 r"|training locally, without the cluster"
                                 r"|training with Keras' own loop")
TAIL = 4000  # characters of output shown when a run fails


# -- the README's diff ----------------------------------------------------------


def script_paths(name: str) -> tuple[str, str]:
    """(plain, elastic) script paths of example `name`."""
    return (os.path.join(SCRIPTS_DIR, f"{name}.py"),
            os.path.join(SCRIPTS_DIR, f"{name}_elastic.py"))


_ASSIGNMENT = re.compile(r"^(?P<lhs>\s*[\w.]+\s*=\s*)(?P<rhs>\S.*)$")


def wrapped(plain_line: str) -> str | None:
    """`x = make()` -> `x = ke.wrap(make())`; None if not an assignment."""
    m = _ASSIGNMENT.match(plain_line)
    if m is None:
        return None
    return f"{m['lhs']}ke.wrap({m['rhs']})"


def _dataset_lines(plain: list[str], elastic: list[str]) -> bool:
    """README line 3: a `tf.data` pipeline (lines building a dataset) replaced
    by `ke.ElasticDataset(...)` lines."""
    return bool(plain) and bool(elastic) and all(
        "ke.ElasticDataset(" in line for line in elastic) and all(
        "tf.data" in line or re.match(r"^\s*(\w+) = \1\.", line) for line in plain)


def check_readme_diff(plain_path: str, elastic_path: str) -> None:
    """Asserts that `elastic_path` is `plain_path` with the README's change only:
    the line `import keras_elastic as ke` added right after `import keras`, one
    or more assignment lines whose right-hand side is wrapped in `ke.wrap(...)`,
    and (README line 3) `tf.data` pipeline lines replaced by
    `ke.ElasticDataset(...)` lines. Fails with the unified diff otherwise."""
    with open(plain_path) as f:
        plain = f.read().splitlines()
    with open(elastic_path) as f:
        elastic = f.read().splitlines()
    problems: list[str] = []
    imports_added = 0
    wraps = 0
    matcher = difflib.SequenceMatcher(a=plain, b=elastic, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        if op == "insert":
            for j in range(j1, j2):
                line = elastic[j]
                if line != IMPORT_KE:
                    problems.append(f"line {j + 1} added: {line!r}")
                elif j == 0 or elastic[j - 1] != IMPORT_KERAS:
                    problems.append(f"line {j + 1}: {IMPORT_KE!r} must come right "
                                    f"after {IMPORT_KERAS!r}")
                else:
                    imports_added += 1
            continue
        if op == "replace" and _dataset_lines(plain[i1:i2], elastic[j1:j2]):
            continue
        if op == "replace" and i2 - i1 == j2 - j1:
            for i, j in zip(range(i1, i2), range(j1, j2)):
                expected = wrapped(plain[i])
                if elastic[j] == expected and elastic[j].count("ke.wrap(") == 1:
                    wraps += 1
                else:
                    allowed = (f" (a changed line may only wrap its right-hand side: "
                               f"{expected!r})" if expected else "")
                    problems.append(f"line {i + 1} changed: {plain[i]!r} -> "
                                    f"{elastic[j]!r}{allowed}")
            continue
        problems.append(f"{op} of plain lines {i1 + 1}-{i2} / elastic lines "
                        f"{j1 + 1}-{j2}: only the import line and ke.wrap(...) "
                        "around a right-hand side may differ")
    if imports_added != 1:
        problems.append(f"{IMPORT_KE!r} added {imports_added} times (once expected)")
    if wraps == 0:
        problems.append("no model construction wrapped in ke.wrap(...)")
    if problems:
        diff = "\n".join(difflib.unified_diff(
            plain, elastic, fromfile=plain_path, tofile=elastic_path, lineterm=""))
        raise AssertionError("the elastic script is not the plain one with the "
                             "README's change only:\n  " + "\n  ".join(problems)
                             + "\n\n" + diff)


# -- running the scripts ------------------------------------------------------


def parse_result(output: str, where: str) -> dict:
    """The dict of the one `RESULT {json}` line in `output`."""
    lines = [line[len(RESULT_PREFIX):] for line in output.splitlines()
             if line.startswith(RESULT_PREFIX)]
    if len(lines) != 1:
        raise AssertionError(f"{where}: {len(lines)} RESULT lines, one expected; "
                             f"output ends with:\n{output[-TAIL:]}")
    return json.loads(lines[0])


_EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b.*")


# A Keras epoch summary (`fit(verbose=2)`, or the end of an epoch's progress
# bar): "10/10 - 1s - 95ms/step - loss: 0.4370 - val_accuracy: 0.9111".
_EPOCH_VALUE = re.compile(r" - (\w+): (-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)\b")


def epoch_lines(output: str) -> list[str]:
    """The epoch summaries in `output` (lines with a validation loss)."""
    return [line.strip() for line in output.splitlines() if " - val_loss: " in line]


def best_epoch_values(output: str) -> dict[str, float]:
    """{"best_<m>": the highest value over the epochs} of every validation
    accuracy `m` the epoch summaries in `output` show (`val_accuracy`,
    `val_sparse_categorical_accuracy`, ...): what `ModelCheckpoint(
    save_best_only=True)` or `EarlyStopping(restore_best_weights=True)` keeps.

    >>> best_epoch_values("1/1 - 0s - val_loss: 0.5 - val_accuracy: 0.8\n"
    ...                   "1/1 - 0s - val_loss: 0.6 - val_accuracy: 0.9")
    {'best_val_accuracy': 0.9}
    """
    best: dict[str, float] = {}
    for line in epoch_lines(output):
        for name, value in _EPOCH_VALUE.findall(line):
            if name.startswith("val_") and name.endswith("accuracy"):
                key = "best_" + name
                best[key] = max(best.get(key, -math.inf), float(value))
    return best


def _with_best_epochs(result: dict, output: str) -> dict:
    """`result` with `best_epoch_values(output)` added (its own keys kept)."""
    return {**best_epoch_values(output), **result}


def error_line(output: str) -> str:
    """The last exception line of a traceback in `output` (else its last line)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line):
            return line
    return lines[-1] if lines else "(no output)"


# Runs a script as `python script` would, its global generators seeded first:
# `keras.utils.set_random_seed(seed)`, what a launched worker does on
# `import keras_elastic` with the job's `--seed` (common/seeding.py).
_SEEDED_RUNNER = ("import runpy, sys, keras; "
                  "keras.utils.set_random_seed(int(sys.argv[2])); "
                  "sys.argv = sys.argv[1:2]; "
                  "runpy.run_path(sys.argv[0], run_name='__main__')")


def _run_script(script: str, cwd: str, timeout: float, seed: int | None = None
                ) -> tuple[dict, str]:
    os.makedirs(cwd, exist_ok=True)
    started = time.time()
    command = ([sys.executable, script] if seed is None
               else [sys.executable, "-c", _SEEDED_RUNNER, script, str(seed)])
    proc = subprocess.run(command, cwd=cwd, env=subprocess_env(),
                          capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    where = f"{os.path.basename(script)} (in {cwd})"
    if proc.returncode != 0:
        raise AssertionError(f"{where} exited with {proc.returncode}: "
                             f"{error_line(output)}\noutput ends with:\n{output[-TAIL:]}")
    result = _with_best_epochs(parse_result(proc.stdout, where), proc.stdout)
    print(f"{where}: {time.time() - started:.1f} s, RESULT {json.dumps(result)}")
    return result, output


def _check_trained_on_cluster(output: str, where: str) -> None:
    for line in output.splitlines():
        if KERAS_LOOP_FALLBACK.search(line):
            raise AssertionError(f"{where}: fit() did not train on the cluster (Keras' "
                                 f"own loop in the process): {line.strip()}")


def run_plain(name: str, tmp_dir, timeout: float = 600, seed: int | None = None
              ) -> dict:
    """Runs the plain Keras script in `tmp_dir`; its RESULT dict. `seed`: the
    global generators are seeded with it before the script runs (for a script
    that seeds nothing itself: two runs then draw the same data and weights)."""
    result, _ = _run_script(script_paths(name)[0], str(tmp_dir), timeout, seed)
    return result


def run_embedded(name: str, tmp_dir, timeout: float = 600, seed: int | None = None
                 ) -> dict:
    """Runs the elastic script as a plain process (embedded master and parameter
    server) in `tmp_dir`; its RESULT dict. `seed`: as `run_plain`'s."""
    script = script_paths(name)[1]
    result, output = _run_script(script, str(tmp_dir), timeout, seed)
    _check_trained_on_cluster(output, os.path.basename(script))
    return result


def run_job(name: str, tmp_dir, num_workers: int = 2, timeout: float = 900,
            seed: int | None = None) -> dict[str, dict]:
    """Runs the elastic script as a job of `num_workers` workers and one
    parameter server (job dir `tmp_dir/job`, workers' working directory
    `tmp_dir`). Returns {"worker-<i>": RESULT} for every worker log that
    has one (a job without failures: one per worker). `seed`: the job's
    `--seed` (its workers' global generators start from it, as `run_plain`'s
    `seed` does for the plain script); None: the launcher draws one."""
    tmp_dir = str(tmp_dir)
    job_dir = os.path.join(tmp_dir, "job")
    script = script_paths(name)[1]
    os.makedirs(tmp_dir, exist_ok=True)
    started = time.time()
    # The launcher starts workers in its own working directory. Every worker
    # trains from the first task (the start rendezvous, given a long timeout
    # here: under a loaded CI machine a worker's TensorFlow import can take a
    # minute), so each worker's History has every epoch, as in plain Keras.
    with contextlib.chdir(tmp_dir):
        seed_flag = () if seed is None else (f"--seed={seed}",)
        proc = launch(job_dir, script, f"--num_workers={num_workers}", "--num_ps=1",
                      "--rendezvous_timeout=600", *seed_flag, timeout=timeout)
    logs = sorted(glob.glob(os.path.join(job_dir, "worker-*.log")))
    texts = {}
    for path in logs:
        with open(path, errors="replace") as f:
            texts[os.path.basename(path)[:-len(".log")]] = f.read()
    if proc.returncode != 0:
        tails = "".join(f"\n--- {w}.log ends with:\n{t[-TAIL // 2:]}"
                        for w, t in texts.items())
        first = next((error_line(t) for t in texts.values()
                      if _EXCEPTION_LINE.match(error_line(t))),
                     error_line(proc.stdout + proc.stderr))
        raise AssertionError(f"job of {os.path.basename(script)} exited with "
                             f"{proc.returncode}: {first}\nlauncher output ends with:\n"
                             f"{(proc.stdout + proc.stderr)[-TAIL:]}{tails}")
    results = {}
    for worker, text in texts.items():
        _check_trained_on_cluster(text, f"{worker} of the job of {name}")
        if any(line.startswith(RESULT_PREFIX) for line in text.splitlines()):
            results[worker] = _with_best_epochs(parse_result(text, f"{worker}.log"),
                                                text)
    if len(results) < num_workers:
        raise AssertionError(f"{len(results)} of the job's workers printed RESULT, "
                             f"{num_workers} expected; logs: {sorted(texts)}")
    print(f"job of {os.path.basename(script)}: {time.time() - started:.1f} s, "
          f"RESULT per worker {json.dumps(results)}")
    # Each worker's epoch lines (Keras' verbose=2 summaries), shown with a
    # failed comparison: whether the job's last figures are a late dip of an
    # otherwise close run or a run that never got there.
    for worker, text in texts.items():
        epochs = epoch_lines(text)
        if epochs:
            print(f"{worker} epochs:\n  " + "\n  ".join(epochs))
    return results


# -- tolerances -------------------------------------------------------------------


@dataclass(frozen=True)
class Tol:
    """|actual - expected| <= abs + rel * |expected|, and `above_rel` *
    |expected| more where actual is above expected (a figure that a job's
    asynchronous updates can only raise)."""

    abs: float = 0.0
    rel: float = 0.0
    above_rel: float = 0.0

    def bound(self, expected: float, actual: float | None = None) -> float:
        extra = self.above_rel if actual is not None and actual > expected else 0.0
        return self.abs + (self.rel + extra) * abs(expected)


EXACT = Tol()  # equal (numbers or anything else)


def assert_close(actual: dict, expected: dict, tolerances: dict[str, Tol],
                 what: str = "elastic") -> None:
    """Every metric named in `tolerances` of `actual` (an elastic run) is
    within its tolerance of `expected` (the plain Keras run); non-numeric
    values (lists, strings) must be equal. Reports all misses at once."""
    misses = []
    for key, tol in tolerances.items():
        if key not in actual or key not in expected:
            misses.append(f"{key}: missing ({what} has {sorted(actual)}, plain has "
                          f"{sorted(expected)})")
            continue
        a, e = actual[key], expected[key]
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool)
                      for v in (a, e))
        if not numbers:
            if a != e:
                misses.append(f"{key}: {what} {a!r} != plain {e!r}")
            continue
        bound = tol.bound(e, a)
        if not math.isfinite(a) or abs(a - e) > bound:
            misses.append(f"{key}: {what} {a:.6g} vs plain {e:.6g} "
                          f"(|diff| {abs(a - e):.3g} > {bound:.3g})")
    assert not misses, f"{what} differs from plain Keras:\n  " + "\n  ".join(misses)

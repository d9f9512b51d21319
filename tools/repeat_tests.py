"""Runs test files many times in a row under the README's pytest-xdist
settings, to show that the multi-process tests do not depend on a race, and
records the result in docs/stability.md.

A test that drives its faults with fault-injection points passes every time;
one that races a fresh process against a timer fails now and then, and only
repetition shows it. Each run is the README's command on the given files
(`python -m pytest -q -n 2 --dist loadfile FILES`), by default on the
files' tests marked `multiprocess` only (`--marker`); a failed run's output is
kept (its path is printed).

```
python tools/repeat_tests.py --runs=20 tests/test_elastic_job.py tests/test_fencing.py
python tools/repeat_tests.py --remaining   # multi-process files not yet recorded
```
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys
import tempfile
import time

from absl import app, flags, logging

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.join(ROOT, "docs", "stability.md")
TABLE_HEAD = ("| date | commit | files | runs | failed runs | tests a run | wall "
              "| failed tests |")
_FAILED_TEST = re.compile(r"^FAILED (\S+?\.py::\S+)")

FLAGS = flags.FLAGS
flags.DEFINE_integer("runs", 20, "Runs in a row.")
flags.DEFINE_integer("workers", 2, "pytest-xdist workers (-n), as README's command.")
flags.DEFINE_string("marker", "multiprocess", "Repeat only the tests with this marker "
                    "(pytest -m; empty: every test of the files).")
flags.DEFINE_bool("record", True, "Append the result to docs/stability.md.")
flags.DEFINE_bool("remaining", False, "Print the test files with multi-process tests "
                  "(marker `multiprocess`) that docs/stability.md has no clean "
                  "record of --runs runs for, and exit.")


def multiprocess_files() -> list[str]:
    """The test files holding tests marked `multiprocess`."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "multiprocess",
         "-p", "no:cacheprovider", "tests"],
        cwd=ROOT, capture_output=True, text=True, check=False).stdout
    return sorted({line.split("::")[0] for line in out.splitlines() if "::" in line})


def recorded_files(runs: int = 20) -> set[str]:
    """The files whose latest row of at least `runs` runs (rows in order)
    had no failed test in them (a row's failed tests name their files: the
    row's other files passed every run). A file that failed in a row is not
    recorded until a later row passes it."""
    try:
        with open(RECORD) as f:
            lines = f.read().splitlines()
    except OSError:
        return set()
    done: set[str] = set()
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 8 or not cells[3].isdigit() or int(cells[3]) < runs:
            continue
        failed = {test.split("::")[0] for test in cells[7].replace("`", "").split()
                  if "::" in test}
        done.update(f for f in cells[2].replace("`", "").split() if f not in failed)
        done.difference_update(failed)
    return done


def run_once(files: list[str], log: str) -> tuple[bool, int, list[str]]:
    """One run of README's command on `files`: (passed, tests that passed,
    the ids of the tests that failed)."""
    with open(log, "w") as out:
        code = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-n", str(FLAGS.workers), "--dist",
             "loadfile", "-p", "no:cacheprovider",
             *(["-m", FLAGS.marker] if FLAGS.marker else []), *files],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    with open(log) as f:
        lines = f.read().strip().splitlines()
    last = lines[-1:] or [""]
    passed = re.search(r"(\d+) passed", last[0])
    failed = [m.group(1) for m in map(_FAILED_TEST.match, lines) if m]
    if code != 0 and not failed:  # no test to blame (a crash, a collection error)
        failed = [f"{path}::?" for path in files]
    return code == 0, int(passed.group(1)) if passed else 0, failed


def append_record(files: list[str], runs: int, failed: list[str], tests: int,
                  seconds: float, failed_tests: dict[str, list[int]]) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True, check=False).stdout.strip()
    row = (f"| {datetime.date.today()} | {commit or '?'} | "
           f"{' '.join(f'`{f}`' for f in files)} | {runs} | {len(failed)} | {tests} | "
           f"{seconds / 60:.0f} min | "
           + (" ".join(f"`{test}` (run {', '.join(map(str, numbers))})"
                       for test, numbers in failed_tests.items()) or "none")
           + " |")
    with open(RECORD, "a") as f:
        f.write(row + "\n")


def main(argv: list[str]) -> None:
    files = argv[1:]
    if FLAGS.remaining:
        done = recorded_files(FLAGS.runs)
        for path in multiprocess_files():
            if path not in done:
                print(path)
        return
    if not files:
        raise app.UsageError("name the test files to repeat (or --remaining)")
    missing = [f for f in files if not os.path.isfile(os.path.join(ROOT, f))]
    if missing:
        raise app.UsageError(f"no such test file: {', '.join(missing)}")
    logs = tempfile.mkdtemp(prefix="keras-elastic-repeat-")
    started, failed, tests = time.time(), [], set()
    failed_tests: dict[str, list[int]] = {}
    for i in range(1, FLAGS.runs + 1):
        log = os.path.join(logs, f"run-{i:02d}.txt")
        t0 = time.time()
        ok, passed, failures = run_once(files, log)
        tests.add(passed)
        if not ok:
            failed.append(log)
        for test in failures:
            failed_tests.setdefault(test, []).append(i)
        logging.info("run %d/%d: %s, %d passed, %.0f s%s", i, FLAGS.runs,
                     "ok" if ok else "FAILED", passed, time.time() - t0,
                     "" if ok else f" (output: {log})")
    seconds = time.time() - started
    print(f"{FLAGS.runs} runs of {len(files)} file(s) in {seconds / 60:.1f} min: "
          f"{FLAGS.runs - len(failed)} passed, {len(failed)} failed"
          + "".join(f"\n  failed: {log}" for log in failed))
    if FLAGS.record:
        append_record(files, FLAGS.runs, failed, max(tests), seconds, failed_tests)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    app.run(main)

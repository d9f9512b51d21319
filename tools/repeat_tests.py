"""Runs test files many times in a row under the README's pytest-xdist
settings, to show that the multi-process tests do not depend on a race, and
records the result in docs/stability.md.

A test that drives its faults with fault-injection points passes every time;
one that races a fresh process against a timer fails now and then, and only
repetition shows it. Each run is the README's command on the given files
(`python -m pytest -q -n 2 --dist loadfile FILES`), by default on the
files' tests marked `multiprocess` only (`--marker`: every test that starts
processes carries it); a failed run's output is kept (its path is printed).

A row records the commit checked out when the runs began and the content of
each file (its git blob id, `git hash-object FILE`), so a row says what ran
even from a working tree with changes; a file changed during the runs is not
recorded. `--remaining` lists the multi-process files without a clean row, and
those changed since their row (its blob id differs; a row from before blob ids
were kept: the file differs from the row's commit).

```
python tools/repeat_tests.py --runs=20 tests/test_elastic_job.py tests/test_fencing.py
python tools/repeat_tests.py --remaining   # multi-process files not yet recorded
```
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
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
              "| failed tests | content |")
_FAILED_TEST = re.compile(r"^FAILED (\S+?\.py::\S+)")

FLAGS = flags.FLAGS
flags.DEFINE_integer("runs", 20, "Runs in a row.")
flags.DEFINE_integer("workers", 2, "pytest-xdist workers (-n), as README's command.")
flags.DEFINE_string("marker", "multiprocess", "Repeat only the tests with this marker "
                    "(pytest -m; empty: every test of the files).")
flags.DEFINE_bool("record", True, "Append the result to docs/stability.md.")
flags.DEFINE_bool("remaining", False, "Print the test files with multi-process tests "
                  "(marker `multiprocess`) that docs/stability.md has no clean "
                  "record of --runs runs for, or that changed since their row, "
                  "and exit.")


@dataclasses.dataclass(frozen=True)
class Row:
    """A file's latest clean row: when, the commit, and the file's blob id
    then (None in rows from before blob ids were kept)."""

    date: str
    commit: str
    blob: str | None


def blob_id(path: str) -> str:
    """The git blob id of the file at `path` (as `git hash-object`), short.

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile("w", delete=False) as f:
    ...     _ = f.write("hello\\n")
    >>> blob_id(f.name)  # git hash-object: ce013625030ba8dba906f756967f9e9ca394464a
    'ce013625030b'
    """
    with open(path, "rb") as f:
        data = f.read()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()[:12]


def head_commit() -> str:
    """The commit checked out (short), '?' outside a git checkout."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True,
                          check=False).stdout.strip() or "?"


def changed_since(path: str, row: Row) -> bool:
    """Whether the file at `path` (from the repository root) differs from
    what its row ran: its blob id, or, in an older row, the row's commit's
    version of it (an unknown commit counts as changed)."""
    full = os.path.join(ROOT, path)
    if not os.path.isfile(full):
        return True
    if row.blob is not None:
        return blob_id(full) != row.blob
    return subprocess.run(["git", "diff", "--quiet", row.commit, "--", path], cwd=ROOT,
                          capture_output=True, check=False).returncode != 0


def multiprocess_files() -> list[str]:
    """The test files holding tests marked `multiprocess`."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "multiprocess",
         "-p", "no:cacheprovider", "tests"],
        cwd=ROOT, capture_output=True, text=True, check=False).stdout
    return sorted({line.split("::")[0] for line in out.splitlines() if "::" in line})


def recorded_rows(runs: int = 20) -> dict[str, Row]:
    """The files whose latest row of at least `runs` runs (rows in order)
    had no failed test in them (a row's failed tests name their files: the
    row's other files passed every run), each with that row. A file that
    failed in a row is not recorded until a later row passes it."""
    try:
        with open(RECORD) as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    done: dict[str, Row] = {}
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) not in (8, 9) or not cells[3].isdigit() or int(cells[3]) < runs:
            continue
        failed = {test.split("::")[0] for test in cells[7].replace("`", "").split()
                  if "::" in test}
        files = cells[2].replace("`", "").split()
        blobs = cells[8].replace("`", "").split() if len(cells) == 9 else []
        for i, path in enumerate(files):
            if path not in failed:
                done[path] = Row(cells[0], cells[1],
                                 blobs[i] if len(blobs) == len(files) else None)
        for path in failed:
            done.pop(path, None)
    return done


def recorded_files(runs: int = 20) -> set[str]:
    """The files `recorded_rows` has a clean row for."""
    return set(recorded_rows(runs))


def remaining(runs: int = 20) -> list[str]:
    """`--remaining`'s lines: each multi-process file without a clean row,
    and each changed since its row (saying which row)."""
    rows = recorded_rows(runs)
    lines = []
    for path in multiprocess_files():
        row = rows.get(path)
        if row is None:
            lines.append(path)
        elif changed_since(path, row):
            lines.append(f"{path} (changed since its row of {row.date}, "
                         f"commit {row.commit})")
    return lines


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
                  seconds: float, failed_tests: dict[str, list[int]], commit: str,
                  blobs: list[str]) -> None:
    """Appends a row: `commit` and `blobs` (one per file) as they were when
    the runs began."""
    row = (f"| {datetime.date.today()} | {commit} | "
           f"{' '.join(f'`{f}`' for f in files)} | {runs} | {len(failed)} | {tests} | "
           f"{seconds / 60:.0f} min | "
           + (" ".join(f"`{test}` (run {', '.join(map(str, numbers))})"
                       for test, numbers in failed_tests.items()) or "none")
           + f" | {' '.join(f'`{b}`' for b in blobs)} |")
    with open(RECORD, "a") as f:
        f.write(row + "\n")


def main(argv: list[str]) -> None:
    files = argv[1:]
    if FLAGS.remaining:
        for line in remaining(FLAGS.runs):
            print(line)
        return
    if not files:
        raise app.UsageError("name the test files to repeat (or --remaining)")
    missing = [f for f in files if not os.path.isfile(os.path.join(ROOT, f))]
    if missing:
        raise app.UsageError(f"no such test file: {', '.join(missing)}")
    logs = tempfile.mkdtemp(prefix="keras-elastic-repeat-")
    # What runs: the commit and the files' content now, not after the runs.
    commit = head_commit()
    blobs = [blob_id(os.path.join(ROOT, f)) for f in files]
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
    changed = [f for f, b in zip(files, blobs, strict=True)
               if blob_id(os.path.join(ROOT, f)) != b]
    if changed:
        print(f"not recorded: changed during the runs: {' '.join(changed)}")
    elif FLAGS.record:
        append_record(files, FLAGS.runs, failed, max(tests), seconds, failed_tests,
                      commit, blobs)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    app.run(main)

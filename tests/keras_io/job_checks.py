"""Checks on a finished job of a keras-io port, beside the RESULT lines the
harness compares (tests/keras_io/harness.py).

`run_job` returns the RESULT of every worker log that has one: a worker that
crashed and was relaunched by the launcher (`--max_worker_restarts`) leaves a
log without RESULT and its replacement prints one, so the job's RESULT lines
alone would hide the crash.
"""

from __future__ import annotations

import glob
import os


def last_exception(text: str) -> str:
    """The exception line ending the last traceback in `text` (the first
    unindented line after it), else the last line."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback ")]
    if starts:
        for line in lines[starts[-1] + 1:]:
            if line and not line[0].isspace():
                return line.strip()
    return lines[-1].strip() if lines else "(empty log)"


def assert_no_worker_relaunched(tmp_dir, num_workers: int = 2) -> None:
    """Every worker of the job in `tmp_dir/job` ran to the end the first time:
    the job has exactly `num_workers` worker logs. Fails naming each extra
    log's predecessor error (the exception that ended the crashed worker)."""
    logs = sorted(glob.glob(os.path.join(str(tmp_dir), "job", "worker-*.log")),
                  key=lambda p: int(p.rsplit("-", 1)[1][:-len(".log")]))
    if len(logs) == num_workers:
        return
    crashes = []
    for path in logs:
        with open(path, errors="replace") as f:
            text = f.read()
        if not any(line.startswith("RESULT ") for line in text.splitlines()):
            crashes.append(f"{os.path.basename(path)}: {last_exception(text)}")
    raise AssertionError(f"{len(logs)} worker logs for a job of {num_workers} workers "
                         "(the launcher relaunched a worker that exited): "
                         + "; ".join(crashes))

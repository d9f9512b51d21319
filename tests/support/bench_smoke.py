"""What tests/test_bench_smoke_*.py share: run a bench script with `--smoke` in a
process of its own and read the figures of its report.

Only that the bench runs and prints its ratio lines is checked, never a
timing: at smoke sizes the figures mean nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, subprocess_env

BENCH_DIR = os.path.join(REPO, "bench")
# A number as the benches print it ("1,234.5", "-0.25"): one regex group.
NUM = r"(-?\d[\d,]*(?:\.\d+)?)"

skip_without_bench = pytest.mark.skipif(
    not os.path.isdir(BENCH_DIR), reason="bench/ is not in this checkout (Bazel runfiles)")


def run_smoke(name: str, tmp: str, *args: str) -> str:
    """Runs bench/`name`.py --smoke `args` with its temporary files (job and
    data directories, logs) under `tmp`; returns its stdout, after checking
    that it exited 0."""
    result = subprocess.run([sys.executable, os.path.join(BENCH_DIR, f"{name}.py"),
                             "--smoke", *args], cwd=REPO,
                            env=subprocess_env(TMPDIR=tmp), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, (
        f"{name} --smoke exited {result.returncode}\n--- stdout (end):\n"
        f"{result.stdout[-3000:]}\n--- stderr (end):\n{result.stderr[-3000:]}")
    return result.stdout


def figures(pattern: str, stdout: str) -> list[tuple[float, ...]]:
    """The numbers captured by `pattern` (a regex over one line; its groups
    are numbers, commas as thousands separators allowed) on every line that
    matches it, in order."""
    regex = re.compile(pattern)
    found = []
    for line in stdout.splitlines():
        if m := regex.search(line):
            found.append(tuple(float(g.replace(",", "")) for g in m.groups()))
    return found


def one_positive(pattern: str, stdout: str) -> float:
    """The number of the one line matching `pattern` (one group), checked > 0."""
    found = figures(pattern, stdout)
    assert len(found) == 1, f"{len(found)} lines match {pattern!r}:\n{stdout}"
    (value,) = found[0]
    assert value > 0, f"not positive: {found[0]} in {pattern!r}:\n{stdout}"
    return value

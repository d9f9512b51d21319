"""bench/bench_embedded.py runs: --smoke trains every kind of model, plain and
on the embedded cluster, and prints a ratio per kind (no timing is checked).
A kind that fails prints "skipped" with the reason; the tests refuse that."""

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, subprocess_env

BENCH = os.path.join(REPO, "bench", "bench_embedded.py")
KINDS = ("convnet", "mlp", "conv1d_bn", "gan")
# A kind's row of the table: name, epochs x steps, plain s, elastic s, ratio,
# then the steady-state columns.
ROW = re.compile(r"^\s+(\w+)\s+\d+x\d+\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s+[\d.]+\s+[\d.]+"
                 r"\s+([\d.]+)\s")
SKIPPED = re.compile(r"^\s+(\w+)\s+skipped \((plain|elastic)\): (.+)$")

pytestmark = pytest.mark.skipif(not os.path.exists(BENCH),
                                reason="bench/ is not in this checkout (Bazel runfiles)")


def run_bench(*args: str) -> str:
    result = subprocess.run([sys.executable, BENCH, "--smoke", *args], cwd=REPO,
                            env=subprocess_env(), capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def table(stdout: str) -> tuple[dict[str, tuple[float, float]], dict[str, str]]:
    """{kind: (whole-fit ratio, steady ratio)} and {kind: skip reason}."""
    ratios, skipped = {}, {}
    for line in stdout.splitlines():
        if m := ROW.match(line):
            ratios[m.group(1)] = (float(m.group(2)), float(m.group(3)))
        elif m := SKIPPED.match(line):
            skipped[m.group(1)] = m.group(3)
    return ratios, skipped


@pytest.mark.multiprocess
def test_smoke_prints_a_ratio_per_kind():
    out = run_bench()
    ratios, skipped = table(out)
    for kind in KINDS:  # the GAN's own train_step with two optimizers included
        assert kind in ratios, out
        assert all(r > 0 for r in ratios[kind]), out
    assert not skipped, out
    assert "target >= 0.9" in out, out


@pytest.mark.multiprocess
def test_smoke_in_fresh_processes():
    out = run_bench("--isolate", "--kinds=mlp")
    ratios, skipped = table(out)
    assert "each run in a fresh process" in out, out
    assert set(ratios) == {"mlp"} and not skipped, out

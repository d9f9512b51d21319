"""An error a relaunch cannot fix fails the job at once with that error
instead of spending the restart budget (issue 40): arrays, or a compile,
that differ between workers (the master refuses them: `JobMismatchError`),
and the same exception raised by the script at the same place on two
workers."""

from __future__ import annotations

import os

import pytest
from conftest import REPO, launch

SCRIPT = os.path.join(REPO, "tests", "scripts", "failing_script.py")


def job_failed_line(output: str) -> str:
    return next(line for line in output.splitlines() if "job FAILED" in line)


@pytest.mark.multiprocess
def test_workers_whose_arrays_differ_fail_the_job_at_once(tmp_path):
    result = launch(str(tmp_path / "job"), SCRIPT, "--num_workers=2", "--num_ps=1",
                    "--max_worker_restarts=3", script_args=("differ",), timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    failed = job_failed_line(output)
    assert "JobMismatchError" in failed and "differs from the one registered" in (
        failed), failed
    assert "Relaunching the same script cannot fix that" in failed
    assert "restart 0 of 3 used" in failed, failed
    assert "relaunched worker" not in output


@pytest.mark.multiprocess
def test_the_same_script_error_on_two_workers_fails_the_job(tmp_path):
    result = launch(str(tmp_path / "job"), SCRIPT, "--num_workers=2", "--num_ps=1",
                    "--max_worker_restarts=5", script_args=("raise",), timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    failed = job_failed_line(output)
    assert "raised ValueError at" in failed and "failing_script.py" in failed, failed
    # The second death ends it: at most the first one was relaunched.
    assert output.count("relaunched worker") <= 1, output[-3000:]


@pytest.mark.multiprocess
def test_workers_compiling_another_loss_fail_the_job_quoting_both(tmp_path):
    result = launch(str(tmp_path / "job"), SCRIPT, "--num_workers=2", "--num_ps=1",
                    "--max_worker_restarts=3", script_args=("compile",), timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    failed = job_failed_line(output)
    assert "the model is compile(" in failed, failed
    assert "loss='mse'" in failed and "loss='mae'" in failed, failed
    assert "Every worker must compile the model the same way" in failed

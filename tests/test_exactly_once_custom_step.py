"""Exactly-once model updates for a train_step of the model's own (issue 23),
as real process trees: the counting model (`counting_script.py --step=...`)
with a custom step and with a step of two optimizer applies, a worker killed
by fault injection mid-push, between a step's two updates, and pipelined.
After each job every weight equals `epochs x records` exactly (see
tests/test_exactly_once.py; its own file so that the suite's slow job files
spread over the test processes).
"""

import pytest
from support.counting_jobs import check_exact, counting_job, worker_logs, write_data

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(str(tmp_path_factory.mktemp("counting")))


@pytest.mark.parametrize("point, nth, step, exchange", [
    # A train_step of the model's own (issue 23).
    ("mid_push", 5, "custom", "sync"),
    # Two optimizer applies per step: the 5th push is the first update of the
    # 3rd step, so the worker dies between a step's two updates (after_push)
    # or in the middle of its first one (mid_push).
    ("after_push", 5, "two_optimizers", "sync"),
    ("mid_push", 5, "two_optimizers", "sync"),
    ("after_push", 6, "two_optimizers", "pipelined"),
])
def test_custom_train_step_worker_killed_mid_step_applies_every_gradient_once(
        tmp_path, data, point, nth, step, exchange):
    out, result = counting_job(
        tmp_path, data, "--num_ps=2", "--max_worker_restarts=2",
        script_args=("--sleep_per_batch=0.03", f"--step={step}",
                     f"--exchange={exchange}"), faults=f"{point}@{nth}:w1")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert f"SIGKILL at '{point}'" in worker_logs(tmp_path), output[-3000:]
    check_exact(tmp_path, out, output)

"""Exactly-once model updates under kills, as real process trees (issue 8).

The counting model (`counting_script.py`) has weights that count the record
gradients applied: after a job each equals `epochs x records` exactly when
every record's gradient was applied exactly once, whatever died meanwhile.
Workers are killed at precise moments by fault injection
(`KERAS_ELASTIC_FAULTS`, see `keras_elastic/common/faults.py`), parameter
servers with SIGKILL from outside.
"""

import json
import os
import re

import pytest
from conftest import launch
from support.counting_jobs import check_exact, counting_job, worker_logs, write_data

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(str(tmp_path_factory.mktemp("counting")))


@pytest.mark.parametrize("point, nth, num_ps, exchange", [
    ("after_claim", 3, 2, "sync"),   # a task claimed on the servers, nothing pushed
    ("mid_push", 5, 2, "sync"),      # a push reached the first server only
    ("after_push", 5, 2, "sync"),    # pushed everywhere, not reported
    ("epoch_end", 1, 2, "sync"),     # at the epoch barrier, last tasks not reported
    ("validation", 1, 2, "sync"),    # during a validation round
    # One server: the claim and the push are one call each (no partial push).
    ("after_claim", 3, 1, "sync"),
    ("after_push", 5, 1, "sync"),
    # The pipelined exchange: a push cut while the next step computes, and
    # one applied whose tasks were not reported.
    ("mid_push", 5, 2, "pipelined"),
    ("after_push", 5, 2, "pipelined"),
    # A variable split over the servers (issue 26): a push cut between its
    # two slices.
    ("mid_push", 5, 2, "sync/split"),
    # An embedding table with admission (issue 27): each record's row
    # gradient is applied or dropped (not admitted yet) exactly once.
    ("mid_push", 5, 2, "sync/admission"),
    # The same table in the functional graph with the pipelined exchange:
    # each batch's rows looked up while the step before it computes.
    ("mid_push", 5, 2, "pipelined/admission-ahead"),
])
def test_worker_killed_at_any_moment_applies_every_gradient_once(
        tmp_path, data, point, nth, num_ps, exchange):
    extra = ("--validate",) if point == "validation" else ()
    flags = ()
    if exchange.endswith("/split"):
        exchange = exchange.split("/")[0]
        extra += ("--vector=64",)  # 256 bytes, over 2 servers
        flags = ("--ps_partition_bytes=128",)
    admission = "/admission" in exchange
    if admission:
        if exchange.endswith("-ahead"):
            extra += ("--table_in_graph",)
        exchange = exchange.split("/")[0]
        extra += ("--table_rows=300", "--admit_after=3")
    extra += (f"--exchange={exchange}",)
    # Worker 1 dies at its nth time at the point; a validation round's first
    # task may go to either worker, so there the first worker to evaluate one
    # dies (once per job: the fault plan's marker).
    who = "" if point == "validation" else ":w1"
    out, result = counting_job(
        tmp_path, data, f"--num_ps={num_ps}", "--max_worker_restarts=2", *flags,
        script_args=("--sleep_per_batch=0.03", *extra), faults=f"{point}@{nth}{who}")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    # The fault really fired, and the worker was replaced.
    assert f"SIGKILL at '{point}'" in worker_logs(tmp_path), output[-3000:]
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["workers_lost"] == 1 and summary["worker_restarts"] == 1
    result = check_exact(tmp_path, out, output)
    if exchange == "pipelined" and "--table_in_graph" in extra:
        # The surviving worker took most of its steps' rows from lookups ahead.
        logs = worker_logs(tmp_path)
        found = [(int(a), int(n)) for a, n in re.findall(
            r"the rows of (\d+) of (\d+) steps were looked up ahead", logs)]
        assert found and all(n and a >= n // 2 for a, n in found), found
    if admission:
        # Applied + dropped = every record's row gradient, once an epoch.
        stats = [s["table_stats"] for s in result["ps"]]
        dropped = sum(t["dropped"] for s in stats for t in s.values())
        assert dropped > 0 and sum(result["table"]) + dropped == 2 * 1024, (
            sum(result["table"]), dropped)
    if flags:  # the vector really was split: a slice on each server
        assert len(result["counts"]) == 8 + 64
        for server in result["ps"]:
            assert any("__slice_" in v for v in server["variables"]), server


def test_grads_to_wait_two_and_a_filtering_dataset_fn_with_a_push_cut_in_the_middle(
        tmp_path, data):
    # Updates average 2 pushes, and dataset_fn drops odd records (a task's
    # elements are not its records): every weight counts a quarter per record.
    out, result = counting_job(
        tmp_path, data, "--num_ps=2", "--grads_to_wait=2",
        script_args=("--sleep_per_batch=0.03", "--filter_odd"), faults="mid_push@4:w1")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "SIGKILL at 'mid_push'" in worker_logs(tmp_path)
    check_exact(tmp_path, out, output, per_record=0.25)


CRASH = """
import os, sys
worker = os.environ["KERAS_ELASTIC_WORKER_ID"]
sys.exit(f"crash.py: cannot open /no/such/data (worker {worker})")
"""


def test_restart_budget_is_a_hard_bound(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    result = launch(str(tmp_path / "job"), str(script), "--num_workers=2",
                    "--max_worker_restarts=3", timeout=180)
    assert result.returncode == 1
    logs = [n for n in os.listdir(tmp_path / "job") if n.startswith("worker-")]
    assert len(logs) == 2 + 3, logs  # 2 workers, exactly 3 relaunches
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["worker_restarts"] == 3
    assert "has used all 3 worker restarts" in result.stderr
    assert "crash.py: cannot open /no/such/data" in result.stderr


def test_workers_failing_the_same_way_fail_the_job_promptly(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("raise SystemExit('crash.py: model_def has no attribute "
                      "custom_model')\n")
    result = launch(str(tmp_path / "job"), str(script), "--num_workers=2",
                    "--max_worker_restarts=50", timeout=180)
    assert result.returncode == 1
    assert "the last 3 workers all failed the same way" in result.stderr
    assert "model_def has no attribute custom_model" in result.stderr
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    # Promptly: after 3 identical deaths, not after the budget of 50.
    assert summary["worker_restarts"] <= 2, summary

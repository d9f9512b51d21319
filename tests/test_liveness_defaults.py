"""The slow twins of test_liveness.py: the same frozen master and frozen
parameter server, with the default flags (`--liveness_timeout=60`, every
deadline as a user gets it) and the freeze done from outside (SIGSTOP by the
test, as an operator's or a kernel's stop is), at the moment a fault point
holds (`hold`), not at a guess from polling.

The promise (README, "Guarantees"): a frozen service is replaced within
`--liveness_timeout` plus a few seconds, and no worker is lost or relaunched
for its fault: the launcher's supervision never waits on the frozen service
(its calls to the master run off its loop: launcher/status_feed.py), and a
worker's calls outlast the liveness timeout (`cluster_env.call_deadline`).
"""

import json
import os
import signal
import time

import pytest
from support.counting_jobs import check_exact, counting_job, write_data
from test_liveness import assert_gone, lost_workers

from keras_elastic.common import faults

pytestmark = pytest.mark.multiprocess

LIVENESS_TIMEOUT = 60  # the default (launcher/config.py)
REPLACED_WITHIN = 90   # the bound: the timeout plus the restart


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(str(tmp_path_factory.mktemp("counting")))


def freeze_at(tmp_path, entry: str) -> tuple[int, float]:
    """Waits for the `hold` fault `entry`, stops its process from outside
    (SIGSTOP), then lets the held thread go (it runs only if the process is
    ever woken). Returns (pid, when it froze)."""
    directory = str(tmp_path / "faults")
    pid = faults.wait_held(directory, entry, timeout=300)
    os.kill(pid, signal.SIGSTOP)
    frozen_at = time.time()
    faults.release(directory, entry)
    return pid, frozen_at


def frozen_job(tmp_path, data, entry: str):
    """The counting job (1 server, default flags) with the process that
    reaches the `hold` fault `entry` stopped from outside there; returns
    (out, output, summary, the stopped pid, when it froze) once it ended."""
    out, proc = counting_job(tmp_path, data, "--num_ps=1", faults=entry,
                             background=True)
    pid, frozen_at = freeze_at(tmp_path, entry)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-4000:]
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    return out, output, summary, pid, frozen_at


@pytest.mark.parametrize("entry,service,restarts,recoveries", [
    ("master_task@20:master=hold", "master", "master_restarts", "master_recoveries"),
    ("ps_push@40:ps0=hold", "server", "ps_restarts", "ps_recoveries")])
def test_a_service_frozen_with_default_flags_is_replaced_within_the_timeout(
        tmp_path, data, entry, service, restarts, recoveries):
    out, output, summary, pid, frozen_at = frozen_job(tmp_path, data, entry)
    assert summary[restarts] == 1, summary
    recovery = summary[recoveries][0]
    # What was observed: a stopped process answers no health check (the
    # workers' calls to it hang too); never "answers health checks".
    assert recovery["reason"].startswith("answered no health check for "), recovery
    replaced_after = recovery["at"] - frozen_at
    print(f"the {service} was replaced {replaced_after:.1f} s after it froze "
          f"(--liveness_timeout={LIVENESS_TIMEOUT})")
    # (the workers' calls in flight began at most a moment before the freeze)
    assert LIVENESS_TIMEOUT - 2 <= replaced_after <= REPLACED_WITHIN, (
        replaced_after, recovery)
    # No worker died of a call to the frozen service, none was declared lost.
    assert summary["workers_lost"] == 0 and summary["worker_restarts"] == 0, (
        f"{lost_workers(tmp_path / 'job')}\n{summary}")  # the why first
    check_exact(tmp_path, out, output)
    assert_gone(pid)


def test_a_worker_frozen_with_default_flags_is_lost_killed_and_replaced(
        tmp_path, data):
    """The twin of test_liveness's hung training thread, for a whole worker
    stopped from outside: its heartbeats stop, the master declares it lost
    after `--heartbeat_timeout` (30 s), the launcher kills the stopped
    process and relaunches a worker; its task goes to another; exact."""
    entry = "after_push@6=hold"
    out, output, summary, pid, frozen_at = frozen_job(tmp_path, data, entry)
    assert summary["workers_lost"] == 1 and summary["worker_restarts"] == 1, summary
    assert summary["ps_restarts"] == 0 and summary["master_restarts"] == 0, summary
    assert "was declared lost by the master" in output, output[-3000:]
    check_exact(tmp_path, out, output)
    assert_gone(pid)

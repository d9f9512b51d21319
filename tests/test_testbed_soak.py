"""The chaos soak on machines (tools/chaos_soak.py --testbed; issue 42, item
5), CI's version: three machines (network namespaces: support/testbed.py),
the launcher and the services on machine 0,
workers joined from machines 1 and 2, and three partitions, one of each role
class: a worker's machine cut off for the rest of the job, a parameter
server's port and the master's port cut from every joined worker's machine
for a while (the launcher and the worker beside the services still reach
them). The job ends exact (counting model and ledger), every worker cut off
for good is among the job's lost and leaves when the job ends (status 3),
and no process of the job outlives it on any machine by more than 10 s
(checked by the soak). Kills and freezes of each class: the loopback smoke
(test_exactly_once_ps.py); a worker's machine cut for a while and cut from
one server: test_testbed_partitions.py.
"""

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, subprocess_env
from support import testbed

pytestmark = pytest.mark.multiprocess

PARTITIONS = {"worker": "cut_for_good", "ps": "cut_from_workers",
              "master": "cut_from_workers"}


def test_partitions_of_every_role_class_stay_exact(tmp_path):
    reason = testbed.unavailable()
    if reason:
        pytest.skip(f"no testbed: {reason}")
    soak = tmp_path / "soak"
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "tools", "chaos_soak.py"), "--testbed",
         "--faults=3", "--minutes=12", "--epochs=20", "--seed=2",
         "--kinds=cut_for_good,cut_from_workers",
         f"--job_dir={soak}"],
        env=subprocess_env(), capture_output=True, text=True, timeout=1200)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "result: EXACT (counting model and ledger of every job)" in result.stdout
    assert "3 machines: 1 worker with the services, 2 joined" in result.stdout
    faults = json.loads((soak / "faults.json").read_text())["faults"]
    assert len(faults) == 3 and all(f["seconds_lost"] is not None for f in faults)
    # One partition of each class, the kind its class allows.
    by_class = {re.split(r"[-@]", f["role"])[0]: f for f in faults}
    assert {c: f["kind"] for c, f in by_class.items()} == PARTITIONS, faults
    # The job's own record (read here, not the soak's): the worker whose
    # machine was cut off for good is among its lost, and that worker, which
    # never heard from the master again, left with status 3 when the job
    # ended without it (the soak checked that nothing outlived the job).
    cut = by_class["worker"]
    summary = json.loads((soak / f"job-{cut['job']}" / "summary.json").read_text())
    assert summary["workers"]["lost"] >= 1, summary["workers"]
    machine = cut["role"].partition("@m")[2]
    assert re.search(rf"job {cut['job']}: the worker joined from machine {machine} "
                     r"exited with 3 \(cut off for the job's rest\)", output), (
        output[-6000:])
    log = (soak / f"job-{cut['job']}-joined-m{machine}.log").read_text()
    assert "ended without this worker" in log, log[-3000:]

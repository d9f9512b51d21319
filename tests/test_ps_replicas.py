"""Parameter servers with backups (`--ps_replicas=2`, issue 43): a lost
server is replaced by its backup, which applied every call the server
answered, so the master does not roll back and nothing is trained again;
the counting model stays exact (see test_exactly_once.py).

Each fault is a fault point in the server itself (SIGKILL at its N-th push,
or at its N-th call forwarded to the backup: applied on the primary, not yet
on the backup), never a guess from the job's status.
"""

import json
import os
import signal

import pytest
from conftest import read_ledger, wait_for
from support.counting_jobs import check_exact, counting_job, through_holds, write_data

pytestmark = pytest.mark.multiprocess

HOLD = "ps_push@60:ps0=hold"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(str(tmp_path_factory.mktemp("counting")))


def run_holding(tmp_path, data, faults, hold, server, then=lambda job_dir: None):
    """The job in the background under `faults`; once the fault `hold` holds
    a push and server `server`'s new backup is in (built off the launcher's
    loop, while the job trains on: without the hold it could end first),
    `then(job_dir)`, and the push goes on. Returns (out, output, summary)."""
    out, proc = counting_job(
        tmp_path, data, "--num_ps=2", "--ps_replicas=2", "--ps_checkpoint_secs=1000",
        script_args=("--sleep_per_batch=0.05",), background=True, faults=faults)

    def then_after_the_backup(job_dir):
        wait_for(lambda: f"parameter server {server} has a new backup at" in (
            job_dir / "launcher.log").read_text(), timeout=120,
            what=f"server {server}'s new backup")
        then(job_dir)

    output = through_holds(tmp_path, proc, [(hold, then_after_the_backup)])
    return out, output, json.loads((tmp_path / "job" / "summary.json").read_text())


def run(tmp_path, data, faults, *flags):
    out, result = counting_job(
        tmp_path, data, "--num_ps=2", "--ps_replicas=2", *flags,
        script_args=("--sleep_per_batch=0.05",), faults=faults)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    return out, output, summary


@pytest.mark.parametrize("faults, victim, flags", [
    # A push arrived at server 1 (second epoch), before it was applied.
    ("ps_push@90:ps1", 1, ()),
    # Server 0 applied a call (a push, a claim, a lookup) and died before its
    # backup had it: the caller, never answered, sends it again to the backup.
    ("ps_forward@60:ps0", 0, ()),
    # Server 1 frozen (SIGSTOP) as a push arrived: found silent, killed, and
    # its backup takes its place.
    ("ps_push@90:ps1=freeze", 1, ("--liveness_timeout=8",)),
])
def test_a_lost_server_is_replaced_by_its_backup_and_nothing_is_trained_again(
        tmp_path, data, faults, victim, flags):
    # No automatic checkpoint in the job: a recovery from one would train
    # everything again from the initial model.
    out, output, summary = run(tmp_path, data, faults, "--ps_checkpoint_secs=1000",
                               *flags)
    point, action = faults.split("@")[0], faults.partition("=")[2] or "SIGKILL"
    assert f"fault injection: {action} at '{point}'" in (
        tmp_path / "job" / f"ps-{victim}.log").read_text()
    assert summary["ps_restarts"] == 1, summary
    [recovery] = summary["ps_recoveries"]
    assert recovery["failover"] and recovery["ps"] == victim, recovery
    assert recovery["completions_undone"] == {}, recovery
    # Nothing trained again: the master never rolled back, no completion undone.
    assert summary["datasets"]["training"]["rollbacks"] == 0, summary["datasets"]
    ledger = read_ledger(str(tmp_path / "job"))["training"]
    assert not [e for e in ledger if e.get("rolled_back")]
    result = check_exact(tmp_path, out, output)
    # The promoted backup serves from now on, nothing restored anywhere.
    assert all(p["restored_from"] is None for p in result["ps"]), result["ps"]
    cluster = json.loads((tmp_path / "job" / "cluster.json").read_text())
    assert cluster["ps"][victim] == recovery["promoted"], (cluster, recovery)
    assert "its backup took its place" in output, output[-3000:]
    # The promoted server gets a new backup of its own (built while the job
    # trains on: it may end first).
    for rebuilt in summary["ps_backups_rebuilt"]:
        assert rebuilt["ps"] == victim
        assert cluster["ps_backups"][victim] == rebuilt["backup"]


def test_a_server_lost_twice_is_replaced_by_its_backup_twice(tmp_path, data):
    # Server 1 dies at its 30th push; its backup takes its place and gets a
    # new backup (a copy of its state, built while the job trains on). The
    # promoted server's 40th push is held until that backup is in: then the
    # promoted server dies after applying its 5th call forwarded to the new
    # backup (reached only once it has one), before forwarding it; the new
    # backup, built from the copy and the calls since, takes its place.
    # Nothing trained again either time.
    hold = "ps_push@40:ps1b=hold"
    out, output, summary = run_holding(
        tmp_path, data, f"ps_push@30:ps1,{hold},ps_forward@5:ps1b", hold, server=1)
    first, second = summary["ps_recoveries"]
    assert first["failover"] and second["failover"], summary["ps_recoveries"]
    assert first["ps"] == second["ps"] == 1
    # (The second new backup is built while the job trains on: it may end
    # first.)
    rebuilt = summary["ps_backups_rebuilt"]
    assert 1 <= len(rebuilt) <= 2 and second["promoted"] == rebuilt[0]["backup"], (
        rebuilt, second)
    assert summary["datasets"]["training"]["rollbacks"] == 0
    check_exact(tmp_path, out, output)


def test_a_lost_backup_is_replaced_and_its_server_stays_replicated(tmp_path, data):
    # Server 0's backup dies at its 30th push: server 0 goes on alone (it
    # wrote ps-0.unreplicated) until the launcher gives it a new backup (a
    # copy of its state; the marker goes). Server 0's 60th push is held; once
    # the new backup is in cluster.json, the test kills server 0 (the held
    # push neither applied nor answered): the new backup takes its place.
    def kill_server_0(job_dir):
        assert not (job_dir / "ps-0.unreplicated").exists()
        os.kill(json.loads((job_dir / "cluster.json").read_text())["ps_pids"][0],
                signal.SIGKILL)

    out, output, summary = run_holding(tmp_path, data, f"ps_push@30:ps0b,{HOLD}", HOLD,
                                       server=0, then=kill_server_0)
    [lost] = summary["ps_backups_lost"]
    assert lost["ps"] == 0, lost
    [recovery] = summary["ps_recoveries"]
    assert recovery["ps"] == 0 and recovery["failover"], recovery
    assert summary["datasets"]["training"]["rollbacks"] == 0
    check_exact(tmp_path, out, output)


def test_a_backup_that_fell_behind_is_never_promoted(tmp_path, data):
    # Server 0's backup hangs in its 20th push (the thread holds; the process
    # answers its health checks): server 0 waits --backup_timeout for it,
    # detaches it and writes ps-0.unreplicated before answering the push.
    # When server 0 dies later (its 100th push), its backup is alive but
    # lacks every call since: it is killed, and server 0 comes back from the
    # automatic checkpoint.
    out, output, summary = run(
        tmp_path, data, "ps_push@20:ps0b=hold,ps_push@100:ps0",
        "--ps_checkpoint_versions=8", "--ps_checkpoint_secs=0")
    log = (tmp_path / "job" / "ps-0.log").read_text()
    assert "detached: it did not answer PushSmall" in log, log[-3000:]
    assert summary["ps_backups_lost"] == [], summary["ps_backups_lost"]
    [recovery] = summary["ps_recoveries"]
    assert recovery["ps"] == 0 and not recovery.get("failover"), recovery
    assert "ckpt-" in recovery["checkpoint"], recovery
    launcher_log = (tmp_path / "job" / "launcher.log").read_text() + output
    assert "the backup of parameter server 0 lacks calls the server answered" in (
        launcher_log), launcher_log[-3000:]
    check_exact(tmp_path, out, output)

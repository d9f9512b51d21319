"""Exactly-once model updates with parameter servers killed (SIGKILL at a
fault point) and in seeded chaos with every role class (tools/chaos_soak.py
--smoke: kills, short freezes, freezes for good of a worker, a parameter
server and the master), as real process trees (issues 8, 25, 42).

Split from test_exactly_once.py (same counting model, see there) so that
pytest-xdist's `--dist loadfile` can run the two halves on two cores.
"""

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, launch, subprocess_env
from support.counting_jobs import (
    check_exact,
    counting_job,
    write_data,
)

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(str(tmp_path_factory.mktemp("counting")))


@pytest.mark.parametrize("num_ps, victim, push, checkpoint", [
    # 1 PS killed in the first epoch (at its 10th push of 128), before any
    # automatic checkpoint: the job restarts from the initial model.
    (1, 0, 10, False),
    # One of 2 PS killed in the second epoch (its 90th push), after automatic
    # checkpoints (one every 8 model versions).
    (2, 1, 90, True),
    # The same with a variable split over both servers (issue 26): the
    # restarted server restores its slice from the automatic checkpoint.
    (2, 0, 90, "split"),
    # With an embedding table under admission and a row bound (issue 27): the
    # counting weights stay exact through the server's recovery, the table
    # within its bound.
    (2, 1, 90, "table"),
    # One of 3 servers (issue 43): only it goes back to the checkpoint; the
    # other two keep their state, and the tasks trained again since the
    # checkpoint reach only it (the others' task logs have them).
    (3, 1, 90, "three"),
])
def test_parameter_server_killed_mid_epoch_job_finishes_exact(
        tmp_path, data, num_ps, victim, push, checkpoint):
    # The moment comes from a fault-injection point in the server itself
    # (SIGKILL at its N-th push), not from watching the job's status.
    every = ("--ps_checkpoint_versions=8", "--ps_checkpoint_secs=0") if checkpoint \
        else ("--ps_checkpoint_secs=1000",)
    split = checkpoint == "split"
    if split:
        every += ("--ps_partition_bytes=128",)
    table = ("--table_rows=300", "--admit_after=2", "--max_rows=120") \
        if checkpoint == "table" else ()
    if table:
        # After the first (full) save every automatic checkpoint holds only the
        # rows changed since the one before, so the recovery point ends a chain
        # whatever the kill's timing (with a full save every N, the newest one
        # was a full save in one CI run). test_table_checkpoints covers the cycle.
        every += ("--ps_checkpoint_full_every=1000",)
    out, result = counting_job(
        tmp_path, data, f"--num_ps={num_ps}", *every,
        script_args=("--sleep_per_batch=0.05", *(("--vector=64",) if split else ()),
                     *table),
        faults=f"ps_push@{push}:ps{victim}")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "fault injection: SIGKILL at 'ps_push'" in (
        tmp_path / "job" / f"ps-{victim}.log").read_text()
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["ps_restarts"] == 1, summary
    recovery = summary["ps_recoveries"][0]
    assert recovery["ps"] == victim
    if checkpoint:
        assert "ckpt-" in recovery["checkpoint"], recovery
    else:
        assert recovery["checkpoint"] is None or "init" in recovery["checkpoint"]
    result = check_exact(tmp_path, out, output)
    assert all(p["incarnation"] for p in result["ps"])
    # Only the lost server was restored; the others kept their state.
    restored = {p["ps_index"]: p["restored_from"] for p in result["ps"]}
    assert recovery["servers_kept"] == [j for j in range(num_ps) if j != victim]
    assert all(restored[j] is None for j in recovery["servers_kept"]), restored
    if checkpoint:
        assert restored[victim] == recovery["checkpoint"], (restored, recovery)
    if split:
        assert all(any("__slice_" in v for v in p["variables"]) for p in result["ps"])
    if table:
        stats = [p["table_stats"]["0/1"] for p in result["ps"]]
        assert all(s["rows"] <= 60 for s in stats), stats  # 120 over 2 servers
        assert sum(s["evicted"] for s in stats) > 0, stats
        assert sum(1 for v in result["table"] if v) <= 120
        # The automatic checkpoints saved the table incrementally, and the
        # server came back from such a chain.
        saved = re.search(re.escape(f"automatic parameter-server checkpoint "
                                    f"{recovery['checkpoint']} (") + r"[^)]*\)", output)
        assert saved and "embedding rows changed since ckpt-" in saved.group(0), (
            recovery, output[-3000:])


def test_parameter_server_that_keeps_dying_fails_the_job_with_its_log(tmp_path, data):
    # Every incarnation of the server dies at its 5th push (the fault plan
    # counts per process here: no faults directory), so the restarted one
    # dies too, and --max_ps_restarts=1 is spent.
    _, result = counting_job(tmp_path, data, "--num_ps=1", "--max_ps_restarts=1",
                             script_args=("--sleep_per_batch=0.05",),
                             env={"KERAS_ELASTIC_FAULTS": "ps_push@5:ps0"})
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-4000:]
    assert ("job FAILED: parameter server 0 exited with code -9 and was already "
            "restarted 1 time(s) (--max_ps_restarts=1)") in output
    assert "serving at" in output  # the tail of its log
    assert output.count("fault injection: SIGKILL at 'ps_push'") >= 2


def test_digits_with_a_parameter_server_killed_reaches_95_percent(tmp_path):
    digits = os.path.join(REPO, "examples", "digits")
    data_dir = tmp_path / "digits"
    subprocess.run([sys.executable, os.path.join(digits, "prepare_data.py"),
                    f"--output_dir={data_dir}", "--num_shards=2"], check=True,
                   env=subprocess_env(), timeout=300, capture_output=True)
    out = tmp_path / "metrics.json"
    # SIGKILL of the server at its 140th push (about 46 an epoch: epoch 4 of
    # 8), from its fault point.
    result = launch(str(tmp_path / "job"), os.path.join(digits, "train.py"),
                    "--num_workers=2", "--num_ps=1", "--ps_checkpoint_secs=3",
                    script_args=("--epochs=8", f"--data_dir={data_dir}", "--noprepare",
                                 f"--output={out}"),
                    env={"KERAS_ELASTIC_FAULTS": "ps_push@140:ps0",
                         "KERAS_ELASTIC_FAULTS_DIR": str(tmp_path / "faults")})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "fault injection: SIGKILL at 'ps_push'" in (
        tmp_path / "job" / "ps-0.log").read_text()
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["ps_restarts"] == 1, summary
    metrics = json.loads(out.read_text())
    assert metrics["val_accuracy"] >= 0.95, metrics


def test_chaos_soak_smoke_hits_every_role_class_and_stays_exact(tmp_path):
    """tools/chaos_soak.py --smoke (issues 25, 42): three faults (kills, short
    freezes or freezes for good), one of each role class its docstring names
    (a worker, a parameter server, the master), then exact. What was
    injected is checked against what the job recorded: every kill or freeze
    for good shows in its summary.json (workers lost, server and master
    restarts)."""
    soak = tmp_path / "soak"
    # Any seed hits the three classes (they come in rounds); seed 28 draws a
    # worker frozen for good, the master killed and a server killed: each
    # leaves its trace in the summary, and no fault waits out a liveness
    # timeout of a service (the smoke's time stays about that of the
    # worker-only plan it replaces).
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "tools", "chaos_soak.py"), "--smoke",
         "--faults=3", "--minutes=12",  # 3 faults however slow the machine
         f"--job_dir={soak}", "--seed=28"],
        env=subprocess_env(), capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert "result: EXACT (counting model and ledger of every job)" in result.stdout
    faults = json.loads((soak / "faults.json").read_text())["faults"]
    assert len(faults) == 3 and all(f["seconds_lost"] is not None for f in faults)
    # The server's recovery, with what it trained again, in the report.
    assert re.search(r"parameter-server recoveries: [1-9]\d* \(0 by a backup taking "
                     r"the server's place, \d+ onto a started spare\); tasks trained "
                     r"again \(pushed to the restored server only\) per recovery: "
                     r"mean .*; elements \(x64\): \[", result.stdout), result.stdout
    classes = sorted(f["role"].split("-")[0] for f in faults)
    assert classes == ["master", "ps", "worker"], faults
    # Each job's own record of what happened to it, read here (not the
    # soak's): at least one worker lost, server or master restart per
    # process of that class killed or frozen for good.
    traces = {"worker": "workers_lost", "ps": "ps_restarts",
              "master": "master_restarts"}
    for job in {f["job"] for f in faults}:
        summary = json.loads((soak / f"job-{job}" / "summary.json").read_text())
        for cls, key in traces.items():
            hard = len({f["pid"] for f in faults if f["job"] == job
                        and f["kind"] != "freeze" and f["role"].split("-")[0] == cls})
            assert summary[key] >= hard, (cls, summary[key], faults)
        # A server killed or frozen for good is the one recovered, and only
        # it: the other kept its state (issue 43).
        for r in summary["ps_recoveries"]:
            assert r["servers_kept"] == [1 - r["ps"]], r
        recovered = {r["ps"] for r in summary["ps_recoveries"]}
        for fault in faults:
            if fault["job"] == job and fault["kind"] != "freeze" and (
                    fault["role"].startswith("ps-")):
                assert int(fault["role"][3:]) in recovered, (fault, summary)


def test_chaos_soak_that_cannot_inject_its_faults_in_time_says_so(tmp_path):
    """--faults=N with a cap too short for any job (0: no job starts; a job
    started before the cap runs to its end, which a test need not wait for):
    not exact, and why."""
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "tools", "chaos_soak.py"), "--faults=3",
         "--minutes=0", f"--job_dir={tmp_path / 'soak'}"],
        env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    assert ("result: NOT EXACT: only 0 of the 3 faults asked for within the cap of "
            "0 minutes") in result.stdout, result.stdout


@pytest.mark.parametrize("flags, message", [
    (["--kinds=kill,shake"], "--kinds: no kind of fault ['shake']; the kinds: "),
    (["--kinds=cut_for_good"], "--kinds: partitions need machines (--testbed)"),
])
def test_chaos_soak_refuses_kinds_it_cannot_inject(tmp_path, flags, message):
    """A kind of fault that does not exist, or a partition without machines:
    refused before any job starts, naming what is wrong."""
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "tools", "chaos_soak.py"), *flags,
         f"--job_dir={tmp_path / 'soak'}"],
        env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    assert message in result.stderr, result.stderr[-3000:]
    assert not (tmp_path / "soak").exists()


@pytest.mark.parametrize("spares", [1, 0])
def test_a_killed_server_is_restored_onto_a_started_spare(tmp_path, data, spares):
    """With a spare up (--ps_spares=1, the default), server 1 of 3, killed
    mid-epoch, comes back on it: its partition restored from the automatic
    checkpoint into the spare process (no process start after the loss),
    the job exact, and a new spare started for the next loss. Without one
    (--ps_spares=0) a process is started as before. The kill waits at the
    server's 90th push (a held fault point) until the spare is ready."""
    import signal

    from conftest import wait_for
    from support.counting_jobs import through_holds

    from keras_elastic.common import faults

    hold = "ps_push@90:ps1=hold"
    out, proc = counting_job(
        tmp_path, data, "--num_ps=3", f"--ps_spares={spares}",
        "--ps_checkpoint_versions=8", "--ps_checkpoint_secs=0",
        script_args=("--sleep_per_batch=0.05",), faults=hold, background=True)
    launcher_log = tmp_path / "job" / "launcher.log"

    def kill_when_the_spare_is_ready(job_dir) -> None:
        if spares:
            wait_for(lambda: launcher_log.exists() and "spare parameter server ps-s0 "
                     "ready" in launcher_log.read_text(), timeout=240,
                     what="the spare started")
        os.kill(faults.wait_held(str(tmp_path / "faults"), hold), signal.SIGKILL)

    output = through_holds(tmp_path, proc, [(hold, kill_when_the_spare_is_ready)])
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    [recovery] = summary["ps_recoveries"]
    assert recovery["ps"] == 1 and "ckpt-" in recovery["checkpoint"], recovery
    assert recovery["spare"] == ("ps-s0" if spares else None), recovery
    assert summary["ps_spares"]["taken"] == (1 if spares else 0), summary["ps_spares"]
    if spares:
        # Its replacement spare started after the recovery (and was ended).
        assert summary["ps_spares"]["started"] == 2, summary["ps_spares"]
        assert "held here" in (tmp_path / "job" / "ps-s0.log").read_text()
    result = check_exact(tmp_path, out, output)
    restored = {p["ps_index"]: p["restored_from"] for p in result["ps"]}
    assert restored == {0: None, 1: recovery["checkpoint"], 2: None}, restored

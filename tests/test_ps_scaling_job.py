"""Parameter servers added, removed and drained while a job trains (issue 43,
item 3): `keras-elastic scale --num_ps` and `--drain_ps` move partitions
between server processes (`launcher/server_scaler.py`, `ps/moves.py`); the
counting model stays exact, nothing rolls back, nothing is trained again.

Each change is asked while a worker's push is held at a fault point (the
other worker trains on), so it happens mid-epoch by the code's clock, not a
guess from the job's status.
"""

import json
import subprocess
import sys

import pytest
from conftest import REPO, subprocess_env, wait_for
from support.counting_jobs import check_exact, counting_job, through_holds, write_data

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(str(tmp_path_factory.mktemp("counting")))


def cluster(job_dir) -> dict:
    return json.loads((job_dir / "cluster.json").read_text())


def scale(job_dir, *flags: str, expect: int = 0) -> str:
    """`keras-elastic scale`, which waits for the launcher's outcome and exits
    0 only when the job reached what was asked; its output."""
    result = subprocess.run(
        [sys.executable, "-m", "keras_elastic", "scale", f"--job_dir={job_dir}",
         "--wait_secs=150", *flags],
        capture_output=True, text=True, env=subprocess_env(), cwd=REPO, timeout=200)
    assert result.returncode == expect, result.stdout + result.stderr
    return result.stdout + result.stderr


def hosts(job_dir) -> list[list[int]]:
    return sorted(h["partitions"] for h in cluster(job_dir)["ps_hosts"])


def run_with_changes(tmp_path, data, changes, servers=(2, 4), script_args=()):
    """The counting job with `servers` (processes, partitions); at each hold
    in `changes` ({fault entry: (scale flags, the hosts' partitions after)}),
    the change is asked and awaited, then the held call goes on. Returns
    (the counting model's result, the output, the summary)."""
    holds = ",".join(changes)
    out, proc = counting_job(
        tmp_path, data, f"--num_ps={servers[0]}", f"--ps_partitions={servers[1]}",
        "--ps_checkpoint_secs=1000",
        script_args=("--sleep_per_batch=0.03", *script_args), background=True,
        faults=holds)
    def change(scale_flags, after):
        def action(job_dir):
            scale(job_dir, *scale_flags)
            wait_for(lambda: hosts(job_dir) == after, timeout=120,
                     what=f"the servers' partitions {after}")
        return action

    output = through_holds(tmp_path, proc, [(hold, change(*what))
                                            for hold, what in changes.items()])
    job_dir = tmp_path / "job"
    result = check_exact(tmp_path, out, output)
    return result, output, json.loads((job_dir / "summary.json").read_text())


def test_servers_scaled_2_to_4_to_1_during_training_stay_exact(tmp_path, data):
    _, output, summary = run_with_changes(tmp_path, data, {
        # (One entry per fault point.) Two more processes, one partition each.
        "after_push@15:w0=hold": (("--num_ps=4",), [[0], [1], [2], [3]]),
        # Later (worker 1 trained on meanwhile): every partition into one.
        "after_claim@12:w1=hold": (("--num_ps=1",), [[0, 1, 2, 3]]),
    })
    scaling = summary["ps_scaling"]
    assert [(r["servers_before"], r["servers_after"]) for r in scaling] == [
        (2, 4), (4, 1)], scaling
    assert [len(r["moves"]) for r in scaling] == [2, 3] and not any(
        r["failed"] for r in scaling), scaling
    assert len(scaling[1]["stopped"]) == 3
    # No recovery, no rollback: nothing was trained again.
    assert summary["ps_recoveries"] == [] and summary["ps_restarts"] == 0
    assert summary["requeued"] == 0, summary["requeued"]
    assert "partition(s) moved" in output


def test_a_drained_server_hands_its_partitions_over_and_stops(tmp_path, data):
    _, output, summary = run_with_changes(tmp_path, data, {
        "after_push@20:w1=hold": (("--drain_ps=ps-1",), [[0, 1, 2, 3]]),
    })
    (record,) = summary["ps_scaling"]
    assert record["request"] == {"drain": "ps-1"} and record["stopped"] == ["ps-1"]
    assert sorted(m["partition"] for m in record["moves"]) == [1, 3]
    assert summary["ps_recoveries"] == [] and summary["requeued"] == 0


def test_a_process_holding_two_partitions_is_recovered_as_one(tmp_path, data):
    # One process holds both partitions; killed as its 60th push arrives
    # (its fault role is its first partition's), it comes back as one
    # process holding both, from the checkpoint: exact.
    out, result = counting_job(
        tmp_path, data, "--num_ps=1", "--ps_partitions=2", "--ps_checkpoint_secs=1",
        script_args=("--sleep_per_batch=0.03",), faults="ps_push@60:ps0")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    check_exact(tmp_path, out, output)
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    (recovery,) = summary["ps_recoveries"]
    assert recovery["partitions"] == [0, 1] and recovery["servers_kept"] == []
    assert hosts(tmp_path / "job") == [[0, 1]]


def test_a_checkpoint_taken_after_scaling_resumes_onto_another_count(tmp_path, data):
    import os
    import signal

    from conftest import launch
    from support.counting_jobs import SCRIPT

    # Worker 0 hangs at its 15th push for good: the job cannot end before
    # the launcher is killed.
    out, proc = counting_job(
        tmp_path, data, "--num_ps=2", "--ps_partitions=4", "--ps_checkpoint_secs=1",
        script_args=("--sleep_per_batch=0.03",), faults="after_push@15:w0=hang",
        background=True)
    job_dir = tmp_path / "job"
    try:
        wait_for(lambda: "fault injection: hang" in (job_dir / "worker-0.log").read_text()
                 if (job_dir / "worker-0.log").exists() else False, timeout=300,
                 what="worker 0 hanging")
        scale(job_dir, "--num_ps=4")
        wait_for(lambda: hosts(job_dir) == [[0], [1], [2], [3]], timeout=120,
                 what="four servers")
        # An automatic checkpoint of the four processes.
        log = job_dir / "launcher.log"
        wait_for(lambda: "automatic parameter-server checkpoint" in log.read_text().split(
            "partition(s) moved")[-1], timeout=120, what="a checkpoint after the moves")
        pids = [p for p in cluster(job_dir)["ps_pids"]]
        os.kill(cluster(job_dir)["launcher_pid"], signal.SIGKILL)
        proc.communicate(timeout=60)
        wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids),
                 timeout=60, what="the servers to be gone")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # Three processes now, the same four partitions.
    args = (f"--data={data}", "--epochs=2", f"--output={out}", "--sleep_per_batch=0.01")
    result = launch(str(job_dir), SCRIPT, "--num_workers=2", "--num_ps=3",
                    "--ps_partitions=4", "--resume", script_args=args, timeout=400)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    summary = json.loads((job_dir / "summary.json").read_text())
    assert summary["resumed_from"]["checkpoint"], summary["resumed_from"]
    # (The --num_ps=4 asked of the first run is not this run's.)
    assert hosts(job_dir) == [[0, 3], [1], [2]]
    check_exact(tmp_path, out, output)


def test_partitions_that_hold_no_variable_move_and_scale_ends_where_asked(
        tmp_path, data):
    """One variable over 4 partitions: three hold none (issue 49: their
    copies were refused, "does not record its variables", and the job stayed
    at 2 servers while `scale` said it had asked). Each `scale` now waits
    for the outcome: 2 -> 3 -> 1 reached (exit 0, the moves printed), 5 is
    refused (exit 1, why)."""
    said = {}

    def change(flags, shares):
        def action(job_dir):
            said[flags] = scale(job_dir, *flags)
            # Reached when scale returns: each process's share of the 4.
            assert sorted(map(len, hosts(job_dir))) == shares, (hosts(job_dir),
                                                                said[flags])
        return action

    out, proc = counting_job(
        tmp_path, data, "--num_ps=2", "--ps_partitions=4", "--ps_checkpoint_secs=1000",
        script_args=("--weights=1", "--sleep_per_batch=0.03"), background=True,
        faults="after_push@15:w0=hold,after_claim@12:w1=hold")
    refused = {}

    def too_many(job_dir):
        refused["output"] = scale(job_dir, "--num_ps=5", expect=1)
        change(("--num_ps=1",), [4])(job_dir)

    output = through_holds(tmp_path, proc, [
        ("after_push@15:w0=hold", change(("--num_ps=3",), [1, 1, 2])),
        ("after_claim@12:w1=hold", too_many)])
    check_exact(tmp_path, out, output)
    assert "parameter servers: 2 -> 3 processes" in said[("--num_ps=3",)]
    assert "parameter servers: 3 -> 1 processes" in said[("--num_ps=1",)]
    assert "refused: --num_ps=5: the job has 4 partitions" in refused["output"]
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert all(not r["failed"] for r in summary["ps_scaling"]), summary["ps_scaling"]


def test_table_rows_move_with_their_partitions_1_to_3_servers_exact(tmp_path, data):
    # An embedding table on the servers (the counting model's: record i adds
    # one on row i % 300); its rows live in 3 partitions, all on one process,
    # then each on its own (the CTR example's tables scaled live). Every row
    # counts each of its records once per epoch, wherever it was applied.
    from support.counting_jobs import RECORDS

    result, _, summary = run_with_changes(
        tmp_path, data, {"after_push@15:w0=hold": (("--num_ps=3",), [[0], [1], [2]])},
        servers=(1, 3), script_args=("--table_rows=300",))
    expected = [2 * len(range(r, RECORDS, 300)) for r in range(300)]
    assert [abs(v) for v in result["table"]] == expected, result["table"]
    # Each server holds the rows of its partition.
    rows = [p["table_stats"]["0/1"]["rows"] for p in result["ps"]]
    assert sum(rows) == 300 and all(r > 0 for r in rows), rows
    assert summary["ps_recoveries"] == [] and summary["requeued"] == 0


def test_scale_requests_that_cannot_be_met_say_what_to_do(tmp_path):
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "cluster.json").write_text(json.dumps({
        "master": "127.0.0.1:1", "ps": ["127.0.0.1:2", "127.0.0.1:2"],
        "ps_hosts": [{"name": "ps-0", "pid": 1, "address": "127.0.0.1:2",
                      "partitions": [0, 1]}]}))

    def run(*flags):
        return subprocess.run([sys.executable, "-m", "keras_elastic", "scale",
                               f"--job_dir={job_dir}", *flags], capture_output=True,
                              text=True, env=subprocess_env(), cwd=REPO, timeout=60)

    refused = run("--drain_ps=ps-7")
    assert refused.returncode != 0
    assert "--drain_ps=ps-7: the job's server processes are ps-0" in refused.stderr
    refused = run("--num_ps=0")
    assert refused.returncode != 0 and "--num_ps must be at least 1" in refused.stderr
    refused = run()
    assert refused.returncode != 0 and "one of --num_workers, --num_ps" in refused.stderr
    assert not (job_dir / "desired_servers").exists()
    # (No launcher runs here: --wait_secs=0 returns once asked.)
    asked = run("--num_ps=2", "--wait_secs=0")
    assert asked.returncode == 0 and "asked the launcher for 2 parameter servers" in (
        asked.stdout)
    assert (job_dir / "desired_servers").read_text() == "2"
    refused = run("--num_ps=2", "--wait_secs=-1")
    assert refused.returncode != 0 and "--wait_secs must be 0 or more" in refused.stderr
    # Waiting on a launcher that is gone ends at once, saying so.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    cluster_file = job_dir / "cluster.json"
    cluster_file.write_text(json.dumps(dict(json.loads(cluster_file.read_text()),
                                            launcher_pid=gone.pid)))
    waited = run("--num_ps=2", "--wait_secs=60")
    assert waited.returncode == 1 and (
        f"the job's launcher (pid {gone.pid}) is not running" in waited.stderr), (
        waited.stdout + waited.stderr)


def test_a_job_refuses_server_bounds_it_cannot_hold(tmp_path):
    from conftest import launch
    from support.counting_jobs import SCRIPT

    for flags, says in (
            (("--num_ps=3", "--ps_partitions=2"),
             "--ps_partitions=2 is fewer than --num_ps=3"),
            (("--num_ps=2", "--ps_partitions=4", "--ps_replicas=2"),
             "servers with backups hold one partition each"),
            (("--num_ps=1", "--max_ps=3", "--ps_partitions=2"),
             "--max_ps=3 is more than --ps_partitions=2"),
            (("--num_ps=1", "--min_ps=2", "--max_ps=3"),
             "--num_ps=1 is outside --min_ps=2 .. --max_ps=3")):
        out = launch(str(tmp_path / "job"), SCRIPT, *flags,
                     script_args=("--data=unused",), timeout=60)
        assert out.returncode != 0 and says in out.stdout + out.stderr, (
            flags, out.stdout + out.stderr)

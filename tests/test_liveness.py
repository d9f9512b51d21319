"""A role that hangs is a role that died (issue 25): liveness of every role.

A parameter server or the master that freezes for good (SIGSTOP of itself at
a fault-injection point, so the moment is exact) answers no health check;
after `--liveness_timeout` the launcher kills it (it does not outlive the
job) and recovers it as if it had died, and the counting model is exact.
"""

import json
import os
import re

import pytest
from support.counting_jobs import check_exact, counting_job, write_data

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(str(tmp_path_factory.mktemp("counting")))


def frozen_pid(log_path, action: str = "freeze") -> int:
    """The pid the fault injection froze (or cut off), from the role's log."""
    text = open(log_path).read()
    found = re.findall(rf"fault injection: {action} at '\w+', pid (\d+)", text)
    assert len(found) == 1, text[-3000:]
    return int(found[0])


def lost_workers(job_dir) -> str:
    """For a failed assertion: the launcher's lines on lost workers and the
    end of each worker log (a worker killed for holding a task too long
    writes its threads' stacks first)."""
    launcher = open(os.path.join(job_dir, "launcher.log")).read().splitlines()
    text = "\n".join(line for line in launcher if "lost" in line or "killing" in line)
    for name in sorted(os.listdir(job_dir)):
        if name.startswith("worker-") and name.endswith(".log"):
            tail = open(os.path.join(job_dir, name)).read()[-6000:]
            text += f"\n--- {name} ---\n{tail}"
    return text


def assert_gone(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.parametrize("num_ps", [1, 2])
def test_a_parameter_server_frozen_for_good_is_killed_and_recovered(
        tmp_path, data, num_ps):
    victim = num_ps - 1
    out, result = counting_job(
        tmp_path, data, f"--num_ps={num_ps}", "--ps_checkpoint_secs=1",
        "--liveness_timeout=8", faults=f"ps_push@40:ps{victim}=freeze")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["ps_restarts"] == 1, summary
    assert summary["workers_lost"] == 0, lost_workers(tmp_path / "job")
    recovery = summary["ps_recoveries"][0]
    assert recovery["ps"] == victim
    assert "answered no health check" in recovery["reason"], recovery
    assert f"ps-{victim} (pid " in output and "killing it" in output
    check_exact(tmp_path, out, output)
    # The frozen process was killed: it does not outlive the job.
    assert_gone(frozen_pid(tmp_path / "job" / f"ps-{victim}.log"))


def test_a_server_the_workers_are_cut_off_from_is_replaced(tmp_path, data):
    """A partition between the workers and the only server (its process
    answers every call but health checks with UNAVAILABLE from its 40th push
    on): the launcher's health checks pass, but every worker reports waiting
    on it; after --liveness_timeout the launcher kills and replaces it, and
    the workers, none of them blamed for the tasks they could not finish,
    go on to the exact result."""
    out, result = counting_job(
        tmp_path, data, "--num_ps=1", "--ps_checkpoint_secs=1",
        "--liveness_timeout=8", faults="ps_push@40:ps0=cut")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["ps_restarts"] == 1, summary
    assert summary["workers_lost"] == 0 and summary["worker_restarts"] == 0, (
        f"{lost_workers(tmp_path / 'job')}\n{summary}")  # the why first
    reason = summary["ps_recoveries"][0]["reason"]
    assert re.search(r"answers health checks, but (every worker \(0, 1\) has waited "
                     r"\d+ s for it|worker\(s\) \d waited \d+ s for it and worker\(s\) "
                     r"\d did not reach it since): the workers are cut off from it",
                     reason), reason
    check_exact(tmp_path, out, output)
    assert_gone(frozen_pid(tmp_path / "job" / "ps-0.log", action="cut"))


def test_a_server_cut_off_at_an_epochs_end_is_replaced_not_a_waiting_worker(
        tmp_path, data):
    """The server cut off from every worker at the first flush of an epoch's
    end: that worker's flush is answered and it waits at the master for the
    epoch's last tasks, calling no server, while the other worker waits on
    the server with them. The idle worker is no evidence that the server is
    reachable (a CI run lost the waiting worker for it): the server is
    replaced, no worker is lost, and the result is exact."""
    out, result = counting_job(
        tmp_path, data, "--num_ps=1", "--ps_checkpoint_secs=1",
        "--liveness_timeout=8", faults="ps_flush@1:ps0=cut")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["workers_lost"] == 0 and summary["worker_restarts"] == 0, (
        f"{lost_workers(tmp_path / 'job')}\n{summary}")  # the why first
    assert summary["ps_restarts"] == 1, summary
    assert "the workers are cut off from it" in summary["ps_recoveries"][0]["reason"]
    check_exact(tmp_path, out, output)


def test_the_master_frozen_for_good_is_killed_and_restarted(tmp_path, data):
    out, result = counting_job(
        tmp_path, data, "--num_ps=1", "--liveness_timeout=8",
        faults="master_task@20:master=freeze")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["master_restarts"] == 1, summary
    assert "answered no health check" in summary["master_recoveries"][0]["reason"]
    # The workers waited for the new master: none was lost for its fault.
    assert summary["workers_lost"] == 0 and summary["worker_restarts"] == 0, (
        f"{lost_workers(tmp_path / 'job')}\n{summary}")  # the why first
    check_exact(tmp_path, out, output)
    assert_gone(frozen_pid(tmp_path / "job" / "master.log"))


def test_a_worker_whose_training_thread_hangs_is_lost_killed_and_replaced(
        tmp_path, data):
    """A worker's training thread blocks for good after a push (its heartbeat
    thread goes on): the master sees no progress on its task for longer
    than the job's tasks take, requeues it and declares the worker lost; the
    launcher kills the process and relaunches a worker; the model is exact.
    The first worker to make its 6th push hangs (on a loaded machine one
    worker may start late and push less)."""
    out, result = counting_job(
        tmp_path, data, "--num_ps=1", "--liveness_timeout=8",
        faults="after_push@6=hang")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    hung = [int(name[len("worker-"):-len(".log")]) for name in sorted(os.listdir(
        tmp_path / "job")) if name.startswith("worker-") and name.endswith(".log")
        and "fault injection: hang at 'after_push'" in (
            tmp_path / "job" / name).read_text()]
    assert len(hung) == 1, output[-3000:]
    (worker,) = hung
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["workers"]["lost_ids"] == [worker], summary["workers"]
    assert summary["workers_lost"] == 1 and summary["worker_restarts"] == 1, summary
    assert summary["datasets"]["training"]["requeued"] >= 1
    assert (f"worker {worker} (pid " in output
            and "was declared lost by the master" in output)
    assert re.search(rf"worker {worker}: no progress: it held a task for more than \d+ s "
                     r"\(the dataset's tasks take far less\) while every server "
                     r"answered; declaring it lost", output), output[-3000:]
    # Before the kill it wrote its threads' stacks: the hung one among them.
    log = (tmp_path / "job" / f"worker-{worker}.log").read_text()
    assert "most recent call first" in log, log[-3000:]
    assert re.search(r'faults\.py", line \d+ in act', log), log[-3000:]
    check_exact(tmp_path, out, output)

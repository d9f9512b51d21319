"""A job over machines, not processes on one loopback (issue 42, items 1 and
2): the launcher on machine A (`--bind` A's address, TLS on as beyond
loopback), a worker joined from machine B (`keras-elastic join`), machines
being network namespaces on a bridge (support/testbed.py). The network
between them fails: B cut off for good, cut off for a while, and cut off
from the parameter server only while it reaches the master. Every job
finishes exact (the counting model and the ledger), and no process of the
job outlives it by more than a few seconds on a machine that still reaches
the job directory (all of them here: namespaces share the file system).

Each cut happens at a moment of the code, not of a clock: the local worker
and the joined one each hold at a fault point (`hold`) until the cut is
made (faults.wait_held / faults.release).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, subprocess_env
from support import testbed
from support.counting_jobs import SCRIPT, check_exact, write_data

from keras_elastic.common import faults, job_end

pytestmark = pytest.mark.multiprocess

A, B, C = 0, 1, 2
# The local worker holds here until the joined one is in the job.
LOCAL_HOLD = "after_push@2:w0=hold"
# The joined worker (its id is the master's: no `:WHO`) holds here, a task
# trained and pushed, not reported, while its machine is cut.
JOINED_HOLD = "after_push@1=hold"
# How long a process of the job may outlive it.
OUTLIVE_S = 10.0


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(str(tmp_path_factory.mktemp("data")))


@pytest.fixture
def machines():
    """Three machines (A, B, C); skipped where namespaces cannot be made."""
    reason = testbed.unavailable()
    if reason:
        pytest.skip(f"no testbed: {reason}")
    testbed.clean()  # leftovers of test runs that were killed
    with testbed.Testbed(3) as bed:
        if testbed.has_tbf(bed):
            for i in range(bed.n):
                bed.shape(i, "1gbit")
        yield bed


class Job:
    """The launcher on machine A with one local worker (w0), and workers
    joined from other machines; logs in tmp_path."""

    def __init__(self, bed, tmp_path, data, *flags, fault=LOCAL_HOLD, bind=None):
        self.bed, self.tmp_path = bed, tmp_path
        self.job_dir = str(tmp_path / "job")
        self.faults_dir = str(tmp_path / "faults")
        self.out = tmp_path / "out.json"
        self.script_args = [f"--data={data}", "--epochs=2", f"--output={self.out}"]
        argv = [sys.executable, "-m", "keras_elastic", "run", f"--job_dir={self.job_dir}",
                *(bind or [f"--bind={bed.address(A)}"]), "--progress_interval=2",
                "--num_workers=1",
                "--max_workers=3", "--heartbeat_timeout=6", *flags, "--",
                sys.executable, SCRIPT, *self.script_args]
        self.launcher_log = tmp_path / "launcher.log"
        self.launcher = bed.popen(A, argv, env=self._env(fault),
                                  stdout=open(self.launcher_log, "w"),
                                  stderr=subprocess.STDOUT)
        self.joined: dict[int, subprocess.Popen] = {}

    def _env(self, fault: str) -> dict:
        return subprocess_env(KERAS_ELASTIC_FAULTS=fault,
                              KERAS_ELASTIC_FAULTS_DIR=self.faults_dir)

    def join(self, machine: int, *flags: str, fault: str = JOINED_HOLD) -> None:
        argv = [sys.executable, "-m", "keras_elastic", "join",
                f"--job_dir={self.job_dir}", *flags, "--", sys.executable, SCRIPT,
                *self.script_args]
        # `join` reads cluster.json: it is there once the local worker holds.
        self.joined[machine] = self.bed.popen(
            machine, argv, env=self._env(fault), cwd=REPO,
            stdout=open(self.tmp_path / f"joined-{machine}.log", "w"),
            stderr=subprocess.STDOUT)

    def cluster(self) -> dict:
        with open(os.path.join(self.job_dir, "cluster.json")) as f:
            return json.load(f)

    def summary(self) -> dict:
        with open(os.path.join(self.job_dir, "summary.json")) as f:
            return json.load(f)

    def held(self, entry: str) -> int:
        try:
            return faults.wait_held(self.faults_dir, entry, timeout=180)
        except TimeoutError:
            raise AssertionError(f"{entry} never held\n{self.logs()}") from None

    def release(self, entry: str) -> None:
        faults.release(self.faults_dir, entry)

    def dump_stacks(self) -> None:
        """SIGUSR1 to the workers still running: each writes its threads'
        stacks to its output (common/stacks.py), for the failure's message."""
        for i in range(self.bed.n):
            for pid, argv in self.bed.commands(i).items():
                if SCRIPT in argv and "join" not in argv and "run" not in argv:
                    os.kill(pid, signal.SIGUSR1)
        time.sleep(1)  # (for the failure's message only)

    def log(self, machine: int) -> str:
        """The output of the worker joined from `machine`."""
        return (self.tmp_path / f"joined-{machine}.log").read_text()

    def logs(self) -> str:
        text = self.launcher_log.read_text()[-6000:]
        for machine in self.joined:
            log = self.tmp_path / f"joined-{machine}.log"
            text += f"\n--- joined on machine {machine}:\n" + log.read_text()[-4000:]
        return text

    def wait(self, timeout: float = 240) -> float:
        """Waits for the launcher; returns when it ended (monotonic)."""
        try:
            self.launcher.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job did not end in {timeout:.0f} s\n"
                                 f"{self.logs()}") from None
        return time.monotonic()

    def check(self, ended: float) -> None:
        """The job succeeded, exact; nothing of it runs OUTLIVE_S after it ended
        on any machine (they all reach the job directory here)."""
        assert self.launcher.returncode == 0, self.logs()
        # beyond loopback: TLS, on by default
        assert self.cluster().get("tls"), self.cluster()
        # What `join` passes on to its worker (deadlines, keepalive, retries).
        assert (self.cluster()["liveness_timeout"], self.cluster()["connect_timeout"]
                ) == (60.0, 300.0), self.cluster()
        check_exact(self.tmp_path, self.out, self.logs())
        deadline = ended + OUTLIVE_S
        for machine, proc in self.joined.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.dump_stacks()
                raise AssertionError(
                    f"the worker joined from machine {machine} still runs "
                    f"{OUTLIVE_S:.0f} s after its job ended\n{self.logs()}") from None
        while time.monotonic() < deadline and any(
                self.bed.pids(i) for i in range(self.bed.n)):
            time.sleep(0.1)
        left = {i: self.bed.pids(i) for i in range(self.bed.n) if self.bed.pids(i)}
        assert not left, (f"processes of the job still run {OUTLIVE_S:.0f} s after "
                          f"it ended: {left}\n{self.logs()}")


def start(bed, tmp_path, data, *flags, join_flags=(), bind=None) -> Job:
    """The job, its local worker held, a worker joined from B and held."""
    job = Job(bed, tmp_path, data, *flags, bind=bind)
    job.held(LOCAL_HOLD)
    job.join(B, *join_flags)
    job.held(JOINED_HOLD)
    return job


def test_machine_cut_for_good(machines, tmp_path, data):
    """B is cut off for good, its task trained and pushed, not reported; a
    worker joined from C stays connected. The job goes on without B (lost,
    its task trained again) and ends exact; B's worker, which never hears
    from the master again, sees in the job directory that the job ended
    without it and exits (status 3) within seconds; C's finishes as usual."""
    c_hold = "after_claim@1=hold"
    # The services listen on every address of A and are reached at the one
    # the others route to (`--advertise`: the address in cluster.json and in
    # the job's TLS certificate).
    job = start(machines, tmp_path, data,
                bind=["--bind=0.0.0.0", f"--advertise={machines.address(A)}"])
    assert job.cluster()["master"].startswith(f"{machines.address(A)}:"), job.cluster()
    job.join(C, fault=c_hold)
    job.held(c_hold)
    machines.cut(B)
    for entry in (JOINED_HOLD, c_hold, LOCAL_HOLD):
        job.release(entry)
    job.check(job.wait())
    assert "ended without this worker" in job.log(B), job.logs()
    assert job.joined[B].returncode == job_end.EXIT_LOST, job.logs()
    assert job.joined[C].returncode == 0, job.logs()
    workers = job.summary()["workers"]
    assert workers["lost_ids"] == [1000] and sorted(workers["exited"]) == [0, 1001], (
        workers)


def test_machine_cut_for_a_while(machines, tmp_path, data):
    """B is cut off, its task trained and pushed, not reported, until the
    master gave that task to the local worker: its 17th claim (an epoch has
    16 tasks, B holds one: the claim is of B's task or of the next epoch,
    which starts only when B's task is done), so the job lost B. Then B's
    cable is plugged back while the job still runs (the local worker holds).
    B's late report counts for nothing; told it is not part of the job, B's
    worker exits (status 3) and `join` starts it again as a new worker, which
    trains with the local one (released once the new worker registered). The
    job ends exact, and B's worker is gone within seconds of the job."""
    local_claim = "after_claim@17:w0=hold"
    job = Job(machines, tmp_path, data, fault=f"{LOCAL_HOLD},{local_claim}")
    job.held(LOCAL_HOLD)
    job.join(B, "--max_rejoins=2")
    job.held(JOINED_HOLD)
    machines.cut(B)
    job.release(JOINED_HOLD)
    job.release(LOCAL_HOLD)
    job.held(local_claim)
    machines.heal(B)
    assert machines.reaches(B, A)
    master_log = os.path.join(job.job_dir, "master.log")
    deadline = time.monotonic() + 180
    while "worker 1001 registered" not in open(master_log).read():
        assert time.monotonic() < deadline, f"B never joined again\n{job.logs()}"
        assert job.joined[B].poll() is None, f"B's join ended\n{job.logs()}"
        time.sleep(0.2)
    job.release(local_claim)
    job.check(job.wait())
    workers = job.summary()["workers"]
    assert workers["lost_ids"] == [1000] and sorted(workers["exited"]) == [0, 1001], (
        workers)
    assert "joining again as a new worker (1 of --max_rejoins=2)" in job.log(B)
    assert job.joined[B].returncode == 0, job.logs()


def test_worker_cut_from_the_parameter_server_only(machines, tmp_path, data):
    """B reaches the master on A but not the parameter server on A (its port
    blackholed both ways between A and B), from the moment its first task
    was pushed, for good; default flags. The server answers the launcher's
    health checks and the local worker reaches it, so the server is not to
    blame: after --liveness_timeout the launcher declares B lost (cut off
    from the server), its tasks go to the local worker, B is told it is
    lost and leaves; the job ends exact, and nothing of it outlives it."""
    job = start(machines, tmp_path, data)
    ps_port = int(job.cluster()["ps"][0].rpartition(":")[2])
    machines.partition(B, A, port=ps_port)
    job.release(JOINED_HOLD)
    job.release(LOCAL_HOLD)
    job.check(job.wait())
    summary = job.summary()
    assert summary["workers"]["lost_ids"] == [1000], job.logs()
    assert summary["ps_restarts"] == 0, summary
    assert re.search(r"worker 1000 could not reach ps-0 \(or waited on it\) for \d+ s "
                     r"while it answered health checks and worker\(s\) 0 reached it: "
                     r"cut off from it \(--liveness_timeout=60\); declaring it lost",
                     job.launcher_log.read_text()), job.logs()

"""Chaos soak: a counting job under random kills and freezes, then checked exact.

Runs `keras-elastic run` of the counting model (tests/scripts/counting_script.py:
every weight counts each record once per epoch, so any lost or doubled
gradient shows) with 2 workers and 2 parameter servers, on loopback, and for
`--minutes` injects faults into randomly chosen roles at random moments
(seeded, one at a time, at most `--max_faults`), one job of `--epochs` after
the other:

- `kill`:          SIGKILL;
- `freeze`:        SIGSTOP, SIGCONT after a few seconds (less than the
                   liveness timeout: the role must come back on its own);
- `freeze_for_good`: SIGSTOP and never SIGCONT (the launcher must find it
                   silent, kill it and replace it).

The roles come in three classes, drawn in rounds: each round is the three
classes in a seeded random order, and each fault hits the next class of the
round (so any three faults in a row from a round's start hit a worker, a
parameter server and the master, whatever the seed), a random member of it
(any worker alive, either parameter server, the master). After each fault
the soak waits until the job is healthy again (the job made progress, and a
killed or frozen-for-good service is replaced) before the next, and counts
that wait as the seconds the fault cost. Each job runs to its end, and the
soak checks its counting model (exact), its ledger (every task of every
epoch exactly once) and that every kill and freeze for good left its trace
in the job's summary.json (the master's and the servers' restarts, the
workers lost: a fault the soak thinks it injected must have happened), and
prints the faults injected and recovered, the seconds lost per fault by kind,
and the result. Exit status 0 only when all of that holds; faults.json holds
the faults and each job's summary counts.

With `--testbed` (root: tests/support/testbed.py) the roles run on three
machines (network namespaces) instead of loopback, as users place them: the
launcher, the master, both servers and one worker on machine 0 (`--bind`
its address, TLS on), and a worker joined from each of machines 1 and 2
(`keras-elastic join`; the soak joins one again when it exits, as a
cluster manager would). The faults then include partitions of every role
class as well:

- worker `cut`:          a worker machine's cable pulled for a while (up to
                         twice the heartbeat timeout), then plugged back;
- worker `cut_for_good`: a worker machine cut off for the rest of the job
                         (its worker must be lost, and leave when the job
                         ends without it);
- worker `cut_from_ps`:  a worker machine cut from one server's port for the
                         rest of the job, while it still reaches the master
                         (the worker, not the server, must be lost);
- ps or master `cut_from_workers`: the service's port cut from every joined
                         worker's machine for a while (up to twice the
                         liveness timeout), while the launcher and the
                         worker on its own machine still reach it.

With `--ps_partitions=P` (more than `--num_ps`), the parameter servers hold
P partitions, and the faults of the parameter-server class include:

- ps `scale`:            `keras-elastic scale --num_ps K` (K from 1 to P,
                         another count than now): partitions move between
                         server processes while the job trains (its wait is
                         until the job runs with K processes and made
                         progress); a kill or freeze of "ps-<p>" hits the
                         process holding partition p, whichever that is now.

After each job the soak checks as well that no process of it still runs on
any machine `OUTLIVE_S` after it ended (a worker cut off for good reads the
job directory, which every machine shares, and leaves).

    python tools/chaos_soak.py --minutes=30 --seed=1
    python tools/chaos_soak.py --faults=20     # 20 faults, however long
    python tools/chaos_soak.py --smoke        # 3 faults, one per role class (CI)
    python tools/chaos_soak.py --testbed --minutes=30   # machines, partitions
    python tools/chaos_soak.py --num_ps=2 --ps_partitions=4   # servers scaled live
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import os
import random
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags, logging

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # keras_elastic of this checkout
SCRIPT = os.path.join(REPO, "tests", "scripts", "counting_script.py")
RECORDS = 1024
TASKS_PER_EPOCH = 16  # 1024 records / (batch 16 x 4 minibatches per task)
KINDS = ("kill", "freeze", "freeze_for_good")
SCALE = ("scale",)  # --ps_partitions: servers added or removed live
ROLE_CLASSES = ("worker", "ps", "master")
# The summary.json count each class's kill or freeze for good adds to (a
# short freeze leaves none).
TRACES = {"worker": "workers.lost", "ps": "ps_restarts", "master": "master_restarts"}
# The partitions of each class (--testbed), and those that must leave a trace
# as a kill does (the worker cut off for the rest of the job is lost).
PARTITIONS = {"worker": ("cut", "cut_for_good", "cut_from_ps"),
              "ps": ("cut_from_workers",), "master": ("cut_from_workers",)}
FOR_GOOD = ("kill", "freeze_for_good", "cut_for_good", "cut_from_ps")
# How long a process of a job may outlive it (--testbed).
OUTLIVE_S = 10.0
# Every parameter-server recovery of the soak's jobs (from their summaries).
RECOVERIES: list[dict] = []

FLAGS = flags.FLAGS
flags.DEFINE_float("minutes", 10.0, "Minutes of fault injection.")
flags.DEFINE_integer("seed", 1, "Seed of the fault plan.")
flags.DEFINE_integer("max_faults", 1000, "Most faults injected.")
flags.DEFINE_float("liveness_timeout", 6.0, "The job's --liveness_timeout.")
flags.DEFINE_float("heartbeat_timeout", 10.0, "The job's --heartbeat_timeout.")
flags.DEFINE_float("sleep_per_batch", 0.03, "Paces the workers.")
flags.DEFINE_integer("epochs", 30, "Epochs of each counting job (the soak runs one "
                     "job after the other until --minutes are over).")
flags.DEFINE_integer("num_ps", 2, "Parameter servers of each job.")
flags.DEFINE_integer("ps_partitions", 0, "The jobs' --ps_partitions (0: --num_ps); "
                     "more than --num_ps adds `scale` to the faults of the servers.")
flags.DEFINE_integer("ps_replicas", 1, "The jobs' --ps_replicas (2: a backup of each "
                     "server takes its place when it is lost).")
flags.DEFINE_string("job_dir", None, "Where the job runs (default: a new temp dir).")
flags.DEFINE_integer("faults", 0, "Inject exactly this many faults, however long "
                     "the jobs take (a slow machine gets as many as a fast one); "
                     "--minutes is then only a cap. 0: as many as --minutes allow.")
flags.DEFINE_bool("smoke", False, "A short soak: 3 faults (--faults: one of each "
                  "role class), at most 10 minutes, jobs of 20 epochs.")
flags.DEFINE_list("kinds", [], "Only these kinds of fault (default: every kind "
                  "the roles' placement allows; see the module doc).")
flags.DEFINE_bool("testbed", False, "Run the roles on three machines (network "
                  "namespaces; needs root) and add partitions to the faults (see "
                  "the module doc).")


def _cluster(job_dir: str) -> dict:
    try:
        with open(os.path.join(job_dir, "cluster.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _status(job_dir: str) -> dict | None:
    from keras_elastic.common import tls
    from keras_elastic.master.client import MasterClient

    cluster = _cluster(job_dir)
    address = cluster.get("master")
    if not address:
        return None
    if cluster.get("tls"):  # beyond loopback (--testbed): the job's CA
        os.environ.update(tls.TLSConfig(ca=cluster["tls"].get("ca"),
                                        server_name=cluster["tls"].get("server_name")
                                        ).to_env())
    try:
        client = MasterClient(address, connect_timeout=2, reconnect_timeout=1)
    except (ConnectionError, ValueError):
        return None
    try:
        return client.status(timeout=3)
    except (ConnectionError, ValueError):
        return None
    finally:
        client.close()


def _tasks_done(status: dict | None) -> int:
    training = ((status or {}).get("datasets") or {}).get("training") or {}
    return int(training.get("tasks_done_total", 0))


def _finished(status: dict | None) -> bool:
    training = ((status or {}).get("datasets") or {}).get("training") or {}
    return bool(training.get("finished"))


def _pid_of(cluster: dict, role: str) -> int | None:
    if role == "master":
        return cluster.get("master_pid")
    kind, _, index = role.partition("-")
    if kind == "ps":
        pids = cluster.get("ps_pids") or []
        return pids[int(index)] if int(index) < len(pids) else None
    return (cluster.get("worker_pids") or {}).get(index)


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def _healthy_again(job_dir: str, role: str, pid: int, kind: str, done_before: int,
                   start: float, timeout: float, launcher: subprocess.Popen
                   ) -> float | None:
    """Seconds from the fault (at monotonic `start`) until the job is healthy
    again (progress made, and a service that was killed or frozen for good
    replaced); None: not within `timeout`, or the job ended first."""
    while time.monotonic() - start < timeout and launcher.poll() is None:
        status = _status(job_dir)
        replaced = True
        if kind in ("kill", "freeze_for_good") and not role.startswith("worker"):
            replaced = _pid_of(_cluster(job_dir), role) not in (None, pid)
        if status is not None and replaced and (
                _tasks_done(status) > done_before or _finished(status)):
            return time.monotonic() - start
        time.sleep(0.25)
    if launcher.poll() == 0:  # the job finished (between two looks)
        return time.monotonic() - start
    return None


def role_class(role: str) -> str:
    """`worker`, `ps` or `master`, of a role as faults.json names it (a
    worker joined from machine 1 of the testbed: `worker@m1`).

    >>> role_class("worker-3"), role_class("ps-1"), role_class("master")
    ('worker', 'ps', 'master')
    >>> role_class("worker@m1")
    'worker'
    """
    return re.split(r"[-@]", role)[0]


class Loopback:
    """Every role a process of this machine on 127.0.0.1 (the default)."""

    def launcher_flags(self) -> list[str]:
        return ["--num_workers=2"]

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(argv, **kwargs)

    def job_started(self, job: str, script_args: list[str], root: str) -> None:
        pass

    def workers(self, job: str, status: dict) -> list[str]:
        return [f"worker-{w}" for w in status["workers"]["alive"]]

    def pid(self, job: str, role: str) -> int | None:
        return _pid_of(_cluster(job), role)

    def kinds(self, cls: str, members: list[str] | None = None) -> tuple[str, ...]:
        return KINDS

    def partition(self, job: str, role: str, kind: str, rng: random.Random) -> None:
        raise AssertionError(f"no partitions on loopback ({kind})")

    def maintain(self, job: str) -> None:
        pass

    def froze(self, pid: int) -> None:
        """`pid` was frozen for good."""

    def job_ended(self, job: str, index: int) -> list[str]:
        return []


class Machines(Loopback):
    """Three machines of a testbed (see the module doc): the launcher and
    every service on machine 0 with one local worker, a worker joined from
    each of machines 1 and 2."""

    def __init__(self, bed) -> None:
        self.bed = bed
        self.joined: dict[int, subprocess.Popen] = {}
        self.out: set[int] = set()  # worker machines cut off for the job's rest
        self.frozen: set[int] = set()  # processes frozen for good
        self._job = ""
        self._join_argv: list[str] = []
        self._root = ""

    def launcher_flags(self) -> list[str]:
        return [f"--bind={self.bed.address(0)}", "--num_workers=1", "--max_workers=3"]

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        return self.bed.popen(0, argv, **kwargs)

    def job_started(self, job: str, script_args: list[str], root: str) -> None:
        """Joins a worker from machines 1 and 2."""
        self._job, self._root = job, root
        self._join_argv = [sys.executable, "-m", "keras_elastic", "join",
                           f"--job_dir={job}", "--", sys.executable, SCRIPT,
                           *script_args]
        self.joined, self.out, self.frozen = {}, set(), set()
        for machine in (1, 2):
            self._join(machine)

    def _join(self, machine: int) -> None:
        log = open(os.path.join(self._root, f"{os.path.basename(self._job)}-joined-"
                                f"m{machine}.log"), "a")
        self.joined[machine] = self.bed.popen(machine, self._join_argv, env=_child_env(),
                                              cwd=REPO, stdout=log,
                                              stderr=subprocess.STDOUT)
        log.close()

    def _script_pid(self, machine: int) -> int | None:
        """The joined worker's own process on `machine` (the script `join`
        runs), if any."""
        return next((pid for pid, argv in self.bed.commands(machine).items()
                     if SCRIPT in argv and "join" not in argv), None)

    def workers(self, job: str, status: dict) -> list[str]:
        """The workers to hit: the launched ones alive, and the joined ones
        that registered (one still starting is not in the job yet: its
        loss would leave no trace)."""
        launched = _cluster(job).get("worker_pids") or {}
        local = [f"worker-{w}" for w in status["workers"]["alive"] if str(w) in launched]
        registered = _registered_pids(job)
        return local + [f"worker@m{m}" for m in (1, 2)
                        if m not in self.out and self._script_pid(m) in registered]

    def pid(self, job: str, role: str) -> int | None:
        if role.startswith("worker@m"):
            return self._script_pid(int(role[len("worker@m"):]))
        return _pid_of(_cluster(job), role)

    def kinds(self, cls: str, members: list[str] | None = None) -> tuple[str, ...]:
        """The kinds of fault for class `cls` with these `members` now
        (None: any members; a worker's partitions need a joined one)."""
        joined = members is None or any("@" in m for m in members)
        partitions = PARTITIONS[cls] if cls != "worker" or joined else ()
        return KINDS + partitions

    def _port(self, job: str, role: str) -> int:
        cluster = _cluster(job)
        address = (cluster["master"] if role == "master"
                   else cluster["ps"][int(role.partition("-")[2])])
        return int(address.rpartition(":")[2])

    def partition(self, job: str, role: str, kind: str, rng: random.Random) -> None:
        """Injects the partition `kind` on `role` (see the module doc); a
        partition for a while is healed before this returns."""
        if kind == "cut_from_workers":
            port = self._port(job, role)
            machines = [m for m in (1, 2) if m not in self.out]
            for m in machines:
                self.bed.partition(m, 0, port=port)
                self._check_cut(m, port)
            time.sleep(rng.uniform(1.0, 2 * FLAGS.liveness_timeout))
            for m in machines:
                self.bed.unpartition(m, 0, port=port)
            return
        machine = int(role[len("worker@m"):])
        if kind == "cut":
            self.bed.cut(machine)
            self._check_cut(machine, self._port(job, "master"))
            time.sleep(rng.uniform(1.0, 2 * FLAGS.heartbeat_timeout))
            self.bed.heal(machine)
        elif kind == "cut_for_good":
            self.bed.cut(machine)
            self._check_cut(machine, self._port(job, "master"))
            self.out.add(machine)
        elif kind == "cut_from_ps":
            server = f"ps-{rng.randrange(len(_cluster(job).get('ps') or [0]))}"
            self.bed.partition(machine, 0, port=self._port(job, server))
            self._check_cut(machine, self._port(job, server))
            self.out.add(machine)
        else:
            raise ValueError(f"no partition {kind!r}")

    def _check_cut(self, machine: int, port: int) -> None:
        """Machine `machine` no longer reaches `port` on machine 0: a
        partition that did not take is the soak's failure, not a pass."""
        if self.bed.reaches(machine, 0, port=port, timeout=0.5):
            raise RuntimeError(f"machine {machine} still reaches port {port} of "
                               "machine 0 after the partition")

    def maintain(self, job: str) -> None:
        """A joined worker that failed (killed, lost, gave up) while the job
        runs is joined again from its machine (a cluster manager restarting
        a failed pod), unless that machine is cut off for the job's rest."""
        if os.path.exists(os.path.join(job, "summary.json")):
            return  # the job ended
        for machine, proc in self.joined.items():
            if machine not in self.out and proc.poll() not in (None, 0):
                logging.info("the worker joined from machine %d exited (%s): "
                             "joining one again", machine, proc.returncode)
                self._join(machine)

    def froze(self, pid: int) -> None:
        self.frozen.add(pid)

    def job_ended(self, job: str, index: int) -> list[str]:
        """Nothing of the job runs OUTLIVE_S after it ended, on any machine
        (checked before the partitions are healed: a machine cut off for
        good is still cut off); then every machine is plugged back in. A
        process the soak froze for good cannot leave by itself: the soak
        kills it first, as its machine's owner would (the launcher kills
        those it started)."""
        for pid in self.frozen:
            with _suppress():
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + OUTLIVE_S
        left: dict[int, list[int]] = {}
        while time.monotonic() < deadline:
            left = {m: [p for p in self.bed.pids(m) if not _the_soaks(p)]
                    for m in range(self.bed.n)}
            left = {m: pids for m, pids in left.items() if pids}
            if not left:
                break
            time.sleep(0.2)
        problems = []
        if left:
            problems.append(f"processes still run {OUTLIVE_S:g} s after the job "
                            f"ended: {left}")
            for pids in left.values():
                for pid in pids:
                    with _suppress():
                        os.kill(pid, signal.SIGKILL)
        for machine in range(self.bed.n):
            self.bed.heal(machine)
        for machine, proc in self.joined.items():
            with _suppress():
                proc.wait(timeout=10)
            logging.info("job %d: the worker joined from machine %d exited with "
                         "%s%s", index, machine, proc.returncode,
                         " (cut off for the job's rest)" if machine in self.out
                         else "")
        return problems


def _registered_pids(job: str) -> set[int]:
    """The pids of the workers that registered with the job's master (its
    log's "worker N registered (pid P)" lines)."""
    try:
        with open(os.path.join(job, "master.log"), errors="replace") as f:
            return {int(p) for p in re.findall(r"worker \d+ registered \(pid (\d+)\)",
                                               f.read())}
    except OSError:
        return set()


def _the_soaks(pid: int) -> bool:
    """Whether `pid` is this process, or the `ip netns pids` it runs: both
    are in machine 0's network (this process joined it for its status calls,
    and its children start there)."""
    if pid == os.getpid():
        return True
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() == "ip"
    except OSError:
        return True  # gone already


def _suppress():
    return contextlib.suppress(OSError, subprocess.TimeoutExpired)


def _child_env() -> dict[str, str]:
    """The environment of the launchers and joins the soak starts: this
    checkout's keras_elastic first."""
    return dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get(
        "PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="2")


def _run_job(root: str, index: int, data_dir: str, epochs: int, rng: random.Random,
             started: float, deadline: float, faults: list[dict],
             max_faults: int, round_: list[str], place: Loopback) -> list[str]:
    """One counting job under faults until it ends (faults stop at
    `deadline`); returns its problems ([]: exact). `round_`: the role
    classes of the current round not hit yet (the next fault hits the first;
    refilled, in a seeded order, once empty). `place`: where the roles run."""
    job = os.path.join(root, f"job-{index}")
    out = os.path.join(root, f"out-{index}.json")
    script_args = [f"--data={data_dir}/*.tfrecord", f"--epochs={epochs}",
                   f"--output={out}", f"--sleep_per_batch={FLAGS.sleep_per_batch}"]
    argv = [sys.executable, "-m", "keras_elastic", "run", f"--job_dir={job}",
            *place.launcher_flags(), f"--num_ps={FLAGS.num_ps}",
            f"--ps_replicas={FLAGS.ps_replicas}", "--ps_checkpoint_secs=2",
            f"--ps_partitions={_partitions()}",
            "--max_worker_restarts=1000", "--max_ps_restarts=1000",
            "--max_master_restarts=1000",
            f"--liveness_timeout={FLAGS.liveness_timeout}",
            f"--heartbeat_timeout={FLAGS.heartbeat_timeout}",
            "--progress_interval=30", "--", sys.executable, SCRIPT, *script_args]
    log_path = os.path.join(root, f"launcher-{index}.log")
    # Processes this job's faults froze for good: never a target again (a
    # later short freeze's SIGCONT would wake one up, and the summary would
    # then count one loss less than the soak injected).
    frozen_for_good: set[int] = set()
    with open(log_path, "w") as log:
        proc = place.popen(argv, env=_child_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        while _tasks_done(_status(job)) < 2:
            if proc.poll() is not None:
                return [f"job {index} ended before training: see {log_path}"]
            time.sleep(0.5)
        place.job_started(job, script_args, root)
        while time.monotonic() < deadline and len(faults) < max_faults and (
                proc.poll() is None):
            time.sleep(rng.uniform(2.0, 8.0))
            place.maintain(job)
            status = _status(job)
            if status is None or _finished(status):
                continue
            if not round_:
                round_.extend(rng.sample(ROLE_CLASSES, len(ROLE_CLASSES)))
            members = {"master": ["master"],
                       "ps": [f"ps-{i}" for i in range(_partitions())],
                       "worker": place.workers(job, status)}[round_[0]]
            if not members:
                continue
            if FLAGS.kinds and not set(place.kinds(round_[0])) & set(FLAGS.kinds):
                round_.pop(0)  # none of --kinds is for this class, ever
                continue
            kinds = [k for k in place.kinds(round_[0], members) + (
                SCALE if round_[0] == "ps" and _partitions() > FLAGS.num_ps else ())
                     if not FLAGS.kinds or k in FLAGS.kinds]
            if not kinds:  # not now (no joined worker in the job yet)
                continue
            kind = rng.choice(kinds)
            if kind == "scale":
                round_.pop(0)
                faults.append(_scale(job, index, rng, status, started, proc))
                continue
            if kind in PARTITIONS["worker"]:  # a machine's: a joined worker
                members = [m for m in members if "@" in m]
            role = rng.choice(members)
            pid = place.pid(job, role)
            if not _alive(pid) or pid in frozen_for_good:
                continue
            round_.pop(0)
            done = _tasks_done(status)
            injected = time.monotonic()
            if kind == "kill":
                os.kill(pid, signal.SIGKILL)
            elif kind in KINDS:
                os.kill(pid, signal.SIGSTOP)
                if kind == "freeze_for_good":
                    place.froze(pid)
                    frozen_for_good.add(pid)
                if kind == "freeze":
                    time.sleep(rng.uniform(1.0, FLAGS.liveness_timeout / 2))
                    if _alive(pid):
                        os.kill(pid, signal.SIGCONT)
            else:
                place.partition(job, role, kind, rng)
            lost = _healthy_again(job, role, pid, kind, done, injected, timeout=300,
                                  launcher=proc)
            faults.append({"job": index, "at": round(injected - started, 1),
                           "role": role, "kind": kind, "pid": pid,
                           "seconds_lost": None if lost is None else round(lost, 1)})
            logging.info("fault %d (job %d): %s of %s (pid %d) at %.0f s: %s",
                         len(faults), index, kind, role, pid, injected - started,
                         "not recovered" if lost is None
                         else f"healthy again in {lost:.1f} s")
        end_by = time.monotonic() + max(600, epochs * 20)
        while proc.poll() is None and time.monotonic() < end_by:
            place.maintain(job)
            time.sleep(1.0)
        proc.wait(timeout=1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    problems = [] if proc.returncode == 0 else [
        f"job {index} exited with {proc.returncode} ({log_path})"]
    problems += [f"job {index}: {p}" for p in place.job_ended(job, index)]
    problems += [f"job {index}: {p}" for p in _traced(
        job, [f for f in faults if f["job"] == index])]
    return problems + [f"job {index}: {p}" for p in _exact(job, out, epochs)]


def _partitions() -> int:
    return FLAGS.ps_partitions or FLAGS.num_ps


def _scale(job: str, index: int, rng: random.Random, status: dict, started: float,
           launcher: subprocess.Popen) -> dict:
    """`keras-elastic scale --num_ps K` of the job, K another count than now;
    waits until the job runs with K server processes and made progress."""
    now = len(_cluster(job).get("ps_hosts") or ()) or FLAGS.num_ps
    count = rng.choice([k for k in range(1, _partitions() + 1) if k != now])
    done = _tasks_done(status)
    injected = time.monotonic()
    subprocess.run([sys.executable, "-m", "keras_elastic", "scale", f"--job_dir={job}",
                    f"--num_ps={count}"], env=_child_env(), check=True,
                   capture_output=True, timeout=60)
    took = None
    while time.monotonic() - injected < 300 and launcher.poll() is None:
        if len(_cluster(job).get("ps_hosts") or ()) == count:
            status = _status(job)
            if status is not None and (_tasks_done(status) > done or _finished(status)):
                took = time.monotonic() - injected
                break
        time.sleep(0.25)
    if took is None and launcher.poll() == 0:
        took = time.monotonic() - injected
    logging.info("scale (job %d): %d -> %d server processes at %.0f s: %s", index,
                 now, count, injected - started,
                 "not done" if took is None else f"done in {took:.1f} s")
    return {"job": index, "at": round(injected - started, 1), "role": "ps",
            "kind": "scale", "pid": 0, "servers": [now, count],
            "seconds_lost": None if took is None else round(took, 1)}


def _traced(job: str, faults: list[dict]) -> list[str]:
    """The faults of a job its summary.json shows too few of: each process
    of a class killed, frozen for good or cut off for the job's rest adds one
    to its count (TRACES), at least (a process frozen for good and then
    killed, before the job found it silent, is one)."""
    try:
        with open(os.path.join(job, "summary.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError) as e:
        return [f"no summary: {e}"]
    for fault in faults:
        fault["summary"] = {key: summary.get(key) for key in TRACES.values()
                            if "." not in key}
        fault["summary"]["workers.lost"] = (summary.get("workers") or {}).get("lost")
    # What each server recovery trained again (tasks: only the lost server's
    # share is pushed; the others keep their state).
    RECOVERIES.extend({"job": os.path.basename(job), "ps": r.get("ps"),
                       "tasks_redone": sum((r.get("completions_undone") or {}).values()),
                       "servers_kept": r.get("servers_kept"),
                       "failover": bool(r.get("failover")),
                       "spare": r.get("spare"),
                       "seconds": r.get("seconds")}
                      for r in summary.get("ps_recoveries") or [])
    problems = []
    for cls, key in TRACES.items():
        injected = len({f["pid"] for f in faults if role_class(f["role"]) == cls
                        and f["kind"] in FOR_GOOD})
        # Workers: the master's count, of joined workers too (the
        # launcher's workers_lost counts those it started).
        found = (summary.get("workers") or {}).get("lost") if cls == "worker" else (
            summary.get(key))
        if (found or 0) < injected:
            problems.append(f"{injected} process(es) of the {cls} class killed, "
                            f"frozen or cut off for good, but the summary counts "
                            f"{found}")
    return problems


def _enter_network(path: str) -> None:
    """This thread (the soak's main thread: the gRPC threads it starts later
    inherit its network) joins the network namespace at `path` (os.setns is
    Python 3.12's)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), f"setns into {path}")
    finally:
        os.close(fd)


def soak(root: str, minutes: float, seed: int, max_faults: int, target: int = 0,
         place: Loopback | None = None) -> int:
    """Counting jobs one after the other, under faults, for `minutes` (with
    `target`: until that many faults, `minutes` a cap); `place`: where the
    roles run (default: loopback)."""
    place = place or Loopback()
    rng = random.Random(seed)
    os.makedirs(root, exist_ok=True)
    # The jobs' token, shared with their launchers so that this process may
    # ask the master for a job's status.
    os.environ.setdefault("KERAS_ELASTIC_TOKEN", secrets.token_hex(32))
    data_dir = os.path.join(root, "data")
    subprocess.run([sys.executable, "-c",
                    "import sys; sys.path.insert(0, sys.argv[1]); "
                    "import counting_script as c; c.write_data(sys.argv[2], "
                    f"{RECORDS}, 4)", os.path.join(REPO, "tests", "scripts"), data_dir],
                   check=True, env=dict(os.environ, PYTHONPATH=REPO))
    faults: list[dict] = []
    problems: list[str] = []
    started = time.monotonic()
    deadline = started + minutes * 60
    jobs = 0
    round_: list[str] = []
    while time.monotonic() < deadline and len(faults) < max_faults:
        problems += _run_job(root, jobs, data_dir, FLAGS.epochs, rng, started,
                             deadline, faults, max_faults, round_, place)
        jobs += 1
    if target and len(faults) < target:
        problems.append(f"only {len(faults)} of the {target} faults asked for "
                        f"within the cap of {minutes:g} minutes")
    return _report(root, faults, problems, jobs, time.monotonic() - started, place)


def _exact(job: str, out: str, epochs: int) -> list[str]:
    problems = []
    try:
        with open(out) as f:
            counts = json.load(f)["counts"]
        if counts != [epochs * RECORDS] * len(counts):
            problems.append(f"counts {counts}, expected {epochs * RECORDS} each")
    except (OSError, ValueError, KeyError) as e:
        problems.append(f"no model output: {e}")
    try:
        with open(os.path.join(job, "ledger.json")) as f:
            ledger = json.load(f)["training"]
    except (OSError, ValueError, KeyError) as e:
        return problems + [f"no ledger: {e}"]
    seen = collections.Counter((e["epoch"], e["task_id"]) for e in ledger
                               if not e.get("rolled_back"))
    expected = {(ep, t) for ep in range(epochs) for t in range(TASKS_PER_EPOCH)}
    if set(seen) != expected:
        problems.append(f"ledger: {len(expected - set(seen))} tasks missing, "
                        f"{len(set(seen) - expected)} unexpected")
    doubled = sum(1 for n in seen.values() if n != 1)
    if doubled:
        problems.append(f"ledger: {doubled} tasks done more than once")
    return problems


def _report(root: str, faults: list[dict], problems: list[str], jobs: int,
            elapsed: float, place: Loopback) -> int:
    where = ("3 machines: 1 worker with the services, 2 joined" if isinstance(
        place, Machines) else "2 workers")
    print(f"chaos soak: {len(faults)} faults in {elapsed / 60:.1f} min over {jobs} "
          f"counting job(s) of {FLAGS.epochs} epochs, {where}, {FLAGS.num_ps} "
          f"parameter servers" + (" with backups" if FLAGS.ps_replicas > 1 else "")
          + (f" over {_partitions()} partitions, scaled live" if _partitions()
             > FLAGS.num_ps else ""))
    print(f"{'kind':<16} {'role':<7} {'injected':>8} {'recovered':>9} "
          f"{'mean s lost':>11} {'max s lost':>10}")
    groups: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    for fault in faults:
        groups[(fault["kind"], role_class(fault["role"]))].append(fault)
    for (kind, role), items in sorted(groups.items()):
        lost = [f["seconds_lost"] for f in items if f["seconds_lost"] is not None]
        print(f"{kind:<16} {role:<7} {len(items):>8} {len(lost):>9} "
              f"{statistics.mean(lost) if lost else float('nan'):>11.1f} "
              f"{max(lost) if lost else float('nan'):>10.1f}")
    if RECOVERIES:
        redone = [r["tasks_redone"] for r in RECOVERIES]
        failovers = sum(1 for r in RECOVERIES if r["failover"])
        onto_spares = sum(1 for r in RECOVERIES if r["spare"])
        per_task = RECORDS // TASKS_PER_EPOCH
        print(f"parameter-server recoveries: {len(redone)} ({failovers} by a backup "
              f"taking the server's place, {onto_spares} onto a started spare); "
              f"tasks trained again (pushed to the restored server only) per "
              f"recovery: mean {statistics.mean(redone):.1f}, max {max(redone)} (an "
              f"epoch is {TASKS_PER_EPOCH}); per recovery: {redone}; elements "
              f"(x{per_task}): {[n * per_task for n in redone]}; the launcher's "
              f"seconds per recovery: {[r['seconds'] for r in RECOVERIES]}")
    unrecovered = [f for f in faults if f["seconds_lost"] is None]
    if unrecovered:
        problems = problems + [f"{len(unrecovered)} fault(s) not recovered within "
                               f"300 s: {unrecovered[:3]}"]
    print("result: EXACT (counting model and ledger of every job)" if not problems
          else "result: NOT EXACT: " + "; ".join(problems))
    with open(os.path.join(root, "faults.json"), "w") as f:
        json.dump({"faults": faults, "problems": problems, "jobs": jobs,
                   "ps_recoveries": RECOVERIES}, f, indent=1)
    return 0 if not problems else 1


def main(argv) -> None:
    del argv
    minutes, max_faults, target = FLAGS.minutes, FLAGS.max_faults, FLAGS.faults
    known = set(KINDS).union(SCALE, *PARTITIONS.values())
    if set(FLAGS.kinds) - known:
        sys.exit(f"--kinds: no kind of fault {sorted(set(FLAGS.kinds) - known)}; "
                 f"the kinds: {', '.join(sorted(known))}")
    if not FLAGS.testbed and set(FLAGS.kinds) and not set(FLAGS.kinds) & set(KINDS + SCALE):
        sys.exit("--kinds: partitions need machines (--testbed)")
    if FLAGS.smoke:
        target = target or 3
        minutes = minutes if FLAGS["minutes"].present else 10.0
        FLAGS.epochs = min(FLAGS.epochs, 20)
    if target:
        max_faults = min(max_faults, target)
    job_dir = FLAGS.job_dir or tempfile.mkdtemp(prefix="chaos-soak-")
    if not FLAGS.testbed:
        sys.exit(soak(job_dir, minutes, FLAGS.seed, max_faults, target))
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from support import testbed

    reason = testbed.unavailable()
    if reason:
        sys.exit(f"--testbed: no machines can be made here: {reason}")
    testbed.clean()
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    with testbed.Testbed(3) as bed:
        # On machine 0's network to ask the master for the job's status; back
        # home before the testbed goes (it kills every process in a machine).
        _enter_network(f"/run/netns/{bed.machine(0)}")
        try:
            code = soak(job_dir, minutes, FLAGS.seed, max_faults, target,
                        Machines(bed))
        finally:
            _enter_network(f"/proc/self/fd/{home}")
    sys.exit(code)


if __name__ == "__main__":
    app.run(main)

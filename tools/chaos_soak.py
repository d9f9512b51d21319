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

    python tools/chaos_soak.py --minutes=30 --seed=1
    python tools/chaos_soak.py --faults=20     # 20 faults, however long
    python tools/chaos_soak.py --smoke        # 3 faults, one per role class (CI)
"""

from __future__ import annotations

import collections
import json
import os
import random
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
ROLE_CLASSES = ("worker", "ps", "master")
# The summary.json count each class's kill or freeze for good adds to (a
# short freeze leaves none).
TRACES = {"worker": "workers_lost", "ps": "ps_restarts", "master": "master_restarts"}

FLAGS = flags.FLAGS
flags.DEFINE_float("minutes", 10.0, "Minutes of fault injection.")
flags.DEFINE_integer("seed", 1, "Seed of the fault plan.")
flags.DEFINE_integer("max_faults", 1000, "Most faults injected.")
flags.DEFINE_float("liveness_timeout", 6.0, "The job's --liveness_timeout.")
flags.DEFINE_float("heartbeat_timeout", 10.0, "The job's --heartbeat_timeout.")
flags.DEFINE_float("sleep_per_batch", 0.03, "Paces the workers.")
flags.DEFINE_integer("epochs", 30, "Epochs of each counting job (the soak runs one "
                     "job after the other until --minutes are over).")
flags.DEFINE_string("job_dir", None, "Where the job runs (default: a new temp dir).")
flags.DEFINE_integer("faults", 0, "Inject exactly this many faults, however long "
                     "the jobs take (a slow machine gets as many as a fast one); "
                     "--minutes is then only a cap. 0: as many as --minutes allow.")
flags.DEFINE_bool("smoke", False, "A short soak: 3 faults (--faults: one of each "
                  "role class), at most 10 minutes, jobs of 20 epochs.")


def _cluster(job_dir: str) -> dict:
    try:
        with open(os.path.join(job_dir, "cluster.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _status(job_dir: str) -> dict | None:
    from keras_elastic.master.client import MasterClient

    address = _cluster(job_dir).get("master")
    if not address:
        return None
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
                   start: float, timeout: float) -> float | None:
    """Seconds from the fault (at monotonic `start`) until the job is healthy
    again (progress made, and a service that was killed or frozen for good
    replaced); None: not within `timeout`."""
    while time.monotonic() - start < timeout:
        status = _status(job_dir)
        replaced = True
        if kind != "freeze" and not role.startswith("worker"):
            replaced = _pid_of(_cluster(job_dir), role) not in (None, pid)
        if status is not None and replaced and (
                _tasks_done(status) > done_before or _finished(status)):
            return time.monotonic() - start
        time.sleep(0.25)
    return None


def role_class(role: str) -> str:
    """`worker`, `ps` or `master`, of a role as faults.json names it.

    >>> role_class("worker-3"), role_class("ps-1"), role_class("master")
    ('worker', 'ps', 'master')
    """
    return role.split("-")[0]


def _run_job(root: str, index: int, data_dir: str, epochs: int, rng: random.Random,
             started: float, deadline: float, faults: list[dict],
             max_faults: int, round_: list[str]) -> list[str]:
    """One counting job under faults until it ends (faults stop at
    `deadline`); returns its problems ([]: exact). `round_`: the role
    classes of the current round not hit yet (the next fault hits the first;
    refilled, in a seeded order, once empty)."""
    job = os.path.join(root, f"job-{index}")
    out = os.path.join(root, f"out-{index}.json")
    argv = [sys.executable, "-m", "keras_elastic", "run", f"--job_dir={job}",
            "--num_workers=2", "--num_ps=2", "--ps_checkpoint_secs=2",
            "--max_worker_restarts=1000", "--max_ps_restarts=1000",
            "--max_master_restarts=1000",
            f"--liveness_timeout={FLAGS.liveness_timeout}",
            f"--heartbeat_timeout={FLAGS.heartbeat_timeout}",
            "--progress_interval=30", "--", sys.executable, SCRIPT,
            f"--data={data_dir}/*.tfrecord", f"--epochs={epochs}", f"--output={out}",
            f"--sleep_per_batch={FLAGS.sleep_per_batch}"]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get(
        "PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="2")
    log_path = os.path.join(root, f"launcher-{index}.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        while _tasks_done(_status(job)) < 2:
            if proc.poll() is not None:
                return [f"job {index} ended before training: see {log_path}"]
            time.sleep(0.5)
        while time.monotonic() < deadline and len(faults) < max_faults and (
                proc.poll() is None):
            time.sleep(rng.uniform(2.0, 8.0))
            status = _status(job)
            if status is None or _finished(status):
                continue
            if not round_:
                round_.extend(rng.sample(ROLE_CLASSES, len(ROLE_CLASSES)))
            members = {"master": ["master"], "ps": ["ps-0", "ps-1"],
                       "worker": [f"worker-{w}" for w in status["workers"]["alive"]]
                       }[round_[0]]
            if not members:
                continue
            role, kind = rng.choice(members), rng.choice(KINDS)
            pid = _pid_of(_cluster(job), role)
            if not _alive(pid):
                continue
            round_.pop(0)
            done = _tasks_done(status)
            injected = time.monotonic()
            if kind == "kill":
                os.kill(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGSTOP)
                if kind == "freeze":
                    time.sleep(rng.uniform(1.0, FLAGS.liveness_timeout / 2))
                    if _alive(pid):
                        os.kill(pid, signal.SIGCONT)
            lost = _healthy_again(job, role, pid, kind, done, injected, timeout=300)
            faults.append({"job": index, "at": round(injected - started, 1),
                           "role": role, "kind": kind, "pid": pid,
                           "seconds_lost": None if lost is None else round(lost, 1)})
            logging.info("fault %d (job %d): %s of %s (pid %d) at %.0f s: %s",
                         len(faults), index, kind, role, pid, injected - started,
                         "not recovered" if lost is None
                         else f"healthy again in {lost:.1f} s")
        proc.wait(timeout=max(600, epochs * 20))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    problems = [] if proc.returncode == 0 else [
        f"job {index} exited with {proc.returncode} ({log_path})"]
    problems += [f"job {index}: {p}" for p in _traced(
        job, [f for f in faults if f["job"] == index])]
    return problems + [f"job {index}: {p}" for p in _exact(job, out, epochs)]


def _traced(job: str, faults: list[dict]) -> list[str]:
    """The faults of a job its summary.json shows too few of: each process
    of a class killed or frozen for good adds one to its count (TRACES), at
    least (a process frozen for good and then killed, before the job found it
    silent, is one)."""
    try:
        with open(os.path.join(job, "summary.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError) as e:
        return [f"no summary: {e}"]
    for fault in faults:
        fault["summary"] = {key: summary.get(key) for key in TRACES.values()}
    problems = []
    for cls, key in TRACES.items():
        injected = len({f["pid"] for f in faults if role_class(f["role"]) == cls
                        and f["kind"] != "freeze"})
        if (summary.get(key) or 0) < injected:
            problems.append(f"{injected} process(es) of the {cls} class killed or "
                            f"frozen for good, but the summary's {key} is "
                            f"{summary.get(key)}")
    return problems


def soak(root: str, minutes: float, seed: int, max_faults: int, target: int = 0
         ) -> int:
    """Counting jobs one after the other, under faults, for `minutes` (with
    `target`: until that many faults, `minutes` a cap)."""
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
                             deadline, faults, max_faults, round_)
        jobs += 1
    if target and len(faults) < target:
        problems.append(f"only {len(faults)} of the {target} faults asked for "
                        f"within the cap of {minutes:g} minutes")
    return _report(root, faults, problems, jobs, time.monotonic() - started)


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
            elapsed: float) -> int:
    print(f"chaos soak: {len(faults)} faults in {elapsed / 60:.1f} min over {jobs} "
          f"counting job(s) of {FLAGS.epochs} epochs, 2 workers, 2 parameter servers")
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
    unrecovered = [f for f in faults if f["seconds_lost"] is None]
    if unrecovered:
        problems = problems + [f"{len(unrecovered)} fault(s) not recovered within "
                               f"300 s: {unrecovered[:3]}"]
    print("result: EXACT (counting model and ledger of every job)" if not problems
          else "result: NOT EXACT: " + "; ".join(problems))
    with open(os.path.join(root, "faults.json"), "w") as f:
        json.dump({"faults": faults, "problems": problems, "jobs": jobs}, f, indent=1)
    return 0 if not problems else 1


def main(argv) -> None:
    del argv
    minutes, max_faults, target = FLAGS.minutes, FLAGS.max_faults, FLAGS.faults
    if FLAGS.smoke:
        target = target or 3
        minutes = minutes if FLAGS["minutes"].present else 10.0
        FLAGS.epochs = min(FLAGS.epochs, 20)
    if target:
        max_faults = min(max_faults, target)
    job_dir = FLAGS.job_dir or tempfile.mkdtemp(prefix="chaos-soak-")
    sys.exit(soak(job_dir, minutes, FLAGS.seed, max_faults, target))


if __name__ == "__main__":
    app.run(main)

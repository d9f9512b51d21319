"""Fault injection: kill, freeze or hang a role at a named point of the code.

For tests of what survives a crash, a freeze or a hang at a precise moment
(like etcd's or TiKV's failpoints). Off unless the environment variable
`KERAS_ELASTIC_FAULTS` is set: a comma-separated list of `POINT@N[:WHO][=ACTION]`
entries. The N-th time POINT is reached (in the role WHO only, if given:
`w<ID>` a worker, `ps<I>` a parameter server, `ps<I>b` its backup, `master`),
ACTION happens:

- `kill` (the default): SIGKILL of the process;
- `freeze`: SIGSTOP of the process, for good (it holds its sockets and
  answers nothing; only SIGKILL or SIGCONT ends that);
- `hang`: the thread that reached the point blocks for good while the rest
  of the process (a worker's heartbeats, a server's other calls) goes on;
- `cut`: from then on the process answers every call but health checks
  with UNAVAILABLE (only a server: `common/rpc.make_server`): the workers
  are cut off from it, as in a network partition, while the launcher's
  health checks still get through. A replacement process runs clean;
- `hold`: the thread that reached the point writes `ENTRY.held` (its pid)
  in `KERAS_ELASTIC_FAULTS_DIR` and waits there until `ENTRY.go` exists
  (`release`): a test waits for that moment (`wait_held`), does what is
  done from outside (a SIGSTOP, a partition of the machine), then lets
  the thread go on. The fault's moment is the code's, not a guess from
  polling the job's status.

The points:

- `after_claim` (worker): a task was claimed on the parameter servers, nothing
  of it pushed yet;
- `mid_push` (worker): a push reached the first of its servers, not the others
  (with one server: it was applied, its reply never read);
- `after_push` (worker): a push was applied everywhere, the trained tasks not
  reported;
- `epoch_end` (worker): at the epoch barrier: the worker's stream ran out (or
  ended a segment, see `common/keras_compat.py`), its last tasks trained and
  pushed, not reported;
- `validation` (worker): during a validation round, after the first evaluated
  task;
- `follower_sync` (worker, not the chief): at the start of a fit, an
  evaluate or a predict call, the chief passed the sync point and this
  worker is about to take the point's values (worker/session.py);
- `fit_end` (worker): `fit` trained the job's last epoch and is about to
  return (the script goes on after it);
- `task_end` (worker): in an evaluation or a prediction, a task's batches
  are all evaluated or predicted, the task not reported (a prediction's
  outputs not written): the worker holds it, so a kill there requeues it;
- `ps_push` (parameter server): a push arrived, before it is applied;
- `ps_flush` (parameter server): a worker's flush (every worker's at its
  epoch's end) arrived, before it is answered;
- `ps_forward` (parameter server with a backup): a call that changes its state
  (a push, a claim, ...) was applied here, not yet forwarded to the backup;
- `master_task` (master): a worker asked for a task, before one is handed out.

With `KERAS_ELASTIC_FAULTS_DIR` set, each entry fires once per job, not once
per process: a marker file in that directory records that it fired, so a
replacement of the role (a restarted server has the same WHO) runs clean.

Example:

```bash
KERAS_ELASTIC_FAULTS=mid_push@5:w1,ps_push@40:ps0=freeze \\
    keras-elastic run --num_workers 2 -- python train.py
```
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time

ENV = "KERAS_ELASTIC_FAULTS"
DIR_ENV = "KERAS_ELASTIC_FAULTS_DIR"
POINTS = ("after_claim", "mid_push", "after_push", "epoch_end", "validation",
          "follower_sync", "fit_end", "task_end", "ps_push", "ps_flush", "ps_forward",
          "master_task")
ACTIONS = ("kill", "freeze", "hang", "cut", "hold")

_lock = threading.Lock()
_counts: dict[str, int] = {}
_plan: dict[str, Fault] | None = None
_role: str | None = None
_cut = threading.Event()  # the `cut` action happened in this process


@dataclasses.dataclass(frozen=True)
class Fault:
    """One entry of the plan: ACTION the COUNT-th time the point is reached."""

    entry: str
    count: int
    action: str = "kill"


def set_role(role: str | None) -> None:
    """Names this process's role for `:WHO` entries (`ps0`, `master`); a
    worker's is `w<KERAS_ELASTIC_WORKER_ID>` without this. Call it before the
    first point is reached."""
    global _role, _plan
    _role = role
    _plan = None


def _parse(text: str, role: str) -> dict[str, Fault]:
    plan = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        spec, _, action = item.partition("=")
        point, _, rest = spec.partition("@")
        count, _, who = rest.partition(":")
        if point not in POINTS or not count.isdigit() or action and (
                action not in ACTIONS):
            raise ValueError(f"{ENV}: bad entry {item!r}; expected POINT@N[:WHO]"
                             f"[=ACTION] with POINT one of {POINTS} and ACTION one "
                             f"of {ACTIONS}")
        if who and who != role:
            continue
        plan[point] = Fault(item, int(count), action or "kill")
    return plan


def _load() -> dict[str, Fault]:
    global _plan
    if _plan is None:
        role = _role or f"w{os.environ.get('KERAS_ELASTIC_WORKER_ID', '')}"
        _plan = _parse(os.environ.get(ENV, ""), role)
    return _plan


def _file(directory: str, entry: str, suffix: str) -> str:
    name = "".join(c if c.isalnum() or c in "@_-" else "_" for c in entry)
    return os.path.join(directory, name + suffix)


def _marker(fault: Fault) -> str | None:
    directory = os.environ.get(DIR_ENV)
    if not directory:
        return None
    return _file(directory, fault.entry, ".fired")


def _first_time(fault: Fault) -> bool:
    """Records that `fault` fires; False if it fired before in this job."""
    marker = _marker(fault)
    if marker is None:
        return True
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def due(point: str) -> str | None:
    """Counts `point`; the action if this is the time the plan says to act
    there (else None). For points where the caller does part of the work
    first (see `act`)."""
    plan = _load()
    fault = plan.get(point)
    if fault is None:
        return None
    with _lock:
        _counts[point] = _counts.get(point, 0) + 1
        if _counts[point] != fault.count or not _first_time(fault):
            return None
    return fault.action


def is_cut() -> bool:
    """Whether a `cut` cut this process off from the job's other roles."""
    return _cut.is_set()


def act(point: str, action: str = "kill") -> None:
    """Does `action` here, saying where."""
    what = "SIGKILL" if action == "kill" else action
    sys.stderr.write(f"keras_elastic fault injection: {what} at '{point}', "
                     f"pid {os.getpid()}\n")
    sys.stderr.flush()
    if action == "cut":
        _cut.set()
        return
    if action == "hang":
        threading.Event().wait()
    if action == "hold":
        _hold(point)
        return
    os.kill(os.getpid(), signal.SIGSTOP if action == "freeze" else signal.SIGKILL)


def reached(point: str) -> None:
    """Counts `point`; acts if the plan says so."""
    action = due(point)
    if action is not None:
        act(point, action)


def _hold(point: str) -> None:
    """`hold` (module docstring): ENTRY.held, then wait for ENTRY.go."""
    fault = _load()[point]
    directory = os.environ.get(DIR_ENV)
    if not directory:
        raise RuntimeError(f"{ENV}: {fault.entry!r} holds, which needs {DIR_ENV} "
                           "(the directory where a test releases it)")
    held = _file(directory, fault.entry, ".held")
    with open(held + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(held + ".tmp", held)
    go = _file(directory, fault.entry, ".go")
    while not os.path.exists(go):
        time.sleep(0.02)


def wait_held(directory: str, entry: str, timeout: float = 300.0) -> int:
    """Waits until the `hold` fault `entry` (as written in the plan, e.g.
    `"master_task@20:master=hold"`) holds a thread; returns its process's pid.
    Raises TimeoutError naming the entry.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> open(_file(d, "ps_push@3=hold", ".held"), "w").write("4242")
    4
    >>> wait_held(d, "ps_push@3=hold", timeout=1)
    4242
    >>> release(d, "ps_push@3=hold")
    """
    held = _file(directory, entry, ".held")
    deadline = time.monotonic() + timeout
    while not os.path.exists(held):
        if time.monotonic() > deadline:
            raise TimeoutError(f"fault {entry!r} was not reached in {timeout:g} s "
                               f"(no {held})")
        time.sleep(0.02)
    with open(held) as f:
        return int(f.read())


def fired(directory: str, entry: str) -> bool:
    """Whether the fault `entry` fired in the job whose faults directory is
    `directory` (its marker: module docstring). For a test that waits until
    one role's fault has happened before it lets another go on.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> fired(d, "task_end@1:w1")
    False
    >>> open(_file(d, "task_end@1:w1", ".fired"), "w").close()  # as it fires
    >>> fired(d, "task_end@1:w1")
    True
    """
    return os.path.exists(_file(directory, entry, ".fired"))


def release(directory: str, entry: str) -> None:
    """Lets the thread the `hold` fault `entry` holds go on."""
    os.close(os.open(_file(directory, entry, ".go"), os.O_CREAT | os.O_WRONLY))

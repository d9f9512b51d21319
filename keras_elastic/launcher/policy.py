"""What the launcher decides, as functions of what it observed.

The launcher (`launcher.py`) is the mechanism: it starts, watches, stops and
recovers roles on a backend. Every decision it takes about them is made here,
from a plain description of the job's state, so that each rule can be tested
without a process (tests/test_launcher_policy.py), in the manner of Ray
Train's `FailurePolicy` and torch elastic's agent:

- `FailurePolicy.on_worker_death`: relaunch a worker that died, wait for room
  on the backend, ignore it (the job is over), or fail the job (restart
  budget spent; every recent worker failed the same way with no progress);
- `FailurePolicy.restart_service`: restart a dead parameter server or master,
  or fail the job (its restart budget spent);
- `desired_workers` and `scale_steps`: how many workers the job should have
  (`--num_workers`, `keras-elastic scale`, nodes that joined) and what to
  start or stop to get there;
- `blame_overdue`: which worker holding a task far too long is to blame
  (not when a server it waits for was in trouble meanwhile);
- `ServiceLiveness`: which service (the master, a parameter server) is lost
  although its process lives (frozen, deadlocked, cut off from the
  workers): from the launcher's health checks and what the workers report
  waiting on.

Example:

>>> policy = FailurePolicy(max_worker_restarts=3, num_workers=2)
>>> death = WorkerDeath(worker_id=0, cause="Killed", tasks_done=5)
>>> policy.on_worker_death(JobView(deaths=[death])).action
'relaunch'
>>> policy.on_worker_death(JobView(deaths=[death], restarts_used=3)).action
'fail_budget'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

RELAUNCH = "relaunch"
WAIT_FOR_ROOM = "wait_for_room"
IGNORE = "ignore"
FAIL_BUDGET = "fail_budget"
FAIL_SAME_FAILURE = "fail_same_failure"
FAIL_UNFIXABLE = "fail_unfixable"

# Exceptions a relaunch cannot fix: the worker's script differs from the
# job's (other arrays, another call or compile: master/client.py).
UNFIXABLE = frozenset({"JobMismatchError"})
# Exceptions of the machine or the cluster, not of the script: two workers
# dying of one of them in a row may well live when relaunched.
TRANSIENT = frozenset({
    "ConnectionError", "ConnectionResetError", "ConnectionRefusedError",
    "BrokenPipeError", "TimeoutError", "MemoryError", "KeyboardInterrupt",
    "SystemExit", "OSError", "RpcError", "_InactiveRpcError", "UnavailableError",
    "DeadlineExceededError", "AbortedError", "CancelledError",
    "ResourceExhaustedError", "JobFailedError", "JobRolledBackError",
    "WorkerLostError", "TaskNotHeldError"})


@dataclasses.dataclass(frozen=True)
class WorkerDeath:
    """A worker that exited with an error or was lost.

    `cause`: the last line of its log, or why its node lost it (two deaths
    with the same cause failed the same way); `tasks_done`: the job's tasks
    done when it died; `exception` and `where`: the exception its log's
    traceback ends with (class name) and where it was raised, "" without one
    (`launcher/exit_cause.py`)."""

    worker_id: int
    cause: str
    tasks_done: int
    exception: str = ""
    where: str = ""

    @property
    def script_error(self) -> bool:
        """The script raised (an exception of its own or of a library it
        calls), not the machine or the cluster."""
        return bool(self.exception) and self.exception not in TRANSIENT


@dataclasses.dataclass(frozen=True)
class JobView:
    """What the launcher knows when a worker dies.

    `deaths`: every worker death so far, the new one last; `job_over`: every
    dataset is done (a lost worker need not come back); `restarts_used`:
    relaunches so far; `pending_slots`: lost workers waiting for room;
    `room_for_worker`: the backend has room for one more now."""

    deaths: list[WorkerDeath]
    job_over: bool = False
    restarts_used: int = 0
    pending_slots: int = 0
    room_for_worker: bool = True


@dataclasses.dataclass(frozen=True)
class Decision:
    action: str
    streak: int = 0   # FAIL_SAME_FAILURE: how many deaths failed the same way


class FailurePolicy:
    """The restart budgets and the rules for spending them."""

    def __init__(self, max_worker_restarts: int, num_workers: int,
                 max_ps_restarts: int = 0, max_master_restarts: int = 0) -> None:
        self.max_worker_restarts = max_worker_restarts
        self.num_workers = num_workers
        self.max_ps_restarts = max_ps_restarts
        self.max_master_restarts = max_master_restarts

    def on_worker_death(self, view: JobView) -> Decision:
        if view.job_over:
            return Decision(IGNORE)
        if view.deaths and view.deaths[-1].exception in UNFIXABLE:
            return Decision(FAIL_UNFIXABLE, 1)
        if view.restarts_used + view.pending_slots >= self.max_worker_restarts:
            # The budget is a hard bound: one more death fails the job.
            return Decision(FAIL_BUDGET)
        streak = self.same_failure_streak(view.deaths)
        if streak:
            return Decision(FAIL_SAME_FAILURE, streak)
        if not view.room_for_worker:
            return Decision(WAIT_FOR_ROOM)
        return Decision(RELAUNCH)

    def same_failure_streak(self, deaths: list[WorkerDeath]) -> int:
        """2 if the last two worker deaths were the script raising the same
        exception at the same place (a bug every worker runs into: the
        relaunch would too, whatever the others trained meanwhile); N if the
        last N = num_workers + 1 worker deaths had the same cause and no
        task was done from the first to the last (a script that crashes
        deterministically: relaunching cannot help); else 0."""
        if len(deaths) >= 2 and deaths[-1].script_error and len({
                (d.cause, d.exception, d.where) for d in deaths[-2:]}) == 1:
            return 2
        n = self.num_workers + 1
        last = deaths[-n:]
        if len(last) < n or len({d.cause for d in last}) != 1:
            return 0
        if not last[0].cause or last[-1].tasks_done != last[0].tasks_done:
            return 0
        return n

    def restart_service(self, kind: str, restarts_used: int) -> bool:
        """Whether a dead parameter server (`kind="ps"`, the budget shared by
        the servers) or master (`"master"`) is restarted; False: the job
        fails."""
        budget = {"ps": self.max_ps_restarts, "master": self.max_master_restarts}[kind]
        return restarts_used < budget


def desired_workers(num_workers: int, bounds: tuple[int, int],
                    requested: int | None = None, requested_at: float = 0.0,
                    grown_to: int = 0, grown_at: float = 0.0,
                    autoscaled: int | None = None, autoscaled_at: float = 0.0) -> int:
    """How many workers the job should run: the newest of `keras-elastic
    scale`'s `requested` number, the autoscaler's `autoscaled` one and, when
    nodes joined (`grown_at`), `grown_to` (`--max_workers`), clamped to
    `bounds`; else `--num_workers`. (A request written after the
    autoscaler's last decision wins until its next one.)

    >>> desired_workers(2, (1, 4), requested=9, requested_at=5.0)
    4
    >>> desired_workers(2, (1, 4), requested=3, requested_at=5.0, grown_to=4,
    ...                 grown_at=6.0)
    4
    >>> desired_workers(1, (1, 3), requested=1, requested_at=5.0, autoscaled=2,
    ...                 autoscaled_at=7.0)
    2
    """
    lo, hi = bounds
    sources = [(at, n) for at, n in ((grown_at, grown_to or None),
                                     (autoscaled_at, autoscaled),
                                     (requested_at, requested)) if n is not None]
    if not sources:
        return num_workers
    # max() keeps the first of equal times: a request ties in its favour.
    _, wanted = max(reversed(sources), key=lambda s: s[0])
    return min(max(wanted, lo), hi)


@dataclasses.dataclass(frozen=True)
class ScaleSteps:
    """What to do to reach the desired number of workers: relaunch
    `fill_pending` lost workers that waited for room, start `start` new
    ones, drop `drop_pending` waiting slots, and stop `stop` running
    workers (the highest ids)."""

    fill_pending: int = 0
    start: int = 0
    drop_pending: int = 0
    stop: int = 0


def scale_steps(running: int, pending: int, desired: int, room: int | None) -> ScaleSteps:
    """`room`: how many more workers the backend can place now (None: no
    limit).

    >>> scale_steps(running=1, pending=1, desired=3, room=None)
    ScaleSteps(fill_pending=1, start=1, drop_pending=0, stop=0)
    >>> scale_steps(running=3, pending=1, desired=2, room=0)
    ScaleSteps(fill_pending=0, start=0, drop_pending=1, stop=1)
    """
    def take(wanted: int) -> int:
        nonlocal room
        if room is None:
            return wanted
        got = max(0, min(wanted, room))
        room -= got
        return got

    fill = take(pending)
    pending -= fill
    running += fill
    start = take(max(0, desired - running - pending))
    running += start
    drop = min(pending, max(0, running + pending - desired))
    pending -= drop
    stop = max(0, running + pending - desired)
    return ScaleSteps(fill_pending=fill, start=start, drop_pending=drop, stop=stop)


class ServiceLiveness:
    """When a service that still runs is lost. The clock is the caller's
    (monotonic seconds), so every rule is tested without processes or waiting.

    A service is lost when

    - it answered no health check for `timeout` seconds; or
    - it answered none for `confirm` seconds (default: a quarter of
      `timeout`, at least three probes) while a worker could not reach it
      for as long (`reported`: its calls failed as UNAVAILABLE, not merely
      slow): two observers agree that it is gone, so the launcher need not
      wait the whole timeout; or
    - it answers health checks, a live worker has waited `timeout` seconds
      for it, and no other live worker reached it meanwhile (`reported`'s
      `reached`: an answer more than `interval` seconds after the wait
      began, not a call that crossed the cut nor the mere absence of a
      wait; a worker idle at its epoch's end asks the servers it has not
      heard from, `PSClient.probe_idle`): the workers are cut off from it (a network
      partition, a wedged servicer behind a live health service), and the
      job cannot go on with it. Unless the same workers, and not all of
      them, waited on it before it was last replaced for that: then they
      are the ones cut off (`cut_off_workers`), not a second server.

    One missed answer is nothing, and neither is a server that is slow but
    there (a long GC pause, a busy server, a process stopped for a while:
    calls hang rather than fail): only `timeout` seconds of it count. Time
    the observer itself did not run (the launcher's machine or process
    stalled: `observed` is called every `interval` seconds, and a gap much
    longer than that is the observer's own) is not counted as the services'
    silence; a round the observer spent waiting on a silent service's answer
    (up to `deadline` seconds, so a round lasts at most `interval +
    deadline`) is not a stall. A worker's wait counts only from the service's (re)start and
    from the end of the last recovery (`recovered`: a server paused for a
    rollback makes workers wait too).

    >>> live = ServiceLiveness(timeout=60, interval=2)
    >>> live.started("ps-0", now=0.0)
    >>> live.observed({"ps-0": False}, now=2.0)
    >>> live.observed({"ps-0": False}, now=61.0)  # a stall of the observer
    >>> live.lost(now=61.0)
    []
    >>> for t in range(63, 125, 2):
    ...     live.observed({"ps-0": False}, now=float(t))
    >>> live.lost(now=123.0)
    ['ps-0']
    >>> live.why("ps-0", now=123.0)
    'answered no health check for 66 s (--liveness_timeout=60)'
    """

    def __init__(self, timeout: float, interval: float,
                 confirm: float | None = None, deadline: float = 0.0) -> None:
        self.timeout = timeout
        self.interval = interval
        # The longest a round of health checks waits for answers.
        self.deadline = deadline
        self.confirm = (confirm if confirm is not None
                        else min(timeout, max(3 * interval, timeout / 4)))
        self._last_ok: dict[str, float] = {}
        self._started: dict[str, float] = {}
        self._last_observed: float | None = None
        self._recovered = float("-inf")
        # From the last `reported`: role -> (since when some worker could not
        # reach it, those workers) and role -> (since when every live worker
        # waits on it, the workers).
        self._unreachable: dict[str, tuple[float, list[int]]] = {}
        self._waited: dict[str, tuple[float, list[int]]] = {}
        # Per live worker: role -> since when its calls could not reach it.
        self._cut: dict[int, dict[str, float]] = {}
        self._alive: list[int] = []
        # Per live worker: role -> when it last answered the worker.
        self._reached: dict[int, dict[str, float]] = {}
        # Role -> the workers whose waits last made it lost as cut off.
        self._replaced_for: dict[str, frozenset[int]] = {}

    def started(self, role: str, now: float) -> None:
        """A service (re)started: its silence counts from `now`."""
        self._last_ok[role] = now
        self._started[role] = now

    def forget(self, role: str) -> None:
        self._last_ok.pop(role, None)
        self._started.pop(role, None)
        self._unreachable.pop(role, None)
        self._waited.pop(role, None)

    def recovered(self, now: float) -> None:
        """A recovery (a restart, a rollback that paused the servers) ended:
        workers' waits before `now` were the recovery's."""
        self._recovered = now
        self._unreachable.clear()
        self._waited.clear()
        self._cut.clear()

    def observed(self, answers: dict[str, bool], now: float) -> None:
        """A round of health checks: `{role: answered SERVING}`."""
        if self._last_observed is not None:
            stalled = now - self._last_observed - self.interval - self.deadline
            if stalled > 2 * self.interval:
                for role in self._last_ok:
                    self._last_ok[role] += stalled
        self._last_observed = now
        for role, ok in answers.items():
            if ok or role not in self._last_ok:
                self._last_ok[role] = now

    def reported(self, waiting: dict[int, dict[str, float]],
                 unreachable: dict[int, dict[str, float]], alive: list[int],
                 now: float, reached: dict[int, dict[str, float]] | None = None
                 ) -> None:
        """What the workers wait on, as the master last heard it:
        `waiting`: {worker: {role: seconds its oldest call to role has
        waited}}; `unreachable`: {worker: {role: seconds since such a call
        first failed to reach it}}; `alive`: the job's live workers;
        `reached`: {worker: {role: seconds since role last answered it}}."""
        self._unreachable, self._waited, self._cut = {}, {}, {}
        self._alive = list(alive)
        self._reached = {w: {role: now - seconds for role, seconds in
                             (reached or {}).get(w, {}).items()} for w in alive}
        for w in alive:
            # A call that failed to reach the role, or hung on it (a partition
            # drops packets in silence: calls hang until keepalive gives up).
            seen = dict(waiting.get(w, {}))
            for role, seconds in unreachable.get(w, {}).items():
                seen[role] = max(seconds, seen.get(role, 0.0))
            for role, seconds in seen.items():
                if role in self._last_ok:
                    floor = max(self._started.get(role, float("-inf")), self._recovered)
                    self._cut.setdefault(w, {})[role] = max(now - seconds, floor)
        for role in self._last_ok:
            floor = max(self._started.get(role, float("-inf")), self._recovered)
            gone = {w: unreachable[w][role] for w in alive
                    if role in unreachable.get(w, {})}
            if gone:
                self._unreachable[role] = (max(now - max(gone.values()), floor),
                                           sorted(gone))
            waits = {w: waiting[w][role] for w in alive if role in waiting.get(w, {})}
            if not waits:
                continue
            since = max(now - min(waits.values()), floor)
            if any(self._reached_at(w, role) > since + self.interval
                   for w in alive if w not in waits):
                continue  # another worker reached it: `cut_off_workers`
            if (len(waits) < len(alive)
                    and set(waits) <= self._replaced_for.get(role, frozenset())):
                continue  # replaced once for these workers: `cut_off_workers`
            self._waited[role] = (since, sorted(waits))

    def _reached_at(self, worker: int, role: str) -> float:
        """When `role` last answered `worker` (-inf: not known)."""
        return self._reached.get(worker, {}).get(role, float("-inf"))

    def silent_for(self, role: str, now: float) -> float:
        return now - self._last_ok.get(role, now)

    def why(self, role: str, now: float) -> str | None:
        """Why `role` is lost (None while it is not)."""
        silent = self.silent_for(role, now)
        limit = f"(--liveness_timeout={self.timeout:g})"
        if silent >= self.timeout:
            return f"answered no health check for {silent:.0f} s {limit}"
        since, workers = self._unreachable.get(role, (now, []))
        if silent >= self.confirm and now - since >= self.confirm:
            return (f"answered no health check for {silent:.0f} s, and worker(s) "
                    f"{', '.join(map(str, workers))} could not reach it for "
                    f"{now - since:.0f} s {limit}")
        since, workers = self._waited.get(role, (now, []))
        if now - since >= self.timeout:
            if len(workers) == len(self._alive):
                waited = (f"every worker ({', '.join(map(str, workers))}) has "
                          f"waited {now - since:.0f} s for it")
            else:
                others = [w for w in self._alive if w not in workers]
                waited = (f"worker(s) {', '.join(map(str, workers))} waited "
                          f"{now - since:.0f} s for it and worker(s) "
                          f"{', '.join(map(str, others))} did not reach it since")
            if silent > 2 * self.interval + self.deadline:
                # What was observed: it is silent too, not only cut off.
                return (f"answered no health check for {silent:.0f} s, and "
                        f"{waited} {limit}")
            return (f"answers health checks, but {waited}: the workers are cut "
                    f"off from it {limit}")
        return None

    def cut_off_workers(self, now: float) -> dict[int, str]:
        """The workers cut off from a service the others reach: {worker: why}.
        A worker whose calls could not reach a service (or hung on it) for
        `timeout` seconds
        while the service answered health checks and another live worker
        reached it (a partition between that worker's machine and the
        service's) cannot go on, and nothing is wrong with the service: the
        worker is lost (its tasks go to others), not the service.

        A worker is cut off only on evidence: another worker reached the
        service since (`reported`'s `reached`), or the service was already
        replaced once for this worker's waits alone.

        >>> live = ServiceLiveness(timeout=60, interval=2)
        >>> live.started("ps-0", now=0.0)
        >>> for t in range(2, 70, 2):
        ...     live.observed({"ps-0": True}, now=float(t))
        ...     live.reported({1: {"ps-0": t - 4.0}}, {1: {"ps-0": t - 4.0}},
        ...                   alive=[0, 1], now=float(t), reached={0: {"ps-0": 0.1}})
        >>> live.cut_off_workers(now=63.0)
        {}
        >>> print(live.cut_off_workers(now=64.0)[1])  # doctest: +NORMALIZE_WHITESPACE
        could not reach ps-0 (or waited on it) for 60 s while it answered
        health checks and worker(s) 0 reached it: cut off from it
        (--liveness_timeout=60)
        """
        found = {}
        for worker, roles in sorted(self._cut.items()):
            for role, since in sorted(roles.items()):
                if now - since < self.timeout or self.silent_for(role, now) >= min(
                        self.confirm, 2 * self.interval + self.deadline):
                    continue
                others = sorted(w for w in self._alive
                                if w != worker and role not in self._cut.get(w, {})
                                and self._reached_at(w, role) > since + self.interval)
                if others:
                    evidence = (f"worker(s) {', '.join(map(str, others))} reached it")
                elif (worker in self._replaced_for.get(role, frozenset())
                      and len(self._cut) < len(self._alive)):
                    evidence = "it was replaced once already for this worker's waits"
                else:
                    continue  # no evidence against the worker: `why`
                found[worker] = (
                    f"could not reach {role} (or waited on it) for {now - since:.0f} s "
                    f"while it answered health checks and {evidence}: cut off from it "
                    f"(--liveness_timeout={self.timeout:g})")
                break
        return found

    def lost(self, now: float) -> list[str]:
        """The services lost (see the class doc), by name. The caller
        replaces them: one lost because its waiting workers were cut off
        from it is remembered with those workers."""
        reasons = {r: self.why(r, now) for r in self._last_ok}
        lost = sorted(r for r, why in reasons.items() if why is not None)
        for role in lost:
            if "cut off from it" in reasons[role]:
                self._replaced_for[role] = frozenset(self._waited[role][1])
        return lost


def blame_overdue(overdue: dict[int, float], services_fine_for: float,
                  waiting: Collection[int] = ()) -> list[int]:
    """The workers to declare lost among those the master finds `overdue`
    (`{worker: the limit, in seconds, its hold of a task passed}`: far longer
    than the dataset's tasks take): those whose servers were all fine for
    longer than that limit (`services_fine_for`: seconds since a server last
    missed a health check or was recovered), and which do not report
    `waiting` on a server now. A worker that waits for a server that hangs,
    or that it cannot reach, is not to blame: the server is found and
    replaced (`ServiceLiveness`), and the worker goes on.

    >>> blame_overdue({1: 90.0, 2: 30.0}, services_fine_for=60.0)
    [2]
    >>> blame_overdue({1: 90.0}, services_fine_for=float("inf"))
    [1]
    >>> blame_overdue({1: 90.0}, services_fine_for=float("inf"), waiting=[1])
    []
    """
    return sorted(w for w, limit in overdue.items()
                  if services_fine_for > limit and w not in waiting)

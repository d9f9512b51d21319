"""How many workers and parameter servers a job should have: the autoscale
policy (issue 43), a pure function of what the job measured.

No processes, no clock and no gRPC here (Ray Train's failure policy and
torch elastic's rendezvous are written the same way): the launcher hands
`decide` the windows it observed, newest last, and applies what it returns
(or not: `--autoscale` off). Each window (`Window`) is a stretch of training
at one size: the job's samples per second, the seconds the workers' steps
spent per phase (summed over workers: `compute`, `push`, `pull`,
`input_wait`), and each server's busy share (CPU seconds per second).

The rules, in order (each decision names its reason):

1. Nothing while the newest window (the job at its current sizes: the
   caller starts a new one at each change) is shorter than `settle_s`.
2. **Give back what did not help.** The last change added a worker (or a
   server) and the samples per second did not grow by `gain` over the
   window before it: it is removed again, and that size is remembered as
   the ceiling (`ceiling`), so it is not tried again.
3. **Servers are the wall.** The workers' steps spend more than
   `push_share` of their time in push + pull, and the busiest server is busy
   more than `server_busy` of a core: a server is added (up to `max_ps`).
   (A busy server with workers waiting on it: more servers split the
   variables, so each push is answered sooner.)
4. **Workers are the wall.** Otherwise, below `max_workers` and below the
   ceiling: a worker is added (the job's throughput grows with its workers
   until something shared saturates: rule 2 finds out).
5. **Too many servers.** Every server is busy less than `idle_busy` and
   push + pull is less than `idle_push_share` of the steps: one server is
   given back (down to `min_ps`).

Example:

>>> limits = Limits(min_workers=1, max_workers=4, min_ps=1, max_ps=2)
>>> w = Window(workers=1, servers=1, seconds=60, samples_per_s=100.0,
...            phases={"compute": 50, "push": 5, "pull": 3, "input_wait": 2},
...            server_busy=[0.2])
>>> d = decide([w], limits)
>>> (d.workers, d.servers), d.reason
((2, 1), 'add a worker: the steps are 83% compute, 13% push and pull; 2 of at most 4')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Window:
    """One stretch of training at one size, as the job measured it."""

    workers: int
    servers: int
    seconds: float  # how long it lasted
    samples_per_s: float  # the job's, all workers together
    phases: dict[str, float]  # seconds per phase, summed over the workers
    server_busy: list[float]  # each server's CPU seconds per second

    def share(self, *names: str) -> float:
        """The share of the workers' step time spent in the phases `names`."""
        total = sum(self.phases.get(p, 0.0) for p in
                    ("compute", "push", "pull", "input_wait"))
        return sum(self.phases.get(p, 0.0) for p in names) / total if total else 0.0


@dataclasses.dataclass(frozen=True)
class Limits:
    """--min_workers/--max_workers, and the servers' bounds (flags to come)."""

    min_workers: int
    max_workers: int
    min_ps: int
    max_ps: int


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """The policy's figures (module doc)."""

    settle_s: float = 30.0
    gain: float = 0.05
    push_share: float = 0.5
    server_busy: float = 0.8
    idle_busy: float = 0.2
    idle_push_share: float = 0.1


@dataclasses.dataclass(frozen=True)
class ScaleDecision:
    """The sizes the job should have, and why."""

    workers: int
    servers: int
    reason: str


def ceiling(history: Sequence[Window], thresholds: Thresholds = Thresholds()
            ) -> tuple[int | None, int | None]:
    """The worker and server counts that did not pay (rule 2), as (workers,
    servers), None where none: the smallest size whose step up from the one
    before it gained less than `thresholds.gain`.

    >>> a = Window(2, 1, 60, 200.0, {"compute": 1}, [0.5])
    >>> b = Window(3, 1, 60, 203.0, {"compute": 1}, [0.5])
    >>> ceiling([a, b])
    (3, None)
    """
    workers = servers = None
    for before, after in zip(history, history[1:]):
        if after.samples_per_s >= before.samples_per_s * (1 + thresholds.gain):
            continue
        if after.workers > before.workers and after.servers == before.servers:
            workers = after.workers if workers is None else min(workers, after.workers)
        if after.servers > before.servers and after.workers == before.workers:
            servers = after.servers if servers is None else min(servers, after.servers)
    return workers, servers


def decide(history: Sequence[Window], limits: Limits,
           thresholds: Thresholds = Thresholds()) -> ScaleDecision | None:
    """What the job should do after the windows `history` (oldest first; the
    newest at the job's current size): a `ScaleDecision`, or None (keep the
    sizes). See the module doc for the rules."""
    if not history:
        return None
    now = history[-1]
    if now.seconds < thresholds.settle_s:
        return None
    push = now.share("push", "pull")
    compute = now.share("compute")
    busiest = max(now.server_busy, default=0.0)
    # 2. the last change did not pay: undo it
    if len(history) >= 2:
        before = history[-2]
        grew = now.samples_per_s >= before.samples_per_s * (1 + thresholds.gain)
        if not grew and now.workers > before.workers and now.servers == before.servers:
            return ScaleDecision(before.workers, now.servers, (
                f"give back a worker: {now.workers} trained {now.samples_per_s:.0f} "
                f"samples/s, {before.workers} {before.samples_per_s:.0f} (less than "
                f"{thresholds.gain:.0%} more)"))
        if not grew and now.servers > before.servers and now.workers == before.workers:
            return ScaleDecision(now.workers, before.servers, (
                f"give back a server: {now.servers} served {now.samples_per_s:.0f} "
                f"samples/s, {before.servers} {before.samples_per_s:.0f} (less than "
                f"{thresholds.gain:.0%} more)"))
    worker_ceiling, server_ceiling = ceiling(history, thresholds)
    # 3. the servers are the wall
    if push > thresholds.push_share and busiest > thresholds.server_busy:
        if now.servers < limits.max_ps and (server_ceiling is None
                                            or now.servers + 1 < server_ceiling):
            return ScaleDecision(now.workers, now.servers + 1, (
                f"add a server: the steps are {push:.0%} push and pull, and the "
                f"busiest server is {busiest:.0%} busy; {now.servers + 1} of at "
                f"most {limits.max_ps}"))
        return None  # more workers would only wait on the servers too
    # 4. the workers are the wall
    if now.workers < limits.max_workers and (worker_ceiling is None
                                             or now.workers + 1 < worker_ceiling):
        return ScaleDecision(now.workers + 1, now.servers, (
            f"add a worker: the steps are {compute:.0%} compute, {push:.0%} push and "
            f"pull; {now.workers + 1} of at most {limits.max_workers}"))
    # 5. servers to spare
    if (now.servers > limits.min_ps and push < thresholds.idle_push_share
            and busiest < thresholds.idle_busy):
        return ScaleDecision(now.workers, now.servers - 1, (
            f"give back a server: the busiest is {busiest:.0%} busy and the steps "
            f"are {push:.0%} push and pull"))
    return None

"""The autoscaler: what `--autoscale` does while a job trains.

The policy (`launcher/autoscale.py`) is a pure function of windows of
measured training; this module makes those windows and applies the policy's
decisions. Three parts, each apart from the others:

- `WindowTracker` (no clock, no I/O): turns the job's observations (the
  master's status and the servers' CPU seconds, each with the time it was
  taken) into `autoscale.Window`s: one per stretch of training at one size.
  A window's figures leave out its first `warmup_s` (a worker just started
  traces its step and fills its pipeline), and a decision closes the window
  it was made on: nothing of the change's own cost (a new worker's
  TensorFlow import on the same machine) counts against the size before it.
- `ServerLoad`: a thread that asks each parameter server for its CPU seconds
  (its Status call) every few seconds, off the launcher's loop (a frozen
  server holds up this thread only).
- `Autoscaler`: at each new status of the job, observes, asks the policy,
  applies a change of the worker count (through the launcher's worker group,
  the way `keras-elastic scale` does), and keeps every decision with its
  reason for the log and summary.json (`record`).

The number of parameter servers is observed (their busy share decides
whether more workers would only wait on them) but not changed: servers
cannot be added to a running job yet, so the servers' bounds are the job's
`--num_ps`.

Example (the tracker alone):

>>> tracker = WindowTracker(warmup_s=5)
>>> for t in range(0, 41, 5):
...     tracker.observe(Observation(now=float(t), workers=1, servers=1, samples=10.0 * t,
...                                 phases={"compute": 0.9 * t, "push": 0.1 * t},
...                                 server_cpu=[0.2 * t]))
>>> w = tracker.history()[-1]
>>> (w.workers, w.seconds, w.samples_per_s, w.server_busy)
(1, 35.0, 10.0, [0.2])
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence

from absl import logging

from keras_elastic.launcher.autoscale import (
    Limits,
    ScaleDecision,
    Thresholds,
    Window,
    decide,
)
from keras_elastic.master.status import JobStatus


@dataclasses.dataclass(frozen=True)
class Observation:
    """The job at one moment: counters since the job (or the process) began."""

    now: float  # seconds (any monotonic clock)
    workers: int  # alive
    servers: int
    samples: float  # training samples done so far, every dataset
    phases: dict[str, float]  # seconds per phase so far, summed over the workers
    server_cpu: list[float] | None  # each server's CPU seconds; None: not known


def observe_status(status: JobStatus, servers: int, server_cpu: list[float] | None,
                   now: float) -> Observation | None:
    """The observation a status of the master gives; None while no training
    dataset is in progress (before the first, after the last, or in an
    evaluation-only job: there is no training throughput to size for)."""
    training = status.training_datasets()
    if not training or all(ds.finished for ds in training.values()):
        return None
    samples = float(sum(ds.tasks_done_total * ds.records_per_task
                        for ds in training.values()))
    return Observation(now=now, workers=len(status.workers.alive), servers=servers,
                       samples=samples, phases=dict(status.timings),
                       server_cpu=server_cpu)


class WindowTracker:
    """Observations to windows (module doc). `history()`: the windows so
    far, oldest first, the open one (if it has a figure yet) last."""

    def __init__(self, warmup_s: float, reopen_s: float = 120.0) -> None:
        self.warmup_s = warmup_s
        # A decision not applied after this long (no room for a worker):
        # the size it was made at gets a new window.
        self.reopen_s = reopen_s
        self._closed: list[Window] = []
        self._start: Observation | None = None  # the open window's first
        self._first: Observation | None = None  # its first after the warm-up
        self._last: Observation | None = None
        self._decided: Observation | None = None  # a decision awaits its size

    def observe(self, obs: Observation) -> None:
        size = (obs.workers, obs.servers)
        if self._decided is not None:
            waited = obs.now - self._decided.now
            if size == (self._decided.workers, self._decided.servers) and (
                    waited < self.reopen_s):
                return  # the change is under way
            self._decided = None
            self._open(obs)
            return
        if self._start is None or size != (self._start.workers, self._start.servers):
            self._close()
            self._open(obs)
            return
        if self._restarted(obs):
            # A rollback (fewer samples done) or a server restarted (its CPU
            # seconds count from 0): the figures start again from here.
            self._open(obs)
            return
        if self._first is None and obs.now - self._start.now >= self.warmup_s:
            self._first = obs
        self._last = obs

    def decided(self) -> None:
        """A decision was made on the open window: it is closed as it stands,
        and observations wait for the new size (or `reopen_s`)."""
        self._decided = self._last or self._start
        self._close()

    @property
    def awaiting_change(self) -> bool:
        """A decision waits for its new size (nothing is measured meanwhile)."""
        return self._decided is not None

    def history(self) -> list[Window]:
        now = self._window()
        return self._closed + ([now] if now is not None else [])

    def _open(self, obs: Observation) -> None:
        self._start, self._first, self._last = obs, None, obs
        if self.warmup_s <= 0:
            self._first = obs

    def _close(self) -> None:
        window = self._window()
        if window is not None:
            self._closed.append(window)
        self._start = self._first = self._last = None

    def _restarted(self, obs: Observation) -> bool:
        base = self._last
        if obs.samples < base.samples:
            return True
        if obs.server_cpu is not None and base.server_cpu is not None:
            return any(a < b for a, b in zip(obs.server_cpu, base.server_cpu))
        return False

    def _window(self) -> Window | None:
        first, last = self._first, self._last
        if first is None or last is None or last.now <= first.now:
            return None
        seconds = last.now - first.now
        phases = {p: max(0.0, last.phases.get(p, 0.0) - first.phases.get(p, 0.0))
                  for p in set(first.phases) | set(last.phases)}
        busy: list[float] = []
        if first.server_cpu is not None and last.server_cpu is not None and len(
                first.server_cpu) == len(last.server_cpu):
            busy = [round((b - a) / seconds, 3)
                    for a, b in zip(first.server_cpu, last.server_cpu)]
        return Window(workers=first.workers, servers=first.servers, seconds=seconds,
                      samples_per_s=(last.samples - first.samples) / seconds,
                      phases=phases, server_busy=busy)


class ServerLoad:
    """Each server's CPU seconds, asked every `interval` seconds by a daemon
    thread (`statuses()`: the servers' `ServerStatus`es, or an exception)."""

    def __init__(self, statuses: Callable[[], Sequence], interval: float = 2.0) -> None:
        self._statuses = statuses
        self.interval = interval
        self._lock = threading.Lock()
        self._cpu: list[float] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def latest(self) -> list[float] | None:
        """The newest CPU seconds per server; None before the first answer
        or after a failed round (a server down: no figure, not a stale one)."""
        with self._lock:
            return None if self._cpu is None else list(self._cpu)

    def poll_once(self) -> None:
        try:
            cpu = [float(s.cpu_seconds) for s in self._statuses()]
        except (ConnectionError, ValueError) as e:
            logging.log_every_n_seconds(logging.INFO, "autoscale: no server load: %s",
                                        30, e)
            cpu = None
        with self._lock:
            self._cpu = cpu

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="server-load")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.interval)


class Autoscaler:
    """Observes the job at each new status (`tick`), asks the policy, and
    applies a new worker count with `apply_workers` (module doc)."""

    def __init__(self, limits: Limits, thresholds: Thresholds,
                 server_cpu: Callable[[], list[float] | None],
                 apply_workers: Callable[[int], None], say: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic,
                 apply_servers: Callable[[int], None] | None = None) -> None:
        self.limits = limits
        self.thresholds = thresholds
        self.tracker = WindowTracker(warmup_s=thresholds.settle_s / 3,
                                     reopen_s=max(120.0, 4 * thresholds.settle_s))
        self._server_cpu = server_cpu
        self._apply_workers = apply_workers
        self._apply_servers = apply_servers
        self._say = say
        self._clock = clock
        self._began = clock()
        self.decisions: list[dict] = []

    def tick(self, status: JobStatus, servers: int) -> ScaleDecision | None:
        now = self._clock()
        obs = observe_status(status, servers, self._server_cpu(), now)
        if obs is None:
            return None
        self.tracker.observe(obs)
        history = self.tracker.history()
        if self.tracker.awaiting_change or not history or (
                history[-1].workers, history[-1].servers) != (obs.workers, obs.servers):
            return None  # a change under way, or no figure at this size yet
        decision = decide(history, self.limits, self.thresholds)
        if decision is None:
            return None
        window = history[-1]
        self.tracker.decided()
        self.decisions.append({
            "at_s": round(now - self._began, 1),
            "workers": [window.workers, decision.workers],
            "servers": [window.servers, decision.servers],
            "reason": decision.reason,
            "window": {"seconds": round(window.seconds, 1),
                       "samples_per_s": round(window.samples_per_s, 1),
                       "server_busy": window.server_busy}})
        self._say(f"[launcher] autoscale: {decision.reason} (the last "
                  f"{window.seconds:.0f} s at {window.workers} worker(s), "
                  f"{window.servers} server(s): "
                  f"{window.samples_per_s:.0f} samples/s)")
        if decision.workers != window.workers:
            self._apply_workers(decision.workers)
        if decision.servers != window.servers and self._apply_servers is not None:
            self._apply_servers(decision.servers)
        return decision

    def record(self) -> dict:
        """For summary.json: the decisions, and every window measured."""
        return {"decisions": list(self.decisions),
                "windows": [dataclasses.asdict(w) for w in self.tracker.history()]}

"""Health checks of the job's services, from the launcher.

A `HealthProber` thread calls the standard gRPC health-checking service
(`grpc.health.v1.Health/Check`, which every keras-elastic server serves:
`common/rpc.make_server`) of the master and of each parameter server every
`interval` seconds, all at once, each with a deadline, and feeds the answers
to a `policy.ServiceLiveness`, which decides when a service that still runs
is lost (no answer for `--liveness_timeout` seconds, or for less when the
workers report waiting on it too, or workers cut off from it). The launcher then
kills it (fencing: a frozen process must not wake up into the job) and runs
the recovery it runs for a service that died.

Example:

```python
liveness = ServiceLiveness(timeout=60, interval=2)
prober = HealthProber(liveness, interval=2)
prober.set_targets({"master": "127.0.0.1:5000", "ps-0": "127.0.0.1:5001"})
prober.start()
...
liveness.lost(time.monotonic())      # ['ps-0'] once it stopped answering
```
"""

from __future__ import annotations

import threading
import time

import grpc
from absl import logging
from grpc_health.v1 import health_pb2, health_pb2_grpc

from keras_elastic.common import rpc
from keras_elastic.launcher.policy import ServiceLiveness

SERVING = health_pb2.HealthCheckResponse.SERVING


def probe_deadline(liveness_timeout: float) -> float:
    """How long one health check may take: a third of the liveness timeout,
    within 1-5 s.

    >>> probe_deadline(60), probe_deadline(8), probe_deadline(1)
    (5.0, 2.6666666666666665, 1.0)
    """
    return max(1.0, min(5.0, liveness_timeout / 3))


class HealthProber:
    """Probes every target's health every `interval` seconds (a daemon
    thread); `deadline`: how long one answer may take."""

    def __init__(self, liveness: ServiceLiveness, interval: float,
                 deadline: float | None = None) -> None:
        self.liveness = liveness
        self.interval = interval
        self.deadline = deadline or probe_deadline(liveness.timeout)
        self._lock = threading.Lock()  # guards the targets and the liveness record
        self._targets: dict[str, tuple[str, grpc.Channel]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # When a server last missed a health check or was (re)started.
        self._last_trouble = time.monotonic()

    def set_target(self, role: str, address: str) -> None:
        """Probes `role` at `address` from now on; a (re)started service's
        silence counts from now."""
        with self._lock:
            old = self._targets.pop(role, None)
            if old is not None:
                old[1].close()
            self._targets[role] = (address, rpc.make_channel(address))
            self.liveness.started(role, time.monotonic())
            self._last_trouble = time.monotonic()

    def remove_target(self, role: str) -> None:
        """Stops probing `role` (a backup that was lost or promoted)."""
        with self._lock:
            old = self._targets.pop(role, None)
            if old is not None:
                old[1].close()
            self.liveness.forget(role)

    def set_targets(self, targets: dict[str, str]) -> None:
        for role, address in targets.items():
            self.set_target(role, address)

    def lost(self) -> list[str]:
        with self._lock:
            return self.liveness.lost(time.monotonic())

    def services_fine_for(self) -> float:
        """Seconds since a server last missed a health check or was
        (re)started: workers waiting on a server in that time are not to
        blame for their lack of progress (`policy.blame_overdue`)."""
        with self._lock:
            return time.monotonic() - self._last_trouble

    def silent_for(self, role: str) -> float:
        with self._lock:
            return self.liveness.silent_for(role, time.monotonic())

    def why(self, role: str) -> str | None:
        """Why `role` is lost, None while it is not (`ServiceLiveness.why`)."""
        with self._lock:
            return self.liveness.why(role, time.monotonic())

    def cut_off_workers(self) -> dict[int, str]:
        """Workers cut off from a service the others reach
        (`ServiceLiveness.cut_off_workers`)."""
        with self._lock:
            return self.liveness.cut_off_workers(time.monotonic())

    def reported(self, waiting: dict[int, dict[str, float]],
                 unreachable: dict[int, dict[str, float]], alive: list[int],
                 reached: dict[int, dict[str, float]] | None = None) -> None:
        """What the workers wait on and what answered them (the master's
        `workers.waiting`, `workers.unreachable` and `workers.reached`)."""
        with self._lock:
            self.liveness.reported(waiting, unreachable, alive, time.monotonic(),
                                   reached)

    def recovered(self) -> None:
        """A recovery ended: workers' waits so far were the recovery's."""
        with self._lock:
            self.liveness.recovered(time.monotonic())
            self._last_trouble = time.monotonic()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="health-prober")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.deadline + 5)
        with self._lock:
            for _, channel in self._targets.values():
                channel.close()
            self._targets.clear()

    def probe_once(self) -> dict[str, bool]:
        """One round: every target checked at once; `{role: SERVING}`."""
        with self._lock:
            targets = dict(self._targets)
        calls = {}
        for role, (_, channel) in targets.items():
            stub = health_pb2_grpc.HealthStub(channel)
            calls[role] = stub.Check.future(health_pb2.HealthCheckRequest(),
                                            timeout=self.deadline)
        answers = {}
        for role, call in calls.items():
            try:
                answers[role] = call.result().status == SERVING
            except grpc.RpcError as e:
                answers[role] = False
                logging.log_every_n_seconds(
                    logging.WARNING, "%s at %s did not answer a health check: %s",
                    10, role, targets[role][0], e.code().name)
        return answers

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            answers = self.probe_once()
            with self._lock:
                # A target replaced meanwhile starts afresh (set_target).
                answers = {r: ok for r, ok in answers.items() if r in self._targets}
                self.liveness.observed(answers, time.monotonic())
                if not all(answers.values()):
                    self._last_trouble = time.monotonic()

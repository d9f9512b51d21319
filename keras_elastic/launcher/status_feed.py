"""The master's job status, fetched off the launcher's loop.

The launcher's loop must never wait on a frozen master: it is the loop that
finds the master lost and replaces it (`services.check_master`). So the calls
to the master that the loop needs at every round (`GetStatus`, and
`ReportWorkerDead` for each worker that died) are made by a `StatusFeed`
thread; the loop reads the newest status the thread got (`latest`), and a
round whose status did not change waits for the next. A master that hangs
then holds up this thread only, while the loop goes on with its health checks,
kills the frozen master after `--liveness_timeout` and starts its
replacement; the thread's next call goes to the new master.

Example:

>>> from keras_elastic.master.client import MasterClient
>>> from keras_elastic.master.server import MasterServer
>>> server = MasterServer()
>>> client = MasterClient(server.address)
>>> feed = StatusFeed(lambda: client)
>>> feed.poll_once()                  # one round of the thread's (`start`)
True
>>> round_, status, asked_at = feed.latest()
>>> round_, status.workers.alive
(1, [])
>>> client.close(); server.stop()
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from absl import logging

from keras_elastic.master.client import MasterClient
from keras_elastic.master.status import JobStatus


class StatusFeed:
    """A thread that tells the master of dead workers (in order, again after
    a failure) and fetches the job's status every `interval` seconds, each
    call with a `timeout`; `master()` gives the master's client now (it
    changes when the master moves)."""

    def __init__(self, master: Callable[[], MasterClient | None],
                 interval: float = 0.2, timeout: float = 10.0) -> None:
        self._master = master
        self.interval = interval
        self.timeout = timeout
        self._lock = threading.Lock()
        self._round = 0
        self._status: JobStatus | None = None
        self._asked_at = float("-inf")  # when the newest status was asked for
        self._dead: list[tuple[int, str]] = []  # not yet told to the master
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def report_dead(self, worker_id: int, reason: str) -> None:
        """Tells the master that worker `worker_id` is gone, as soon as it
        answers (before the next status is fetched)."""
        with self._lock:
            self._dead.append((worker_id, reason))

    def latest(self) -> tuple[int, JobStatus | None, float]:
        """(the number of statuses fetched so far, the newest (None before the
        first), when it was asked for (`time.monotonic()`): it shows nothing
        that happened after)."""
        with self._lock:
            return self._round, self._status, self._asked_at

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="status-feed")
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread; one in a call stays (a daemon) until the call's
        deadline and is then dropped."""
        self._stop.set()

    def poll_once(self) -> bool:
        """One round (the thread's; the example calls it directly): dead workers told,
        then the status fetched. False if the master did not answer."""
        master = self._master()
        if master is None:
            return False
        try:
            while True:
                with self._lock:
                    if not self._dead:
                        break
                    worker_id, reason = self._dead[0]
                master.report_worker_dead(worker_id, reason, timeout=self.timeout)
                with self._lock:
                    self._dead.pop(0)
            asked_at = time.monotonic()
            status = master.job_status(timeout=self.timeout)
        except ConnectionError as e:
            logging.log_every_n_seconds(logging.WARNING, "%s", 10, e)
            return False
        with self._lock:
            self._round += 1
            self._status = status
            self._asked_at = asked_at
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.interval)

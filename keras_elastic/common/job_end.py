"""A worker notices in the job directory that its job ended without it.

A worker the job lost (cut off from the master by the network: its
heartbeats stopped, its tasks went to others) cannot hear from the master
that the job ended: it retries the master for `--connect_timeout` seconds
(default 300) and its calls in flight wait for their deadlines. A worker on
the launcher's machine is stopped by its launcher; one joined from another
machine (`keras-elastic join`) is nobody's child there. But the job
directory is shared: at its end the launcher writes `JOB_DIR/summary.json`,
whose `workers.lost_ids` name the workers it lost. So every launched or
joined worker watches the job directory from a daemon thread (`watch`, a
`stat` a second: it never blocks the worker's own threads, even on a mount
that hangs):

- the job ended and lists this worker among those it lost: the worker logs
  "the job ... ended without this worker" and exits at once (status
  `EXIT_LOST`), whatever its threads wait for: nothing it does can count in
  a job that is over;
- the job ended, this worker not lost (it was there at the end: a script
  still running after `fit`): it goes on, but retries of an unreachable
  master or parameter server stop at once (`rpc.retry_unreachable` asks
  `ended()`) instead of lasting `--connect_timeout`: the servers are gone
  for good.

A master or parameter server (`watch_service`) leaves as soon as the job
ended: the launcher stops its servers at the end, so one still running then
is one it could not reach (a server it replaced, on a node cut off from
the launcher's machine: fenced, and now gone too).

A worker on a machine that cannot reach the job directory sees no summary,
and gives up after `--connect_timeout` as before. A summary already there
when the watch starts counts only when it is newer than the job's
cluster.json (the rule `keras-elastic join` checks too): a worker that joined
as the job ended sees that it ended, while the summary of an earlier run of
a resumed job (the launcher writes cluster.json again at its start) does
not count until it is written again.

Example:

>>> import json, os, tempfile
>>> job_dir = tempfile.mkdtemp()
>>> w = Watch(job_dir, worker_id=lambda: 1, exit=lambda code: None, poll=0.01)
>>> w.ended() is None
True
>>> with open(os.path.join(job_dir, SUMMARY), "w") as f:
...     json.dump({"workers": {"lost_ids": [1], "exited": [0]}}, f)
>>> w.check()["workers"]["lost_ids"]
[1]
>>> w.lost
True
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable

from absl import logging

SUMMARY = "summary.json"
POLL_SECONDS = 1.0
# The exit status of a worker that left because its job ended without it.
EXIT_LOST = 3

_current: Watch | None = None
_current_lock = threading.Lock()


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def summary_is_newer(job_dir: str) -> bool:
    """Whether the job of `job_dir` ended: its summary.json was written after
    its cluster.json (a resumed job writes cluster.json again at its start);
    False when either is missing. What `keras-elastic join` checks too."""
    summary = _stamp(os.path.join(job_dir, SUMMARY))
    cluster = _stamp(os.path.join(job_dir, "cluster.json"))
    return summary is not None and cluster is not None and summary[1] >= cluster[1]


class Watch:
    """Watches `job_dir` for the job's end (see the module docstring).
    `worker_id()`: this worker's id now; `exit(status)`: how the process
    leaves (`os._exit` by default)."""

    def __init__(self, job_dir: str, worker_id: Callable[[], int],
                 exit: Callable[[int], None] | None = None,
                 poll: float = POLL_SECONDS, service: str | None = None) -> None:
        # `service`: a master or server's name: it leaves at any end.
        self.service = service
        self.job_dir = job_dir
        self.path = os.path.join(job_dir, SUMMARY)
        self._worker_id = worker_id
        self._exit = exit or _exit_now
        self._poll = poll
        # A summary already there counts if the job ended before this watch
        # began; an earlier run's (older than cluster.json) does not.
        self._start = None if summary_is_newer(job_dir) else _stamp(self.path)
        self._summary: dict | None = None
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def ended(self) -> dict | None:
        """The job's summary once it ended (as the watch saw it), else None.
        Never touches the file system."""
        return self._summary

    def check(self) -> dict | None:
        """Looks at the job directory once; the summary if the job ended."""
        if self._summary is not None:
            return self._summary
        stamp = _stamp(self.path)
        if stamp is None or stamp == self._start:
            return None
        try:
            with open(self.path) as f:
                summary = json.load(f)
        except (OSError, ValueError):
            return None  # being written: the next look
        self._summary = summary
        workers = summary.get("workers") or {}
        self.lost = (self.service is not None
                     or self._worker_id() in (workers.get("lost_ids") or []))
        return summary

    def start(self) -> Watch:
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="ke-job-end")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            summary = self.check()
            if summary is None:
                continue
            if not self.lost:
                logging.info("keras_elastic: the job of %s ended (%s); this worker "
                             "was there at its end", self.job_dir, self.path)
                return
            if self._stop.is_set():
                return
            if self.service is not None:
                line = (f"keras_elastic: the job of {self.job_dir} ended ({self.path});"
                        f" {self.service} exits (status {EXIT_LOST}): the launcher "
                        "stops its servers at the end, so it could not reach this one")
            else:
                line = (f"keras_elastic: the job of {self.job_dir} ended without this "
                        f"worker (id {self._worker_id()}: lost, cut off from the "
                        f"master; {self.path}); exiting (status {EXIT_LOST})")
            logging.error("%s", line)
            sys.stderr.write(line + "\n")
            self._exit(EXIT_LOST)
            return


def _exit_now(status: int) -> None:
    """Leaves at once: the worker's threads wait on servers that are gone."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    logging.flush()
    os._exit(status)


def exit_lost_on(error_type: type[BaseException]) -> None:
    """An uncaught `error_type` (the master presumed this worker lost:
    `master.client.WorkerLostError`) ends the process with status
    `EXIT_LOST` once its traceback is printed, not 1: `keras-elastic join`
    then starts the worker again while the job runs (the launcher does for
    a worker it started, whatever the status). Installed once per process."""
    previous = sys.excepthook
    if getattr(previous, "_keras_elastic_lost", False):
        return

    def hook(exc_type, exc, tb):
        previous(exc_type, exc, tb)
        if issubclass(exc_type, error_type):
            _exit_now(EXIT_LOST)

    hook._keras_elastic_lost = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def watch(job_dir: str, worker_id: Callable[[], int]) -> Watch:
    """Starts this process's watch of `job_dir` (replacing an earlier one)."""
    global _current
    with _current_lock:
        if _current is not None:
            _current.stop()
        _current = Watch(job_dir, worker_id).start()
        return _current


def stop() -> None:
    """Stops this process's watch (its worker closed normally)."""
    global _current
    with _current_lock:
        if _current is not None:
            _current.stop()
            _current = None


def ended() -> dict | None:
    """The summary of this process's job once it ended, else None (also
    without a watch). Cheap: no file system access."""
    current = _current
    return current.ended() if current is not None else None


def watch_service(job_dir: str, name: str) -> Watch:
    """A master's or parameter server's watch of `job_dir`: the process
    leaves once its job ended (module docstring). `name`: its name in the
    line it logs."""
    return Watch(job_dir, worker_id=lambda: -1, service=name).start()

"""`JOB_DIR/launcher.log`: the launcher's own log beside its roles' logs.

Each role logs to `JOB_DIR/ROLE.log`; the launcher's log records (what it
started, stopped, declared lost, recovered) and the lines it prints (progress,
the summary, a failure) go to the terminal and to `launcher.log`, so the job
directory tells the whole story of a job after its terminal is gone.

Writing it never fails the job: a disk error stops the file, not the launcher.

Example:

>>> import tempfile
>>> log = JobLog(tempfile.mkdtemp())
>>> log.say("[launcher] progress")
[launcher] progress
>>> log.close()
"""

from __future__ import annotations

import logging as pylogging
import os
from typing import TextIO

from absl import logging

from keras_elastic.launcher import console

FILE = "launcher.log"


class _QuietFileHandler(pylogging.FileHandler):
    """A file handler that goes quiet after a write error (a full disk)."""

    broken = False

    def emit(self, record: pylogging.LogRecord) -> None:
        if not self.broken:
            super().emit(record)

    def handleError(self, record: pylogging.LogRecord) -> None:  # noqa: N802
        self.broken = True


class JobLog:
    """The launcher's log records and printed lines, also in `JOB_DIR/launcher.log`."""

    def __init__(self, job_dir: str) -> None:
        self.path = os.path.join(job_dir, FILE)
        try:
            self._handler: _QuietFileHandler | None = _QuietFileHandler(self.path)
        except OSError:
            self._handler = None
            return
        self._handler.setFormatter(logging.PythonFormatter())
        logging.get_absl_logger().addHandler(self._handler)

    def say(self, text: str, stream: TextIO | None = None) -> None:
        """Prints `text` (to stdout by default) and writes it to the file."""
        console.write_line(text, stream)
        handler = self._handler
        if handler is None or handler.broken:
            return
        try:
            handler.acquire()
            try:
                handler.stream.write(text + "\n")
                handler.stream.flush()
            finally:
                handler.release()
        except (OSError, ValueError):
            handler.broken = True

    def close(self) -> None:
        if self._handler is not None:
            logging.get_absl_logger().removeHandler(self._handler)
            try:
                self._handler.close()  # (flushes: a full disk fails here)
            except OSError:
                pass
            self._handler = None

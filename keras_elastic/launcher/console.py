"""The launcher's terminal: whole lines, one writer at a time.

The launcher prints its own lines (progress, the summary, a failure) from its
main thread while a thread per role echoes that role's output (`[worker-0]
...`). Python's `print` writes a line's text and its newline separately, so
two writers can splice a role's line into the middle of one of the
launcher's. `write_line` writes a line and its newline in one call under one
lock, so every line on the terminal is one writer's.

Example:

>>> write_line("[launcher] progress")
[launcher] progress
"""

from __future__ import annotations

import sys
import threading
from typing import TextIO

_LOCK = threading.Lock()


def write_line(line: str | bytes, stream: TextIO | None = None) -> None:
    """Writes `line` and a newline to `stream` (stdout by default) in one
    call, under the console's lock, and flushes it."""
    stream = stream or sys.stdout
    buffer = getattr(stream, "buffer", None)
    with _LOCK:
        if buffer is not None:
            data = line if isinstance(line, bytes) else line.encode(
                stream.encoding or "utf-8", errors="replace")
            stream.flush()  # anything written to it as text before
            buffer.write(data + b"\n")
            buffer.flush()
        else:  # a text-only stream (a doctest's, a StringIO)
            text = line.decode(errors="replace") if isinstance(line, bytes) else line
            stream.write(text + "\n")
            stream.flush()

"""Why a worker died, read from the end of its log.

The launcher decides what a worker's death means (`launcher/policy.py`) from
its cause: the log's last line, and, when the log ends with a Python
traceback, the exception's type and where it was raised (the innermost
frame). Two workers that died of the same exception at the same place died
of the script, not of the machine; an exception keras-elastic raises for a
worker whose script differs from the job's (`JobMismatchError`: other arrays,
another call) cannot be fixed by running the same script again.

Example:

>>> tail = '''Traceback (most recent call last):
...   File "/job/train.py", line 7, in <module>
...     model.fit(x, y)
... ValueError: shapes (3, 4) and (5,) do not match'''
>>> cause = exit_cause(tail)
>>> cause.exception, cause.where
('ValueError', '/job/train.py:7')
>>> cause.text
'ValueError: shapes (3, 4) and (5,) do not match'
"""

from __future__ import annotations

import dataclasses
import re

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)')
_LOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")  # absl's, after the message
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)"
                        r"|[A-Za-z_][\w.]*\.[A-Z]\w*)(: |$)")


@dataclasses.dataclass(frozen=True)
class ExitCause:
    """`text`: the line that says why (the log's last one); `exception`: the
    type of the exception the log's last traceback ends with, as printed
    ("" if none); `where`: its innermost frame, "file:line"."""

    text: str
    exception: str = ""
    where: str = ""

    @property
    def exception_name(self) -> str:
        """The exception's class name without its module."""
        return self.exception.rsplit(".", 1)[-1]


def exit_cause(log_tail: str) -> ExitCause:
    """The cause of a death whose log ends with `log_tail`."""
    lines = [line.rstrip() for line in log_tail.splitlines() if line.strip()]
    if not lines:
        return ExitCause("(no output)")
    text = _strip_role(lines[-1]).strip()
    start = max((i for i, line in enumerate(lines)
                 if "Traceback (most recent call last):" in line), default=None)
    if start is None:
        return ExitCause(text)
    where, exception = "", ""
    for line in (_strip_role(line) for line in lines[start + 1:]):
        frame = _FRAME.match(line)
        if frame:
            where = f"{frame['file']}:{frame['line']}"
            continue
        found = _EXCEPTION.match(line)
        if found:
            exception = found["type"]
            text = line.strip()
        elif exception and line.strip() and not _LOG_LINE.match(line):
            # A message of several lines: its last says what to do (the
            # runner's hint after a checkpoint's mismatched variables).
            text = line.strip()
    return ExitCause(text, exception, where)


def _strip_role(line: str) -> str:
    """A line as the role wrote it (the launcher's echo prefixes `[worker-3] `)."""
    return re.sub(r"^\[[\w-]+\] ", "", line)

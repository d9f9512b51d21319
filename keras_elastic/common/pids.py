"""Whether a process of this machine is still running.

>>> import os
>>> pid_alive(os.getpid())
True
"""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True while process `pid` runs (a zombie, dead but not yet reaped by its
    parent, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # somebody else's process: it exists
    try:  # Linux: the state letter after the command name
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True

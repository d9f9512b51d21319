"""Every thread's stack on demand: `kill -USR1 PID` prints them to the
process's stderr (its log in the job directory), for a role that hangs.

The master, the parameter servers and the workers enable it at start; a
program that has its own SIGUSR1 handler keeps it.

Example:

>>> enable_stack_dumps()
"""

from __future__ import annotations

import faulthandler
import signal
import sys
import threading

_done = False


def enable_stack_dumps() -> None:
    """On SIGUSR1, writes every thread's Python stack to stderr (once per
    process; not where SIGUSR1 already has a handler, nor off the main
    thread, where a handler cannot be set)."""
    global _done
    if _done or not hasattr(signal, "SIGUSR1"):
        return
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None):
        return
    try:
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, OSError):  # a stderr without a file
        return
    _done = True

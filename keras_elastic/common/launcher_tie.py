"""Processes of a job die with their launcher.

The launcher puts its pid in `KERAS_ELASTIC_LAUNCHER_PID` for every process it
starts. `tie_to_launcher()`, called when `keras_elastic` is imported, then:

- on Linux, when the launcher is the direct parent, asks the kernel for
  SIGKILL at the parent's death (`prctl(PR_SET_PDEATHSIG)`): immediate, and
  no thread;
- otherwise (a worker started through a shell, a Ray actor, another OS),
  watches the launcher from a daemon thread (once a second) and kills this
  process when it is gone.

So a launcher killed with SIGKILL leaves no master, parameter server or
worker behind. (Done in the child rather than between fork and exec: a
`preexec_fn` makes Python fork the launcher, whose gRPC threads then crash
some children before they start.)

Example (what `import keras_elastic` does):

>>> tie_to_launcher()   # nothing happens outside a launched job
False
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading

from keras_elastic.common.pids import pid_alive

LAUNCHER_PID = "KERAS_ELASTIC_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1
_tied = False


def set_parent_death_signal() -> bool:
    """Whether the kernel now kills this process when its parent dies."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) == 0
    except (OSError, AttributeError):
        return False  # the watchdog below applies


def tie_to_launcher(interval: float = 1.0) -> bool:
    """Makes this process die with the launcher named in the environment;
    returns whether there is one."""
    global _tied
    raw = os.environ.get(LAUNCHER_PID)
    if not raw or _tied:
        return _tied
    try:
        launcher = int(raw)
    except ValueError:
        return False
    if launcher == os.getpid():
        return False  # the launcher itself (its environment is inherited)
    _tied = True
    by_kernel = os.getppid() == launcher and set_parent_death_signal()
    if not pid_alive(launcher):  # it died before the signal was set
        os.kill(os.getpid(), signal.SIGKILL)
    if by_kernel:
        return True

    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(interval):
            if not pid_alive(launcher):
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="ke-launcher-watch").start()
    return True


def forget() -> None:
    """Forgets the tie this process's image inherited (a warm process' fork:
    launcher/warm/child.py ties itself to its own launcher next)."""
    global _tied
    _tied = False

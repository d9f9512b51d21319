"""Starting and watching the processes of a local job (kept for existing imports).

The code lives in `keras_elastic.launcher.backends`: `local.ManagedProcess`
(a role as a child process of this machine) and `services.start_service` (start a
service, wait for its ready file), which works on any backend.

Example:

>>> import os
>>> from keras_elastic.launcher.processes import start_service
>>> os.makedirs("job", exist_ok=True)
>>> master, info = start_service("master", "keras_elastic.master", [], "job")
>>> master.terminate()
"""

from __future__ import annotations

from keras_elastic.launcher.backends.base import ProcessStartError
from keras_elastic.launcher.backends.local import ManagedProcess
from keras_elastic.launcher.backends.services import start_service

__all__ = ["ManagedProcess", "ProcessStartError", "start_service"]

"""Starting service roles (the master, parameter servers) and waiting until
they serve: `start_service` / `start_services`, on any backend (this
machine's processes by default).

Apart from `base.py` (the backend interface), which must not know its
implementations: this module sits above both.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence

from keras_elastic.common import auth
from keras_elastic.launcher.backends.base import Backend, ProcessStartError, RoleHandle
from keras_elastic.launcher.backends.local import LocalBackend


def start_service(name: str, module: str, args: Sequence[str], job_dir: str,
                  timeout: float = 120.0, echo: bool = False,
                  backend: Backend | None = None,
                  kind: str | None = None) -> tuple[RoleHandle, dict]:
    """Starts `python -m module args --ready_file ...` on `backend` (default:
    this machine); waits until it serves; returns its handle and the ready
    file's content (`{"address": ..., "pid": ...}`).

    >>> os.makedirs("job", exist_ok=True)
    >>> handle, info = start_service("master", "keras_elastic.master", [], "job")
    >>> info["address"]
    '127.0.0.1:...'
    >>> handle.terminate()
    """
    return start_services([(name, module, args)], job_dir, timeout, echo, backend,
                          kind)[0]


def start_services(services: Sequence[tuple[str, str, Sequence[str]]], job_dir: str,
                   timeout: float = 120.0, echo: bool = False,
                   backend: Backend | None = None,
                   kind: str | None = None) -> list[tuple[RoleHandle, dict]]:
    """`start_service` for several `(name, module, args)` at once: all start,
    then all are waited for (their start-ups overlap). If one fails, the others
    are killed and ProcessStartError names the first that failed.

    >>> os.makedirs("job", exist_ok=True)
    >>> started = start_services([("master", "keras_elastic.master", []),
    ...                           ("master-b", "keras_elastic.master", [])], "job")
    >>> [info["address"] for _, info in started]
    ['127.0.0.1:...', '127.0.0.1:...']
    >>> for handle, _ in started:
    ...     handle.terminate()
    """
    if backend is None:
        backend = LocalBackend()
    # Services answer this process's job token (made now if there is none).
    env = dict(os.environ, **{auth.TOKEN_ENV: auth.job_token()})
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # as the workers' (worker_group.py)
    started: list[tuple[str, str, RoleHandle]] = []
    try:
        for name, module, args in services:
            ready = os.path.join(job_dir, f"{name}.ready.json")
            if os.path.exists(ready):
                os.remove(ready)
            handle = backend.start(
                name, [sys.executable, "-m", module, *args, f"--ready_file={ready}"],
                os.path.join(job_dir, f"{name}.log"), env=env,
                kind=kind or name.split("-")[0], echo=echo)
            started.append((name, ready, handle))
        deadline = time.monotonic() + timeout
        return [(handle, _wait_ready(name, ready, handle, deadline, timeout, backend))
                for name, ready, handle in started]
    except BaseException:
        for _, _, handle in started:
            if handle.poll() is None:
                handle.kill()
            else:
                handle.close()
        raise


def _wait_ready(name: str, ready: str, handle: RoleHandle, deadline: float,
                timeout: float, backend: Backend) -> dict:
    while time.monotonic() < deadline:
        if os.path.exists(ready):
            try:
                with open(ready) as f:
                    return json.load(f)
            except (OSError, ValueError):
                pass  # being replaced (shared storage): read it again
        code = handle.poll()
        if code is not None:
            if handle.lost_reason:
                raise ProcessStartError(f"the {name} process was {handle.lost_reason} "
                                        "before serving")
            raise ProcessStartError(
                f"the {name} process exited with code {code} before serving;"
                f" its log ({handle.log_path}) ends with:\n{handle.tail()}")
        time.sleep(0.05)
    where = "" if handle.node is not None else (
        f"; {backend.name} never found room for it (resources requested for its kind "
        "of role are busy or missing)")
    raise ProcessStartError(f"the {name} process did not start serving within "
                            f"{timeout:.0f} s{where}; log: {handle.log_path}")

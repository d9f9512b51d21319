"""The launcher's side of warm processes: start one, and start roles from it.

`WarmPool(log_path)` starts a warm process (`zygote.py`: TensorFlow and
Keras imported) at once, in the background. `pool.popen(argv, env, cwd)`
then starts a role from it in milliseconds and returns a `WarmPopen`, which
has what the launcher uses of `subprocess.Popen` (`pid`, `stdout`, `poll`,
`wait`, `terminate`, `kill`, `send_signal`, `returncode`), or None when
the command must start afresh: it is not `python ...` of the warm
interpreter, its environment differs in what is read at start
(`command.py`), the warm process failed or refused. The reason is logged
once per kind of reason.

Example:

```python
pool = WarmPool("job/warm.log")
proc = pool.popen([sys.executable, "train.py"], env, os.getcwd())
if proc is None:
    proc = subprocess.Popen([sys.executable, "train.py"], env=env, ...)
code = proc.wait()
pool.close()
```
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

from absl import logging

from keras_elastic.common.launcher_tie import LAUNCHER_PID
from keras_elastic.common.pids import pid_alive
from keras_elastic.launcher.warm import command as commands
from keras_elastic.launcher.warm.zygote import recv_message, send_message

# Off with KERAS_ELASTIC_WARM_START=0 (or the launcher's --nowarm_start).
ENV = "KERAS_ELASTIC_WARM_START"
# A warm process already serving at this Unix socket path (`python -m
# keras_elastic.launcher.warm --listen=PATH`), shared by the launchers that
# name it: they then pay no import at all (the test suite runs one per
# pytest-xdist worker). Used only when it runs the same interpreter in the
# same network namespace; else the launcher starts its own.
SOCKET_ENV = "KERAS_ELASTIC_WARM_SOCKET"
# How long a role's start waits for the warm process' imports before it
# starts afresh instead.
READY_TIMEOUT = 120.0
# How long the warm process has to answer a request with the role's pid.
ANSWER_TIMEOUT = 30.0


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether warm starts are allowed by the environment.

    >>> enabled({"KERAS_ELASTIC_WARM_START": "0"})
    False
    """
    environ = os.environ if environ is None else environ
    return environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def zygote_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The warm process' environment: this process's without the job's
    variables (a role gets its own), tied to this process."""
    env = {k: v for k, v in environ.items() if not k.startswith(commands.JOB_PREFIX)}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # as the launcher gives every role
    env[LAUNCHER_PID] = str(os.getpid())
    return env


class WarmPopen:
    """A role started by a warm process, as the launcher sees a Popen."""

    def __init__(self, pid: int, status: socket.socket, stdout_fd: int) -> None:
        self.pid = pid
        self.args = None
        self.returncode: int | None = None
        self.stdout = os.fdopen(stdout_fd, "rb", buffering=0)
        self._status = status
        self._lock = threading.Lock()

    def _read_status(self, timeout: float) -> None:
        with self._lock:
            if self.returncode is not None:
                return
            ready, _, _ = select.select([self._status], [], [], timeout)
            if not ready:
                return
            try:
                text = recv_message(self._status).decode()
            except (OSError, EOFError):
                text = ""
            if text.startswith("exit "):
                self.returncode = int(text.split()[1])
            elif not pid_alive(self.pid):
                # The warm process died, and its children with it (SIGKILL).
                self.returncode = -signal.SIGKILL
            else:
                return  # the warm process died; the role dies with it soon
            self._status.close()

    def poll(self) -> int | None:
        """The exit code, or None while the role runs."""
        self._read_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Waits for the role's end; subprocess.TimeoutExpired after `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 0.2 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(["warm role", str(self.pid)], timeout)
            self._read_status(min(left, 0.2))
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class WarmPool:
    """One warm process for a launcher's roles (see the module doc)."""

    def __init__(self, log_path: str, environ: Mapping[str, str] | None = None,
                 python: str = sys.executable, shared: str | None = None) -> None:
        self.python = python
        self.env = zygote_env(os.environ if environ is None else environ)
        self.log_path = log_path
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._failed: str | None = None
        self._said: set[str] = set()
        self.starts = 0
        self.started_at = time.monotonic()
        self.ready_after: float | None = None
        self.process: subprocess.Popen | None = None
        self.shared = shared
        if shared is not None:
            self._control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._control.connect(shared)  # OSError: the caller starts its own
        else:
            self._control, theirs = socket.socketpair()
            with open(log_path, "ab") as log:
                self.process = subprocess.Popen(
                    [python, "-m", "keras_elastic.launcher.warm",
                     f"--control_fd={theirs.fileno()}"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=(theirs.fileno(),), env=self.env, start_new_session=True)
            theirs.close()
        threading.Thread(target=self._wait_ready, daemon=True,
                         name="ke-warm-ready").start()

    @classmethod
    def for_launcher(cls, log_path: str) -> WarmPool:
        """The shared warm process of SOCKET_ENV when it can serve this
        launcher's roles, else one of its own."""
        shared = os.environ.get(SOCKET_ENV)
        if shared:
            try:
                pool = cls(log_path, shared=shared)
                if pool.usable(10.0):
                    return pool
                pool.close()
            except OSError as e:
                logging.info("the shared warm process at %s: %s; starting one",
                             shared, e)
        return cls(log_path)

    def _wait_ready(self) -> None:
        try:
            info = json.loads(recv_message(self._control))
        except (OSError, EOFError, ValueError):
            code = self.process.poll() if self.process is not None else None
            self._failed = (f"it exited with code {code} before it was ready (see "
                            f"{self.log_path})" if self.process is not None else
                            f"the shared warm process at {self.shared} did not answer")
            self._ready.set()
            return
        mine = os.readlink("/proc/self/ns/net") if os.path.exists(
            "/proc/self/ns/net") else ""
        if info.get("netns", "") != mine:
            self._failed = "it runs in another network namespace"
        elif not commands.same_interpreter(info.get("python", ""), self.python):
            self._failed = f"it runs {info.get('python')}, not {self.python}"
        else:
            # What the warm process fixed at its start: a role must match it.
            self.env = dict(info.get("env", {}))
            self.ready_after = time.monotonic() - self.started_at
            logging.info("warm process %s ready in %.1f s%s", info.get("pid"),
                         self.ready_after,
                         f" (shared, at {self.shared})" if self.shared else "")
        self._ready.set()

    def _say(self, reason: str) -> None:
        key = reason.split(" (")[0]
        if key not in self._said:
            self._said.add(key)
            logging.info("starting afresh: %s", reason)

    def usable(self, timeout: float = READY_TIMEOUT) -> bool:
        """Whether the warm process is ready (waiting up to `timeout`)."""
        if not self._ready.wait(timeout):
            self._say(f"the warm process was not ready within {timeout:.0f} s")
            return False
        if (self._failed is None and self.process is not None
                and self.process.poll() is not None):
            self._failed = f"it exited with code {self.process.poll()}"
        if self._failed is not None:
            self._say(f"the warm process failed: {self._failed}")
            return False
        return True

    def popen(self, argv: Sequence[str], env: Mapping[str, str],
              cwd: str) -> WarmPopen | None:
        """The role `argv` started from the warm process, or None (start it
        afresh: see the module doc)."""
        why = commands.why_not(argv, env, self.env, self.python)
        if why is not None:
            self._say(why)
            return None
        if not self.usable():
            return None
        plan = commands.command_of(argv)
        mine, theirs = socket.socketpair()
        read_fd, write_fd = os.pipe()
        try:
            with self._lock:
                socket.send_fds(self._control, [b"r"], [theirs.fileno(), write_fd])
            theirs.close()
            os.close(write_fd)
            send_message(mine, json.dumps({
                "command": {"kind": plan.kind, "target": plan.target,
                            "argv": plan.argv},
                "env": dict(env), "cwd": cwd}).encode())
            ready, _, _ = select.select([mine], [], [], ANSWER_TIMEOUT)
            answer = recv_message(mine).decode() if ready else "refused no answer"
        except (OSError, EOFError) as e:
            with contextlib.suppress(OSError):
                theirs.close()
                os.close(write_fd)
            answer = f"refused {e or type(e).__name__}"
        if not answer.startswith("pid "):
            mine.close()
            os.close(read_fd)
            self._failed = self._failed or answer.removeprefix("refused ")
            self._say(f"the warm process refused: {answer.removeprefix('refused ')}")
            return None
        self.starts += 1
        return WarmPopen(int(answer.split()[1]), mine, read_fd)

    def close(self) -> None:
        """Stops the warm process, and with it every role it started that
        still runs (they die with it): call it once the roles are stopped.
        A shared warm process is only disconnected from."""
        with contextlib.suppress(OSError):
            self._control.close()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

"""Starting and watching the processes of a local job.

Every child is tied to the launcher: it gets the launcher's pid in
`KERAS_ELASTIC_LAUNCHER_PID` and, on importing keras_elastic, dies when the
launcher dies, however it dies (`common/launcher_tie.py`), so a killed
launcher leaves no master, parameter server or worker holding ports and CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from keras_elastic.common import auth
from keras_elastic.common.launcher_tie import LAUNCHER_PID

# TensorFlow's C++ start-up chatter (INFO lines, and the note that precedes
# them): kept in the log files, not echoed.
_NOISE = (b"I0000 00:00:", b"WARNING: All log messages before absl::InitializeLog()")


class ProcessStartError(RuntimeError):
    """A service process exited or did not become ready."""


class ManagedProcess:
    """A child process whose output goes to a log file and, prefixed, to ours."""

    def __init__(self, name: str, argv: Sequence[str], log_path: str,
                 env: dict[str, str] | None = None, echo: bool = True) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._log = open(log_path, "ab", buffering=0)
        self.started = time.time()
        self.popen = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
            env=dict(env if env is not None else os.environ,
                     **{LAUNCHER_PID: str(os.getpid())}))
        self._pump = threading.Thread(target=self._copy_output, args=(echo,),
                                      daemon=True, name=f"out-{name}")
        self._pump.start()

    def _copy_output(self, echo: bool) -> None:
        prefix = f"[{self.name}] ".encode()
        for line in iter(self.popen.stdout.readline, b""):
            self._log.write(line)
            if echo:
                # Keras progress bars redraw with \r: show the last state only.
                text = line.rstrip(b"\n").split(b"\r")[-1]
                if text.strip() and not text.startswith(_NOISE):
                    sys.stdout.buffer.write(prefix + text + b"\n")
                    sys.stdout.buffer.flush()
        self.popen.stdout.close()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def terminate(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.close()

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        self.close()

    def close(self) -> None:
        self._pump.join(timeout=5)
        self._log.close()

    def tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as f:
                data = f.read()[-20000:]
        except OSError:
            return ""
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def start_service(name: str, module: str, args: Sequence[str], job_dir: str,
                  timeout: float = 120.0,
                  echo: bool = False) -> tuple[ManagedProcess, dict]:
    """Starts `python -m module args --ready_file ...`; waits until it serves."""
    ready = os.path.join(job_dir, f"{name}.ready.json")
    if os.path.exists(ready):
        os.remove(ready)
    # The service answers this process's job token (made now if there is none).
    env = dict(os.environ, **{auth.TOKEN_ENV: auth.job_token()})
    process = ManagedProcess(
        name, [sys.executable, "-m", module, *args, f"--ready_file={ready}"],
        os.path.join(job_dir, f"{name}.log"), env=env, echo=echo)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(ready):
            with open(ready) as f:
                return process, json.load(f)
        if process.poll() is not None:
            process.close()
            raise ProcessStartError(
                f"the {name} process exited with code {process.poll()} before serving;"
                f" its log ({process.log_path}) ends with:\n{process.tail()}")
        time.sleep(0.05)
    process.kill()
    raise ProcessStartError(f"the {name} process did not start serving within "
                            f"{timeout:.0f} s; log: {process.log_path}")

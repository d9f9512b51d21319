"""The local backend: every role a child process of the launcher, on this machine.

Every child is tied to the launcher: it gets the launcher's pid in
`KERAS_ELASTIC_LAUNCHER_PID` and, on importing keras_elastic, dies when the
launcher dies, however it dies (`common/launcher_tie.py`), so a killed
launcher leaves no master, parameter server or worker holding ports and CPU.

Example:

```python
backend = LocalBackend(bind="127.0.0.1")
worker = backend.start("worker-0", ["python", "train.py"], "/job/worker-0.log",
                       env, kind="worker")
code = worker.poll()
```
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence

from absl import logging

from keras_elastic.common import disk, tls
from keras_elastic.common.launcher_tie import LAUNCHER_PID
from keras_elastic.launcher.backends.base import Backend, RoleHandle, echo_line
from keras_elastic.launcher.warm import pool as warm_pool
from keras_elastic.launcher.warm.pool import WarmPool

# The roles that import TensorFlow (the master does not: it starts afresh,
# in a third of a second, while the warm process imports).
WARM_KINDS = ("ps", "worker")


class ManagedProcess(RoleHandle):
    """A child process whose output goes to a log file and, prefixed, to ours."""

    def __init__(self, name: str, argv: Sequence[str], log_path: str,
                 env: dict[str, str] | None = None, echo: bool = True,
                 kind: str = "worker", warm: WarmPool | None = None) -> None:
        self.name = name
        self.kind = kind
        self.argv = list(argv)
        self.log_path = log_path
        self.lost_reason = None
        self._log = open(log_path, "ab", buffering=0)
        self.started = time.time()
        env = dict(env if env is not None else os.environ,
                   **{LAUNCHER_PID: str(os.getpid())})
        # A warm process' fork when it can (launcher/warm/), else afresh.
        started = warm.popen(self.argv, env, os.getcwd()) if warm is not None else None
        self.warm = started is not None
        self.popen = started or subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        self._pump = threading.Thread(target=self._copy_output, args=(echo,),
                                      daemon=True, name=f"out-{name}")
        self._pump.start()

    def _copy_output(self, echo: bool) -> None:
        prefix = f"[{self.name}] ".encode()
        log_error = None
        for line in iter(self.popen.stdout.readline, b""):
            if log_error is None:
                try:
                    self._log.write(line)
                except OSError as e:
                    # A full disk: the role goes on (its output is drained and
                    # echoed still), its log stops here, said once.
                    log_error = disk.describe_write_error(self.log_path, e)
                    logging.error("%s; its further output is not logged there",
                                  log_error)
            if echo:
                echo_line(prefix, line)
        self.popen.stdout.close()

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def node(self) -> str:
        return "local"

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

    def dump_stacks(self) -> None:
        if self.popen.poll() is None and hasattr(signal, "SIGUSR1"):
            with contextlib.suppress(OSError):
                os.kill(self.popen.pid, signal.SIGUSR1)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        self.close()

    def close(self) -> None:
        self._pump.join(timeout=5)
        self._log.close()


class LocalBackend(Backend):
    """Roles as processes of this machine; services bind `bind` and are
    reached at `advertise` (default: `bind`). With `warm` (the default),
    `prepare` starts a warm process (launcher/warm/: TensorFlow and Keras
    imported once) from which parameter servers and workers are forked."""

    name = "local"
    keeps_addresses = True

    def __init__(self, bind: str = "127.0.0.1", advertise: str | None = None,
                 warm: bool = True) -> None:
        self.bind = bind
        self.advertise = advertise
        self.warm = warm and warm_pool.enabled()
        self.pool: warm_pool.WarmPool | None = None

    def prepare(self, job_dir: str) -> None:
        if self.warm and self.pool is None:
            self.pool = warm_pool.WarmPool.for_launcher(os.path.join(job_dir, "warm.log"))

    def start(self, name: str, argv: Sequence[str], log_path: str,
              env: dict[str, str], kind: str, resources: dict | None = None,
              echo: bool = True) -> ManagedProcess:
        pool = self.pool if kind in WARM_KINDS else None
        return ManagedProcess(name, argv, log_path, env=env, echo=echo, kind=kind,
                              warm=pool)

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def service_host(self) -> str:
        return self.bind

    def advertised(self, address: str) -> str:
        port = address.rsplit(":", 1)[1]
        return f"{self.advertise or self.bind}:{port}"

    def loopback_only(self) -> bool:
        return tls.is_loopback(self.bind)

    def routable_host(self) -> str | None:
        return None if self.loopback_only() else self.bind

    def describe(self) -> str:
        warm = ", warm starts" if self.warm else ""
        return f"local processes, services on {self.bind}{warm}"

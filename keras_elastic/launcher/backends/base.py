"""What the launcher needs from a place to run a job's roles.

A *backend* starts a role (the master, a parameter server, a worker) as a
process somewhere, with an environment and a log file, and hands back a
`RoleHandle` to watch and stop it. The launcher's logic (restarts, budget,
scaling, recovery, summary) is written once above this interface
(`launcher.py`); `local.py` runs roles as processes of this machine, `ray.py`
as Ray actors that run them on the nodes of a Ray cluster.

A role that dies has an exit code (`poll()`). A role lost with its node (the
machine left the cluster) has a negative code and says why in `lost_reason`.

Services announce their address in a ready file in the job directory
(`start_service`): on a cluster that directory is on storage every node
mounts, and the address is the one of the node the service landed on.

Example:

```python
backend = LocalBackend()
handle, info = start_service("master", "keras_elastic.master", [], job_dir,
                             backend=backend)
print(info["address"], handle.node)
handle.terminate()
```
"""

from __future__ import annotations

import abc
import os
import threading
from collections.abc import Sequence

from keras_elastic.common import errors
from keras_elastic.launcher import console

# TensorFlow's C++ start-up chatter (INFO lines, and the note that precedes
# them): kept in the log files, not echoed.
_NOISE = (b"I0000 00:00:", b"WARNING: All log messages before absl::InitializeLog()")

# Roles: what a backend's resource request and placement depend on.
KINDS = ("master", "ps", "worker")

# In a service's argv, replaced by the address of the node it runs on (a
# backend whose services bind their node's address, e.g. Ray).
NODE_IP = "{node_ip}"


class ProcessStartError(errors.ClusterError, RuntimeError):
    """A service process exited or did not become ready."""


class BackendError(errors.JobError, ValueError):
    """The backend cannot run this job (missing package, unreachable cluster,
    resources no node has, job directory not shared...): raised before any
    role starts, with what to do."""


def echo_line(prefix: bytes, line: bytes) -> None:
    """Prints one line of a role's output, prefixed, unless it is noise.
    Keras progress bars redraw with \\r: only their last state is shown."""
    text = line.rstrip(b"\n").split(b"\r")[-1]
    if text.strip() and not text.startswith(_NOISE):
        console.write_line(prefix + text)


def read_tail(log_path: str, lines: int = 20) -> str:
    """The last `lines` lines of a log file ("" if it cannot be read)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 20000))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


class LogFollower:
    """Echoes what a process on another machine appends to its log file (on
    shared storage), like `tail -f`, from a daemon thread.

    >>> follower = LogFollower("worker-0", "worker-0.log", interval=60)
    >>> with open("worker-0.log", "w") as log:   # what the worker appends
    ...     log.write("Epoch 1/2\\n")
    10
    >>> follower.stop()                          # echoes what is left
    [worker-0] Epoch 1/2
    """

    def __init__(self, name: str, log_path: str, interval: float = 0.2) -> None:
        self._prefix = f"[{name}] ".encode()
        self._path = log_path
        self._interval = interval
        self._offset = 0
        self._partial = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"out-{name}")
        self._thread.start()

    def _read(self) -> None:
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            echo_line(self._prefix, line)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._read()

    def stop(self) -> None:
        """Echoes what is left, then stops."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._read()
        if self._partial:
            echo_line(self._prefix, self._partial)
            self._partial = b""


class RoleHandle(abc.ABC):
    """One running role: a process somewhere, its log in the job directory.

    Attributes: `name` ("master", "ps-0", "worker-3"), `kind` ("master", "ps",
    "worker"), `log_path`, and `lost_reason` (why the role was lost without
    exiting, e.g. "lost with its node 5f3c...", else None).

    >>> import os, sys
    >>> from keras_elastic.launcher.backends import LocalBackend
    >>> handle = LocalBackend().start(
    ...     "worker-0", [sys.executable, "-c", "import time; time.sleep(60)"],
    ...     "worker-0.log", dict(os.environ), kind="worker")
    >>> handle.poll() is None                 # running
    True
    >>> handle.kill()
    >>> handle.poll() is None
    False
    """

    name: str
    kind: str
    log_path: str
    lost_reason: str | None = None

    @property
    @abc.abstractmethod
    def pid(self) -> int | None:
        """The role's process id on its node (None while not yet placed)."""

    @property
    @abc.abstractmethod
    def node(self) -> str | None:
        """Where the role runs ("local", a Ray node id; None: not placed yet)."""

    @abc.abstractmethod
    def poll(self) -> int | None:
        """The exit code, or None while it runs (or waits for room). A role
        lost with its node gives a negative code and sets `lost_reason`."""

    @abc.abstractmethod
    def terminate(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds; then `close()`."""

    @abc.abstractmethod
    def kill(self) -> None:
        """SIGKILL; then `close()`."""

    @abc.abstractmethod
    def close(self) -> None:
        """Releases what watches the role (output echo, log file)."""

    @abc.abstractmethod
    def dump_stacks(self) -> None:
        """Asks the role to write every thread's stack into its log (SIGUSR1,
        common/stacks.py), before it is killed for hanging; best effort."""

    def tail(self, lines: int = 20) -> str:
        """The last lines of the role's log."""
        return read_tail(self.log_path, lines)

    def describe_exit(self, code: int) -> str:
        """'exited with code 3', or why the role was lost."""
        return self.lost_reason or f"exited with code {code}"


class Backend(abc.ABC):
    """Where a job's roles run.

    >>> import os, sys
    >>> from keras_elastic.launcher.backends import LocalBackend
    >>> backend = LocalBackend()
    >>> backend.check("job")                  # this machine runs any job
    >>> handle = backend.start("ps-0", [sys.executable, "-c", "input()"],
    ...                        "ps-0.log", dict(os.environ), kind="ps")
    >>> handle.kind, handle.log_path
    ('ps', 'ps-0.log')
    >>> handle.terminate()
    """

    name: str = "?"
    # A restarted service can listen on its old port again (same machine);
    # otherwise it may land elsewhere, and clients find its new address in
    # JOB_DIR/cluster.json (keras_elastic/common/resolver.py).
    keeps_addresses: bool = True
    # Job-made TLS certificates name the services by a fixed DNS name that
    # clients check (`tls.JOB_SERVER_NAME`) rather than by their addresses,
    # which are not known in advance.
    tls_by_name: bool = False

    def check(self, job_dir: str) -> None:
        """Fails early (BackendError, saying what to do) when this backend
        cannot run the job from `job_dir`."""
        return None

    def prepare(self, job_dir: str) -> None:
        """Readies what starting roles needs (a warm process, locally), in
        the background; called once, before the first role starts."""
        return None

    @abc.abstractmethod
    def start(self, name: str, argv: Sequence[str], log_path: str,
              env: dict[str, str], kind: str, resources: dict | None = None,
              echo: bool = True) -> RoleHandle:
        """Starts `argv` with environment `env` as role `name` (of `kind`),
        its output appended to `log_path` and, with `echo`, printed prefixed."""

    @abc.abstractmethod
    def service_host(self) -> str:
        """The `--host` a service binds (NODE_IP: the address of its node)."""

    @abc.abstractmethod
    def advertised(self, address: str) -> str:
        """A service's bound address (from its ready file) as the job's
        processes reach it."""

    @abc.abstractmethod
    def loopback_only(self) -> bool:
        """Every service binds a loopback address (no TLS needed)."""

    def routable_host(self) -> str | None:
        """A non-loopback address services would bind (for error messages),
        or None."""
        return None

    def worker_capacity(self) -> int | None:
        """How many more workers fit now (None: no known limit)."""
        return None

    def nodes_joined(self) -> int:
        """Nodes that joined since the last call (0 for a fixed machine)."""
        return 0

    def describe(self) -> str:
        """One line for the launcher's log."""
        return self.name

    def shutdown(self) -> None:
        """Releases the backend (after every role was stopped)."""
        return None

"""The warm process: imports TensorFlow and Keras once, then forks roles.

`python -m keras_elastic.launcher.warm --control_fd=N` imports what every
worker and parameter server imports (`PRELOAD`), writes `ready` on its
control socket (fd N, one end of a socket pair whose other end the
launcher holds: `pool.py`) and serves. Each request on the control socket
brings two descriptors: the role's status socket and the write end of the
role's output pipe. The request itself (JSON: argv, env, cwd) is then read
from the status socket; the zygote forks, and

- the child becomes the role (`child.py`) and runs its command;
- the parent sends `pid N` on the status socket, and `exit CODE` once the
  child has ended (CODE as `subprocess.Popen.returncode`: negative for a
  signal), then closes it.

Forking is safe only while this process runs nothing but its main thread
and no TensorFlow runtime or gRPC channel exists: it starts none (importing
starts no runtime: tests/test_warm_start.py checks it), and before each fork
it checks that TensorFlow's runtime is not up; a request it cannot serve
safely is answered `refused REASON` (the launcher then starts that role
afresh). The threads the imports start (OpenBLAS' pool, Arrow's jemalloc
background thread) register fork handlers of their own.

The zygote dies with the launcher (PR_SET_PDEATHSIG, `launcher_tie`), and
its children die with it (`child._die_with_parent`): a role the launcher
cannot hear about any more does not outlive it.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import sys
import time

# What every worker and parameter server imports (TensorFlow and Keras with
# them): 4-5 s of a fresh process' start on 2 cores.
PRELOAD = ("tensorflow", "keras", "keras_elastic.model", "keras_elastic.dataset",
           "keras_elastic.worker", "keras_elastic.ps.server",
           "keras_elastic.callbacks", "keras_elastic.layers")

_LENGTH = struct.Struct("!I")


# sockaddr_un's sun_path: 108 bytes with the terminating NUL (Linux).
MAX_SOCKET_PATH = 107


def send_message(sock: socket.socket, payload: bytes) -> None:
    """Sends `payload` with its length first."""
    sock.sendall(_LENGTH.pack(len(payload)) + payload)


def recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the other end closed")
        data += chunk
    return data


def recv_message(sock: socket.socket) -> bytes:
    """A message `send_message` sent."""
    (size,) = _LENGTH.unpack(recv_exact(sock, _LENGTH.size))
    return recv_exact(sock, size)


def runtime_started() -> bool:
    """Whether TensorFlow's eager runtime exists in this process (a fork
    would then copy a runtime whose threads the child lacks)."""
    context = sys.modules.get("tensorflow.python.eager.context")
    if context is None:
        return False
    ctx = context.context_safe()
    return ctx is not None and ctx._context_handle is not None


def describe(python: str = sys.executable) -> bytes:
    """What a client checks before it forks roles from this process: the
    interpreter, the environment fixed at its start, its network namespace
    (a role binds its services there)."""
    from keras_elastic.launcher.warm.command import import_time_env

    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = ""
    return json.dumps({"ready": True, "pid": os.getpid(), "python": python,
                       "env": import_time_env(os.environ), "netns": netns}).encode()


class Zygote:
    """The serving loop (see the module doc). `control`: the launcher's end
    of a socket pair (the zygote exits when it closes), or `listener`: a
    listening Unix socket, each connection a client of its own (the zygote
    serves until it is stopped)."""

    def __init__(self, control: socket.socket | None = None,
                 listener: socket.socket | None = None) -> None:
        self.control = control
        self.listener = listener
        self.clients: set[socket.socket] = set()
        self.children: dict[int, socket.socket] = {}
        self.selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)

    def serve(self):
        """Serves until the control socket closes (returns None: the zygote
        exits) or a fork's child returns (the child's request)."""
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        if self.control is not None:
            self._add_client(self.control)
        if self.listener is not None:
            self.selector.register(self.listener, selectors.EVENT_READ, "listen")
        self.selector.register(self._wake_r, selectors.EVENT_READ, "child")
        while True:
            for key, _ in self.selector.select(timeout=1.0):
                if key.data == "child":
                    try:
                        while os.read(self._wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                elif key.data == "listen":
                    try:
                        client, _ = self.listener.accept()
                    except OSError:
                        continue
                    self._add_client(client)
                    self._answer(client, describe().decode(), close=False)
                else:
                    request = self._accept(key.fileobj)
                    if request == "closed":
                        self._drop_client(key.fileobj)
                        if key.fileobj is self.control:
                            return None
                    elif request is not None:
                        return request  # in the child
            self._reap()

    def _add_client(self, client: socket.socket) -> None:
        self.clients.add(client)
        self.selector.register(client, selectors.EVENT_READ, "client")

    def _drop_client(self, client: socket.socket) -> None:
        self.clients.discard(client)
        try:
            self.selector.unregister(client)
        except (KeyError, ValueError):
            pass
        client.close()

    def _accept(self, client: socket.socket):
        try:
            data, fds, _, _ = socket.recv_fds(client, 1, 2)
        except OSError:
            return "closed"
        if not data and not fds:
            return "closed"
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            return None
        status = socket.socket(fileno=fds[0])
        output_fd = fds[1]
        try:
            request = json.loads(recv_message(status))
        except (OSError, EOFError, ValueError):
            status.close()
            os.close(output_fd)
            return None
        if runtime_started():
            self._answer(status, "refused TensorFlow's runtime is up in the warm process")
            os.close(output_fd)
            return None
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.selector.close()
            for other in [*self.clients, *self.children.values()]:
                other.close()
            if self.listener is not None:
                self.listener.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
            status.close()
            request["output_fd"] = output_fd
            request["parent"] = parent
            return request
        os.close(output_fd)
        self.children[pid] = status
        self._answer(status, f"pid {pid}", close=False)
        return None

    def _answer(self, status: socket.socket, text: str, close: bool = True) -> None:
        try:
            send_message(status, text.encode())
        except OSError:
            pass
        if close:
            status.close()

    def _reap(self) -> None:
        while self.children:
            try:
                pid, code = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            status = self.children.pop(pid, None)
            if status is not None:
                self._answer(status, f"exit {os.waitstatus_to_exitcode(code)}")


def main(argv: list[str]) -> None:
    """The zygote's entry point (`python -m keras_elastic.launcher.warm`):
    `--control_fd=N` (a launcher's own warm process) or `--listen=PATH` (one
    shared by the launchers that name PATH in KERAS_ELASTIC_WARM_SOCKET)."""
    options = dict(a.lstrip("-").split("=", 1) for a in argv if "=" in a)
    control = listener = None
    if "control_fd" in options:
        control = socket.socket(fileno=int(options["control_fd"]))
    elif "listen" in options:
        if len(os.fsencode(options["listen"])) > MAX_SOCKET_PATH:
            raise SystemExit(f"--listen={options['listen']}: a Unix socket's path has at "
                             f"most {MAX_SOCKET_PATH} bytes; choose a shorter one")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(options["listen"]):
            os.remove(options["listen"])
    else:
        raise SystemExit("usage: python -m keras_elastic.launcher.warm "
                         "--control_fd=N | --listen=PATH")
    started = time.monotonic()
    import importlib

    for module in PRELOAD:
        importlib.import_module(module)
    if runtime_started():
        raise RuntimeError("importing the warm modules started TensorFlow's runtime: "
                           "a module runs TensorFlow at import")
    print(f"warm process {os.getpid()}: imported {', '.join(PRELOAD)} in "
          f"{time.monotonic() - started:.1f} s", flush=True)
    if control is not None:
        send_message(control, describe())
    else:
        listener.bind(options["listen"])  # only once ready: clients wait on it
        listener.listen(64)
    request = Zygote(control, listener).serve()
    if request is None:
        return
    # This process is now a fork's child: it becomes the role.
    from keras_elastic.launcher.warm import child
    from keras_elastic.launcher.warm.command import WarmCommand

    command = WarmCommand(**request["command"])
    child.become(command, request["env"], request["cwd"], request["output_fd"],
                 request["parent"])
    del request
    child.run(command)

"""The Ray backend: every role a Ray actor that runs it as a process on its node.

`keras-elastic run --backend ray --ray_address auto --num_workers 4 --num_ps 2
--worker_resources '{"CPU": 2, "GPU": 1}' -- python train.py` asks Ray for one
actor per role, each with its own resource request (`--master_resources`,
`--ps_resources`, `--worker_resources`: JSON objects of Ray resources, "CPU",
"GPU", "memory" in bytes, or custom ones; defaults: master {"CPU": 0}, others
{"CPU": 1}). Ray places the actors (spread over the nodes); each one starts
its role as a child process on its node: `python -m keras_elastic.master` or
`keras_elastic.ps` (the node's Python), or the user's worker command
unchanged, with the job's environment variables (the cluster, token, TLS:
every `KERAS_ELASTIC_*` and `TF_*` variable the launcher gives the role, and
`OMP_NUM_THREADS` only if the launcher has it) over the node's own
environment. The child gets the actor's pid as its launcher
(`KERAS_ELASTIC_LAUNCHER_PID`): when the actor dies (its node left, or the
launcher ended the job) the child dies with it.

Services bind the address of the node they run on (`{node_ip}` in their
argv) and write it to their ready file in the job directory, which every node
must see at the same path (shared storage: logs, ready files, the master's
journal, automatic checkpoints). A restarted service may land on another node:
clients find its new address in `JOB_DIR/cluster.json`
(`keras_elastic/common/resolver.py`).

The launcher watches each actor with one long `wait` call: a role lost with
its node gives exit code -1 and "lost with its node <id>".

Example:

```python
backend = RayBackend(address="auto", resources={"worker": {"CPU": 2}})
backend.check(job_dir)        # clear errors before anything starts
worker = backend.start("worker-0", ["python", "train.py"], log, env, kind="worker")
```
"""

from __future__ import annotations

import logging as pylogging
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from absl import logging

from keras_elastic.common import tls
from keras_elastic.common.launcher_tie import LAUNCHER_PID
from keras_elastic.launcher.backends.base import (
    KINDS,
    NODE_IP,
    Backend,
    BackendError,
    LogFollower,
    RoleHandle,
)

INSTALL = ('pip install "keras-elastic[ray]" (from a source checkout: '
           'pip install -e ".[ray]")')
DEFAULT_RESOURCES = {"master": {"CPU": 0}, "ps": {"CPU": 1}, "worker": {"CPU": 1}}
LOST = -1             # poll() of a role lost with its node (or its actor)
NOT_STARTED = 127     # poll() of a role whose process could not be started
_JOB_PREFIXES = ("KERAS_ELASTIC_", "TF_")
# Ray sets it in its workers to the CPUs the actor asked for; a role sizes its
# thread pools as it would locally unless the launcher's environment sets it.
_THREADS = "OMP_NUM_THREADS"
# Ray starts its worker processes at niceness 15 (raylet's worker_niceness), so
# they yield to anything else on the node; a role is the job's main work, and a
# training worker at nice 15 loses 3-5% of its speed to Ray's own daemons on a
# busy node. Ray Jobs starts the user's entrypoint at niceness 0 the same way
# (job_manager.py sets RAY_worker_niceness=0 in the supervisor's runtime_env).
_RUNTIME_ENV = {"env_vars": {"RAY_worker_niceness": "0"}}
_LABELS = {"master": "the master", "ps": "a parameter server", "worker": "a worker"}


def import_ray():
    """The `ray` module, or BackendError with the install command."""
    try:
        import ray
    except ImportError as e:
        raise BackendError(f"--backend ray needs Ray, which is not installed here "
                           f"({e}): {INSTALL}") from None
    # The actor and the job-directory probe travel by value: Ray's worker
    # processes on the nodes then never import keras_elastic (seconds of
    # start-up per role on a small machine).
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return ray


def actor_options(request: dict[str, float]) -> dict:
    """Ray actor options for a resource request ({"CPU": 2, "GPU": 1, "x": 1}).

    >>> actor_options({"CPU": 2, "GPU": 1, "worker_slot": 1})
    {'num_cpus': 2, 'num_gpus': 1, 'resources': {'worker_slot': 1}}
    """
    rest = {k: v for k, v in request.items() if k not in ("CPU", "GPU", "memory")}
    options = {"num_cpus": request.get("CPU", 0), "num_gpus": request.get("GPU", 0)}
    if request.get("memory"):
        options["memory"] = request["memory"]
    if rest:
        options["resources"] = rest
    return options


def fits(free: dict[str, float], request: dict[str, float]) -> int:
    """How many times `request` fits in `free` (a large number when it asks
    for nothing).

    >>> fits({"CPU": 4, "GPU": 1}, {"CPU": 2}), fits({"CPU": 4}, {"GPU": 1})
    (2, 0)
    """
    counts = [math.floor(free.get(k, 0.0) / v + 1e-9) for k, v in request.items() if v > 0]
    return max(0, min(counts)) if counts else 1 << 30


def _host_port(address: str) -> tuple[str, int] | None:
    rest = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _probe(address: str, timeout: float = 5.0) -> None:
    """BackendError unless something listens at the Ray address."""
    where = _host_port(address)
    if where is None:
        raise BackendError(f"--ray_address={address!r} is not an address: give auto, "
                           "HOST:PORT (the head's GCS port, 6379 by default) or "
                           "ray://HOST:PORT (Ray Client, 10001 by default)")
    try:
        socket.create_connection(where, timeout=timeout).close()
    except OSError as e:
        raise BackendError(
            f"cannot reach the Ray cluster at {address}: {e.strerror or e}. Is it "
            f"running (`ray status` on its head node; `ray start --head` starts one), "
            "and is --ray_address right?") from None


def _visible(marker: str, nonce: str) -> tuple[str, str, str | None]:
    """On a node: whether the job directory is there (the launcher's marker
    file, with its nonce) and writable; returns (node id, ip, problem)."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    ip = ray.util.get_node_ip_address()
    try:
        with open(marker) as f:
            if f.read().strip() != nonce:
                return node, ip, "it holds another job's files (a local directory " \
                                 "of the same name?)"
        with open(f"{marker}.{node[:12]}", "w") as f:
            f.write(nonce)
    except OSError as e:
        return node, ip, f"{e.strerror or e} ({e.filename or marker})"
    return node, ip, None


class _RoleActor:
    """Runs one role as a child process on the node Ray placed it on."""

    def __init__(self, name: str, argv: list[str], log_path: str, env: dict[str, str],
                 cwd: str, launcher_python: str, marker: str | None) -> None:
        import ray

        self.node = ray.get_runtime_context().get_node_id()
        self.ip = ray.util.get_node_ip_address()
        self.proc: subprocess.Popen | None = None
        self.error: str | None = None
        try:
            if marker and not os.path.isfile(marker):
                raise OSError(f"the job directory {os.path.dirname(marker)} is not "
                              "visible from this node: put it on storage every node "
                              "mounts at the same path")
            argv = [a.replace(NODE_IP, self.ip) for a in argv]
            if argv and argv[0] == launcher_python:
                argv[0] = sys.executable  # the node's interpreter (same image)
            child_env = {k: v for k, v in os.environ.items()
                         if not k.startswith("KERAS_ELASTIC_") and k != _THREADS}
            child_env.update(env)
            child_env[LAUNCHER_PID] = str(os.getpid())
            with open(log_path, "ab", buffering=0) as log:
                # Started from __init__, which runs on the actor's main thread:
                # the child's parent-death signal fires when the actor dies.
                self.proc = subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env=child_env, start_new_session=True,
                    cwd=cwd if os.path.isdir(cwd) else None)
        except Exception as e:  # reported through info() and wait()
            self.error = (f"could not start on Ray node {self.node} ({self.ip}):"
                          f" {e}")

    def info(self) -> dict:
        return {"node": self.node, "ip": self.ip, "error": self.error,
                "pid": self.proc.pid if self.proc is not None else None}

    def wait(self) -> int:
        if self.proc is None:
            return NOT_STARTED
        return self.proc.wait()

    def dump_stacks(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)

    def terminate(self, timeout: float) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


_actor_class = None


def _remote_actor_class():
    global _actor_class
    if _actor_class is None:
        ray = import_ray()
        _actor_class = ray.remote(max_concurrency=4, max_restarts=0,
                                  max_task_retries=0)(_RoleActor)
    return _actor_class


class RayRoleHandle(RoleHandle):
    """A role run by a Ray actor (see the module docstring)."""

    def __init__(self, backend: RayBackend, name: str, kind: str, log_path: str,
                 actor, request: dict[str, float], echo: bool) -> None:
        self._ray = backend.ray
        self._backend = backend
        self.name = name
        self.kind = kind
        self.log_path = log_path
        self.request = request
        self.lost_reason = None
        self.started = time.time()
        self._actor = actor
        self._info_ref = actor.info.remote()
        self._wait_ref = actor.wait.remote()
        self._info: dict | None = None
        self._code: int | None = None
        self._closed = False
        self._follower = LogFollower(name, log_path) if echo else None

    def _resolve(self) -> dict | None:
        """The actor's info once it runs on a node (None before)."""
        if self._info is None:
            ready, _ = self._ray.wait([self._info_ref], timeout=0)
            if ready:
                try:
                    self._info = self._ray.get(self._info_ref)
                except self._ray.exceptions.RayError:
                    self._info = {"node": None, "pid": None, "ip": None, "error": None}
        return self._info

    @property
    def pid(self) -> int | None:
        return (self._resolve() or {}).get("pid")

    @property
    def node(self) -> str | None:
        return (self._resolve() or {}).get("node")

    @property
    def running(self) -> bool:
        """Placed on a node, not finished, not closed."""
        return not self._closed and self._code is None and self.node is not None

    def poll(self) -> int | None:
        if self._code is not None:
            return self._code
        exceptions = self._ray.exceptions
        ready, _ = self._ray.wait([self._wait_ref], timeout=0)
        if not ready:
            return None
        try:
            code = self._ray.get(self._wait_ref)
            error = (self._resolve() or {}).get("error")
            if error:
                self.lost_reason = error
        except exceptions.ActorUnavailableError:
            self._wait_ref = self._actor.wait.remote()  # transient: watch again
            return None
        except exceptions.RayError as e:
            code = LOST
            self.lost_reason = self._why_lost(e)
        self._code = code
        return code

    def _why_lost(self, error: Exception) -> str:
        node = self.node
        if node is not None and not self._backend.node_alive(node):
            return f"lost with its node {node}"
        first = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        where = f" on node {node}" if node else " before it started"
        return f"lost{where}: {first}"

    def terminate(self, timeout: float = 10.0) -> None:
        if self._code is None and self._resolve() is not None:
            try:
                self._ray.get(self._actor.terminate.remote(timeout), timeout=timeout + 10)
            except self._ray.exceptions.RayError:
                pass  # the actor (or its node) is gone already
        self.close()

    def dump_stacks(self) -> None:
        if self._code is None and not self._closed and self._resolve() is not None:
            try:
                self._ray.get(self._actor.dump_stacks.remote(), timeout=5)
            except Exception as e:  # the actor (or its node) is gone already
                logging.debug("dump_stacks(%s): %s", self.name, e)

    def kill(self) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._ray.kill(self._actor, no_restart=True)
        except Exception as e:  # a dead actor, or Ray shutting down
            logging.debug("ray.kill(%s): %s", self.name, e)
        if self._follower is not None:
            self._follower.stop()


class RayBackend(Backend):
    """Roles as Ray actors on the nodes of a Ray cluster.

    `address`: None (RAY_ADDRESS, else a cluster started on this machine with
    `ray start`, else a new single-node Ray instance), "auto", "HOST:PORT"
    (the head's GCS) or "ray://HOST:PORT" (Ray Client). `resources`: the
    request per kind of role ({"worker": {"CPU": 2, "GPU": 1}}; missing or
    None: DEFAULT_RESOURCES).
    """

    name = "ray"
    keeps_addresses = False
    tls_by_name = True

    def __init__(self, address: str | None = None,
                 resources: dict[str, dict | None] | None = None) -> None:
        self.ray = import_ray()
        self.address = address
        resources = resources or {}
        self.requests = {k: dict(DEFAULT_RESOURCES[k] if resources.get(k) is None
                                 else resources[k]) for k in KINDS}
        self._connected_here = False
        self._marker: str | None = None
        self._handles: list[RayRoleHandle] = []
        self._nodes: dict[str, dict] = {}       # alive node id -> ray.nodes() entry
        self._nodes_at = -math.inf
        self._known: set[str] = set()
        self._capacity: tuple[float, int | None] = (-math.inf, None)

    # -- connecting and checking ------------------------------------------------
    def connect(self) -> None:
        """Connects this process to the Ray cluster (unless it already is)."""
        ray = self.ray
        if ray.is_initialized():
            return
        target = self.address or os.environ.get("RAY_ADDRESS")
        if target == "auto":
            target = self._auto_address()
        if target and target not in ("auto", "local"):
            _probe(target)
        try:
            ray.init(address=self.address, log_to_driver=False,
                     logging_level=pylogging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise BackendError(
                f"cannot connect to the Ray cluster at {self.address or 'auto'}: {e}. "
                "Start one (`ray start --head`) or give --ray_address") from None
        self._connected_here = True

    def _auto_address(self) -> str | None:
        try:
            from ray._private import services

            return services.canonicalize_bootstrap_address("auto")
        except Exception:  # none running: ray.init says so
            return None

    def _alive(self, refresh: bool = False) -> dict[str, dict]:
        now = time.monotonic()
        if refresh or now - self._nodes_at >= 1.0:
            self._nodes = {n["NodeID"]: n for n in self.ray.nodes() if n.get("Alive")}
            self._nodes_at = now
        return self._nodes

    def node_alive(self, node: str) -> bool:
        return node in self._alive(refresh=True)

    def check(self, job_dir: str) -> None:
        self.connect()
        nodes = self._alive(refresh=True)
        if not nodes:
            raise BackendError("the Ray cluster has no live node")
        self._known = set(nodes)
        for kind in KINDS:
            request = {k: v for k, v in self.requests[kind].items() if v}
            if not any(fits(n.get("Resources", {}), request) for n in nodes.values()):
                offered = "; ".join(
                    f"{node[:8]} ({n.get('NodeManagerAddress')}): "
                    + ", ".join(f"{k}={v:g}" for k, v in sorted(n.get("Resources",
                                                                       {}).items())
                                if not k.startswith(("node:", "memory",
                                                     "object_store_memory")))
                    for node, n in nodes.items())
                raise BackendError(
                    f"no node of the Ray cluster can run {_LABELS[kind]}: "
                    f"--{kind}_resources asks for {request}, the nodes offer {offered}. "
                    "Ask for less, or add a node that has it")
        self._check_job_dir(job_dir, nodes)

    def _check_job_dir(self, job_dir: str, nodes: dict[str, dict]) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nonce = secrets.token_hex(8)
        marker = os.path.join(os.path.abspath(job_dir), f".ray-visible-{nonce}")
        with open(marker, "w") as f:
            f.write(nonce)
        probe = self.ray.remote(num_cpus=0, max_retries=0)(_visible)
        refs = {node: probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            node, soft=False)).remote(marker, nonce) for node in nodes}
        problems = []
        for node, ref in refs.items():
            ip = nodes[node].get("NodeManagerAddress")
            try:
                _, ip, problem = self.ray.get(ref, timeout=120)
            except (self.ray.exceptions.RayError, TimeoutError) as e:
                if not self.node_alive(node):
                    continue  # left meanwhile
                problem = f"the check could not run there: {e}"
            if problem is None and not os.path.isfile(f"{marker}.{node[:12]}"):
                problem = "what it writes there does not appear here"
            if problem is not None:
                problems.append(f"node {node} ({ip}): {problem}")
            try:
                os.remove(f"{marker}.{node[:12]}")
            except OSError:
                pass
        if problems:
            raise BackendError(
                f"the job directory {job_dir} is not visible from every node of the "
                f"Ray cluster ({'; '.join(problems)}). Logs, ready files, the master's "
                "journal and checkpoints live there: put --job_dir on storage every "
                "node mounts at the same path (NFS, a shared volume), and the data too")
        self._marker = marker

    # -- roles ------------------------------------------------------------------
    def start(self, name: str, argv: Sequence[str], log_path: str,
              env: dict[str, str], kind: str, resources: dict | None = None,
              echo: bool = True) -> RayRoleHandle:
        self.connect()
        request = dict(self.requests[kind] if resources is None else resources)
        job_env = {k: v for k, v in env.items() if k.startswith(_JOB_PREFIXES)
                   or k == _THREADS or os.environ.get(k) != v}
        actor = _remote_actor_class().options(
            scheduling_strategy="SPREAD", runtime_env=_RUNTIME_ENV,
            **actor_options(request)).remote(
                name, list(argv), log_path, job_env, os.getcwd(), sys.executable,
                self._marker)
        handle = RayRoleHandle(self, name, kind, log_path, actor, request, echo)
        self._handles = [h for h in self._handles if not h._closed] + [handle]
        self._capacity = (-math.inf, None)
        return handle

    def service_host(self) -> str:
        return NODE_IP

    def advertised(self, address: str) -> str:
        return address

    def _ips(self) -> list[str]:
        return [n.get("NodeManagerAddress", "") for n in self._alive().values()]

    def loopback_only(self) -> bool:
        return all(tls.is_loopback(ip) for ip in self._ips())

    def routable_host(self) -> str | None:
        return next((ip for ip in self._ips() if not tls.is_loopback(ip)), None)

    # -- elasticity ---------------------------------------------------------------
    def worker_capacity(self) -> int | None:
        request = {k: v for k, v in self.requests["worker"].items() if v > 0}
        if not request:
            return None
        now = time.monotonic()
        if now - self._capacity[0] < 1.0:
            return self._capacity[1]
        nodes = self._alive(refresh=True)
        try:
            from ray._private import state

            available = state.available_resources_per_node()
        except Exception:  # Ray Client, or an API change: totals only
            available = {}
        ours: dict[str, dict[str, float]] = {}
        pending = 0
        for h in self._handles:
            if h._closed or h._code is not None:
                continue
            if h.node is None:
                pending += h.kind == "worker"
                continue
            used = ours.setdefault(h.node, {})
            for k, v in h.request.items():
                used[k] = used.get(k, 0.0) + v
        room = 0
        for node, info in nodes.items():
            total = info.get("Resources", {})
            free = {k: total.get(k, 0.0) - ours.get(node, {}).get(k, 0.0) for k in request}
            if node in available:
                free = {k: min(v, available[node].get(k, 0.0)) for k, v in free.items()}
            room += fits(free, request)
        capacity = max(0, room - pending)
        self._capacity = (now, capacity)
        return capacity

    def nodes_joined(self) -> int:
        alive = set(self._alive())
        new = alive - self._known
        self._known |= alive
        if new:
            logging.info("Ray node(s) joined: %s", ", ".join(sorted(new)))
            self._capacity = (-math.inf, None)
        return len(new)

    def describe(self) -> str:
        nodes = self._alive()
        return (f"Ray cluster of {len(nodes)} node(s); requests: "
                + ", ".join(f"{k} {v}" for k, v in self.requests.items()))

    def shutdown(self) -> None:
        for h in self._handles:
            h.close()
        if self._marker is not None:
            try:
                os.remove(self._marker)
            except OSError:
                pass
        if self._connected_here and self.ray.is_initialized():
            self.ray.shutdown()
            self._connected_here = False

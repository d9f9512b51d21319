"""Finds a job's master and parameter servers again after they moved.

On a cluster a restarted service may come back on another node, hence at
another address. The launcher rewrites `JOB_DIR/cluster.json` on every
(re)start; a client that cannot reach a server asks `ClusterResolver` for the
server's current address and, when it changed, talks to the new one
(`rpc.make_channel` does this for every channel of a process launched with
`KERAS_ELASTIC_JOB_DIR`). The file is read at most every `min_interval`
seconds, and only while some server is unreachable.

A server is named by its *role*: "master" or "ps/<index>".

Example:

>>> os.makedirs("job")
>>> with open("job/cluster.json", "w") as f:   # what the launcher writes
...     json.dump({"master": "10.0.0.7:40123", "ps": ["10.0.0.7:40125"]}, f)
>>> resolver = ClusterResolver("job")
>>> resolver.role_of("10.0.0.7:40125")
'ps/0'
>>> with open("job/cluster.json", "w") as f:   # ps/0 restarted elsewhere
...     json.dump({"master": "10.0.0.7:40123", "ps": ["10.0.0.9:35011"]}, f)
>>> resolver.roles(max_age=0)["ps/0"]
'10.0.0.9:35011'
"""

from __future__ import annotations

import json
import os
import threading
import time

from keras_elastic.common import cluster_env, fencing

CLUSTER_FILE = "cluster.json"
MASTER = "master"


def ps_role(index: int) -> str:
    """The role name of parameter server `index`.

    >>> ps_role(2)
    'ps/2'
    """
    return f"ps/{index}"


def roles_of(cluster: dict) -> dict[str, str]:
    """{role: address} of a cluster.json's content.

    >>> roles_of({"master": "a:1", "ps": ["b:2", "c:3"]})
    {'master': 'a:1', 'ps/0': 'b:2', 'ps/1': 'c:3'}
    """
    roles = {MASTER: cluster["master"]} if cluster.get("master") else {}
    roles.update({ps_role(i): a for i, a in enumerate(cluster.get("ps") or [])})
    return roles


class ClusterResolver:
    """The current addresses of the job in `job_dir` (its cluster.json)."""

    def __init__(self, job_dir: str, min_interval: float = 0.5) -> None:
        self.path = os.path.join(job_dir, CLUSTER_FILE)
        self.min_interval = min_interval
        self._lock = threading.Lock()
        self._read_at = -float("inf")
        self._roles: dict[str, str] = {}
        # The job's generation (common/fencing.py): the launcher's at this
        # process's start, then cluster.json's.
        self._generation = fencing.from_env()

    def roles(self, max_age: float | None = None) -> dict[str, str]:
        """{role: address}, from a read of the file at most `max_age` seconds
        old (default: `min_interval`); the last good read if it cannot be read."""
        max_age = self.min_interval if max_age is None else max_age
        with self._lock:
            now = time.monotonic()
            if now - self._read_at >= max_age:
                self._read_at = now
                try:
                    with open(self.path) as f:
                        cluster = json.load(f)
                    self._roles = roles_of(cluster)
                    self._generation = max(self._generation,
                                           int(cluster.get("generation", 0)))
                except (OSError, ValueError, KeyError, TypeError):
                    pass  # being replaced, or not written yet
            return dict(self._roles)

    def generation(self) -> int:
        """The job's generation as last read (no read of the file here: it is
        re-read when a server is unreachable or refuses the generation)."""
        return self._generation

    def lookup(self, role: str) -> str | None:
        """The current address of `role` (None: unknown)."""
        return self.roles().get(role)

    def role_of(self, address: str) -> str | None:
        """Which role listens at `address` now: the process's environment
        (what the launcher gave it), else the file."""
        from_env = role_from_env(address)
        if from_env is not None:
            return from_env
        for role, at in self.roles(max_age=0).items():
            if at == address:
                return role
        return None


def role_from_env(address: str) -> str | None:
    """The role of `address` among the cluster the launcher gave this process.

    >>> os.environ.update({cluster_env.MASTER: "m:1", cluster_env.PS: "p:2,q:3"})
    >>> role_from_env("q:3"), role_from_env("m:1"), role_from_env("x:9")
    ('ps/1', 'master', None)
    >>> for k in (cluster_env.MASTER, cluster_env.PS): del os.environ[k]
    """
    if os.environ.get(cluster_env.MASTER) == address:
        return MASTER
    ps = [a for a in os.environ.get(cluster_env.PS, "").split(",") if a]
    if address in ps:
        return ps_role(ps.index(address))
    return None


_resolvers: dict[str, ClusterResolver] = {}
_resolvers_lock = threading.Lock()


def for_process() -> ClusterResolver | None:
    """The resolver of the job this process belongs to (its
    `KERAS_ELASTIC_JOB_DIR`), or None outside a launched job."""
    job_dir = os.environ.get(cluster_env.JOB_DIR)
    if not job_dir:
        return None
    with _resolvers_lock:
        if job_dir not in _resolvers:
            _resolvers[job_dir] = ClusterResolver(job_dir)
        return _resolvers[job_dir]


def forget() -> None:
    """Drops this process's resolvers (a warm process entering its job:
    common/role_env.py)."""
    with _resolvers_lock:
        _resolvers.clear()

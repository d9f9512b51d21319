"""Environment variables through which the launcher describes the cluster.

Example:

>>> os.environ.update(to_env("127.0.0.1:5000", ["127.0.0.1:5001"], 3))
>>> read().worker_id
3
"""

from __future__ import annotations

import dataclasses
import os

MASTER = "KERAS_ELASTIC_MASTER"
PS = "KERAS_ELASTIC_PS"
WORKER_ID = "KERAS_ELASTIC_WORKER_ID"
JOB_DIR = "KERAS_ELASTIC_JOB_DIR"
CONNECT_TIMEOUT = "KERAS_ELASTIC_CONNECT_TIMEOUT"
LIVENESS_TIMEOUT = "KERAS_ELASTIC_LIVENESS_TIMEOUT"
# The job's seed: every worker's global random generators start from it
# (common/seeding.py), so that unseeded code builds the same data everywhere.
SEED = "KERAS_ELASTIC_SEED"
# A relaunched worker: the id of the worker whose process ended (worker_group.py).
REPLACES = "KERAS_ELASTIC_REPLACES"


DEFAULT_CONNECT_TIMEOUT = 300.0


def connect_timeout() -> float:
    """Seconds a worker keeps trying to reach the master or a parameter server,
    at start and after losing it (a restarting server), before giving up."""
    raw = os.environ.get(CONNECT_TIMEOUT, str(DEFAULT_CONNECT_TIMEOUT))
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{CONNECT_TIMEOUT}={raw!r} is not a number of seconds") from None


def liveness_timeout() -> float:
    """The launcher's --liveness_timeout as a launched process has it
    (`KERAS_ELASTIC_LIVENESS_TIMEOUT`); 0.0 outside a launched job.

    >>> os.environ[LIVENESS_TIMEOUT] = "60"
    >>> liveness_timeout()
    60.0
    >>> del os.environ[LIVENESS_TIMEOUT]
    """
    raw = os.environ.get(LIVENESS_TIMEOUT)
    try:
        return float(raw) if raw else 0.0
    except ValueError:
        raise ValueError(f"{LIVENESS_TIMEOUT}={raw!r} is not a number of seconds"
                         ) from None


def call_deadline(seconds: float) -> float:
    """The deadline of a client's call that would take `seconds` at most
    normally. In a launched job it outlasts the launcher's liveness timeout
    (`KERAS_ELASTIC_LIVENESS_TIMEOUT`): a server that hangs is then killed
    and replaced by the launcher before the call gives up, and the call,
    retried against the replacement, goes on (the worker does not die for
    the server's fault).

    >>> os.environ[LIVENESS_TIMEOUT] = "60"
    >>> call_deadline(10.0)
    150.0
    >>> del os.environ[LIVENESS_TIMEOUT]
    """
    liveness = liveness_timeout()
    return max(seconds, 2 * liveness + 30) if liveness > 0 else seconds


@dataclasses.dataclass(frozen=True)
class ClusterEnv:
    master_address: str
    ps_addresses: list[str]
    worker_id: int
    job_dir: str | None = None


def read() -> ClusterEnv | None:
    """The cluster from the environment, or None when not launched."""
    master = os.environ.get(MASTER)
    if not master:
        return None
    ps = [a for a in os.environ.get(PS, "").split(",") if a]
    if not ps:
        raise ValueError(f"{MASTER} is set but {PS} is empty: the launcher must name "
                         "at least one parameter server")
    raw_id = os.environ.get(WORKER_ID, "-1")
    try:
        worker_id = int(raw_id)
    except ValueError:
        raise ValueError(f"{WORKER_ID}={raw_id!r} is not an integer") from None
    return ClusterEnv(master, ps, worker_id, os.environ.get(JOB_DIR))


def to_env(master: str, ps: list[str], worker_id: int,
           job_dir: str | None = None, seed: int | None = None) -> dict[str, str]:
    env = {MASTER: master, PS: ",".join(ps), WORKER_ID: str(worker_id)}
    if job_dir:
        env[JOB_DIR] = job_dir
    if seed is not None:
        env[SEED] = str(seed)
    return env


def replaces() -> int | None:
    """The worker this relaunched worker replaces (None: not a relaunch).

    >>> os.environ[REPLACES] = "1"
    >>> replaces()
    1
    >>> del os.environ[REPLACES]
    """
    return _int(REPLACES)


def seed() -> int | None:
    """The job's seed (None outside a launched job, or when the launcher
    gave none)."""
    return _int(SEED)


def _int(name: str) -> int | None:
    """Integer variable `name` (None when unset or empty)."""
    raw = os.environ.get(name)
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None

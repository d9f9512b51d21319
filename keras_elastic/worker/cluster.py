"""The cluster a worker process belongs to: from the launcher, or embedded.

The launcher passes the cluster through environment variables (names in
`keras_elastic.common.cluster_env`). Without them, the first use starts an
*embedded* cluster: a master and one parameter server inside this process,
serving over real gRPC on 127.0.0.1, so a notebook or a laptop needs no setup.

Example:

>>> cluster = get_cluster()          # an embedded one: no job around
>>> cluster.embedded, cluster.worker_id
(True, 0)
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading

from absl import logging

from keras_elastic.common import cluster_env, job_end, stacks
from keras_elastic.common.timing import PhaseTimer
from keras_elastic.master.client import MasterClient, WorkerLostError
from keras_elastic.ps.client import PSClient


class Cluster:
    """Clients of the master and the parameter servers, plus phase timers."""

    def __init__(self, master_address: str, ps_addresses: list[str],
                 worker_id: int = -1, embedded_servers: tuple = (),
                 heartbeat_interval: float = 2.0) -> None:
        self.master_address = master_address
        self.ps_addresses = list(ps_addresses)
        self._servers = embedded_servers
        self.timer = PhaseTimer()
        env = cluster_env.read()
        if not self.embedded and env is not None and env.job_dir:
            # A worker the job lost (cut off by the network) leaves when the
            # job ends without it, instead of retrying a master that is gone;
            # watched from the start: registering, or connecting to a server,
            # on a machine cut off then, waits for --connect_timeout.
            job_end.watch(env.job_dir, lambda: (
                self.master.worker_id if hasattr(self, "master") else worker_id))
            # One the job presumed lost exits with status 3 (join rejoins).
            job_end.exit_lost_on(WorkerLostError)
        timeout = cluster_env.connect_timeout()
        self.master = MasterClient(master_address, worker_id, connect_timeout=timeout)
        self.worker_id = self.master.register_worker(
            reason=f"pid {os.getpid()}" + (" (embedded)" if self.embedded else ""),
            replaces=None if self.embedded else cluster_env.replaces())
        self.ps = PSClient(self.ps_addresses, worker_id=self.worker_id,
                           connect_timeout=timeout)
        def reached() -> dict[str, float]:
            # Servers idle for a heartbeat are asked (the next beat says).
            self.ps.probe_idle(older_than=heartbeat_interval)
            return self.ps.reached()

        self.master.start_heartbeats(heartbeat_interval, self.timer.snapshot,
                                     self.ps.waits, reached)
        self._closed = False

    @property
    def embedded(self) -> bool:
        return bool(self._servers)

    @property
    def num_ps(self) -> int:
        return len(self.ps_addresses)

    def local_store(self):
        """The parameter server's store when it runs in this process (an
        embedded cluster), else None."""
        from keras_elastic.ps.server import ParameterServer

        servers = [s for s in self._servers if isinstance(s, ParameterServer)]
        return servers[0].store if len(servers) == 1 else None

    def close(self) -> None:
        """Closes the clients. A launched worker whose script finished tells the
        master it exited (the chief stays the chief: it wrote the job's
        outputs); one whose script died of an exception does not (it is
        lost, reported by its launcher or by its silence, and the chief
        passes on): a chief that left on `JobRolledBackError` (its epochs
        reopened by a recovery) must not keep the role from the worker that
        trains them and finishes the script."""
        if self._closed:
            return
        self._closed = True
        if not self.embedded and not script_failed():
            # (a worker whose script failed keeps the watch: should its end
            # hang on a server it cannot reach, the job's end ends it)
            job_end.stop()
        # (an embedded master goes away with this process)
        if not self.embedded and not script_failed():
            self.master.worker_exited(self.timer.snapshot())
        self.master.close()
        self.ps.close()
        for server in self._servers:
            server.stop(0)


def script_failed() -> bool:
    """Whether this process's script ended with an uncaught exception (Python
    keeps it for the exit handlers as `sys.last_value`, 3.12+ `sys.last_exc`)."""
    return (getattr(sys, "last_exc", None) is not None
            or getattr(sys, "last_value", None) is not None)


_lock = threading.Lock()
_cluster: Cluster | None = None


def start_embedded_cluster() -> Cluster:
    """Starts a master and one parameter server in this process."""
    from keras_elastic.master.server import MasterServer
    from keras_elastic.ps.server import ParameterServer

    # The worker is this process: it cannot be lost while its master lives
    # (the worker's train step then logs its updates right after applying
    # them: worker/train_function.py).
    master = MasterServer(heartbeat_timeout=float("inf"))
    ps = ParameterServer()
    logging.info("keras_elastic: embedded cluster (master %s, PS %s)", master.address,
                 ps.address)
    return Cluster(master.address, [ps.address], worker_id=0,
                   embedded_servers=(ps, master))


def get_cluster() -> Cluster:
    """The process-wide cluster, created on first use."""
    global _cluster
    with _lock:
        if _cluster is None:
            env = cluster_env.read()
            if env is None:
                _cluster = start_embedded_cluster()
            else:
                _cluster = Cluster(env.master_address, env.ps_addresses, env.worker_id)
                _exit_on_sigterm()
                stacks.enable_stack_dumps()  # kill -USR1: every thread's stack
            _close_at_exit(_cluster)
        return _cluster


def _close_at_exit(cluster: Cluster) -> None:
    """Closes `cluster` when the script ends, while the process can still run
    threads: as the main thread ends, before Python stops its thread pools
    (gRPC's server shuts down through them; closed later, from `atexit`, its
    stop waited for good on a pool that refused work: "cannot schedule new
    futures after interpreter shutdown"). `threading._register_atexit` is
    where `concurrent.futures` registers its own end; callbacks run last
    registered first. `atexit` where it is missing."""
    register = getattr(threading, "_register_atexit", None)
    if register is None:
        atexit.register(cluster.close)
        return
    try:
        register(cluster.close)
    except RuntimeError:  # (already shutting down)
        atexit.register(cluster.close)


def _exit_on_sigterm() -> None:
    """A launched worker stopped with SIGTERM (scaling down) exits cleanly, so
    the master requeues its tasks at once instead of after a heartbeat timeout."""
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def is_chief(cluster: Cluster | None = None) -> bool:
    """Whether this worker should write the job's own outputs (final metrics,
    an export, the files of Keras' file-writing callbacks), or is a plain
    process.

    The master holds the chief: the first worker to register, for as long as
    it is alive or has finished the script (it wrote its outputs: the others
    must not write them again); when it is lost, the alive worker with the
    smallest id. So two workers never both write, also at the job's start,
    when one worker may reach `fit` before another has registered. Worker 0 is
    not always the chief, and a lost worker comes back with a new id.

    Example:

    >>> import keras
    >>> import keras_elastic as ke
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> if ke.worker.is_chief():   # always, in a plain process
    ...     model.save("model.keras")
    """
    cluster = cluster if cluster is not None else get_cluster()
    if cluster.embedded:
        return True
    return cluster.master.job_status().workers.chief == cluster.worker_id


def reset_cluster() -> None:
    """Closes the process-wide cluster (the next `get_cluster` makes a new one)."""
    global _cluster
    with _lock:
        if _cluster is not None:
            _cluster.close()
            _cluster = None

"""The launcher's configuration: `LaunchConfig` (one field per flag of
`keras-elastic run`) and its checks, and the Ray resource requests' parsing.

Pure data and checks, no process is started here:

```python
config = LaunchConfig(num_workers=2, num_ps=1, job_dir="/tmp/job")
config.validate()  # ValueError naming the flag when it cannot run
```
"""

from __future__ import annotations

import dataclasses
import json

from keras_elastic.common import cluster_env, rpc, tls
from keras_elastic.launcher.backends import BACKENDS
from keras_elastic.ps.partition import DEFAULT_PARTITION_BYTES


@dataclasses.dataclass
class LaunchConfig:
    """What `keras-elastic run` was asked for: the job's roles, their budgets,
    checkpoints, security and backend. One field per flag of the same name
    (`keras_elastic/cli.py` maps them); `validate()` refuses a combination
    that cannot run, naming the flag.

    >>> config = LaunchConfig(num_workers=2, max_workers=4)
    >>> config.validate()
    >>> config.bounds
    (2, 4)
    >>> LaunchConfig(num_workers=3, max_workers=2).validate()
    Traceback (most recent call last):
    ...
    ValueError: --num_workers=3 is more than --max_workers=2
    """

    num_workers: int = 1
    num_ps: int = 1
    min_workers: int = 0          # 0: num_workers
    max_workers: int = 0          # 0: num_workers
    max_worker_restarts: int = 3
    grads_to_wait: int = 1
    heartbeat_timeout: float = 30.0
    # A master or parameter server that answers no health check for this long
    # is lost (killed, then recovered as if it had died).
    liveness_timeout: float = 60.0
    # The start rendezvous: no task is handed out before the job's
    # num_workers workers registered, or this many seconds passed.
    rendezvous_timeout: float = 120.0
    # Trainable variables of at least this many bytes are split over the
    # parameter servers (ps/partition.py); 0: none is.
    ps_partition_bytes: int = DEFAULT_PARTITION_BYTES
    max_task_retries: int = 3
    progress_interval: float = 10.0
    job_dir: str | None = None
    echo_worker_output: bool = True
    max_ps_restarts: int = 3
    ps_checkpoint_secs: float = 30.0
    ps_checkpoint_versions: int = 0
    # Embedding tables in automatic checkpoints: a full save every this many
    # (the others hold the rows changed since the previous one); 1: all full.
    ps_checkpoint_full_every: int = 8
    ps_checkpoints_to_keep: int = 2
    max_master_restarts: int = 3
    resume: bool = False          # continue the job of job_dir from its journal
    # The workers' random generators start from it (common/seeding.py); None:
    # chosen at random (a resumed job keeps its own).
    seed: int | None = None
    connect_timeout: float = cluster_env.DEFAULT_CONNECT_TIMEOUT
    # Where the master and parameter servers listen, and the host the job's
    # processes reach them at (None: `bind`); see docs/security.md.
    bind: str = "127.0.0.1"
    advertise: str | None = None
    # None: on beyond loopback (unless insecure), off on loopback; True forces
    # it on loopback too; False turns it off (refused beyond loopback unless
    # insecure). Always on when tls_cert is given.
    tls: bool | None = None
    tls_cert: str | None = None   # None with TLS on: a self-signed one in JOB_DIR/tls
    tls_key: str | None = None
    tls_ca: str | None = None     # what clients trust (None: the system's CAs)
    insecure: bool = False        # allows clear text beyond loopback
    # Where roles run: "local" (this machine) or "ray" (see backends/ray.py).
    backend: str = "local"
    ray_address: str | None = None  # None: RAY_ADDRESS / a local cluster / a new one
    # Ray resources per role, e.g. {"CPU": 2, "GPU": 1} (None: the defaults).
    worker_resources: dict | None = None
    ps_resources: dict | None = None
    master_resources: dict | None = None

    @property
    def tls_on(self) -> bool:
        if self.tls_cert:
            return True
        if self.tls is not None:
            return self.tls
        return not tls.is_loopback(self.bind) and not self.insecure

    def validate(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"--num_workers must be at least 1, got {self.num_workers}")
        if self.num_ps < 1:
            raise ValueError(f"--num_ps must be at least 1, got {self.num_ps}")
        if self.max_workers and self.max_workers < self.num_workers:
            raise ValueError(f"--num_workers={self.num_workers} is more than "
                             f"--max_workers={self.max_workers}")
        if self.min_workers > self.num_workers:
            raise ValueError(f"--min_workers={self.min_workers} is more than "
                             f"--num_workers={self.num_workers}")
        if self.seed is not None and not 0 <= self.seed < 2 ** 32:
            raise ValueError(f"--seed must be in [0, 2**32), got {self.seed}")
        if self.max_worker_restarts < 0:
            raise ValueError("--max_worker_restarts must be >= 0, got "
                             f"{self.max_worker_restarts}")
        if self.grads_to_wait < 1:
            raise ValueError(f"--grads_to_wait must be >= 1, got {self.grads_to_wait}")
        if self.max_master_restarts < 0:
            raise ValueError("--max_master_restarts must be >= 0, got "
                             f"{self.max_master_restarts}")
        if self.resume and not self.job_dir:
            raise ValueError("--resume needs the --job_dir of the job to continue")
        if self.max_ps_restarts < 0:
            raise ValueError("--max_ps_restarts must be >= 0, got "
                             f"{self.max_ps_restarts}")
        if self.ps_checkpoint_full_every < 1:
            raise ValueError(f"--ps_checkpoint_full_every must be at least 1, got "
                             f"{self.ps_checkpoint_full_every}")
        if self.ps_checkpoint_secs < 0 or self.ps_checkpoint_versions < 0:
            raise ValueError("--ps_checkpoint_secs and --ps_checkpoint_versions must "
                             "be >= 0 (0: off)")
        if self.ps_checkpoints_to_keep < 1:
            raise ValueError("--ps_checkpoints_to_keep must be >= 1, got "
                             f"{self.ps_checkpoints_to_keep}")
        if self.rendezvous_timeout < 0:
            raise ValueError(f"--rendezvous_timeout must be >= 0, got "
                             f"{self.rendezvous_timeout}")
        if self.ps_partition_bytes < 0:
            raise ValueError(f"--ps_partition_bytes must not be negative, got "
                             f"{self.ps_partition_bytes}")
        if self.liveness_timeout <= 0:
            raise ValueError(f"--liveness_timeout must be positive, got "
                             f"{self.liveness_timeout}")
        if self.connect_timeout <= 0:
            raise ValueError(f"--connect_timeout must be positive, got "
                             f"{self.connect_timeout}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls_cert and --tls_key go together (the servers' "
                             "certificate and its private key)")
        if self.tls_ca and not self.tls_cert:
            raise ValueError("--tls_ca needs --tls_cert and --tls_key (without them "
                             "the job makes its own certificate and CA)")
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend={self.backend!r}: choose among "
                             f"{', '.join(BACKENDS)}")
        resources = {"worker": self.worker_resources, "ps": self.ps_resources,
                     "master": self.master_resources}
        for kind, request in resources.items():
            if request is not None:
                check_resources(request, f"--{kind}_resources")
        if self.backend != "ray":
            given = [f"--{k}_resources" for k, v in resources.items() if v is not None]
            given += ["--ray_address"] if self.ray_address else []
            if given:
                raise ValueError(f"{', '.join(given)} only apply with --backend ray")
        else:
            if self.bind != "127.0.0.1" or self.advertise:
                raise ValueError("--bind and --advertise are for --backend local: on "
                                 "Ray every service listens on the address of its node")
            return
        rpc.check_bind(self.bind, self.tls_on, self.insecure)
        if tls.is_wildcard(self.bind) and not self.advertise:
            raise ValueError(f"--bind={self.bind} listens on every interface: give "
                             "--advertise, the host name or address at which the job's "
                             "processes reach this machine")

    @property
    def bounds(self) -> tuple[int, int]:
        return (self.min_workers or self.num_workers,
                self.max_workers or self.num_workers)


def check_resources(request: object, flag: str) -> dict[str, float]:
    """A resource request is a JSON object of names to numbers >= 0.

    >>> check_resources({"CPU": 2, "GPU": 1}, "--worker_resources")
    {'CPU': 2, 'GPU': 1}
    """
    if not isinstance(request, dict) or not all(
            isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
            and v >= 0 for k, v in request.items()):
        raise ValueError(f"{flag} must be a JSON object of resource names to numbers "
                         f">= 0, e.g. '{{\"CPU\": 2, \"GPU\": 1}}'; got {request!r}")
    return request


def parse_resources(text: str | None, flag: str) -> dict[str, float] | None:
    """`--worker_resources` and the like: JSON text to a request (None: unset).

    >>> parse_resources('{"CPU": 2, "worker_slot": 1}', "--worker_resources")
    {'CPU': 2, 'worker_slot': 1}
    """
    if text is None or not text.strip():
        return None
    try:
        request = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{flag}={text!r} is not JSON ({e}); e.g. "
                         f"{flag}='{{\"CPU\": 2, \"GPU\": 1}}'") from None
    return check_resources(request, flag)

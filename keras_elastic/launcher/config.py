"""The launcher's configuration: `LaunchConfig` (one field per flag of
`keras-elastic run`: each flag's default and help are its field's, and
`launch_flags()` lists them for the CLI) and its checks, and the Ray
resource requests' parsing.

Pure data and checks, no process is started here:

```python
config = LaunchConfig(num_workers=2, num_ps=1, job_dir="/tmp/job")
config.validate()  # ValueError naming the flag when it cannot run
```
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Callable

from keras_elastic.common import cluster_env, rpc, tls
from keras_elastic.launcher.backends import BACKENDS
from keras_elastic.ps.partition import DEFAULT_PARTITION_BYTES


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


def _flag(default: object, help: str, *, choices: tuple[str, ...] | None = None,
          parse: Callable[[str | None, str], object] | None = None) -> typing.Any:
    """A `LaunchConfig` field that is the flag of the same name: `default`
    and `help` are the flag's; `choices` makes it an enum flag; `parse`
    reads the flag's text (and the flag's name, for its ValueError) into the
    field's value. Other fields take their type's flag (int, float, str, bool)."""
    return dataclasses.field(default=default, metadata={
        "help": help, "choices": choices, "parse": parse})


@dataclasses.dataclass(frozen=True)
class LaunchFlag:
    """A flag of `keras-elastic run`, as `LaunchConfig`'s field declares it."""

    name: str
    kind: type  # int, float, str or bool: how absl reads it
    default: object
    help: str
    choices: tuple[str, ...] | None = None


@dataclasses.dataclass
class LaunchConfig:
    """What `keras-elastic run` was asked for: the job's roles, their budgets,
    checkpoints, security and backend. Each field made with `_flag` is the
    flag of the same name, its default and help included: `keras_elastic/cli.py`
    defines the flags from `launch_flags()` (in field order) and builds the
    config with `from_flags`. `validate()` refuses a combination that cannot
    run, naming the flag.

    >>> config = LaunchConfig(num_workers=2, max_workers=4)
    >>> config.validate()
    >>> config.bounds
    (2, 4)
    >>> LaunchConfig(num_workers=3, max_workers=2).validate()
    Traceback (most recent call last):
    ...
    ValueError: --num_workers=3 is more than --max_workers=2
    """

    num_workers: int = _flag(1, "Workers to start.")
    num_ps: int = _flag(1, "Parameter servers to start.")
    min_ps: int = _flag(0, "With --autoscale: fewest parameter servers (0: --num_ps).")
    max_ps: int = _flag(0, "With --autoscale: most parameter servers (0: --num_ps); "
                        "more than --num_ps makes --ps_partitions at least this many.")
    ps_partitions: int = _flag(
        0, "Partitions of the model over the parameter servers (0: --num_ps, or "
        "--max_ps if more): "
        "each server process holds some; `keras-elastic scale --num_ps` moves "
        "them between processes while the job trains, up to this many servers "
        "(docs/elastic_servers.md).")
    min_workers: int = _flag(0, "Fewest workers (0: num_workers).")
    max_workers: int = _flag(0, "Most workers (0: num_workers).")
    autoscale: bool = _flag(
        False, "Size the job by itself within --min_workers/--max_workers: add a "
        "worker while the job's samples/s grows, give back one that did not help "
        "(launcher/autoscale.py; decisions in the launcher's log and summary.json).")
    autoscale_window: float = _flag(
        30.0, "With --autoscale: seconds of training measured at one size before "
        "the next decision (its first third is left out as warm-up).")
    autoscale_server_busy: float = _flag(
        0.8, "With --autoscale: the busy share of a core (CPU seconds per second) "
        "past which the busiest parameter server, with the workers' steps mostly "
        "waiting on push and pull, makes the job add a server (launcher/"
        "autoscale.py, rule 3).")
    max_worker_restarts: int = _flag(
        3, "Relaunches of dead workers before the job fails.")
    grads_to_wait: int = _flag(
        1, "Gradients averaged per update (1: asynchronous SGD).")
    ps_replicas: int = _flag(
        1, "Copies of each parameter server's state: 2 starts a backup of each "
        "server that applies every call before the server answers it; a lost "
        "server is replaced by its backup and nothing is trained again "
        "(docs/elastic_servers.md).")
    heartbeat_timeout: float = _flag(
        30.0, "Seconds without a heartbeat after which a worker is lost.")
    liveness_timeout: float = _flag(
        60.0, "Seconds a master or parameter server may answer no health check "
        "(grpc.health.v1) before it is lost: killed, then recovered as if it had "
        "died.")
    # How variables are split: ps/partition.py.
    ps_partition_bytes: int = _flag(
        DEFAULT_PARTITION_BYTES, "Trainable variables of at least this many bytes are "
        "split into slices that balance the parameter servers' bytes (with an "
        "elementwise optimizer: SGD, Adam, Adagrad, ...); 0: no variable is split.")
    # No task is handed out before the rendezvous ends.
    rendezvous_timeout: float = _flag(
        120.0, "Seconds the job's first task waits for all --num_workers workers to "
        "register (the start rendezvous); then it starts with those there.")
    max_task_retries: int = _flag(3, "Failures of one task that fail the job.")
    progress_interval: float = _flag(10.0, "Seconds between progress lines.")
    job_dir: str | None = _flag(
        None, "Logs, cluster.json, ledger and summary (default: a new temporary "
        "directory).")
    max_ps_restarts: int = _flag(
        3, "Restarts of dead parameter servers before the job fails.")
    ps_spares: int | None = _flag(
        None, "Spare parameter-server processes kept started, holding nothing, from "
        "the first periodic automatic checkpoint on: a lost server's partitions are "
        "restored onto one at once instead of onto a process started then (the "
        "start is most of a recovery's time; launcher/spares.py). Default 1 on "
        "the local backend, 0 on Ray (a spare holds a node's --ps_resources).")
    max_master_restarts: int = _flag(
        3, "Restarts of a dead master (from its journal) before the job fails.")
    # How the generators are seeded: common/seeding.py.
    seed: int | None = _flag(
        None, "The job's seed: every worker's global random generators (Python's "
        "random, NumPy's, TensorFlow's, Keras') start from it when keras_elastic is "
        "imported, so that unseeded code builds the same data on every worker. "
        "Default: chosen at random (kept by relaunched, joining and resumed "
        "workers).")
    resume: bool = _flag(
        False, "Continue the job of --job_dir (after the launcher died): from its "
        "master journal and latest parameter-server checkpoint; tasks done are not "
        "trained again.")
    ps_checkpoint_secs: float = _flag(
        30.0, "Save the parameter servers to JOB_DIR/ps_checkpoints every this many "
        "seconds (0: off); a restarted server goes back to the latest save.")
    ps_checkpoint_full_every: int = _flag(
        8, "Embedding tables in automatic checkpoints: a full save every this many; "
        "the others hold only the rows changed since the previous checkpoint (1: "
        "every save full).")
    ps_checkpoint_versions: int = _flag(
        0, "Also save every this many model versions (0: off).")
    ps_checkpoints_to_keep: int = _flag(
        2, "Automatic parameter-server checkpoints kept.")
    connect_timeout: float = _flag(
        cluster_env.DEFAULT_CONNECT_TIMEOUT, "Seconds a worker keeps retrying a "
        "master or parameter server it cannot reach (at start, or while one "
        "restarts).")
    # Where the services listen and are reached: docs/security.md.
    bind: str = _flag(
        "127.0.0.1", "Interface the master and parameter servers listen on. Beyond "
        "loopback (for workers on other machines) it needs --tls or --insecure.")
    advertise: str | None = _flag(
        None, "Host name or address at which the job's processes reach the services "
        "(default: --bind; required with --bind=0.0.0.0).")
    # None: see `tls_on`. Always on when tls_cert is given.
    tls: bool | None = _flag(
        None, "Serve over TLS (with a self-signed certificate made for the job in "
        "JOB_DIR/tls unless --tls_cert is given). Default: on beyond loopback, off "
        "on 127.0.0.1; --tls forces it on loopback too, --notls off (beyond loopback "
        "only with --insecure).")
    tls_cert: str | None = _flag(
        None, "The services' certificate chain (PEM); turns TLS on.")
    tls_key: str | None = _flag(None, "The private key of --tls_cert (PEM).")
    tls_ca: str | None = _flag(
        None, "The CA certificate (PEM) clients trust (default: the system's CAs).")
    insecure: bool = _flag(
        False, "Allow --bind beyond loopback without TLS: the job's token and data "
        "cross the network in clear text.")
    # The backends: launcher/backends/.
    backend: str = _flag(
        "local", "Where roles run: local (processes of this machine) or ray (Ray "
        "actors on the nodes of a Ray cluster; needs `pip install "
        "\"keras-elastic[ray]\"`, see docs/ray.md).", choices=BACKENDS)
    ray_address: str | None = _flag(
        None, "--backend ray: the cluster, auto, HOST:PORT (the head's GCS) or "
        "ray://HOST:PORT (Ray Client). Default: RAY_ADDRESS, else a cluster started "
        "on this machine, else a new local instance.")
    # Ray resources per role, e.g. {"CPU": 2, "GPU": 1}; the flags are JSON text.
    worker_resources: dict | None = _flag(
        None, "--backend ray: Ray resources of each worker, as JSON, e.g. "
        "'{\"CPU\": 2, \"GPU\": 1}' (default {\"CPU\": 1}).", parse=parse_resources)
    ps_resources: dict | None = _flag(
        None, "--backend ray: Ray resources of each parameter server (default "
        "{\"CPU\": 1}).", parse=parse_resources)
    master_resources: dict | None = _flag(
        None, "--backend ray: Ray resources of the master (default {\"CPU\": 0}).",
        parse=parse_resources)
    warm_start: bool = _flag(
        True, "--backend local: fork parameter servers and workers from a process "
        "that imported TensorFlow and Keras once (a role starts in milliseconds, "
        "not seconds; docs/warm_start.md). --nowarm_start starts each afresh.")
    # Not a flag: whether the launcher copies the workers' output to its own.
    echo_worker_output: bool = True

    @classmethod
    def from_flags(cls, value: Callable[[str], object]) -> LaunchConfig:
        """The config of the flags as parsed: `value(name)` is flag `name`'s
        value; a flag that cannot be read (`parse`) is a ValueError naming it.
        Fields that are no flag keep their defaults."""
        given = {}
        for field in dataclasses.fields(cls):
            if "help" in field.metadata:
                parse = field.metadata["parse"]
                raw = value(field.name)
                given[field.name] = parse(raw, f"--{field.name}") if parse else raw
        return cls(**given)

    @property
    def tls_on(self) -> bool:
        if self.tls_cert:
            return True
        if self.tls is not None:
            return self.tls
        return not tls.is_loopback(self.bind) and not self.insecure

    @property
    def spares(self) -> int:
        """The spare server processes kept started (`--ps_spares`, by default
        1 locally and 0 on Ray)."""
        if self.ps_spares is not None:
            return self.ps_spares
        return 1 if self.backend == "local" else 0

    @property
    def partitions(self) -> int:
        """The model's partitions over the parameter servers (what workers and
        checkpoints see as servers; at most this many server processes)."""
        return self.ps_partitions or max(self.num_ps, self.max_ps)

    @property
    def ps_bounds(self) -> tuple[int, int]:
        """The parameter servers' range for --autoscale."""
        return self.min_ps or self.num_ps, self.max_ps or self.num_ps

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
        if self.ps_partitions and self.ps_partitions < self.num_ps:
            raise ValueError(f"--ps_partitions={self.ps_partitions} is fewer than "
                             f"--num_ps={self.num_ps}: every server holds at least "
                             "one partition")
        if self.ps_replicas == 2 and self.partitions != self.num_ps:
            raise ValueError(f"--ps_replicas=2 with --ps_partitions={self.partitions} "
                             f"over --num_ps={self.num_ps}: servers with backups "
                             "hold one partition each (leave --ps_partitions out)")
        if self.ps_replicas not in (1, 2):
            raise ValueError(f"--ps_replicas must be 1 (no backup) or 2 (a backup of "
                             f"each server), got {self.ps_replicas}")
        if self.grads_to_wait < 1:
            raise ValueError(f"--grads_to_wait must be >= 1, got {self.grads_to_wait}")
        if self.max_master_restarts < 0:
            raise ValueError("--max_master_restarts must be >= 0, got "
                             f"{self.max_master_restarts}")
        lo_ps, hi_ps = self.ps_bounds
        if not lo_ps <= self.num_ps <= hi_ps:
            raise ValueError(f"--num_ps={self.num_ps} is outside --min_ps={lo_ps} .. "
                             f"--max_ps={hi_ps}")
        if hi_ps > self.partitions:
            raise ValueError(f"--max_ps={hi_ps} is more than --ps_partitions="
                             f"{self.partitions}: every server holds at least one "
                             "partition")
        if self.autoscale and self.bounds[0] == self.bounds[1] and lo_ps == hi_ps:
            raise ValueError(
                f"--autoscale has nothing to choose: --min_workers and --max_workers "
                f"both come to {self.bounds[0]}, --min_ps and --max_ps to {lo_ps}; "
                f"give a range, e.g. --min_workers=1 --max_workers=4")
        if not 0 < self.autoscale_server_busy:
            raise ValueError(f"--autoscale_server_busy must be > 0 (a share of one "
                             f"core), got {self.autoscale_server_busy}")
        if self.autoscale_window <= 0:
            raise ValueError(f"--autoscale_window must be > 0, got "
                             f"{self.autoscale_window}")
        if self.resume and not self.job_dir:
            raise ValueError("--resume needs the --job_dir of the job to continue")
        if self.ps_spares is not None and self.ps_spares < 0:
            raise ValueError(f"--ps_spares must not be negative, got {self.ps_spares}")
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


def launch_flags() -> list[LaunchFlag]:
    """The flags of `keras-elastic run`, one per `LaunchConfig` field made
    with `_flag`, in field order.

    >>> flag = launch_flags()[0]
    >>> flag.name, flag.kind.__name__, flag.default, flag.help
    ('num_workers', 'int', 1, 'Workers to start.')
    """
    hints = typing.get_type_hints(LaunchConfig)
    found = []
    for field in dataclasses.fields(LaunchConfig):
        if "help" not in field.metadata:
            continue
        kind = [t for t in typing.get_args(hints[field.name]) if t is not type(None)
                ] or [hints[field.name]]
        found.append(LaunchFlag(
            field.name, str if field.metadata["parse"] else kind[0], field.default,
            field.metadata["help"], field.metadata["choices"]))
    return found

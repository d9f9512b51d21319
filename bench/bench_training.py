"""Training throughput: keras-elastic against plain Keras, in one run.

Seed 000's CIFAR-10 setting: ElasticDL's `cifar10_functional_api` model, batch
128, 32 minibatches per task, one worker, one parameter server, asynchronous
SGD (grads_to_wait=1), on CIFAR-shaped synthetic TFRecords (ElasticDL's record
layout, parsed by the same `dataset_fn` in every configuration).

Configurations, each a fresh model trained for one epoch over the same files:

- plain:     `keras.Model.fit` on `dataset_fn(TFRecordDataset(files)).batch(128)
             .prefetch(AUTOTUNE)`: the baseline;
- processes: `ke.wrap(model).fit(ke.ElasticDataset(files, ...))` in this process
             as the worker, with the master and the parameter server as separate
             processes (`python -m keras_elastic.master` / `keras_elastic.ps`,
             started with --ready_file, as the launcher does): the deployment;
- pipelined: "processes" with `compile(exchange="pipelined")`: the push of step
             k travels while step k+1 computes (targets: processes >= 0.93,
             pipelined >= 0.97 of plain);
- legacy:    seed 000's 2019 worker loop (bench/legacy_worker.py: per task
             get_task, read, per minibatch input_fn in Python, get_model, an
             eager compute, report_gradient, then report_task_result; one
             thread) against the same master/PS processes; the seed's table
             (total, get_batch, input_fn, compute, get_model,
             report_gradient) is printed for it and "processes", with the
             speed-up (seed 000: 2.14x; target >= 2.1x);
- liveness:  "processes" with the liveness and fencing a launched job runs:
             master and PS fenced (`--generation`, every call checked by the
             generation interceptor, the worker's calls carrying its
             generation), the worker's call deadlines from a 60 s liveness
             timeout, and the launcher's health prober probing both services
             every 2 s from this process; its ratio to "processes" is printed
             (liveness must not cost speed);
- embedded:  the same with the embedded cluster (master and PS in this process);
- ray:       master, PS and the worker as Ray actors (the launcher's Ray backend,
             `keras_elastic/launcher/backends/ray.py`) on a local one-node Ray
             instance (`ray.init(num_cpus=2)`, node address 127.0.0.1): each
             actor runs its role as a process, the worker this script in
             `--worker_output` mode, which writes its measurement for this
             process to read. Only with Ray installed (`pip install -e
             ".[ray]"`); skipped with a message otherwise. Its ratio to plain
             is printed beside the local_backend one (target: within 0.03);
- tf_pss:    TensorFlow's own parameter-server training, the peer: tf-keras
             2.21 (`pip install -e ".[bench]"`) with `ParameterServerStrategy`
             and `ClusterCoordinator` (`fit` on a `DatasetCreator`), one
             worker and one PS as in-process `tf.distribute.Server`s on
             127.0.0.1 as TensorFlow's parameter-server tutorial sets them up,
             the same model (examples/cifar10/model.py built with tf-keras),
             optimizer and `dataset_fn`, in a process of its own (the
             strategy reconfigures the process's TensorFlow). Batch-level
             callbacks are refused under the strategy, so its warm-up is a
             first `fit` of `--warmup_batches` steps and the timed window a
             second `fit` of the rest. Prints keras-elastic (processes) / TF
             PSS samples/s (target >= 1.0); skipped without tf-keras;
- tf_keras:  tf-keras's own plain `fit` of the same model, optimizer and
             `dataset_fn`, no strategy, in a process of its own as tf_pss:
             with tf_pss it splits TF PSS's lead into the two frameworks'
             train steps (tf-keras plain / Keras 3 plain) and the
             parameter-server runtimes' own costs (TF PSS / tf-keras plain
             against keras-elastic / Keras 3 plain), all in the same run;
- local_backend: the same roles as local processes, started through the
             launcher's LocalBackend by the same code (`run_with_backend`):
             like Ray, a separate worker process, which "processes" is not;
- testbed, testbed_pipelined: the same roles on two machines of a testbed
             (tests/support/testbed.py: network namespaces on a bridge,
             198.18.0.0/15; root only, skipped with a message otherwise):
             master and PS on machine 0 (bound to its address, TLS on as
             beyond loopback), the worker (as local_backend's) on machine 1,
             sync and pipelined exchanges, once per rate of `--links`
             (`none`: the bridge unshaped; `1gbit`, `10gbit`: both
             machines' links shaped with tc's tbf). A line per rate says how
             long a step's transfer (gradients up, weights down) takes on
             the wire against a step of plain `fit`: where pipelining can
             hide it, and where the link is the wall.

The first `--warmup_batches` batches of each epoch (tracing, first pulls, the
pipeline filling up) are excluded from every measurement in the same way: the
clock runs from the end of batch `warmup_batches` to the end of the epoch.
The keras-elastic configurations run `--rounds` times (default 3), each round
between two baseline runs; each run's ratio is against the mean rate of the
baseline runs around it, and the median over rounds is the figure reported
(the machines are noisy: one round varies by several percent). Prints
samples/s per configuration and the ratios to plain; CPU seconds per sample
of all the job's processes (worker, master, PS) in the same window, a figure
that drifts much less than wall time when other work shares the machine; and
the worker's per-phase timing table over the window.

Run from the repository root:

```
PYTHONPATH=. python bench/bench_training.py
PYTHONPATH=. python bench/bench_training.py --smoke  # tiny sizes, 4 configurations
```

`--smoke`: 256 records, batch 32, 2 minibatches per task, 2 warm-up batches,
one round, and of the configurations plain, processes, liveness, legacy,
embedded, tf_pss and tf_keras
(flags given on the command line are kept): checks that they run and that the
report prints its ratios, the seed's table included; the figures mean nothing.
The others are left out because each costs tens of seconds even at this size
(pipelined: processes with one compile argument; local_backend and ray: a
worker process of its own, ray a Ray instance too); `--smoke --configs=...`
runs them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import statistics
import sys
import tempfile
import time
import types

from absl import app, flags, logging
from proc_stats import cpu_seconds

_EXAMPLE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "examples", "cifar10")


def _example_module(name: str) -> types.ModuleType:
    """examples/cifar10/<name>.py, loaded under a name of its own."""
    key = f"_bench_cifar10_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            key, os.path.join(_EXAMPLE_DIR, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


FLAGS = flags.FLAGS
flags.DEFINE_integer("num_records", 8192, "Synthetic CIFAR-10 records (one epoch).")
flags.DEFINE_integer("num_shards", 2, "TFRecord files the records are spread over.")
flags.DEFINE_integer("batch_size", 128, "Minibatch size (seed 000: 128).")
flags.DEFINE_integer("minibatches_per_task", 32, "Minibatches per task (seed 000: 32).")
flags.DEFINE_integer("warmup_batches", 8,
                     "Batches at the start of each epoch left out of the timing.")
flags.DEFINE_string("data_dir", os.path.join(tempfile.gettempdir(),
                                             "keras_elastic_bench", "cifar10"),
                    "Where the synthetic TFRecords are written (kept for reuse).")
flags.DEFINE_list("configs", ["plain", "processes", "pipelined", "liveness", "legacy",
                              "embedded", "local_backend", "ray", "tf_pss",
                              "tf_keras"],
                  "Configurations to measure, among plain, processes, pipelined, "
                  "liveness, legacy, embedded, local_backend, ray, tf_pss, "
                  "tf_keras; plain is always measured (it is the baseline); ray "
                  "is skipped when Ray is not installed, tf_pss and tf_keras "
                  "without tf-keras.")
flags.DEFINE_list("links", ["none", "10gbit", "1gbit"], "testbed configurations: "
                  "the link rates (tc units) the worker and the PS machines are "
                  "shaped to, one run each; none: unshaped.")
flags.DEFINE_enum("worker_exchange", "sync", ["sync", "pipelined"],
                  "Internal (--worker_output): the worker's exchange.")
flags.DEFINE_float("target_ratio", 0.8, "keras-elastic/plain ratio to meet.")
flags.DEFINE_integer("rounds", 3, "Rounds of keras-elastic runs, each bracketed by "
                     "baseline runs; the ratio reported is the median.")
flags.DEFINE_bool("deterministic", True, "ElasticDataset(deterministic=...): False "
                  "skips the per-element fingerprints of exactly-once replays.")
flags.DEFINE_string("worker_output", None, "Internal (ray, local_backend): run as "
                    "the worker of a launched cluster, write the measurement here.")
flags.DEFINE_list("worker_files", [], "Internal: the data files of --worker_output.")
flags.DEFINE_string("tf_pss_output", None, "Internal (tf_pss): run TensorFlow's "
                    "parameter-server training on --worker_files, write the "
                    "measurement here.")
flags.DEFINE_bool("tf_keras_plain", False, "Internal (tf_keras): with "
                  "--tf_pss_output, tf-keras's plain fit instead, no strategy.")
flags.DEFINE_list("service_pids", [], "Internal: the master and PS pids of "
                  "--worker_output (for their CPU seconds).")
flags.DEFINE_bool("smoke", False, "Tiny sizes (256 records, batch 32, one round; "
                  "configurations plain, processes, liveness, legacy, embedded, "
                  "tf_pss, tf_keras unless "
                  "--configs; a test runs it: tests/test_bench_smoke*.py); the "
                  "figures mean nothing.")

# --smoke: the values of the flags not given on the command line.
SMOKE = {"num_records": 256, "batch_size": 32, "minibatches_per_task": 2,
         "warmup_batches": 2, "rounds": 1,
         "configs": ["plain", "processes", "liveness", "legacy", "embedded", "tf_pss",
                     "tf_keras"]}

CONFIGS = ("plain", "processes", "pipelined", "liveness", "legacy", "embedded",
           "local_backend", "ray", "tf_pss", "tf_keras", "testbed", "testbed_pipelined")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class WindowTimer:
    """Times from the end of batch `warmup` to the end of the epoch.

    Also takes the CPU seconds the job's processes (`pids`: this process and
    the services) use in that window: on a shared machine wall time drifts with
    the load, CPU time per sample much less.
    """

    def __init__(self, warmup: int, phase_timer=None, pids: list[int] | None = None
                 ) -> None:
        import keras

        outer = self
        services = list(pids or [])

        class _Callback(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                outer.batches = batch + 1
                if batch + 1 == warmup:
                    outer.start = time.perf_counter()
                    outer.cpu_start = (cpu_seconds([os.getpid()]), cpu_seconds(services))
                    if phase_timer is not None:
                        outer.phases_start = phase_timer.snapshot()

            def on_epoch_end(self, epoch, logs=None):
                outer.end = time.perf_counter()
                outer.cpu_end = (cpu_seconds([os.getpid()]), cpu_seconds(services))
                if phase_timer is not None:
                    outer.phases_end = phase_timer.snapshot()

        self.callback = _Callback()
        self.start = self.end = None
        self.cpu_start = self.cpu_end = (0.0, 0.0)
        self.batches = 0
        self.phases_start: dict[str, float] = {}
        self.phases_end: dict[str, float] = {}

    def cpu(self) -> tuple[float, float]:
        """CPU seconds of (this process, the service processes) in the window."""
        return (self.cpu_end[0] - self.cpu_start[0], self.cpu_end[1] - self.cpu_start[1])

    def seconds(self) -> float:
        if self.start is None or self.end is None:
            raise RuntimeError(
                f"the epoch had {self.batches} batches, not more than --warmup_batches"
                f"; use more --num_records or fewer --warmup_batches")
        return self.end - self.start

    def phases(self) -> dict[str, float]:
        return {k: v - self.phases_start.get(k, 0.0) for k, v in self.phases_end.items()}


def compiled_model(elastic: bool, exchange: str = "sync"):
    import keras

    import keras_elastic as ke

    cifar10 = _example_module("model")
    keras.utils.set_random_seed(0)
    net = cifar10.custom_model()
    if elastic:
        net = ke.wrap(net, exchange=exchange)
    net.compile(optimizer=cifar10.optimizer(), loss=cifar10.loss(),
                metrics=["accuracy"])
    return net


@dataclasses.dataclass
class Measurement:
    seconds: float                 # wall time of the timed window
    worker_cpu: float              # CPU seconds of this process in it
    service_cpu: float             # CPU seconds of the master + PS processes in it
    phases: dict[str, float]       # the worker's phase timers over the window

    @property
    def cpu(self) -> float:
        return self.worker_cpu + self.service_cpu


def run_plain(files: list[str]) -> Measurement:
    import tensorflow as tf

    cifar10 = _example_module("model")
    dataset = cifar10.dataset_fn(tf.data.TFRecordDataset(files), "training").batch(
        FLAGS.batch_size).prefetch(tf.data.AUTOTUNE)
    net = compiled_model(elastic=False)
    timer = WindowTimer(FLAGS.warmup_batches)
    net.fit(dataset, epochs=1, verbose=0, callbacks=[timer.callback])
    return Measurement(timer.seconds(), *timer.cpu(), {})


def run_elastic(files: list[str], service_pids: list[int], exchange: str = "sync"
                ) -> Measurement:
    import keras_elastic as ke
    from keras_elastic.worker.cluster import get_cluster

    cifar10 = _example_module("model")
    cluster = get_cluster()
    logging.info("worker %d: master %s, PS %s%s", cluster.worker_id,
                 cluster.master_address, ",".join(cluster.ps_addresses),
                 " (embedded)" if cluster.embedded else "")
    train = ke.ElasticDataset(files, dataset_fn=cifar10.dataset_fn,
                              batch_size=FLAGS.batch_size,
                              minibatches_per_task=FLAGS.minibatches_per_task,
                              deterministic=FLAGS.deterministic)
    net = compiled_model(elastic=True, exchange=exchange)
    timer = WindowTimer(FLAGS.warmup_batches, cluster.timer, service_pids)
    net.fit(train, epochs=1, verbose=0, callbacks=[timer.callback])
    return Measurement(timer.seconds(), *timer.cpu(), timer.phases())


def run_legacy(files: list[str], service_pids: list[int]) -> Measurement:
    """Seed 000's 2019 worker loop (bench/legacy_worker.py) on this cluster."""
    from legacy_worker import run_legacy as legacy_loop

    cifar10 = _example_module("model")
    cpu0 = cpu_seconds([os.getpid()]), cpu_seconds(service_pids)
    phases, seconds, loss = legacy_loop(files, cifar10, FLAGS.batch_size,
                                        FLAGS.minibatches_per_task,
                                        FLAGS.warmup_batches)
    logging.info("legacy: last minibatch loss %.4f", loss)
    return Measurement(seconds, cpu_seconds([os.getpid()]) - cpu0[0],
                       cpu_seconds(service_pids) - cpu0[1], phases)


def run_with_processes(files: list[str], exchange: str = "sync",
                       worker=None, liveness: bool = False) -> Measurement:
    """The worker here; master and PS as `python -m` processes. `liveness`:
    fenced services, probed every 2 s, as a launched job runs them."""
    from keras_elastic.common import cluster_env, fencing
    from keras_elastic.launcher.liveness import HealthProber
    from keras_elastic.launcher.policy import ServiceLiveness
    from keras_elastic.launcher.processes import start_service
    from keras_elastic.worker.cluster import reset_cluster

    job_dir = tempfile.mkdtemp(prefix="keras-elastic-bench-")
    services = []
    prober = None
    saved = {k: os.environ.get(k) for k in (
        cluster_env.MASTER, cluster_env.PS, cluster_env.WORKER_ID, cluster_env.JOB_DIR,
        cluster_env.LIVENESS_TIMEOUT, fencing.GENERATION_ENV)}
    fenced = ["--generation=0"] if liveness else []
    try:
        master, master_info = start_service("master", "keras_elastic.master", fenced,
                                            job_dir)
        services.append(master)
        ps, ps_info = start_service("ps-0", "keras_elastic.ps",
                                    ["--partition=0", "--num_partitions=1",
                                     "--grads_to_wait=1", *fenced], job_dir)
        services.append(ps)
        os.environ.update(cluster_env.to_env(master_info["address"],
                                             [ps_info["address"]], 0, job_dir))
        if liveness:  # as the launcher does (launcher/launcher.py)
            os.environ[cluster_env.LIVENESS_TIMEOUT] = "60"
            os.environ[fencing.GENERATION_ENV] = "0"
            prober = HealthProber(ServiceLiveness(60.0, 2.0), 2.0)
            prober.set_targets({"master": master_info["address"],
                                "ps-0": ps_info["address"]})
            prober.start()
        reset_cluster()
        pids = [p.pid for p in services]
        measured = (worker(files, pids) if worker is not None
                    else run_elastic(files, pids, exchange))
        if prober is not None and (lost := prober.lost()):
            raise RuntimeError(f"the health prober found {lost} silent")
        return measured
    finally:
        if prober is not None:
            prober.stop()
        reset_cluster()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for process in reversed(services):
            process.terminate()
        logging.info("service logs in %s", job_dir)


def _ray_available() -> bool:
    # A one-node Ray instance at 127.0.0.1 (Ray otherwise gives its node the
    # machine's routable address, where the services would need TLS). Read
    # when Ray is imported.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # Ray starts its worker processes (and so the roles) with niceness 15 by
    # default; the local processes run at 0.
    os.environ.setdefault("RAY_worker_niceness", "0")
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def run_with_ray(files: list[str]) -> Measurement:
    """Master, PS and worker as Ray actors on a local one-node Ray instance."""
    import ray

    from keras_elastic.launcher.backends.ray import RayBackend

    if not ray.is_initialized():
        # One node at 127.0.0.1 (see _ray_available): the services bind
        # loopback (no TLS), as the local processes do. Shut down at the end
        # of main().
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    # Worker and PS {"CPU": 1}, master {"CPU": 0}.
    return run_with_backend(files, RayBackend())


def run_with_local_backend(files: list[str]) -> Measurement:
    """Master, PS and worker as local processes, started through the
    launcher's LocalBackend exactly as the ray configuration starts its actors:
    what Ray is compared with (both run the worker as a separate process)."""
    from keras_elastic.launcher.backends.local import LocalBackend

    return run_with_backend(files, LocalBackend())


def _testbed():
    """tests/support/testbed.py (machines as network namespaces)."""
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from support import testbed

    return testbed


def run_on_testbed(files: list[str], rate: str, exchange: str) -> Measurement:
    """Master and PS on testbed machine 0, the worker on machine 1, both
    machines' links shaped to `rate` (none: unshaped); TLS on, as a job
    beyond loopback has it."""
    from keras_elastic.common import tls
    from keras_elastic.launcher.backends.local import LocalBackend

    testbed = _testbed()

    class TestbedBackend(LocalBackend):
        """Services on machine 0 (bound to its address), workers on 1."""

        name = "testbed"

        def __init__(self, bed) -> None:
            super().__init__(bind=bed.address(0))
            self.bed = bed

        def start(self, name, argv, log_path, env, kind, resources=None, echo=True):
            machine = 1 if kind == "worker" else 0
            return super().start(name, self.bed.argv(machine, list(argv)), log_path,
                                 env, kind, resources, echo)

    with testbed.Testbed(2) as bed:
        if rate != "none":
            for machine in (0, 1):
                bed.shape(machine, rate)
        saved = dict(os.environ)
        try:
            config = tls.make_self_signed(tempfile.mkdtemp(prefix="bench-tls-"),
                                          [bed.address(0)])
            os.environ.update(config.to_env())
            return run_with_backend(files, TestbedBackend(bed), exchange)
        finally:
            os.environ.clear()
            os.environ.update(saved)


def run_with_backend(files: list[str], backend, exchange: str = "sync"
                     ) -> Measurement:
    """Master, PS and worker started by a launcher backend; the worker is this
    script with --worker_output, which writes its Measurement."""
    import json

    from keras_elastic.common import auth, cluster_env
    from keras_elastic.launcher.backends import start_services

    job_dir = tempfile.mkdtemp(prefix=f"keras-elastic-bench-{backend.name}-")
    host = f"--host={backend.service_host()}"  # as the launcher passes it
    roles = []
    try:
        backend.check(job_dir)
        (master, master_info), (ps, ps_info) = start_services(
            [("master", "keras_elastic.master", [host]),
             ("ps-0", "keras_elastic.ps", ["--partition=0", "--num_partitions=1",
                                           "--grads_to_wait=1", host])],
            job_dir, backend=backend)
        roles += [master, ps]
        out = os.path.join(job_dir, "worker.json")
        env = dict(os.environ, **{auth.TOKEN_ENV: auth.job_token()})
        env.update(cluster_env.to_env(master_info["address"], [ps_info["address"]], 0,
                                      job_dir))
        flag_names = ("batch_size", "minibatches_per_task", "warmup_batches",
                      "deterministic")
        argv = [sys.executable, os.path.abspath(__file__), f"--worker_output={out}",
                f"--worker_files={','.join(files)}",
                f"--service_pids={master.pid},{ps.pid}",
                f"--worker_exchange={exchange}",
                *(f"--{n}={getattr(FLAGS, n)}" for n in flag_names)]
        worker = backend.start("worker-0", argv, os.path.join(job_dir, "worker-0.log"),
                               env, kind="worker", echo=False)
        roles.append(worker)
        while (code := worker.poll()) is None:
            time.sleep(0.2)
        if code != 0:
            raise RuntimeError(
                f"the {backend.name} worker {worker.describe_exit(code)}; its log "
                f"({worker.log_path}) ends with:\n{worker.tail()}")
        with open(out) as f:
            return Measurement(**json.load(f))
    finally:
        for handle in reversed(roles):
            handle.terminate()
        backend.shutdown()
        logging.info("%s backend: logs in %s", backend.name, job_dir)


def _tf_keras_available() -> bool:
    return importlib.util.find_spec("tf_keras") is not None


def run_tf_pss(files: list[str], plain: bool = False) -> Measurement:
    """TensorFlow's ParameterServerStrategy (tf-keras), in a process of its
    own (`tf_pss_main`): its in-process servers' CPU is that process's.
    `plain`: tf-keras's plain fit there instead, no strategy."""
    import json
    import subprocess

    out = tempfile.mktemp(suffix=".json")
    argv = [sys.executable, os.path.abspath(__file__), f"--tf_pss_output={out}",
            f"--worker_files={','.join(files)}", f"--batch_size={FLAGS.batch_size}",
            f"--num_records={FLAGS.num_records}",
            f"--warmup_batches={FLAGS.warmup_batches}",
            f"--{'' if plain else 'no'}tf_keras_plain"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"the {'tf_keras' if plain else 'tf_pss'} run failed "
                           f"({result.returncode}):\n"
                           f"{result.stderr[-3000:]}")
    with open(out) as f:
        measured = json.load(f)
    os.remove(out)
    return Measurement(measured["seconds"], measured["cpu"], 0.0, {})


def tf_pss_main() -> None:
    """--tf_pss_output mode: one worker and one PS as in-process
    `tf.distribute.Server`s (TensorFlow's parameter-server tutorial), this
    process the coordinator; the CIFAR-10 example's model built by tf-keras.
    With --tf_keras_plain, tf-keras's plain fit of the same model instead."""
    import json
    import socket

    import tensorflow as tf
    import tf_keras

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    # The example's model module with `keras` bound to tf-keras.
    saved = sys.modules.get("keras")
    sys.modules["keras"] = tf_keras
    try:
        name = "_bench_cifar10_model_tf_keras"
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(_EXAMPLE_DIR, "model.py"))
        cifar10 = importlib.util.module_from_spec(spec)
        sys.modules[name] = cifar10
        spec.loader.exec_module(cifar10)
    finally:
        if saved is not None:
            sys.modules["keras"] = saved
    servers = []
    scope = contextlib.nullcontext()
    if not FLAGS.tf_keras_plain:
        cluster = tf.train.ClusterSpec({"worker": [f"127.0.0.1:{free_port()}"],
                                        "ps": [f"127.0.0.1:{free_port()}"]})
        servers = [tf.distribute.Server(cluster, job_name=job, task_index=0,
                                        protocol="grpc", start=True)
                   for job in ("worker", "ps")]
        scope = tf.distribute.experimental.ParameterServerStrategy(
            tf.distribute.cluster_resolver.SimpleClusterResolver(
                cluster, rpc_layer="grpc")).scope()
    with scope:
        net = cifar10.custom_model()
        net.compile(optimizer=cifar10.optimizer(), loss=cifar10.loss(),
                    metrics=["accuracy"])
    files = list(FLAGS.worker_files)

    def dataset_fn(input_context):
        return cifar10.dataset_fn(tf.data.TFRecordDataset(files), "training").batch(
            FLAGS.batch_size).repeat().prefetch(tf.data.AUTOTUNE)

    data = (dataset_fn(None) if FLAGS.tf_keras_plain
            else tf_keras.utils.experimental.DatasetCreator(dataset_fn))
    steps = FLAGS.num_records // FLAGS.batch_size
    net.fit(data, epochs=1, steps_per_epoch=FLAGS.warmup_batches, verbose=0)
    start, cpu = time.perf_counter(), cpu_seconds([os.getpid()])
    net.fit(data, epochs=1, steps_per_epoch=steps - FLAGS.warmup_batches, verbose=0)
    measured = {"seconds": time.perf_counter() - start,
                "cpu": cpu_seconds([os.getpid()]) - cpu}
    with open(FLAGS.tf_pss_output + ".tmp", "w") as f:
        json.dump(measured, f)
    os.replace(FLAGS.tf_pss_output + ".tmp", FLAGS.tf_pss_output)
    del servers
    os._exit(0)  # the in-process servers have no clean shutdown


def worker_main() -> None:
    """--worker_output mode: the worker of the ray and local_backend
    configurations."""
    import json

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    m = run_elastic(FLAGS.worker_files, [int(p) for p in FLAGS.service_pids],
                    FLAGS.worker_exchange)
    with open(FLAGS.worker_output + ".tmp", "w") as f:
        json.dump(dataclasses.asdict(m), f)
    os.replace(FLAGS.worker_output + ".tmp", FLAGS.worker_output)


def run_embedded(files: list[str]) -> Measurement:
    from keras_elastic.common import cluster_env
    from keras_elastic.worker.cluster import reset_cluster

    if cluster_env.read() is not None:
        raise RuntimeError(f"{cluster_env.MASTER} is set: the embedded configuration "
                           "needs a process outside a launched job")
    reset_cluster()
    try:
        return run_elastic(files, [])
    finally:
        reset_cluster()


# Seed 000's "before" row (seconds) and its minibatches: one epoch of CIFAR-10's
# 50,000 training images at batch 128, on a worker with a GPU.
_SEED_BEFORE = (51.0, 6.7, 17.9, 14.8, 5.0, 5.0)
_SEED_MINIBATCHES = 391


def _per_minibatch_lines(results: dict, minibatches: int,
                         columns: tuple[str, ...]) -> list[str]:
    """The seed's table per minibatch (ms), beside the legacy loop's and ours:
    the phases that do not depend on the machine (data, PS) can be compared
    with the seed's directly; compute depends on the device, and its share of
    the legacy loop bounds the speed-up a faster pipeline can give."""
    from legacy_worker import phase_row

    lines = [f"\nper minibatch (ms; seed 000: {_SEED_MINIBATCHES} minibatches on a "
             f"GPU worker, here {minibatches} on {_device()}):",
             "  " + f"{'':16s}" + "".join(f"{c:>16s}" for c in columns)]
    rows = [("seed 000 legacy", _SEED_BEFORE, _SEED_MINIBATCHES)]
    rows += [(name, phase_row(results[name].phases, results[name].seconds),
              minibatches) for name in ("legacy", "processes")]
    for name, row, count in rows:
        lines.append("  " + f"{name:16s}" + "".join(f"{1000 * v / count:16.1f}"
                                                     for v in row))
    legacy = phase_row(results["legacy"].phases, results["legacy"].seconds)
    bound = legacy[0] / results["processes"].phases.get("compute", legacy[0])
    lines.append(f"  compute is {legacy[3] / legacy[0]:.0%} of the legacy loop here "
                 f"({_SEED_BEFORE[3] / _SEED_BEFORE[0]:.0%} in seed 000): with every "
                 "other phase hidden, the speed-up is at most legacy total / "
                 f"keras-elastic compute = {bound:.2f}x on this device")
    return lines


def _step_bytes() -> int:
    """Bytes a step moves between worker and PS: the gradients up and the
    weights down (float32 each), the model's trainable parameters twice."""
    model = compiled_model(elastic=False)
    return 2 * 4 * sum(int(w.shape.num_elements()) for w in model.trainable_weights)


def _rate_bits(rate: str) -> float | None:
    """tc's rate units (`1gbit`, `500mbit`) in bits per second."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * scale
    return None


def _link_lines(ratios: dict[str, list[float]], plain: list[Measurement],
                n: int) -> list[str]:
    """Per link rate of the testbed runs: the wire time of a step's transfer
    against a step of plain fit, and what sync and pipelined reached."""
    rates = sorted({name.partition("@")[2] for name in ratios
                    if name.startswith("testbed")})
    if not rates:
        return []
    step_bytes = _step_bytes()
    steps = n / FLAGS.batch_size
    step_s = statistics.mean(m.seconds for m in plain) / steps
    lines = [f"\ntestbed links: a step moves {step_bytes / 1e6:.2f} MB (gradients up, "
             f"weights down); a step of plain fit takes {step_s * 1e3:.1f} ms"]
    for rate in rates:
        sync = ratios.get(f"testbed@{rate}")
        piped = ratios.get(f"testbed_pipelined@{rate}")
        bits = _rate_bits(rate)
        wire = "unshaped" if bits is None else (
            f"{step_bytes * 8 / bits * 1e3:.1f} ms on the wire per step "
            f"({step_bytes * 8 / bits / step_s:.0%} of a step)")
        found = ", ".join(f"{what} {statistics.median(r):.3f}" for what, r in
                          (("sync", sync), ("pipelined", piped)) if r)
        verdict = ""
        if bits is not None:
            share = step_bytes * 8 / bits / step_s
            # (Each way has its own share of the link: gradients up and
            # weights down may overlap, so this is an upper bound of a step's
            # wire time.)
            verdict = ("; the link is the wall: a step's transfer outlasts its "
                       "compute, pipelined or not" if share >= 1
                       else "; the transfer fits in a step's compute: pipelining "
                       "can hide it, sync pays it")
        lines.append(f"  {rate:>7s}: {wire}; ratio to plain: {found}{verdict}")
    return lines


def _device() -> str:
    """The device the training step runs on (the first GPU if any)."""
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return gpus[0].name if gpus else "CPU"


def _logged(order: list[str]):
    for name in order:
        logging.info("measuring %s ...", name)
        yield name


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if FLAGS.smoke:
        for name, value in SMOKE.items():
            if not FLAGS[name].present:
                FLAGS[name].value = value
    if FLAGS.worker_output:
        worker_main()
        return
    if FLAGS.tf_pss_output:
        tf_pss_main()
        return
    unknown = [c for c in FLAGS.configs if c not in CONFIGS]
    if unknown:
        raise app.UsageError(f"--configs: unknown {unknown}; choose among {CONFIGS}")
    if FLAGS.warmup_batches < 1:
        raise app.UsageError("--warmup_batches must be at least 1")
    if FLAGS.num_records <= FLAGS.warmup_batches * FLAGS.batch_size:
        raise app.UsageError(
            f"--num_records={FLAGS.num_records} leaves nothing to time after "
            f"--warmup_batches={FLAGS.warmup_batches} of {FLAGS.batch_size}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from keras_elastic.common.timing import PHASE_HELP, format_table

    cifar10_data = _example_module("data")
    files = cifar10_data.write_synthetic(FLAGS.data_dir, FLAGS.num_records,
                                         FLAGS.num_shards)
    n = FLAGS.num_records - FLAGS.warmup_batches * FLAGS.batch_size
    runners = {"plain": run_plain, "processes": run_with_processes,
               "pipelined": lambda f: run_with_processes(f, exchange="pipelined"),
               "liveness": lambda f: run_with_processes(f, liveness=True),
               "legacy": lambda f: run_with_processes(f, worker=run_legacy),
               "embedded": run_embedded, "local_backend": run_with_local_backend,
               "ray": run_with_ray, "tf_pss": run_tf_pss,
               "tf_keras": lambda f: run_tf_pss(f, plain=True)}
    elastic = [c for c in FLAGS.configs if c != "plain"]
    testbed_configs = [c for c in elastic if c.startswith("testbed")]
    if testbed_configs:
        why = _testbed().unavailable()
        for config in testbed_configs:
            elastic.remove(config)
            if why:
                print(f"no testbed ({why}): skipping the {config} configuration",
                      flush=True)
                continue
            exchange = "pipelined" if config == "testbed_pipelined" else "sync"
            for rate in FLAGS.links:
                name = f"{config}@{rate}"
                elastic.append(name)
                runners[name] = (lambda f, r=rate, e=exchange:
                                 run_on_testbed(f, r, e))
    if "ray" in elastic and not _ray_available():
        print("ray is not installed: skipping the ray configuration (pip install -e "
              "\".[ray]\")", flush=True)
        elastic.remove("ray")
    for config in ("tf_pss", "tf_keras"):
        if config in elastic and not _tf_keras_available():
            print(f"tf-keras is not installed: skipping the {config} configuration "
                  "(pip install -e \".[bench]\")", flush=True)
            elastic.remove(config)
    # The baseline runs first, last and between rounds: on a shared machine the
    # load drifts, and the two baseline runs around each keras-elastic run
    # bracket it. Each round gives one ratio per configuration; the median
    # over rounds is the figure.
    order = ["plain"]
    for _ in range(FLAGS.rounds if elastic else 0):
        order += elastic + ["plain"]
    results: dict[str, Measurement] = {}
    ratios: dict[str, list[float]] = {c: [] for c in elastic}
    plain: list[Measurement] = []
    pending: list[tuple[str, Measurement]] = []
    try:
        measured = [(name, runners[name](files)) for name in _logged(order)]
    finally:
        if "ray" in elastic:
            import ray

            ray.shutdown()
    for name, m in measured:
        logging.info("%s: %.1f s, %.1f CPU s for %d samples", name, m.seconds, m.cpu, n)
        if name == "plain":
            plain.append(m)
            for config, run in pending:
                bracket = (n / plain[-2].seconds + n / plain[-1].seconds) / 2
                ratios[config].append(n / run.seconds / bracket)
            pending = []
        else:
            results[name] = m
            pending.append((name, m))

    plain_rate = sum(n / m.seconds for m in plain) / len(plain)
    plain_cpu_rate = sum(n / m.cpu for m in plain) / len(plain)
    labels = {"processes": "keras-elastic, master + PS processes",
              "pipelined": "keras-elastic, processes, pipelined",
              "liveness": "keras-elastic, processes, liveness + fencing",
              "legacy": "seed 000's 2019 loop, processes",
              "embedded": "keras-elastic, embedded cluster",
              "local_backend": "keras-elastic, local backend processes",
              "ray": "keras-elastic, Ray actors (1 node)",
              "tf_pss": "TF ParameterServerStrategy (tf-keras)",
              "tf_keras": "tf-keras plain fit (no strategy)",
              **{name: f"testbed, 2 machines, {name.partition('@')[2]} links"
                 + (", pipelined" if name.startswith("testbed_pipelined") else "")
                 for name in elastic if name.startswith("testbed")}}
    lines = ["", f"CIFAR-10 (synthetic) {FLAGS.num_records} records, batch "
             f"{FLAGS.batch_size}, {FLAGS.minibatches_per_task} minibatches per task, "
             f"1 worker, 1 PS; {n} samples timed after {FLAGS.warmup_batches} warm-up "
             f"batches; device: {_device()}", "",
             f"  {'configuration':40s} {'samples/s':>9s} {'wall s':>7s} {'ratio':>6s}"
             f"   {'samples/CPU-s':>13s} {'CPU s (worker+services)':>23s} {'ratio':>6s}"]

    def row(label, m, ratio=None, cpu_ratio=None):
        r = f"{ratio:6.3f}" if ratio is not None else " " * 6
        c = f"{cpu_ratio:6.3f}" if cpu_ratio is not None else " " * 6
        cpu = f"{m.cpu:.1f} ({m.worker_cpu:.1f}+{m.service_cpu:.1f})"
        return (f"  {label:40s} {n / m.seconds:9.1f} {m.seconds:7.1f} {r}   "
                f"{n / m.cpu:13.1f} {cpu:>23s} {c}")

    for when, m in zip(("first", "last"), (plain[0], plain[-1])):
        lines.append(row(f"plain Keras fit ({when})", m))
    lines.append(f"  {'plain Keras fit: mean rate (baseline)':40s} {plain_rate:9.1f} "
                 f"{'':7s} {'':6s}   {plain_cpu_rate:13.1f}")
    for name, m in results.items():
        lines.append(row(labels[name], m, n / m.seconds / plain_rate,
                         n / m.cpu / plain_cpu_rate))
    shown: set[str] = set()
    for name, m in results.items():
        lines.append(f"\nper-phase seconds of the worker ({name}), timed window:")
        lines.extend("  " + r for r in format_table(m.phases, m.seconds).splitlines())
        shown.update(m.phases)
    lines.append("")
    lines.extend(f"  {phase}: {text}" for phase, text in PHASE_HELP.items()
                 if phase in shown)
    lines.append("  CPU s: user + system seconds in the timed window, of the worker "
                 "(this process; with the embedded cluster it also runs the master and "
                 "PS) + of the master and PS processes")
    if len(plain) > 2:
        lines.append("\nsamples/s ratio per round (each run against the mean of the "
                     "baseline runs just before and after it):")
        for name, values in ratios.items():
            lines.append(f"  {labels[name]:40s} " + " ".join(f"{r:.3f}" for r in values)
                         + f"   median {statistics.median(values):.3f}")
    if "legacy" in results and "processes" in results:
        from legacy_worker import phase_row

        columns = ("total", "get_batch", "input_fn", "compute", "get_model",
                   "report_gradient")
        lines.append(f"\nseed 000's table, {n} samples (seconds; keras-elastic's "
                     "input_fn = input_wait, get_model = pull, report_gradient = "
                     "push):")
        lines.append("  " + f"{'':16s}" + "".join(f"{c:>16s}" for c in columns))
        for name in ("legacy", "processes"):
            row = phase_row(results[name].phases, results[name].seconds)
            lines.append("  " + f"{name:16s}" + "".join(f"{v:16.1f}" for v in row))
        speedup = results["legacy"].seconds / results["processes"].seconds
        lines.append(f"  keras-elastic / legacy: {speedup:.2f}x faster (seed 000: "
                     f"51.0 s -> 23.8 s, 2.14x; target >= 2.1x: "
                     f"{'met' if speedup >= 2.1 else 'NOT met'})")
        lines.extend(_per_minibatch_lines(results, n // FLAGS.batch_size, columns))
    for name, target in (("processes", 0.93), ("pipelined", 0.97)):
        if name in ratios:
            ratio = statistics.median(ratios[name])
            lines.append(f"\n{name} exchange: samples/s ratio to plain {ratio:.3f} "
                         f"(target >= {target}: "
                         f"{'met' if ratio >= target else 'NOT met'})")
    if "tf_pss" in ratios and "processes" in ratios:
        # keras-elastic against TensorFlow's own parameter servers, both run
        # in each round: the quotient of their ratios to plain.
        paired = [r / q for r, q in zip(ratios["processes"], ratios["tf_pss"],
                                        strict=True)]
        median = statistics.median(paired)
        lines.append("\nkeras-elastic (processes) / TF ParameterServerStrategy, "
                     "samples/s per round: " + " ".join(f"{p:.3f}" for p in paired)
                     + f"   median {median:.3f} (target >= 1.0: "
                     f"{'met' if median >= 1.0 else 'NOT met'})")
    if "tf_keras" in ratios and "tf_pss" in ratios:
        # Which part of TF PSS's lead is the framework's train step and which
        # the parameter-server runtime: each PS configuration against its own
        # framework's plain fit, per round.
        def paired(a: list[float], b: list[float]) -> float:
            return statistics.median(x / y for x, y in zip(a, b, strict=True))

        step = statistics.median(ratios["tf_keras"])
        theirs = paired(ratios["tf_pss"], ratios["tf_keras"])
        lines.append(f"\nthe frameworks' train steps, tf-keras plain fit / Keras 3 "
                     f"plain fit: {step:.3f}")
        lines.append(f"the parameter-server runtimes, each / its own framework's plain "
                     f"fit: TF PSS {theirs:.3f}")
        for name in ("processes", "pipelined"):
            if name in ratios:
                ours = statistics.median(ratios[name])
                lines.append(f"  keras-elastic ({name}) {ours:.3f}: against TF PSS's "
                             f"{ours / theirs:.3f}")
    if "liveness" in ratios and "processes" in ratios:
        # Run one after the other in each round: their quotient drifts less
        # with the machine's load than either ratio to plain.
        paired = [r / q for r, q in zip(ratios["liveness"], ratios["processes"],
                                        strict=True)]
        lines.append("\nliveness + fencing / processes per round: "
                     + " ".join(f"{p:.3f}" for p in paired)
                     + f"   median {statistics.median(paired):.3f}")
    if "ray" in ratios:
        # Compared with the same roles started by the local backend (a separate
        # worker process too); else with the in-process worker.
        local = "local_backend" if "local_backend" in ratios else "processes"
        if local in ratios:
            ray_ratio = statistics.median(ratios["ray"])
            local_ratio = statistics.median(ratios[local])
            lines.append(f"\nray: samples/s ratio {ray_ratio:.3f} beside {local} "
                         f"{local_ratio:.3f} (difference {ray_ratio - local_ratio:+.3f}; "
                         "target: within 0.03)")
            # The two in the same round run one after the other: their quotient
            # drifts less with the machine's load than either ratio to plain.
            paired = [r / q for r, q in zip(ratios["ray"], ratios[local], strict=True)]
            lines.append(f"ray / {local} per round: "
                         + " ".join(f"{p:.3f}" for p in paired)
                         + f"   median {statistics.median(paired):.3f}")
    lines.extend(_link_lines(ratios, plain, n))
    if elastic:
        best = elastic[0]
        ratio = statistics.median(ratios[best])
        verdict = "meets" if ratio >= FLAGS.target_ratio else "is BELOW"
        lines.append(f"\n{best}: samples/s ratio {ratio:.3f} (median of "
                     f"{len(ratios[best])} round(s)) {verdict} the target "
                     f"{FLAGS.target_ratio}")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    app.run(main)

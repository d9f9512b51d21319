"""Parameter-server capacity: pushes/s with 1, 2 and 4 servers and 4 to 32 workers.

For each server count of `--num_ps` (default 1, 2, 4), that many parameter
server processes (`python -m keras_elastic.ps`, started as the launcher does;
`--optimizer`, asynchronous SGD: grads_to_wait 1) hold a model of `--model_mb`
decimal MB as `--tensors` float32 variables spread evenly over them (names
chosen so). Simulated workers, `--client_processes` processes of threads with
a real `PSClient` each, do what a worker's step does against the servers and
nothing else (no compute): push gradients for every variable and take the new
values back (`PSClient.exchange`), as fast as they can, for `--seconds` per
configuration, with `--workers` (default 4, 8, 16, 32) of them at a time.

Prints per configuration: exchanges (pushes) per second, MB/s (model bytes of
both directions), latency of one exchange (median, 90th percentile), CPU
seconds of the server processes per push (from /proc: `proc_stats.py`) and
per pushed MB, and how busy the servers and clients were (CPU seconds per
second, of the machine's cores). Then the scaling efficiency from 1 to 2 and
to 4 servers at each worker count (pushes/s with N servers / (N x pushes/s
with 1)) and the per-push CPU cost, from which the sizing note of docs/benchmarks.md
is derived. On a machine with few cores the clients and servers share them:
the per-push CPU cost is the figure that carries to other machines.

The floor, in the same run (`--echo`): the same client processes send the
same bytes to one raw-bytes gRPC echo server (echo_server.py: chunks in,
chunks back, nothing decoded or applied) at each worker count; printed as its
own table and as the ratio of server CPU per pushed MB, PS / echo, with 1
server (target <= 1.5). Then the fixed cost of a push (`--fixed_cost_kb`,
default a 4 KB model of 4 tensors on 1 server, 4 workers): server CPU per
push (target <= 2 ms), beside the echo's for the same bytes. Then the cost of
each tensor a push carries (`--per_tensor_tensors`, default the same 4 KB
model in 64 tensors): (server CPU per push with 64 tensors - with 4) / 60,
and the same for the client's CPU (a model of many small variables pays it
per variable on both ends).

Last, a server added while the workers push (`--live_add_workers`, default
8; 0: not measured): one process holds both partitions of a 2-partition
model (`--ps_partitions=2` over 1 server), a second process is started
empty, and partition 1 moves to it while the simulated workers push
(`ps/moves.py`, as `keras-elastic scale --num_ps 2` does; the workers follow
it through the job's cluster.json). Printed: pushes/s before the move, during
the phase the move happens in (its longest push), and after, with the ratio
after / before, in the same run. The new process runs on the same machine:
with few cores, servers and clients share them, and the ratio says what a
second server process costs or gains here (`--server_cores` gives each its
own).

```
PYTHONPATH=. python bench/bench_ps_scaling.py
PYTHONPATH=. python bench/bench_ps_scaling.py --model_mb=16 --seconds=10
PYTHONPATH=. python bench/bench_ps_scaling.py --smoke  # tiny sizes: 1 and 2 servers
PYTHONPATH=. python bench/bench_ps_scaling.py --server_cores=1  # a core per server
```

`--server_cores=N`: each server process gets N cores of its own (every thread
bound with `sched_setaffinity`), and the clients the cores left, so that servers
and clients do not compete: the scaling efficiency is then the servers' own,
and a server's busy figure shows how many cores one server process can use.
The bench says so in its first line; with too few cores it stops and says how
many there are.

`--smoke`: 1 and 2 servers (not 4: starting each server process costs
seconds, and 4 run the same code as 2), a 0.1 MB model of 4 tensors, 2 and 4
workers in 2 processes, 0.3 s of warm-up and 1 s measured per configuration
(flags given on the command line are kept): checks that the measurement runs
and prints the tables, the scaling efficiencies, the echo ratio and the fixed
cost; the figures mean nothing.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import tempfile
import threading
import time

import numpy as np
from absl import app, flags, logging
from proc_stats import core_plan, cpu_seconds, pin
from ps_bench_common import variable_names

from keras_elastic.ps.update import Update

FLAGS = flags.FLAGS
flags.DEFINE_list("num_ps", ["1", "2", "4"], "Parameter server counts.")
flags.DEFINE_list("workers", ["4", "8", "16", "32"], "Simulated worker counts.")
flags.DEFINE_float("model_mb", 4.0, "Model size, decimal MB.")
flags.DEFINE_integer("tensors", 16, "Variables of the model (equal sizes; a multiple "
                     "of every --num_ps, so that each server holds its share).")
flags.DEFINE_integer("client_processes", 4, "Processes the simulated workers are "
                     "spread over (threads in each).")
flags.DEFINE_float("seconds", 4.0, "Seconds measured per configuration.")
flags.DEFINE_float("warmup", 1.0, "Seconds each configuration runs before it is "
                   "measured.")
flags.DEFINE_enum("optimizer", "SGD", ["SGD", "Adam"], "The servers' optimizer.")
flags.DEFINE_bool("echo", True, "Also measure a raw-bytes gRPC echo server (1 process, "
                  "echo_server.py) with the same clients and bytes: the floor of "
                  "server CPU per MB the PS is compared with.")
flags.DEFINE_float("fixed_cost_kb", 4.0, "Also measure the fixed cost of a push: a "
                   "model of this many KB in --fixed_cost_tensors tensors on 1 server "
                   "(0: not measured).")
flags.DEFINE_integer("fixed_cost_tensors", 4, "Tensors of the fixed-cost model.")
flags.DEFINE_integer("fixed_cost_workers", 4, "Simulated workers of the fixed-cost "
                     "measurement.")
flags.DEFINE_integer("per_tensor_tensors", 64, "Also measure the cost of each tensor "
                     "of a push: the fixed-cost model in this many tensors against "
                     "--fixed_cost_tensors (0: not measured).")
flags.DEFINE_integer("server_cores", 0, "Cores of its own for each server process "
                     "(bound with sched_setaffinity; the echo server gets the first "
                     "server's), the simulated workers bound to the cores left: servers "
                     "and clients do not share cores, so a server's busy figure and the "
                     "scaling efficiency are the servers' own. 0: all processes share "
                     "every core.", lower_bound=0)
flags.DEFINE_integer("live_add_workers", 8, "Also measure adding a server while this "
                     "many simulated workers push: pushes/s before and after a "
                     "partition moves to a new process (0: not measured).",
                     lower_bound=0)
flags.DEFINE_bool("smoke", False, "Tiny sizes (1 and 2 servers, a 0.1 MB model, 2 and "
                  "4 workers, 1 s per configuration; a test runs it: "
                  "tests/test_bench_smoke*.py); the figures mean nothing.")

# --smoke: the values of the flags not given on the command line.
SMOKE = {"num_ps": ["1", "2"], "workers": ["2", "4"], "model_mb": 0.1, "tensors": 4,
         "client_processes": 2, "seconds": 1.0, "warmup": 0.3, "live_add_workers": 2}

_MB = 1_000_000
# --server_cores: {"servers": [the cores of server i], "clients": [cores]}.
CORES: dict[str, list] = {}


def model_shapes(num_ps: int, model_mb: float, tensors: int) -> dict[str, int]:
    elements = int(model_mb * _MB) // 4 // tensors
    return dict.fromkeys(variable_names(tensors, num_ps), elements)


# -- the simulated workers (client processes) --------------------------------
def _client_process(kind: str, addresses: list[str], shapes: dict[str, int],
                    threads: int, first_id: int, commands, results,
                    job_dir: str | None = None) -> None:
    """`threads` workers, each a `PSClient` (`kind` "ps") or an `EchoClient`
    sending the same bytes ("echo"); runs the phases it is told (`(active
    threads, start time, measured seconds, warm-up seconds)`) until told None;
    reports per phase the exchanges completed in the measured window, their
    bytes and latencies."""
    grads = {n: np.full(size, 1e-3, np.float32) for n, size in shapes.items()}
    sent = sum(g.nbytes for g in grads.values())
    if kind == "echo":
        from echo_server import EchoClient

        clients = [EchoClient(addresses) for _ in range(threads)]
        exchanges = [lambda c=c: c.exchange(sent) for c in clients]
    else:
        from keras_elastic.common.resolver import ClusterResolver
        from keras_elastic.ps.client import PSClient

        # With a job directory, the clients follow moved partitions through
        # its cluster.json, as a job's workers do.
        resolver = ClusterResolver(job_dir) if job_dir else None
        clients = [PSClient(addresses, worker_id=first_id + k, resolver=resolver,
                            reconnect_timeout=60)
                   for k in range(threads)]
        for client in clients:  # learn the servers' versions (a worker's first pull)
            client.pull()
        exchanges = [lambda c=c: sent + sum(v.nbytes for v in c.send(
            Update(grads=grads)).values.values()) for c in clients]
    results.put("ready")
    while True:
        command = commands.get()
        if command is None:
            break
        results.put(_phase(exchanges[:command[0]], *command[1:]))
    for client in clients:
        client.close()


def _phase(exchanges: list, start_at: float, seconds: float, warmup: float
           ) -> tuple[int, int, list[float]]:
    """Every client exchanges as fast as it can from `start_at` for `warmup +
    seconds`; returns the exchanges completed in the last `seconds`: their
    number, bytes and latencies."""
    begin, end = start_at + warmup, start_at + warmup + seconds
    counts = [0] * len(exchanges)
    moved = [0] * len(exchanges)
    latencies: list[list[float]] = [[] for _ in exchanges]

    def run(k: int) -> None:
        while time.time() < start_at:
            time.sleep(0.001)
        while True:
            t0 = time.time()
            if t0 >= end:
                return
            nbytes = exchanges[k]()
            t1 = time.time()
            if begin <= t1 <= end:  # completed in the window (throughput)
                counts[k] += 1
                moved[k] += nbytes
                latencies[k].append(t1 - t0)

    pool = [threading.Thread(target=run, args=(k,)) for k in range(len(exchanges))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(counts), sum(moved), [x for lat in latencies for x in lat]


class Clients:
    """`--client_processes` processes holding `max(--workers)` workers."""

    def __init__(self, addresses: list[str], shapes: dict[str, int],
                 max_workers: int, kind: str = "ps", job_dir: str | None = None) -> None:
        context = multiprocessing.get_context("spawn")
        self.count = min(FLAGS.client_processes, max_workers)
        per = -(-max_workers // self.count)
        self.per = per
        self.results = context.Queue()
        self.commands = [context.Queue() for _ in range(self.count)]
        self.procs = [context.Process(target=_client_process, args=(
            kind, addresses, shapes, per, i * per, self.commands[i], self.results,
            job_dir))
            for i in range(self.count)]
        for p in self.procs:
            p.start()
        for _ in self.procs:
            if self.results.get(timeout=300) != "ready":
                raise RuntimeError("a client process did not start")
        if FLAGS.server_cores:
            pin(self.pids, CORES["clients"])

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def run(self, workers: int, start_at: float) -> tuple[int, int, list[float]]:
        """`workers` workers, spread evenly over the processes."""
        active = [workers // self.count + (i < workers % self.count)
                  for i in range(self.count)]
        if max(active) > self.per:
            raise ValueError(f"{workers} workers do not fit in {self.count} x "
                             f"{self.per}")
        for queue, n in zip(self.commands, active):
            queue.put((n, start_at, FLAGS.seconds, FLAGS.warmup))
        pushes = moved = 0
        latencies: list[float] = []
        for _ in range(self.count):
            p, m, lat = self.results.get(timeout=FLAGS.seconds + FLAGS.warmup + 600)
            pushes, moved = pushes + p, moved + m
            latencies += lat
        return pushes, moved, latencies

    def close(self) -> None:
        for queue in self.commands:
            queue.put(None)
        for p in self.procs:
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()


# -- measuring ----------------------------------------------------------------
def measure_servers(num_ps: int, worker_counts: list[int], job_dir: str,
                    model_mb: float, tensors: int) -> list[dict]:
    from keras_elastic.launcher.backends import start_services
    from keras_elastic.ps.client import PSClient

    started = start_services([(f"ps-{i}", "keras_elastic.ps",
                               [f"--partition={i}", f"--num_partitions={num_ps}",
                                "--grads_to_wait=1"]) for i in range(num_ps)], job_dir)
    try:
        addresses = [info["address"] for _, info in started]
        ps_pids = [info["pid"] for _, info in started]
        if FLAGS.server_cores:
            for pid, cores in zip(ps_pids, CORES["servers"]):
                pin([pid], cores)
        shapes = model_shapes(num_ps, model_mb, tensors)
        rng = np.random.default_rng(0)
        init = PSClient(addresses, worker_id=10_000, resolver=None)
        init.init({n: (rng.standard_normal(size, dtype=np.float32), True)
                   for n, size in shapes.items()},
                  {"class_name": FLAGS.optimizer, "config": {"learning_rate": 1e-6}})
        init.close()
        return _phases(Clients(addresses, shapes, max(worker_counts)), ps_pids,
                       worker_counts, num_ps, "PS")
    finally:
        for handle, _ in started:
            handle.terminate()


def measure_echo(worker_counts: list[int], job_dir: str, model_mb: float,
                 tensors: int) -> list[dict]:
    """The same phases against one raw-bytes gRPC echo server (echo_server.py):
    the model's bytes out and back, nothing decoded, nothing applied."""
    from echo_server import start_echo_servers

    started = start_echo_servers(1, job_dir)
    try:
        info = started[0][1]
        if FLAGS.server_cores:
            pin([info["pid"]], CORES["servers"][0])
        return _phases(Clients([info["address"]], model_shapes(1, model_mb, tensors),
                               max(worker_counts), "echo"),
                       [info["pid"]], worker_counts, 1, "echo")
    finally:
        for handle, _ in started:
            handle.terminate()


def _phases(clients: Clients, server_pids: list[int], worker_counts: list[int],
            num_ps: int, what: str) -> list[dict]:
    """A row per worker count (`measure_phase`) against the servers
    `server_pids`; the clients are closed after."""
    try:
        rows = []
        for workers in worker_counts:
            row = measure_phase(clients, server_pids, workers)
            row["num_ps"] = num_ps
            logging.info("%d %s, %d workers: %.1f pushes/s, server CPU %.1f ms/push",
                         num_ps, what, workers, row["rate"],
                         1e3 * row["ps_cpu_per_push"])
            rows.append(row)
        return rows
    finally:
        clients.close()


def measure_phase(clients: Clients, ps_pids: list[int], workers: int) -> dict:
    """`workers` workers for `--warmup` + `--seconds`; the figures of the last
    `--seconds`, CPU seconds of the servers and clients included."""
    start_at = time.time() + 0.5
    begin = start_at + FLAGS.warmup
    cpu: dict[str, float] = {}

    def sample() -> None:
        for key, at in (("begin", begin), ("end", begin + FLAGS.seconds)):
            time.sleep(max(0.0, at - time.time()))
            cpu[key + "_ps"] = cpu_seconds(ps_pids)
            cpu[key + "_clients"] = cpu_seconds(clients.pids)

    sampler = threading.Thread(target=sample)
    sampler.start()
    pushes, moved, latencies = clients.run(workers, start_at)
    sampler.join()
    ps_cpu = cpu["end_ps"] - cpu["begin_ps"]
    client_cpu = cpu["end_clients"] - cpu["begin_clients"]
    return {"workers": workers, "pushes": pushes, "rate": pushes / FLAGS.seconds,
            "mbs": moved / FLAGS.seconds / _MB,
            "median_ms": 1e3 * statistics.median(latencies) if latencies else 0.0,
            "p90_ms": 1e3 * float(np.percentile(latencies, 90)) if latencies else 0.0,
            "ps_cpu_per_push": ps_cpu / max(pushes, 1),
            "client_cpu_per_push": client_cpu / max(pushes, 1),
            "ps_busy": ps_cpu / FLAGS.seconds,
            "client_busy": client_cpu / FLAGS.seconds}


def measure_live_add(workers: int, job_dir: str, model_mb: float, tensors: int
                     ) -> dict[str, dict]:
    """Pushes of `workers` simulated workers against a 2-partition model held
    by one process, before, during and after partition 1 moves to a second
    process (module doc). Returns {"before", "during", "after"}: figures of
    `measure_phase`, "during" with the move's seconds."""
    import json

    from keras_elastic.launcher.backends import start_services
    from keras_elastic.ps.client import PSClient
    from keras_elastic.ps.moves import move_partition

    live_dir = os.path.join(job_dir, "live-add")
    os.makedirs(live_dir, exist_ok=True)
    started = start_services([
        ("ps-0", "keras_elastic.ps", ["--partition=0", "--num_partitions=2",
                                      "--partitions=0,1", "--grads_to_wait=1",
                                      f"--job_dir={live_dir}"]),
        ("ps-n0", "keras_elastic.ps", ["--partition=2", "--num_partitions=2",
                                       "--partitions=none", "--grads_to_wait=1",
                                       f"--job_dir={live_dir}"])],
        live_dir)
    (old, old_info), (new, new_info) = started

    def write_cluster(ps: list[str]) -> None:
        path = os.path.join(live_dir, "cluster.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"ps": ps}, f)
        os.replace(path + ".tmp", path)

    try:
        a, b = old_info["address"], new_info["address"]
        write_cluster([a, a])
        shapes = model_shapes(2, model_mb, tensors)
        init = PSClient([a, a], worker_id=10_000, resolver=None)
        rng = np.random.default_rng(0)
        init.init({n: (rng.standard_normal(size, dtype=np.float32), True)
                   for n, size in shapes.items()},
                  {"class_name": FLAGS.optimizer, "config": {"learning_rate": 1e-6}})
        init.close()
        clients = Clients([a, a], shapes, workers, job_dir=live_dir)
        pids = [old_info["pid"], new_info["pid"]]
        try:
            rows = {"before": measure_phase(clients, pids, workers)}
            moved: dict[str, float] = {}

            def move() -> None:
                time.sleep(FLAGS.warmup + FLAGS.seconds / 3)
                moved["seconds"] = move_partition(
                    1, a, b, os.path.join(live_dir, "moves"),
                    switch=lambda: write_cluster([a, b]))

            mover = threading.Thread(target=move)
            mover.start()
            rows["during"] = measure_phase(clients, pids, workers)
            mover.join()
            rows["during"]["move_s"] = moved.get("seconds", float("nan"))
            rows["after"] = measure_phase(clients, pids, workers)
        finally:
            clients.close()
        return rows
    finally:
        old.terminate()
        new.terminate()


def report_live_add(rows: dict[str, dict]) -> list[str]:
    before, during, after = rows["before"], rows["during"], rows["after"]
    return ["", f"  a server added while {before['workers']} workers push (a "
            f"2-partition model; partition 1 moves from the first process to a new "
            f"one): pushes/s before {before['rate']:.1f}, during the move "
            f"{during['rate']:.1f} (the move {during['move_s']:.2f} s, p90 push "
            f"{during['p90_ms']:.1f} ms), after {after['rate']:.1f}: ratio after / "
            f"before {after['rate'] / max(before['rate'], 1e-9):.2f}"]


def _row(label: str, r: dict, model_mb: float) -> str:
    return (f"  {label:>4s} {r['workers']:7d} {r['rate']:9.1f} {r['mbs']:7.0f} "
            f"{r['median_ms']:9.1f} {r['p90_ms']:7.1f} "
            f"{1e3 * r['ps_cpu_per_push']:14.2f} "
            f"{1e3 * r['ps_cpu_per_push'] / model_mb:12.2f} "
            f"{r['ps_busy']:8.2f} {r['client_busy']:12.2f}")


def _verdict(value: float, target: float) -> str:
    return f"meets the target <= {target:g}" if value <= target else (
        f"is ABOVE the target <= {target:g}")


def report_echo(rows: list[dict], echo_rows: list[dict]) -> list[str]:
    """The echo's table and the PS's server CPU per MB against it."""
    model_mb = FLAGS.model_mb
    lines = ["", "  raw gRPC echo of the same bytes (echo_server.py, 1 process, the "
             "same clients; 'PS CPU' is the echo server's):"]
    lines += [_row("echo", r, model_mb) for r in echo_rows]
    ps = [r["ps_cpu_per_push"] for r in rows if r["num_ps"] == 1 and r["pushes"]]
    echo = [r["ps_cpu_per_push"] for r in echo_rows if r["pushes"]]
    if ps and echo and statistics.median(echo) > 0:
        p, e = statistics.median(ps) / model_mb, statistics.median(echo) / model_mb
        lines.append(f"  server CPU per pushed MB, 1 server (medians over the worker "
                     f"counts): PS {1e3 * p:.2f} ms, echo {1e3 * e:.2f} ms: ratio PS "
                     f"/ echo {p / e:.2f} ({_verdict(p / e, 1.5)})")
    return lines


def report_fixed_cost(ps: dict, echo: dict | None) -> list[str]:
    """The cost of a push that moves almost no bytes."""
    cost = 1e3 * ps["ps_cpu_per_push"]
    line = (f"  fixed cost of a push ({FLAGS.fixed_cost_kb:g} KB model of "
            f"{FLAGS.fixed_cost_tensors} tensors, 1 server, {ps['workers']} workers, "
            f"{ps['rate']:.0f} pushes/s): {cost:.2f} ms of server CPU per push "
            f"({_verdict(cost, 2.0)} ms)")
    if echo is not None:
        line += f"; echo of the same bytes {1e3 * echo['ps_cpu_per_push']:.2f} ms"
    return ["", line]


def report_per_tensor(few: dict, many: dict, few_tensors: int, many_tensors: int
                      ) -> list[str]:
    """What each tensor of a push costs beyond the bytes: the same model in
    more tensors, server and client CPU per push."""
    extra = many_tensors - few_tensors
    server = (many["ps_cpu_per_push"] - few["ps_cpu_per_push"]) / extra
    client = (many["client_cpu_per_push"] - few["client_cpu_per_push"]) / extra
    return [f"  cost of each tensor of a push ({FLAGS.fixed_cost_kb:g} KB model in "
            f"{many_tensors} tensors against {few_tensors}): {1e6 * server:.1f} us of "
            f"server CPU, {1e6 * client:.1f} us of client CPU"]


def table_header() -> list[str]:
    """The servers' table header; `_row` prints each row under it as measured."""
    return [f"  {'PS':>4s} {'workers':>7s} {'pushes/s':>9s} {'MB/s':>7s} "
            f"{'median ms':>9s} {'p90 ms':>7s} {'PS CPU ms/push':>14s} "
            f"{'PS CPU ms/MB':>12s} {'PS busy':>8s} {'clients busy':>12s}"]


def report(rows: list[dict]) -> list[str]:
    """What the servers' table adds up to: scaling efficiency and the cost of a push."""
    model_mb = FLAGS.model_mb
    lines = ["  (MB/s: model bytes pushed and pulled back; busy: CPU seconds per "
             "second, all server or client processes together)"]
    by = {(r["num_ps"], r["workers"]): r for r in rows}
    counts = sorted({r["num_ps"] for r in rows})
    if 1 in counts and len(counts) > 1:
        lines.append("")
        lines.append("  scaling efficiency, pushes/s with N servers / (N x pushes/s "
                     "with 1):")
        for workers in sorted({r["workers"] for r in rows}):
            one = by.get((1, workers))
            if one is None or not one["rate"]:
                continue
            parts = [f"{n} PS {by[(n, workers)]['rate'] / (n * one['rate']):.2f}"
                     for n in counts if n > 1 and (n, workers) in by]
            lines.append(f"    {workers:3d} workers: " + ", ".join(parts))
    # The cost of one push on one server: the model's bytes are split over the
    # servers, so CPU per push summed over them is the cost of a whole-model push.
    per_push = [r["ps_cpu_per_push"] for r in rows if r["pushes"]]
    if per_push:
        mean = statistics.median(per_push)
        lines += [
            "",
            f"  PS CPU per push of the whole {model_mb:g} MB model (median over the "
            f"configurations): {1e3 * mean:.1f} ms ({1e3 * mean / model_mb:.2f} ms "
            f"per MB), summed over the servers holding it",
            f"  one server core therefore handles about {1 / mean:.0f} pushes/s of "
            f"this model ({model_mb / mean:.0f} MB/s pushed, as much pulled back); "
            f"workers that each push every T seconds: about {1 / mean:.0f} x T of "
            "them per core of parameter servers"]
    return lines


def show(lines) -> None:
    for line in lines:
        print(line, flush=True)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if FLAGS.smoke:
        for name, value in SMOKE.items():
            if not FLAGS[name].present:
                FLAGS[name].value = value
    os.environ.setdefault("KERAS_ELASTIC_TOKEN", os.urandom(16).hex())
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    counts = [int(n) for n in FLAGS.num_ps]
    worker_counts = [int(w) for w in FLAGS.workers]
    if any(FLAGS.tensors % n for n in counts):
        raise app.UsageError("--tensors must be a multiple of every --num_ps")
    if FLAGS.server_cores:
        try:
            servers, clients = core_plan(FLAGS.server_cores, max(counts))
        except ValueError as e:
            raise app.UsageError(f"--server_cores={FLAGS.server_cores} with "
                                 f"--num_ps={','.join(FLAGS.num_ps)}: {e}") from None
        CORES.update(servers=servers, clients=clients)
        pin([os.getpid()], clients)  # this process and what it starts: the clients'
        sharing = (f"each server on {FLAGS.server_cores} core(s) of its own, the "
                   f"clients on the {len(clients)} others")
    else:
        sharing = f"{os.cpu_count()} CPU cores shared by servers and clients"
    started = time.time()
    import tensorflow as tf  # (only to say which device the servers' optimizer uses)

    device = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    print(f"parameter-server capacity: a {FLAGS.model_mb:g} MB model "
          f"({FLAGS.tensors} float32 tensors), {FLAGS.optimizer}, simulated workers "
          f"in {FLAGS.client_processes} processes pushing gradients and taking the "
          f"new values back as fast as they can; {FLAGS.seconds:g} s per "
          f"configuration; TensorFlow device of the servers: {device}; "
          f"{sharing}", flush=True)
    job_dir = tempfile.mkdtemp(prefix="keras-elastic-bench-scaling-")
    # Each part prints as soon as it is measured, so a run cut short (a
    # timeout, a lease that ends) keeps what it measured.
    show(table_header())
    rows = []
    for num_ps in counts:
        measured = measure_servers(num_ps, worker_counts, job_dir, FLAGS.model_mb,
                                   FLAGS.tensors)
        show(_row(str(r["num_ps"]), r, FLAGS.model_mb) for r in measured)
        rows += measured
    show(report(rows))
    if FLAGS.echo:
        show(report_echo(rows, measure_echo(worker_counts, job_dir,
                                            FLAGS.model_mb, FLAGS.tensors)))
    if FLAGS.fixed_cost_kb > 0:
        kb, tensors, workers = (FLAGS.fixed_cost_kb / 1000, FLAGS.fixed_cost_tensors,
                                [FLAGS.fixed_cost_workers])
        fixed = measure_servers(1, workers, job_dir, kb, tensors)[0]
        echo = measure_echo(workers, job_dir, kb, tensors)[0] if FLAGS.echo else None
        show(report_fixed_cost(fixed, echo))
        if FLAGS.per_tensor_tensors > tensors:
            many = measure_servers(1, workers, job_dir, kb, FLAGS.per_tensor_tensors)[0]
            show(report_per_tensor(fixed, many, tensors, FLAGS.per_tensor_tensors))
    if FLAGS.live_add_workers:
        show(report_live_add(measure_live_add(FLAGS.live_add_workers, job_dir,
                                              FLAGS.model_mb, FLAGS.tensors)))
    print(f"  ({time.time() - started:.0f} s in all; service logs in {job_dir})",
          flush=True)


if __name__ == "__main__":
    app.run(main)

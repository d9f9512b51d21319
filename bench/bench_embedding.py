"""Embedding tables on the parameter servers: keras-elastic against plain Keras.

A CTR-like model: `--fields` int64 id inputs (default 26, as in Criteo) looked
up in one table of `--rows` x `--dim` (default 2,000,000 x 32 float32: 256 MB),
the concatenated vectors into a small MLP with a sigmoid output, binary
cross-entropy, Adagrad, batch `--batch_size` (512). Synthetic data: the ids of
each field follow a Zipf law (`--zipf_a`) hashed over the table, so a batch
repeats its popular ids many times; binary labels. Both configurations train
one epoch over the same NumPy arrays, in the same order (plain over the first
`--warmup_steps + --plain_steps` batches of them only: each of its steps costs
a pass over the whole table, see below):

- plain:   `keras.Model.fit(ids, labels)` in this process, with
           `keras.layers.Embedding` (the table local, its gradient IndexedSlices
           applied by Keras' Adagrad): the baseline;
- elastic: the same model with `ke.layers.Embedding` (the table on the servers),
           `ke.Model.fit(ke.ElasticDataset((ids, labels)))` in this process as
           the one worker, with the master and 2 parameter servers as separate
           processes (`python -m keras_elastic.master` / `keras_elastic.ps`,
           started with --ready_file, as the launcher does); once per
           `--exchanges` (sync, pipelined: with the pipelined exchange each
           batch's rows are looked up while the step before it computes).

With `--prefill_rows=N` the servers first make the rows of ids 0..N-1 (a
table that already holds N rows, e.g. 100,000,000 on 2 servers), then look up
`--rate_ids` ids of the data: the servers' resident memory per row and their
lookups per CPU-second are printed.

The first `--warmup_steps` steps of each run (tracing, the first pulls) are
left out: the clock runs from the end of step `warmup_steps` to the end of the
epoch (`--steps` steps elastic, `--plain_steps` plain). Keras 3's Adagrad
applies the IndexedSlices gradient of a `keras.layers.Embedding` through dense
operations on the whole accumulator (`sqrt(accumulator + epsilon)`, then the
sparse division's check of the divisor for zeros), so a plain step costs a few
passes over the table whatever the batch; its rate is steady after warm-up and
fewer steps measure it. The elastic run goes first, so that the worker's
resident memory after it is not inflated by the plain run's local table.

Prints samples/s of each configuration and their ratio (target >= 0.7); the
bytes the elastic worker moved per step, measured by instrumenting
`PSClient.lookup` and `PSClient.exchange` in this process (nbytes of the arrays
sent and received: ids, rows and gradient rows of the table; dense gradients
and values separately) and, at the wire, the protobuf size of the `Lookup` and
`PushSmall` messages; the minimum per step (unique ids of the batch x dim x 4
bytes, each way: rows pulled + gradient rows pushed) and the ratio (target
<= 1.5); the worker's and servers' resident memory against the table's size;
CPU seconds of every process in the timed window; the worker's phase timers,
and how long each step waited for its rows (sync against pipelined: the lookup
taken off the step's path).

Run from the repository root:

```
PYTHONPATH=. python bench/bench_embedding.py
PYTHONPATH=. python bench/bench_embedding.py --smoke  # tiny sizes: both configurations
```

`--smoke`: a 10,000 x 8 table, 4 fields, one hidden layer of 16, batch 64,
2 warm-up steps then 6 timed steps elastic and 3 plain, 2 minibatches per
task (flags given on the command line are kept): checks that both
configurations run and the report prints its ratios; the figures mean nothing.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import tempfile
import threading
import time

import numpy as np
from absl import app, flags, logging
from proc_stats import cpu_seconds, rss_bytes

FLAGS = flags.FLAGS
flags.DEFINE_integer("rows", 2_000_000, "Rows of the embedding table.")
flags.DEFINE_integer("dim", 32, "Width of the embedding table.")
flags.DEFINE_integer("fields", 26, "Id inputs of the model (one table for all).")
flags.DEFINE_list("hidden", ["256", "128"], "Units of the MLP's hidden layers.")
flags.DEFINE_integer("batch_size", 512, "Minibatch size.")
flags.DEFINE_integer("steps", 300, "Timed steps of the elastic configuration.")
flags.DEFINE_integer("plain_steps", 100, "Timed steps of the plain configuration (on "
                     "the first records; at most --steps): Keras' Adagrad does work "
                     "proportional to the whole table every step, so each is slow.")
flags.DEFINE_integer("warmup_steps", 20, "Steps before the timed ones (left out).")
flags.DEFINE_integer("minibatches_per_task", 32, "Elastic: minibatches per task.")
flags.DEFINE_float("zipf_a", 1.2, "Exponent of the Zipf law of each field's ids.")
flags.DEFINE_float("learning_rate", 0.05, "Adagrad learning rate.")
flags.DEFINE_integer("num_ps", 2, "Parameter server processes (elastic).")
flags.DEFINE_list("exchanges", ["sync", "pipelined"], "Elastic configurations, one run "
                  "each: compile(exchange=...). With 'pipelined' each batch's rows are "
                  "looked up while the step before it computes.")
flags.DEFINE_integer("prefill_rows", 0, "Before training, the servers make the rows of "
                     "ids 0..prefill_rows-1 (a table that already holds that many "
                     "rows: its memory per row and its lookup rate are measured).")
flags.DEFINE_integer("rate_ids", 40_000_000, "With --prefill_rows: ids looked up (in "
                     "batches of 1,000,000, drawn from the data) to measure the "
                     "servers' lookups per CPU-second.")
flags.DEFINE_integer("seed", 0, "Seed of the data and of the models.")
flags.DEFINE_float("target_ratio", 0.7, "Elastic/plain samples/s ratio to meet.")
flags.DEFINE_float("target_bytes_ratio", 1.5,
                   "Embedding bytes per step / minimum, not to exceed.")
flags.DEFINE_bool("wire_bytes", True, "Also take the protobuf size of the Lookup and "
                  "PushSmall messages (their size as sent and received: nothing "
                  "serialized twice).")
flags.DEFINE_bool("smoke", False, "Tiny sizes (a 10,000 x 8 table, batch 64, 2 + 6 "
                  "steps; a test runs it: tests/test_bench_smoke*.py); the figures "
                  "mean nothing.")

# --smoke: the values of the flags not given on the command line.
SMOKE = {"rows": 10_000, "dim": 8, "fields": 4, "hidden": ["16"], "batch_size": 64,
         "steps": 6, "plain_steps": 3, "warmup_steps": 2, "minibatches_per_task": 2,
         "prefill_rows": 5_000, "rate_ids": 20_000}

_MB = 1_000_000  # decimal megabytes


# -- data -------------------------------------------------------------------
def make_data(n: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` records: int64 ids (n, fields), Zipf-skewed per field and hashed
    over the table; float32 binary labels (n, 1) that depend on the ids."""
    rng = np.random.default_rng(FLAGS.seed)
    ranks = rng.zipf(FLAGS.zipf_a, size=(n, FLAGS.fields)).astype(np.uint64)
    field = np.arange(FLAGS.fields, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = ranks * np.uint64(0x9E3779B97F4A7C15) + field * np.uint64(
            0xC2B2AE3D27D4EB4F)
        h ^= h >> np.uint64(29)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(32)
    ids = (h % np.uint64(FLAGS.rows)).astype(np.int64)
    # A click rate that depends on the popularity of a few fields' ids.
    logit = -1.5 + 0.8 * (ranks[:, :4] <= 3).sum(axis=1) - 0.3 * np.log(
        ranks[:, 4:6].astype(np.float64)).sum(axis=1)
    labels = rng.random(n) < 1 / (1 + np.exp(-logit))
    return ids, labels.astype(np.float32).reshape(n, 1)


def unique_per_batch(ids: np.ndarray, first: int, last: int) -> np.ndarray:
    b = FLAGS.batch_size
    return np.array([np.unique(ids[i * b:(i + 1) * b]).size for i in range(first, last)])


# -- the model --------------------------------------------------------------
def compiled_model(elastic: bool, exchange: str = "sync"):
    import keras

    import keras_elastic as ke

    keras.utils.set_random_seed(FLAGS.seed)
    ids = keras.Input((FLAGS.fields,), dtype="int64", name="ids")
    table = (ke.layers.Embedding if elastic else keras.layers.Embedding)(
        FLAGS.rows, FLAGS.dim, name="table")
    x = keras.layers.Flatten()(table(ids))
    for units in FLAGS.hidden:
        x = keras.layers.Dense(int(units), activation="relu")(x)
    outputs = keras.layers.Dense(1, activation="sigmoid")(x)
    model = (ke.Model if elastic else keras.Model)(ids, outputs)
    model.compile(optimizer=keras.optimizers.Adagrad(FLAGS.learning_rate),
                  loss="binary_crossentropy",
                  **({"exchange": exchange} if elastic else {}))
    return model


# -- measuring ----------------------------------------------------------------
class Traffic:
    """Bytes the worker's `PSClient` sends and receives, by kind (thread-safe)."""

    KINDS = ("lookup_ids_sent", "rows_received", "push_ids_sent", "grad_rows_sent",
             "dense_sent", "dense_received", "wire_lookup", "wire_push",
             "lookups", "lookup_ids", "exchanges", "lookup_us", "exchange_us")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.totals = dict.fromkeys(self.KINDS, 0)

    def add(self, **amounts: int) -> None:
        with self._lock:
            for k, v in amounts.items():
                self.totals[k] += int(v)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.totals)


TRAFFIC = Traffic()


def instrument_ps_client() -> None:
    """Counts what `PSClient.lookup` and `PSClient.send` move (class-wide)."""
    from keras_elastic.ps.client import PSClient

    if getattr(PSClient, "_bench_instrumented", False):
        return
    lookup, send = PSClient.lookup, PSClient.send

    def counted_lookup(self, ids, *args, **kwargs):
        start = time.perf_counter()
        out = lookup(self, ids, *args, **kwargs)
        TRAFFIC.add(lookups=1, lookup_us=(time.perf_counter() - start) * 1e6,
                    lookup_ids=sum(np.size(v) for v in ids.values()),
                    lookup_ids_sent=sum(np.asarray(v, np.int64).nbytes
                                        for v in ids.values()),
                    rows_received=sum(r.nbytes for r in out.values()))
        return out

    def counted_send(self, update, *args, **kwargs):
        start = time.perf_counter()
        reply = send(self, update, *args, **kwargs)
        TRAFFIC.add(exchanges=1, exchange_us=(time.perf_counter() - start) * 1e6,
                    push_ids_sent=sum(i.nbytes for i, _ in update.rows.values()),
                    grad_rows_sent=sum(r.nbytes for _, r in update.rows.values()),
                    dense_sent=sum(g.nbytes for g in update.grads.values()) + sum(
                        v.nbytes for v in update.assigns.values()),
                    dense_received=sum(v.nbytes for v in reply.values.values()))
        return reply

    PSClient.lookup, PSClient.send = counted_lookup, counted_send
    PSClient._bench_instrumented = True


class _WireCountingStub:
    """A PS client's stub whose unary Lookup and PushSmall count the size of
    the serialized request and reply (the client sends `bytes` it built and
    reads replies that know their `byte_size`; the generated stub's
    messages are serialized here to be measured)."""

    _COUNTED = {"Lookup": "wire_lookup", "PushSmall": "wire_push"}

    def __init__(self, stub) -> None:
        self._stub = stub

    def __getattr__(self, name):
        method = getattr(self._stub, name)
        kind = self._COUNTED.get(name)
        if kind is None:
            return method

        def size(message) -> int:
            if isinstance(message, bytes):
                return len(message)
            if hasattr(message, "byte_size"):
                return message.byte_size
            # (len(SerializeToString()): upb's ByteSize is ~10x slower.)
            return len(message.SerializeToString())

        def call(request, *args, **kwargs):
            reply = method(request, *args, **kwargs)
            TRAFFIC.add(**{kind: size(request) + size(reply)})
            return reply

        return call


class Window:
    """Times from the end of step `warmup` to the end of the epoch, and takes
    the CPU seconds of this process and of `pids`, the worker's phase timers
    and the traffic counters over that window."""

    def __init__(self, warmup: int, pids: list[int] | None = None, phase_timer=None
                 ) -> None:
        import keras

        outer = self
        services = list(pids or [])

        def take():
            return (time.perf_counter(), cpu_seconds([os.getpid()]),
                    cpu_seconds(services), TRAFFIC.snapshot(),
                    phase_timer.snapshot() if phase_timer is not None else {})

        class _Callback(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                outer.batches = batch + 1
                if batch + 1 == warmup:
                    outer.first = take()

            def on_epoch_end(self, epoch, logs=None):
                outer.last = take()

        self.callback = _Callback()
        self.batches = 0
        self.first = self.last = None

    def measurement(self, samples: int) -> Measurement:
        if self.first is None or self.last is None:
            raise RuntimeError(f"the epoch had {self.batches} steps, not more than "
                               "--warmup_steps")
        (t0, w0, s0, b0, p0), (t1, w1, s1, b1, p1) = self.first, self.last
        return Measurement(samples=samples, seconds=t1 - t0, worker_cpu=w1 - w0,
                           service_cpu=s1 - s0,
                           traffic={k: b1[k] - b0[k] for k in b1},
                           phases={k: v - p0.get(k, 0.0) for k, v in p1.items()})


@dataclasses.dataclass
class Measurement:
    samples: int
    seconds: float
    worker_cpu: float
    service_cpu: float
    traffic: dict[str, int]
    phases: dict[str, float]
    rss_before: int = 0
    rss_after: int = 0
    service_rss_before: list[int] = dataclasses.field(default_factory=list)
    service_rss: list[int] = dataclasses.field(default_factory=list)
    rows_held: list[int] = dataclasses.field(default_factory=list)
    exchange: str = ""
    prefill: dict = dataclasses.field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.samples / self.seconds


# -- the configurations ------------------------------------------------------
def run_plain(ids: np.ndarray, labels: np.ndarray, samples: int) -> Measurement:
    before = rss_bytes()  # before the model (and its table) exists
    model = compiled_model(elastic=False)
    window = Window(FLAGS.warmup_steps)
    model.fit(ids, labels, batch_size=FLAGS.batch_size, epochs=1, shuffle=False,
              verbose=0, callbacks=[window.callback])
    m = window.measurement(samples)
    m.rss_before, m.rss_after = before, rss_bytes()
    return m


class Prefill:
    """A callback that, when training begins (the model is connected), makes
    the servers hold the rows of ids 0..`--prefill_rows`-1, then times
    lookups of `--rate_ids` ids of the data (no rows made): the servers'
    resident memory per row and lookups per CPU-second."""

    def __init__(self, cluster, model, services, ids: np.ndarray) -> None:
        import keras

        outer = self
        self.result: dict = {}

        class _Callback(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                outer.run(cluster, model, services, ids)

        self.callback = _Callback()

    def run(self, cluster, model, services, ids: np.ndarray) -> None:
        if not FLAGS.prefill_rows:
            return
        table = model.get_layer("table").table_name
        servers = services[1:]  # (the master first)
        rss0 = [rss_bytes(p.pid) for p in servers]
        start = time.perf_counter()
        chunk = 1_000_000
        for first in range(0, FLAGS.prefill_rows, chunk):
            cluster.ps.lookup({table: np.arange(
                first, min(first + chunk, FLAGS.prefill_rows), dtype=np.int64)})
        filled = time.perf_counter() - start
        rss1 = [rss_bytes(p.pid) for p in servers]
        held = [s.tables.get(table, 0) for s in cluster.ps.status_all()]
        # Requests of unique ids, as workers send them (each request: the
        # distinct ids of the next 1,000,000 ids of the data).
        asked = np.resize(ids.reshape(-1), FLAGS.rate_ids)
        requests = [np.unique(asked[first:first + chunk])
                    for first in range(0, len(asked), chunk)]
        cpu0, start = cpu_seconds([p.pid for p in servers]), time.perf_counter()
        for request in requests:
            cluster.ps.lookup({table: request}, create=False)
        looked = time.perf_counter() - start
        cpu = cpu_seconds([p.pid for p in servers]) - cpu0
        # The same lookups with one server busy at a time (the client asks
        # them in turn), as when each server has its own machine: here the
        # servers share the machine's cores and caches while they work at once.
        pool, cluster.ps._pool = cluster.ps._pool, None
        try:
            cpu0 = cpu_seconds([p.pid for p in servers])
            for request in requests:
                cluster.ps.lookup({table: request}, create=False)
            alone = cpu_seconds([p.pid for p in servers]) - cpu0
        finally:
            cluster.ps._pool = pool
        self.result = dict(rows=sum(held), held=held, seconds=filled,
                           per_row=[(b - a) / max(h, 1) for a, b, h in zip(rss0, rss1,
                                                                         held)],
                           ids=sum(len(r) for r in requests), lookup_seconds=looked,
                           lookup_cpu=cpu, lookup_cpu_alone=alone,
                           calls=len(requests) * len(servers))


def run_elastic(ids: np.ndarray, labels: np.ndarray, samples: int,
                exchange: str = "sync") -> Measurement:
    """The worker here; the master and the parameter servers as processes."""
    import keras_elastic as ke
    from keras_elastic.common import cluster_env
    from keras_elastic.launcher.processes import start_service
    from keras_elastic.worker.cluster import get_cluster, reset_cluster

    instrument_ps_client()
    job_dir = tempfile.mkdtemp(prefix="keras-elastic-bench-embedding-")
    services = []
    saved = {k: os.environ.get(k) for k in (cluster_env.MASTER, cluster_env.PS,
                                            cluster_env.WORKER_ID, cluster_env.JOB_DIR)}
    try:
        master, master_info = start_service("master", "keras_elastic.master", [],
                                            job_dir)
        services.append(master)
        addresses = []
        for i in range(FLAGS.num_ps):
            ps, ps_info = start_service(
                f"ps-{i}", "keras_elastic.ps",
                [f"--partition={i}", f"--num_partitions={FLAGS.num_ps}",
                 "--grads_to_wait=1"],
                job_dir)
            services.append(ps)
            addresses.append(ps_info["address"])
        os.environ.update(cluster_env.to_env(master_info["address"], addresses, 0,
                                             job_dir))
        reset_cluster()
        cluster = get_cluster()
        if FLAGS.wire_bytes:
            cluster.ps._stubs = [_WireCountingStub(s) for s in cluster.ps._stubs]
            cluster.ps._streams = [_WireCountingStub(s) for s in cluster.ps._streams]
        logging.info("worker %d: master %s, PS %s", cluster.worker_id,
                     cluster.master_address, ",".join(cluster.ps_addresses))
        train = ke.ElasticDataset((ids, labels), batch_size=FLAGS.batch_size,
                                  minibatches_per_task=FLAGS.minibatches_per_task,
                                  name="ctr")
        before = rss_bytes()  # as in run_plain: before the model exists
        model = compiled_model(elastic=True, exchange=exchange)
        window = Window(FLAGS.warmup_steps, [p.pid for p in services], cluster.timer)
        services_before = [rss_bytes(p.pid) for p in services]
        prefill = Prefill(cluster, model, services, ids)
        model.fit(train, epochs=1, verbose=0,
                  callbacks=[prefill.callback, window.callback])
        m = window.measurement(samples)
        m.exchange, m.prefill = exchange, prefill.result
        m.rss_before, m.rss_after = before, rss_bytes()
        m.service_rss_before = services_before
        m.service_rss = [rss_bytes(p.pid) for p in services]
        m.rows_held = [sum(s.tables.values())
                       for s in cluster.ps.status_all()]
        return m
    finally:
        reset_cluster()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for process in reversed(services):
            process.terminate()
        logging.info("service logs in %s", job_dir)


# -- the report --------------------------------------------------------------
def report(plain: Measurement, elastics: list[Measurement], unique: np.ndarray) -> str:
    from keras_elastic.common.timing import PHASE_HELP, format_table

    elastic = elastics[0]  # traffic and memory: of the first configuration
    table_bytes = FLAGS.rows * FLAGS.dim * 4
    t = {k: v / max(elastic.traffic["exchanges"], 1) for k, v in elastic.traffic.items()}
    row_bytes = FLAGS.dim * 4
    mean_unique = float(unique.mean())
    minimum = 2 * mean_unique * row_bytes
    sparse = (t["lookup_ids_sent"] + t["rows_received"] + t["push_ids_sent"]
              + t["grad_rows_sent"])
    dense = t["dense_sent"] + t["dense_received"]
    bytes_ratio = sparse / minimum
    lines = [
        "", f"CTR-like model: {FLAGS.fields} int64 id fields -> one table {FLAGS.rows:,}"
        f" x {FLAGS.dim} ({table_bytes / _MB:.0f} MB) -> MLP {','.join(FLAGS.hidden)}"
        f" -> 1; Adagrad({FLAGS.learning_rate}); batch {FLAGS.batch_size}; Zipf "
        f"a={FLAGS.zipf_a}: {mean_unique:.0f} unique ids per batch of "
        f"{FLAGS.batch_size * FLAGS.fields} (min {unique.min()}, max {unique.max()})",
        f"timed after {FLAGS.warmup_steps} warm-up steps: elastic {elastic.samples} "
        f"samples ({elastic.samples // FLAGS.batch_size} steps; 1 worker = this process"
        f", {FLAGS.num_ps} PS + master processes), plain {plain.samples} samples "
        f"({plain.samples // FLAGS.batch_size} steps, the first records)", "",
        f"  {'configuration':44s} {'samples/s':>9s} {'wall s':>7s} {'ratio':>6s}   "
        f"{'CPU s (worker+services)':>23s} {'samples/CPU-s':>13s}"]
    for label, m, r in [("plain Keras fit, keras.layers.Embedding", plain, None)] + [
            (f"keras-elastic, ke.layers.Embedding on PS, {e.exchange}", e,
             e.rate / plain.rate) for e in elastics]:
        cpu = m.worker_cpu + m.service_cpu
        lines.append(f"  {label:44s} {m.rate:9.1f} {m.seconds:7.1f} "
                     f"{'' if r is None else f'{r:6.3f}':>6s}   "
                     f"{f'{cpu:.1f} ({m.worker_cpu:.1f}+{m.service_cpu:.1f})':>23s} "
                     f"{m.samples / cpu:13.1f}")
    lines += [
        "", f"elastic worker traffic per step ({elastic.exchange}; mean over the timed "
        "steps; "
        f"{elastic.traffic['exchanges']} pushes, {elastic.traffic['lookups']} lookups "
        "in the window):",
        f"  unique ids looked up per step:   {t['lookup_ids']:12.1f}"
        f"   (from the data: {mean_unique:.1f})",
        f"  embedding, pulled: ids sent      {t['lookup_ids_sent']:12,.0f} B",
        f"                     rows received {t['rows_received']:12,.0f} B",
        f"  embedding, pushed: ids sent      {t['push_ids_sent']:12,.0f} B",
        f"                     grad rows     {t['grad_rows_sent']:12,.0f} B",
        f"  embedding total                  {sparse:12,.0f} B",
        f"  minimum (2 x unique x {FLAGS.dim} x 4) {minimum:12,.0f} B   ratio "
        f"{bytes_ratio:.3f}",
        f"  dense (MLP): grads sent          {t['dense_sent']:12,.0f} B",
        f"               values received     {t['dense_received']:12,.0f} B",
        f"  dense total                      {dense:12,.0f} B",
    ]
    if FLAGS.wire_bytes:
        lines += [
            f"  at the wire (protobuf): Lookup   {t['wire_lookup']:12,.0f} B",
            f"                       PushSmall   {t['wire_push']:12,.0f} B   (embedding"
            " + dense, both ways)"]
    lines += [
        "", "resident memory (VmRSS):",
        f"  table size ({FLAGS.rows:,} x {FLAGS.dim} x 4)         "
        f"{table_bytes / _MB:8.1f} MB",
        f"  elastic worker after training      {elastic.rss_after / _MB:8.1f} MB   "
        f"({elastic.rss_before / _MB:.1f} MB before the model: "
        f"{(elastic.rss_after - elastic.rss_before) / _MB:+.1f} MB, "
        f"{(elastic.rss_after - elastic.rss_before) / table_bytes:.3f} x the table)",
        "  services before -> after training  " + ", ".join(
            f"{name} {a / _MB:.0f} -> {b / _MB:.0f} MB" for name, a, b in zip(
                ["master"] + [f"ps-{i}" for i in range(FLAGS.num_ps)],
                elastic.service_rss_before, elastic.service_rss)),
        f"  rows held by the servers           {', '.join(map(str, elastic.rows_held))}"
        f" ({sum(elastic.rows_held) / FLAGS.rows:.1%} of the table; rows + Adagrad "
        f"slot {2 * sum(elastic.rows_held) * FLAGS.dim * 4 / _MB:.1f} MB)",
        f"  plain Keras process after training {plain.rss_after / _MB:8.1f} MB   "
        f"({plain.rss_before / _MB:.1f} MB before the model: "
        f"{(plain.rss_after - plain.rss_before) / _MB:+.1f} MB, "
        f"{(plain.rss_after - plain.rss_before) / table_bytes:.3f} x the table)",
        ]
    filled = elastic.prefill
    if filled:
        minimum_row = 8 + 2 * row_bytes  # id + row + Adagrad accumulator
        per_row = float(np.mean(filled["per_row"]))
        rate = filled["ids"] / max(filled["lookup_cpu"], 1e-9)
        alone = filled["ids"] / max(filled["lookup_cpu_alone"], 1e-9)
        lines += [
            f"  table prefilled: {filled['rows']:,} rows on {FLAGS.num_ps} servers "
            f"({', '.join(f'{h:,}' for h in filled['held'])}) in "
            f"{filled['seconds']:.1f} s",
            f"  server memory per row (resident growth / rows held): {per_row:.1f} B, "
            f"{per_row / minimum_row:.2f} x the minimum {minimum_row} (id + row + "
            "Adagrad slot)",
            f"  server lookups: {filled['ids']:,} ids of the data (unique per "
            "request, as workers send them) in "
            f"{filled['lookup_seconds']:.2f} s, {filled['lookup_cpu']:.2f} server "
            f"CPU-s: {rate / 1e6:.2f} million ids per server CPU-second (target >= 5); "
            f"{filled['ids'] / filled['calls']:,.0f} ids a call to a server",
            f"  the same, one server busy at a time: {filled['lookup_cpu_alone']:.2f} "
            f"server CPU-s, {alone / 1e6:.2f} million ids per server CPU-second"]
    lines += ["", "per-phase seconds of the elastic worker, timed window:"]
    for e in elastics:
        lines += [f"  {e.exchange}:"]
        lines += ["  " + r for r in format_table(e.phases, e.seconds).splitlines()]
    lines += [f"  {phase}: {text}" for phase, text in PHASE_HELP.items()
              if any(phase in e.phases for e in elastics)]
    lines += ["", "elastic step, ms (mean over the timed steps; PSClient calls timed "
              "where they run, the lookup wait on the step's path from 'lookup'):"]
    waits = {}
    for e in elastics:
        te = {k: v / max(e.traffic["exchanges"], 1) for k, v in e.traffic.items()}
        steps = max(e.traffic["exchanges"], 1)
        step_ms = e.seconds / steps * 1e3
        lookup_ms, exchange_ms = te["lookup_us"] / 1e3, te["exchange_us"] / 1e3
        waits[e.exchange] = e.phases.get("lookup", 0.0) / steps * 1e3
        lines += [
            f"  {e.exchange}: step {step_ms:.1f}; PSClient.lookup {lookup_ms:.1f}, "
            f"PSClient.exchange {exchange_ms:.1f}; the step waited for its rows "
            f"{waits[e.exchange]:.2f}"]
    if "sync" in waits and "pipelined" in waits:
        lines += [f"lookup wait on the step's path, pipelined / sync: "
                  f"{waits['pipelined'] / max(waits['sync'], 1e-9):.3f} (the rows looked "
                  "up while the step before computes)"]
    bverdict = "meets" if bytes_ratio <= FLAGS.target_bytes_ratio else "is ABOVE"
    lines.append("")
    for e in elastics:
        ratio = e.rate / plain.rate
        verdict = "meets" if ratio >= FLAGS.target_ratio else "is BELOW"
        lines.append(f"samples/s ratio elastic ({e.exchange})/plain {ratio:.3f} "
                     f"{verdict} the target {FLAGS.target_ratio}")
    lines.append(f"embedding bytes per step / minimum {bytes_ratio:.3f} {bverdict} the "
                 f"target {FLAGS.target_bytes_ratio}")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if FLAGS.smoke:
        for name, value in SMOKE.items():
            if not FLAGS[name].present:
                FLAGS[name].value = value
    from keras_elastic.worker.exchange import MODES as EXCHANGES

    unknown = sorted(set(FLAGS.exchanges) - set(EXCHANGES))
    if unknown or not FLAGS.exchanges:
        raise app.UsageError(f"--exchanges: {unknown or 'none'}; give sync, pipelined "
                             "or both")
    if FLAGS.warmup_steps < 1 or FLAGS.steps < 1:
        raise app.UsageError("--warmup_steps and --steps must be at least 1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if not 1 <= FLAGS.plain_steps <= FLAGS.steps:
        raise app.UsageError("--plain_steps must be in [1, --steps]")
    total = FLAGS.warmup_steps + FLAGS.steps
    ids, labels = make_data(total * FLAGS.batch_size)
    unique = unique_per_batch(ids, FLAGS.warmup_steps, total)
    # Elastic first: its worker's resident memory is then not the plain run's.
    elastics = []
    for exchange in FLAGS.exchanges:
        logging.info("measuring elastic, exchange=%s ...", exchange)
        elastics.append(run_elastic(ids, labels, FLAGS.steps * FLAGS.batch_size,
                                    exchange))
        logging.info("elastic: %.1f s for %d samples", elastics[-1].seconds,
                     elastics[-1].samples)
        gc.collect()
    logging.info("measuring plain ...")
    n = (FLAGS.warmup_steps + FLAGS.plain_steps) * FLAGS.batch_size
    plain = run_plain(ids[:n], labels[:n], FLAGS.plain_steps * FLAGS.batch_size)
    logging.info("plain: %.1f s for %d samples", plain.seconds, plain.samples)
    print(report(plain, elastics, unique), flush=True)


if __name__ == "__main__":
    app.run(main)

"""Large models at wire speed: the PS exchange against a raw-bytes gRPC echo.

A model of `--sizes_mb` (default 100; add 400 with `--sizes_mb=100,400`) as
`--tensors` float32 variables of equal size lives on 1 and on 2 parameter
server processes (`python -m keras_elastic.ps`, started as the launcher does;
SGD). This process is the worker: a real `PSClient` pushes gradients for every
variable and receives the new values (`PSClient.exchange`: what a worker's
step does; the model's bytes each way), and pulls the whole model
(`PSClient.pull`). With 2 servers each holds half of the bytes (variable
names are chosen so) and the client sends both halves from its own threads.

The baseline, in the same run: echo server processes (this script with
`echo_server.py`: a generic gRPC service, bytes in, bytes out, no protobuf, made
with `keras_elastic.common.rpc.make_server`/`make_channel`, so the same
message limits, channel options and token check as the PS). The echo
client sends the same number of bytes cut into `tensor_codec.CHUNK_BYTES`
chunks (as the PS client streams its tensors; pre-made `bytes`, nothing to
encode), the server keeps them all and sends them back; for a pull, a small
request and the model's bytes back in chunks. With 2 servers, the echo too
goes to 2 processes, half each, from 2 threads.

MB/s counts the bytes of both directions (decimal MB) over the wall time of
one call. Configurations alternate within each round; the best of
`--rounds` is kept (medians printed beside). Prints the ratio PS / echo per
configuration (target >= `--target_ratio` at 100 MB), the servers' CPU per MB
moved against the echo servers' (target <= 1.5), how parallel the two
halves travel with 2 servers (the exchange to both against the exchange to
each alone), CPU seconds per exchange of this process and of the servers,
and the device TensorFlow uses. With 1 server it also times the exchange's
own work without the transport in this process (the encodes and decodes, a
real `ParameterStore`'s update: see `Work`) and the bounds the work no
exchange can drop (4 copies and the update) sets on PS / echo, with none of
it and with all but the update overlapping the transfer, beside the share
the exchange hides: what is left to gain on this machine.

```
PYTHONPATH=. python bench/bench_ps_wire.py
PYTHONPATH=. python bench/bench_ps_wire.py --sizes_mb=100,400
PYTHONPATH=. python bench/bench_ps_wire.py --smoke  # tiny sizes: 1 and 2 servers
```

`--smoke`: a 1 MB model, best of 2 rounds (flags given on the command line are
kept): checks that every configuration runs, with 1 and 2 servers, and prints
its ratios; the figures mean nothing.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import numpy as np
from absl import app, flags, logging
from echo_server import EchoClient, start_echo_servers
from proc_stats import cpu_seconds
from ps_bench_common import variable_names

from keras_elastic.ps.update import Update

FLAGS = flags.FLAGS
flags.DEFINE_list("sizes_mb", ["100"], "Model sizes, decimal MB.")
flags.DEFINE_list("num_ps", ["1", "2"], "Parameter server counts.")
flags.DEFINE_integer("tensors", 8, "Variables of the model (equal sizes; even, so "
                     "that 2 servers hold half each).")
flags.DEFINE_integer("rounds", 5, "Measurements per configuration (best kept).")
flags.DEFINE_float("target_ratio", 0.7, "PS exchange / echo MB/s to meet at 100 MB.")
flags.DEFINE_bool("smoke", False, "Tiny sizes (a 1 MB model, best of 2 rounds; a test "
                  "runs it: tests/test_bench_smoke*.py); the figures mean nothing.")

# --smoke: the values of the flags not given on the command line.
SMOKE = {"sizes_mb": ["1"], "rounds": 2}

_MB = 1_000_000


# -- the model ----------------------------------------------------------------
def make_model(size: int, num_ps: int) -> dict[str, np.ndarray]:
    n = FLAGS.tensors
    elements = size // 4 // n
    rng = np.random.default_rng(0)
    return {name: rng.standard_normal(elements, dtype=np.float32).reshape(-1, 1000)
            if elements % 1000 == 0 else rng.standard_normal(elements, dtype=np.float32)
            for name in variable_names(n, num_ps)}


# -- measuring ----------------------------------------------------------------
class Measured:
    def __init__(self) -> None:
        self.rates: list[float] = []
        self.client_cpu: list[float] = []
        self.server_cpu: list[float] = []
        self.seconds: list[float] = []

    def add(self, nbytes: int, seconds: float, client_cpu: float, server_cpu: float
            ) -> None:
        self.rates.append(nbytes / seconds / _MB)
        self.seconds.append(seconds)
        self.client_cpu.append(client_cpu)
        self.server_cpu.append(server_cpu)

    @property
    def best(self) -> float:
        return max(self.rates)

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


def timed(fn, server_pids: list[int]) -> tuple[int, float, float, float]:
    c0, s0 = cpu_seconds([os.getpid()]), cpu_seconds(server_pids)
    start = time.perf_counter()
    nbytes = fn()
    seconds = time.perf_counter() - start
    return (nbytes, seconds, cpu_seconds([os.getpid()]) - c0,
            cpu_seconds(server_pids) - s0)


def start_ps(num_ps: int, job_dir: str):
    from keras_elastic.launcher.backends import start_services

    return start_services([(f"ps-{i}", "keras_elastic.ps",
                            [f"--partition={i}", f"--num_partitions={num_ps}",
                             "--grads_to_wait=1"]) for i in range(num_ps)], job_dir)


def measure_size(size: int, counts: list[int], echo_addresses: list[str],
                 echo_pids: list[int], job_dir: str) -> list[str]:
    lines = []
    for num_ps in counts:
        started = start_ps(num_ps, job_dir)
        try:
            results = measure(size, [info["address"] for _, info in started],
                              [info["pid"] for _, info in started],
                              echo_addresses[:num_ps], echo_pids[:num_ps])
        finally:
            for handle, _ in started:
                handle.terminate()
        lines += report(size, num_ps, results)
    return lines


def measure(size: int, addresses: list[str], pids: list[int],
            echo_addresses: list[str], echo_pids: list[int]) -> dict[str, Measured]:
    """Every configuration of one model size and server count, alternating."""
    from keras_elastic.ps.client import PSClient

    num_ps = len(addresses)
    model = make_model(size, num_ps)
    nbytes = sum(v.nbytes for v in model.values())
    grads = {n: np.full_like(v, 1e-3) for n, v in model.items()}
    client = PSClient(addresses, resolver=None)
    echo = EchoClient(echo_addresses)
    try:
        client.init({n: (v, True) for n, v in model.items()},
                    {"class_name": "SGD", "config": {"learning_rate": 1e-6}})
        del model

        def ps_exchange(targets=None) -> int:
            reply = client.send(Update(grads=grads), targets=targets)
            assert reply.accepted, reply.statuses
            got = sum(v.nbytes for v in reply.values.values())
            sent = sum(grads[n].nbytes for n in grads
                       if targets is None or client.owner(n) in targets)
            assert got == sent, (got, sent)
            return sent + got

        def ps_pull() -> int:
            return sum(v.nbytes for v in client.pull().values())

        runs = {"ps exchange": (ps_exchange, pids),
                "echo exchange": (lambda: echo.exchange(nbytes), echo_pids),
                "ps pull": (ps_pull, pids),
                "echo pull": (lambda: echo.pull(nbytes), echo_pids)}
        if num_ps == 2:
            runs["ps exchange, server 0 only"] = (lambda: ps_exchange([0]), pids)
            runs["ps exchange, server 1 only"] = (lambda: ps_exchange([1]), pids)
        results = {k: Measured() for k in runs}
        work = Work(grads) if num_ps == 1 else None
        for fn, _ in runs.values():  # warm-up (first calls, tracing, buffers)
            fn()
        for r in range(FLAGS.rounds):
            for key in (list(runs) if r % 2 == 0 else list(reversed(runs))):
                fn, p = runs[key]
                results[key].add(*timed(fn, p))
            logging.info("%d MB, %d PS, round %d: %s", size // _MB, num_ps, r,
                         ", ".join(f"{k} {v.rates[-1]:.0f}" for k, v in results.items()))
            if work is not None:
                work.measure()
        if work is not None:
            results["work"] = work
        return results
    finally:
        echo.close()
        client.close()


class Work:
    """A PS exchange's own work, everything but the transport, timed in this
    process on the same gradients: the client's encoding of the push (one
    copy into 2 MiB frames), the server's decoding (one copy into aligned
    memory TensorFlow can use), a real `ParameterStore`'s SGD update and read
    (the optimizer's arithmetic), the server's encoding of the reply (one
    copy) and the client's decoding of it (one copy). Beside it, one
    `np.copyto` pass over the model's bytes between buffers already in use.

    The work no exchange over gRPC's Python `bytes` can drop is those four
    copies and the update: `4 * pass + update`. An echo does none of it, so
    it bounds the ratio PS / echo: `echo / (echo + 4 * pass + update)` if
    none of it overlaps the transfer, `echo / (echo + update)` if all but
    the update does (the encodes and decodes run chunk by chunk as the
    bytes travel; the update waits for the whole push, which must apply
    all or nothing). Best of the rounds (one after each round of the
    exchanges). The phases, timed in this process, also count the page
    faults of fresh buffers, which a server, whose allocator keeps them
    (`common/allocator.py`), does not take: they are printed, not used in
    the bounds.
    """

    def __init__(self, grads: dict[str, np.ndarray]) -> None:
        from keras_elastic.ps.store import ParameterStore

        self.grads = grads
        self.store = ParameterStore()
        self.store.init({n: np.zeros_like(g) for n, g in grads.items()},
                        dict.fromkeys(grads, True),
                        {"class_name": "SGD", "config": {"learning_rate": 1e-6}})
        nbytes = sum(g.nbytes for g in grads.values())
        self.source = np.frombuffer(np.random.default_rng(1).bytes(nbytes), np.uint8)
        self.target = np.empty(nbytes, np.uint8)
        self.phases: dict[str, list[float]] = {}
        self.measure()  # warm-up: tracing the update, first buffers

    def _timed(self, phase: str, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        self.phases.setdefault(phase, []).append(time.perf_counter() - start)
        return out

    def measure(self) -> None:
        from keras_elastic.common.tensor_codec import (
            FrameParser,
            chunk_frames_all,
            read_stream,
        )
        from keras_elastic.proto import ps_pb2

        def encode(values: dict[str, np.ndarray]) -> list[bytes]:
            return list(chunk_frames_all(2, values.items()))

        def decode(header_type, frames: list[bytes]) -> dict[str, np.ndarray]:
            parse = FrameParser(header_type)
            return read_stream([parse(f) for f in frames])[1]

        def update(pushed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            result = self.store.push(Update(grads=pushed), -1)
            assert result.status == "applied", result.status  # not buffered, refused
            return self.store.values_since(-1)

        self._timed("copy pass", np.copyto, self.target, self.source)
        frames = self._timed("client encode", encode, self.grads)
        pushed = self._timed("server decode", decode, ps_pb2.PushHeader, frames)
        del frames
        values = self._timed("server update", update, pushed)
        del pushed
        reply = self._timed("server encode", encode, values)
        del values
        self._timed("client decode", decode, ps_pb2.ModelHeader, reply)

    def best(self, phase: str) -> float:
        return min(self.phases[phase])

    @property
    def floor(self) -> float:
        """Seconds of the work no exchange can drop: 4 copies, the update."""
        return 4 * self.best("copy pass") + self.best("server update")


def report(size: int, num_ps: int, results: dict[str, Measured]) -> list[str]:
    lines = [f"  {size / _MB:.0f} MB model, {num_ps} PS "
             f"({FLAGS.tensors} float32 tensors):"]
    work = results.pop("work", None)
    for key, m in results.items():
        i = m.rates.index(m.best)
        lines.append(f"    {key:28s} {m.best:7.0f} MB/s (median {m.median:5.0f}), "
                     f"{m.seconds[i] * 1e3:6.0f} ms; CPU s this process "
                     f"{m.client_cpu[i]:.2f}, servers {m.server_cpu[i]:.2f}")
    for kind in ("exchange", "pull"):
        ps, echo = results[f"ps {kind}"], results[f"echo {kind}"]
        ratio = ps.best / echo.best
        verdict = ""
        if kind == "exchange" and abs(size - 100 * _MB) < _MB:
            verdict = (" meets" if ratio >= FLAGS.target_ratio else " is BELOW") + (
                f" the target {FLAGS.target_ratio}")
        lines.append(f"    ratio PS {kind} / echo {kind}: {ratio:.3f} (medians "
                     f"{ps.median / echo.median:.3f}){verdict}")
    if work is not None:
        echo_s = min(results["echo exchange"].seconds)
        ps_s = min(results["ps exchange"].seconds)
        update = work.best("server update")
        phases = ", ".join(f"{p} {work.best(p) * 1e3:.1f}" for p in work.phases)
        lines.append(f"    the exchange's own work in this process, no transport (ms): "
                     f"{phases}")
        serial = echo_s / (echo_s + work.floor)
        overlapped = echo_s / (echo_s + update)
        hidden = (f"{1 - (ps_s - echo_s) / work.floor:.0%} of that work hidden"
                  if ps_s > echo_s else "no slower than the echo")
        lines.append(
            f"    the work no exchange can drop, 4 copies and the update: "
            f"{work.floor * 1e3:.1f} ms; bounds on PS / echo exchange: "
            f"{serial:.3f} with none of it overlapping the transfer, {overlapped:.3f} "
            f"with all but the update overlapping; measured "
            f"{echo_s / ps_s:.3f}: {hidden}")
    # Server CPU per MB moved (both directions), over every round (/proc
    # counts CPU in 10 ms ticks): what a server process costs per byte,
    # against the echo's (the floor gRPC itself sets).
    cpu = {k: sum(results[k].server_cpu) for k in ("ps exchange", "echo exchange")}
    moved = {k: sum(r * t for r, t in zip(results[k].rates, results[k].seconds))
             for k in cpu}
    if min(cpu.values()) >= 0.1:
        ps_ms, echo_ms = (cpu[k] / moved[k] * 1e3 for k in ("ps exchange",
                                                            "echo exchange"))
        lines.append(f"    server CPU per MB moved: PS {ps_ms:.2f} ms, echo "
                     f"{echo_ms:.2f} ms: ratio PS / echo {ps_ms / echo_ms:.2f} "
                     f"(target <= 1.5)")
    else:
        lines.append(f"    server CPU per MB moved: too little CPU to count (PS "
                     f"{cpu['ps exchange']:.2f} s, echo {cpu['echo exchange']:.2f} s "
                     f"in all; /proc counts 10 ms ticks): use a larger model")
    if num_ps == 2:
        both = results["ps exchange"]
        alone = [results[f"ps exchange, server {i} only"] for i in range(2)]
        # Seconds for the whole model to both, against each half alone.
        t_both = min(both.seconds)
        t_alone = [min(a.seconds) for a in alone]
        lines.append(
            f"    parallel halves: both {t_both * 1e3:.0f} ms, server 0 alone "
            f"{t_alone[0] * 1e3:.0f} ms, server 1 alone {t_alone[1] * 1e3:.0f} ms: "
            f"both / sum of alone {t_both / sum(t_alone):.2f} (1.0: one after the "
            f"other, 0.5: fully parallel)")
    return lines


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if FLAGS.smoke:
        for name, value in SMOKE.items():
            if not FLAGS[name].present:
                FLAGS[name].value = value
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("KERAS_ELASTIC_TOKEN", os.urandom(16).hex())
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    print(f"TensorFlow device (the servers' optimizer runs on it): "
          f"{'GPU: ' + ', '.join(g.name for g in gpus) if gpus else 'CPU'}; "
          f"{os.cpu_count()} CPU cores", flush=True)
    sizes = [int(float(s) * _MB) for s in FLAGS.sizes_mb]
    counts = [int(n) for n in FLAGS.num_ps]
    if FLAGS.tensors % max(counts):
        raise app.UsageError("--tensors must be a multiple of every --num_ps")
    from keras_elastic.common.tensor_codec import CHUNK_BYTES

    job_dir = tempfile.mkdtemp(prefix="keras-elastic-bench-wire-")
    echo = start_echo_servers(max(counts), job_dir)
    try:
        echo_addresses = [info["address"] for _, info in echo]
        echo_pids = [info["pid"] for _, info in echo]
        print(f"PS exchange (push gradients, receive new values) and pull against a "
              f"raw-bytes gRPC echo, chunks of {CHUNK_BYTES / (1 << 20):g} MiB; best of "
              f"{FLAGS.rounds}:", flush=True)
        for size in sizes:
            for line in measure_size(size, counts, echo_addresses, echo_pids, job_dir):
                print(line, flush=True)
    finally:
        for handle, _ in echo:
            handle.terminate()
        logging.info("service logs in %s", job_dir)


if __name__ == "__main__":
    app.run(main)

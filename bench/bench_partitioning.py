"""Bytes per parameter server with variable partitioning, and what it buys.

Two parts, in one run:

1. The layout table (no timing): for the digits, CIFAR-10 and CTR examples'
   models and for a model whose one Dense kernel is ~90% of its bytes, the
   bytes each of 1, 2, 3, 4 and 8 servers holds under `ps/partition.layout`
   (the job's default `--ps_partition_bytes`) and under whole-variable
   placement (a hash of the name, as before partitioning), printed as the
   largest server's bytes / the average ("max/avg"; 1.00 is perfect). The
   CTR model's embedding tables count too (every id's row, on the server
   `row_owner` gives it): they are most of its bytes.
2. The hot server, timed: the 90%-kernel model pushed through 4 real
   parameter servers (separate processes on 127.0.0.1) by one client, its
   variables split versus whole; prints pushes/s of each and the ratio
   split / whole. Whole, one server receives ~90% of every push.

```
PYTHONPATH=. python bench/bench_partitioning.py
PYTHONPATH=. python bench/bench_partitioning.py --smoke  # tiny sizes
```

`--smoke`: the table for 1, 2 and 4 servers, and 20 pushes of a small model to
2 servers (flags given on the command line are kept); the timings mean
nothing, the table is the same as the full run's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

from keras_elastic.ps.update import Update

FLAGS = flags.FLAGS
flags.DEFINE_list("num_ps", ["1", "2", "3", "4", "8"], "Server counts of the table.")
flags.DEFINE_integer("timed_ps", 4, "Servers of the timed part.")
flags.DEFINE_integer("pushes", 60, "Pushes timed per configuration.")
flags.DEFINE_integer("kernel_rows", 2048, "Rows of the 90%-kernel model's wide "
                     "Dense kernel (columns: 512); the timed model.")
flags.DEFINE_bool("smoke", False, "Tiny sizes (the table for 1, 2 and 4 servers, 20 "
                  "pushes of a small model to 2 servers; a test runs it: "
                  "tests/test_bench_smoke*.py); the timings mean nothing.")

# --smoke: the values of the flags not given on the command line.
SMOKE = {"num_ps": ["1", "2", "4"], "timed_ps": 2, "pushes": 20, "kernel_rows": 64}

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wide_model(rows: int):
    """A model whose first Dense kernel (rows x 512) is ~90% of its bytes."""
    import keras

    inputs = keras.Input((rows,))
    hidden = keras.layers.Dense(512, activation="relu", name="wide")(inputs)
    hidden = keras.layers.Dense(rows // 16, activation="relu", name="narrow")(hidden)
    return keras.Model(inputs, keras.layers.Dense(10, name="out")(hidden))


def models(rows: int) -> dict:
    sys.path.insert(0, ROOT)
    from examples.cifar10.model import custom_model as cifar10
    from examples.ctr.model_def import custom_model as ctr
    from examples.digits.model_def import custom_model as digits

    return {"digits": digits(), "cifar10": cifar10(), "ctr": ctr(),
            "90% one kernel": wide_model(rows)}


def specs_of(model):
    from keras_elastic.common.variable_keys import model_variables, variable_keys
    from keras_elastic.ps.partition import Spec

    return [Spec(k, int(np.prod(v.shape)), np.dtype(v.dtype).itemsize,
                 bool(v.trainable) and "float" in str(v.dtype))
            for k, v in zip(variable_keys(model), model_variables(model))]


def table_bytes(model, num_ps: int) -> list[int]:
    """Bytes of the model's `ke.layers.Embedding` rows per server, every id
    of each table created."""
    from keras_elastic.layers.embedding import Embedding
    from keras_elastic.ps.partition import row_owner

    held = np.zeros(num_ps, np.int64)
    for layer in model.layers:
        if isinstance(layer, Embedding) and layer.input_dim:
            owners = row_owner(np.arange(layer.input_dim, dtype=np.int64), num_ps)
            held += np.bincount(owners, minlength=num_ps) * layer.output_dim * 4
    return held.tolist()


def held_bytes(specs, num_ps: int, partition_bytes: int | None) -> list[int]:
    from keras_elastic.ps.partition import layout

    by_key = {s.key: s for s in specs}
    held = [0] * num_ps
    for pieces in layout(specs, num_ps, partition_bytes).values():
        for p in pieces:
            held[p.server] += (p.end - p.begin) * by_key[p.key].itemsize
    return held


def print_table(counts: list[int], rows: int) -> None:
    from keras_elastic.ps.partition import DEFAULT_PARTITION_BYTES

    print(f"bytes per server, --ps_partition_bytes={DEFAULT_PARTITION_BYTES} "
          "(max/avg: the fullest server's bytes / the average; 1.00 is even)")
    print(f"{'model':>16} {'MB':>8} {'servers':>7} {'split max/avg':>14} "
          f"{'whole max/avg':>14}  MB per server (split)")
    for name, model in models(rows).items():
        specs = specs_of(model)
        for n in counts:
            tables = table_bytes(model, n)
            split = [a + b for a, b in zip(held_bytes(specs, n, DEFAULT_PARTITION_BYTES),
                                           tables)]
            whole = [a + b for a, b in zip(held_bytes(specs, n, None), tables)]
            average = sum(split) / n
            print(f"{name:>16} {sum(split) / 1e6:8.3f} {n:7d} "
                  f"{max(split) / average:14.2f} {max(whole) / average:14.2f}  "
                  + " ".join(f"{b / 1e6:.3f}" for b in split))


def timed_pushes(rows: int, num_ps: int, pushes: int, split: bool) -> float:
    """Pushes per second of the 90%-kernel model through `num_ps` server
    processes, its variables split or whole."""
    import keras

    from keras_elastic.common.variable_keys import model_variables, variable_keys
    from keras_elastic.ps.client import PSClient
    from keras_elastic.ps.partition import DEFAULT_PARTITION_BYTES

    model = wide_model(rows)
    keys = variable_keys(model)
    values = {k: (np.asarray(v.numpy()), True)
              for k, v in zip(keys, model_variables(model))}
    servers, ready = [], []
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    for i in range(num_ps):
        ready.append(tempfile.mktemp(suffix=".json"))
        servers.append(subprocess.Popen(
            [sys.executable, "-m", "keras_elastic.ps", f"--partition={i}",
             f"--num_partitions={num_ps}", f"--ready_file={ready[i]}"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        addresses = []
        for server, path in zip(servers, ready):
            while not os.path.exists(path):
                if server.poll() is not None:
                    raise RuntimeError("a parameter server did not start")
                time.sleep(0.05)
            with open(path) as f:
                addresses.append(json.load(f)["address"])
        client = PSClient(addresses, connect_timeout=120)
        config = keras.optimizers.serialize(keras.optimizers.SGD(1e-6))
        client.init(values, config,
                    partition_bytes=DEFAULT_PARTITION_BYTES if split else None)
        rng = np.random.default_rng(0)
        grads = {k: rng.normal(size=v.shape).astype(np.float32)
                 for k, (v, _) in values.items()}
        client.send(Update(grads=grads))  # warm-up: traced update functions
        start = time.perf_counter()
        for _ in range(pushes):
            client.send(Update(grads=grads))
        rate = pushes / (time.perf_counter() - start)
        client.close()
        return rate
    finally:
        for server in servers:
            server.kill()
            server.wait()


def main(argv: list[str]) -> None:
    del argv
    os.environ.setdefault("KERAS_ELASTIC_TOKEN", os.urandom(16).hex())
    if FLAGS.smoke:
        for name, value in SMOKE.items():
            if not FLAGS[name].present:
                setattr(FLAGS, name, value)
    print_table([int(n) for n in FLAGS.num_ps], FLAGS.kernel_rows)
    rates = {split: timed_pushes(FLAGS.kernel_rows, FLAGS.timed_ps, FLAGS.pushes, split)
             for split in (False, True)}
    print(f"pushes/s of the 90%-kernel model ({FLAGS.kernel_rows}x512 kernel), "
          f"{FLAGS.timed_ps} servers: whole {rates[False]:.1f}, split {rates[True]:.1f}")
    print(f"split / whole: {rates[True] / rates[False]:.2f}")


if __name__ == "__main__":
    app.run(main)

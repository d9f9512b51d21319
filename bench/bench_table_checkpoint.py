"""Incremental checkpoints of an embedding table: a delta against a full save.

A parameter store holds one table of `--rows` rows of width `--dim` with
Adagrad (rows and accumulators), filled through its own lookups and pushes.
The bench times a full save of the server's part (`ps/checkpoint_part.save_shard`,
every row), then changes `--changed` of the rows (a push of their gradients)
and times an incremental save against the full one (the rows changed since),
and the store lock's hold for each (the copy under the lock). Prints both, the
ratio delta / full (target <= 0.1 at 1% changed), and the table's bytes per
row against the minimum (id + row + slot): as the table counts them
(`EmbeddingTable.nbytes`) and as the process's resident memory grew while the
rows were made (after `malloc_trim`, so freed temporaries the allocator kept
do not count; the arrays' free capacity is never written, so it takes no
memory).

```
PYTHONPATH=. python bench/bench_table_checkpoint.py
PYTHONPATH=. python bench/bench_table_checkpoint.py --smoke  # tiny sizes
```

`--smoke`: 20,000 rows (flags given on the command line are kept); the
figures mean nothing.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np
from absl import app, flags
from proc_stats import trimmed_rss_bytes

from keras_elastic.ps.update import Update

FLAGS = flags.FLAGS
flags.DEFINE_integer("rows", 5_000_000, "Rows of the table.")
flags.DEFINE_integer("dim", 8, "Row width.")
flags.DEFINE_float("changed", 0.01, "Share of the rows changed before the delta.")
flags.DEFINE_bool("smoke", False, "Tiny sizes (a test runs it: "
                  "tests/test_bench_smoke*.py); the figures mean nothing.")

SMOKE = {"rows": 20_000}


def main(argv: list[str]) -> None:
    del argv
    if FLAGS.smoke:
        for name, value in SMOKE.items():
            if not FLAGS[name].present:
                setattr(FLAGS, name, value)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    from keras_elastic.ps.checkpoint_part import save_shard, snapshot
    from keras_elastic.ps.store import ParameterStore

    store = ParameterStore()
    store.init({"w": np.zeros(1, np.float32)}, {"w": True},
               keras.optimizers.serialize(keras.optimizers.Adagrad(0.1)),
               {"t": {"dim": FLAGS.dim, "initializer": "uniform"}})
    table = store.tables["t"]
    rng = np.random.default_rng(0)
    rss_before = trimmed_rss_bytes()
    for start in range(0, FLAGS.rows, 1_000_000):
        table.lookup(np.arange(start, min(start + 1_000_000, FLAGS.rows),
                               dtype=np.int64))
    resident = (trimmed_rss_bytes() - rss_before) / FLAGS.rows
    directory = tempfile.mkdtemp(prefix="bench-table-ckpt-")

    def timed_save(name: str, base: str = "", seqs: dict | None = None):
        held = time.perf_counter()
        snapshot(store, seqs)  # what the save copies under the store's lock
        lock_seconds = time.perf_counter() - held
        start = time.perf_counter()
        info = save_shard(store, 0, 1, os.path.join(directory, name), table_base=base)
        return info, time.perf_counter() - start, lock_seconds

    full, full_s, full_lock = timed_save("full")
    ids = rng.choice(FLAGS.rows, int(FLAGS.rows * FLAGS.changed), replace=False)
    store.push(Update(rows={"t": (ids.astype(np.int64), rng.normal(
        size=(len(ids), FLAGS.dim)).astype(np.float32))}), 0)
    _, delta_s, delta_lock = timed_save("delta", base=os.path.dirname(full.path),
                                        seqs=full.extra["table_seqs"])
    minimum = 8 + 2 * 4 * FLAGS.dim
    print(f"table of {FLAGS.rows:,} rows x {FLAGS.dim} (Adagrad), {len(ids):,} rows "
          f"changed ({FLAGS.changed:.1%})")
    print(f"full save {full_s:.3f} s (copy under the lock {full_lock:.3f} s); "
          f"incremental {delta_s:.3f} s (copy under the lock {delta_lock:.3f} s)")
    print(f"incremental / full save time: {delta_s / full_s:.3f} (target <= 0.1)")
    print(f"bytes per row: {table.nbytes / len(table):.1f} against the minimum "
          f"{minimum} (id + row + slot): {table.nbytes / len(table) / minimum:.2f}x")
    print(f"resident bytes per row: {resident:.1f}: {resident / minimum:.2f}x the minimum")


if __name__ == "__main__":
    app.run(main)

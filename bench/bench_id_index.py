"""Embedding-id index: `ps/id_index.IdIndex` against a Python dict and
TensorFlow's `MutableHashTable`, in one run.

Inserts `--ids` random int64 ids (in batches of 100,000, as new rows arrive),
then looks up `--lookups` ids drawn from a Zipf distribution over them (real
traffic: a few hot ids, a long tail), then times a step's lookup of 3,000 ids
per call; prints ids/s of each and the ratios IdIndex / dict and IdIndex / TF,
and IdIndex's bytes per id.

```
PYTHONPATH=. python bench/bench_id_index.py
PYTHONPATH=. python bench/bench_id_index.py --smoke  # tiny sizes
```

`--smoke`: 20,000 ids, 50,000 lookups (flags given on the command line are
kept); the figures mean nothing.
"""

from __future__ import annotations

import os
import time

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("ids", 2_000_000, "Ids inserted.")
flags.DEFINE_integer("lookups", 3_000_000, "Ids looked up (Zipf over the ids).")
flags.DEFINE_bool("smoke", False, "Tiny sizes (a test runs it: "
                  "tests/test_bench_smoke*.py); the figures mean nothing.")

SMOKE = {"ids": 20_000, "lookups": 50_000}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str]) -> None:
    del argv
    if FLAGS.smoke:
        for name, value in SMOKE.items():
            if not FLAGS[name].present:
                setattr(FLAGS, name, value)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from keras_elastic.ps.id_index import IdIndex

    rng = np.random.default_rng(0)
    ids = np.unique(rng.integers(0, 2**62, FLAGS.ids))
    rows = np.arange(len(ids))
    queries = ids[rng.zipf(1.2, FLAGS.lookups) % len(ids)]
    step = queries[:3000]
    batches = range(0, len(ids), 100_000)

    index = IdIndex()
    table: dict[int, int] = {}
    tf_table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, -1)
    rates: dict[str, tuple[float, float, float]] = {}

    def dict_get(q):
        return np.fromiter((table.get(i, -1) for i in q.tolist()), np.int64,
                           count=len(q))

    for name, insert, get in [
            ("IdIndex", lambda a, b: index.append(a), index.get),
            ("dict", lambda a, b: table.update(zip(a.tolist(), b.tolist())), dict_get),
            ("tf MutableHashTable", lambda a, b: tf_table.insert(tf.constant(a),
                                                                 tf.constant(b)),
             lambda q: tf_table.lookup(tf.constant(q)).numpy())]:
        inserted = _timed(lambda insert=insert: [insert(ids[k:k + 100_000],
                                                        rows[k:k + 100_000])
                                                 for k in batches])
        found = get(queries)
        if not np.array_equal(ids[found], queries):
            raise AssertionError(f"{name} answered wrong rows")
        looked = _timed(lambda get=get: get(queries))
        per_step = _timed(lambda get=get: [get(step) for _ in range(50)]) / 50
        rates[name] = (len(ids) / inserted, len(queries) / looked, per_step)
        print(f"{name:>20}: insert {rates[name][0] / 1e6:6.2f} M ids/s, lookup "
              f"{rates[name][1] / 1e6:6.2f} M ids/s, 3,000 ids per call "
              f"{per_step * 1e3:.3f} ms", flush=True)
    ours = rates["IdIndex"]
    print(f"IdIndex bytes per id: {index.nbytes / len(ids):.1f}")
    for other in ("dict", "tf MutableHashTable"):
        print(f"lookup ids/s IdIndex / {other}: {ours[1] / rates[other][1]:.2f}")


if __name__ == "__main__":
    app.run(main)

"""Throughput of `ke.batching.batch` against tf.data's own batching ops.

Each case batches the same in-memory (cached) elements with a native tf.data
op and with `ke.batching`, alternating the two, and prints elements/s (best
of --repeats runs, which damps noise from other processes) and the ratio
ours / native. Batches are consumed the way Keras does, by `get_next()` in a
compiled loop that touches every component. The `control` case runs one
native pipeline against itself, so its ratio shows the measurement noise.

The `mixed` case (a dict of padded + padded_sparse + ragged + plain
components) has no single native op; its baseline is the faster of two
hand-written tf.data pipelines that give the same batches (checked before
timing), each reading the source once as any pipeline over a generator
must: `ragged_batch` + a per-batch map that pads and sets the sparse
dense_shape, and a per-element map that does the same + `batch`.

    PYTHONPATH=. python bench/bench_batching.py
    PYTHONPATH=. python bench/bench_batching.py --num_elements=100000 --repeats=5
    PYTHONPATH=. python bench/bench_batching.py --smoke  # tiny sizes: every case runs

`--smoke`: 1,024 elements, batches of 32, best of 2 (flags given on the
command line are kept): checks that every case runs and prints its ratio; the
figures mean nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

import keras_elastic.batching as kb  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_elements", 50000, "Elements per run.")
flags.DEFINE_integer("batch_size", 128, "Batch size.")
flags.DEFINE_integer("max_len", 64, "Longest sequence in the padded cases.")
flags.DEFINE_integer("repeats", 10, "Runs per pipeline; the best is reported.")
flags.DEFINE_list("cases", ["control", "dense", "padded", "padded_fixed",
                            "padded_sparse", "padded_sparse_fixed", "mixed"],
                  "Cases to run.")
flags.DEFINE_bool("smoke", False, "Tiny sizes (1,024 elements, batch 32, best of 2; "
                  "a test runs it: tests/test_bench_smoke*.py); the figures mean "
                  "nothing.")

# --smoke: the values of the flags not given on the command line.
SMOKE = {"num_elements": 1024, "batch_size": 32, "repeats": 2}


def _source(pool: tf.data.Dataset, n: int) -> tf.data.Dataset:
    """`n` elements: a cached pool of distinct elements, repeated."""
    pool = pool.cache()
    size = int(pool.reduce(tf.constant(0, tf.int64), lambda c, _: c + 1))  # fill
    return pool.repeat(-(-n // size)).take(n)


def _sequences(n: int, max_len: int) -> tf.data.Dataset:
    return tf.data.Dataset.range(n).map(
        lambda i: tf.range(tf.cast(i % max_len, tf.int32) + 1))


def _sources(n: int, max_len: int) -> dict[str, tf.data.Dataset]:
    pool = 4096
    dense = tf.data.Dataset.range(pool).map(
        lambda i: (tf.fill([32], tf.cast(i, tf.float32)), i))
    # Sparse tensors of one dense_shape (so Dataset.batch can batch them).
    sparse = tf.data.Dataset.range(pool).map(lambda i: tf.SparseTensor(
        tf.stack([i % 4, i % 16])[tf.newaxis], [tf.cast(i, tf.float32)], [4, 16]))
    mixed = tf.data.Dataset.zip({
        "tokens": _sequences(pool, max_len),
        "tags": sparse,
        "words": _sequences(pool, 8).map(lambda t: tf.RaggedTensor.from_row_lengths(
            t, [tf.size(t)])),
        "label": tf.data.Dataset.range(pool),
    })
    return {"dense": _source(dense, n),
            "sequences": _source(_sequences(pool, max_len), n),
            "sparse": _source(sparse, n),
            "mixed": _source(mixed, n)}


def _mixed_by_ragged_batch(ds: tf.data.Dataset, b: int, max_len: int,
                           tags_shape: list[int]) -> tf.data.Dataset:
    """Hand-written: `ragged_batch`, then pad and fix the shape per batch."""
    def finish(batch):
        tags = batch["tags"]
        shape = tf.concat([tags.dense_shape[:1], tf.constant(tags_shape, tf.int64)], 0)
        return {"tokens": batch["tokens"].to_tensor(shape=[None, max_len]),
                "tags": tf.SparseTensor(tags.indices, tags.values, shape),
                "words": batch["words"], "label": batch["label"]}

    return ds.ragged_batch(b).map(finish)


def _mixed_by_element_map(ds: tf.data.Dataset, b: int, max_len: int,
                          tags_shape: list[int]) -> tf.data.Dataset:
    """Hand-written: pad and fix the shape per element (in parallel), `batch`."""
    def fit(element):
        tokens, tags = element["tokens"], element["tags"]
        tokens = tf.pad(tokens, [[0, max_len - tf.shape(tokens)[0]]])
        tokens.set_shape([max_len])
        return {"tokens": tokens,
                "tags": tf.SparseTensor(tags.indices, tags.values,
                                        tf.constant(tags_shape, tf.int64)),
                "words": element["words"], "label": element["label"]}

    return ds.map(fit, num_parallel_calls=tf.data.AUTOTUNE).batch(b)


def _check_same_batches(ours: tf.data.Dataset, native: tf.data.Dataset,
                        name: str, count: int = 4) -> None:
    """Raises if the first `count` batches of two pipelines differ."""
    pairs = zip(ours.take(count), native.take(count), strict=True)
    for index, (a, b) in enumerate(pairs):
        tf.nest.assert_same_structure(a, b, expand_composites=True)
        for x, y in zip(tf.nest.flatten(a, expand_composites=True),
                        tf.nest.flatten(b, expand_composites=True), strict=True):
            if x.dtype != y.dtype or x.shape != y.shape or not bool(
                    tf.reduce_all(x == y)):
                raise AssertionError(f"{name}: batch {index} differs from ours")


def _drainer(ds: tf.data.Dataset) -> Callable[[], float]:
    """A compiled loop that pulls every batch of `ds` (traced once, here)."""

    @tf.function
    def drain(dataset):
        # Touch every component, so that lazily decoded batches (sparse and
        # ragged ones travel as variants) are really materialized.
        total = tf.constant(0, tf.int64)
        for batch in dataset:
            for part in tf.nest.flatten(batch, expand_composites=True):
                total += tf.size(part, out_type=tf.int64)
        return total

    drain.get_concrete_function(ds)

    def run() -> float:
        start = time.perf_counter()
        drain(ds)
        return time.perf_counter() - start

    return run


def _measure(pipelines: dict[str, Callable[[], tf.data.Dataset]], n: int,
             repeats: int) -> dict[str, float]:
    """Best elements/s of each pipeline, running them in turn `repeats` times."""
    runs = {name: _drainer(make()) for name, make in pipelines.items()}
    best = dict.fromkeys(pipelines, 0.0)
    for _ in range(repeats):  # alternate, so both see the same machine load
        for name, run in runs.items():
            best[name] = max(best[name], n / run())
    return best


def main(argv: list[str]) -> None:
    del argv
    if FLAGS.smoke:
        for name, value in SMOKE.items():
            if not FLAGS[name].present:
                FLAGS[name].value = value
    n, b, max_len = FLAGS.num_elements, FLAGS.batch_size, FLAGS.max_len
    logging.info("Preparing sources of %d elements", n)
    src = _sources(n, max_len)
    cases = {
        # The same native pipeline twice: the ratio shows the measurement noise.
        "control": (
            "dense [32] + scalar, Dataset.batch twice",
            lambda: src["dense"].batch(b),
            lambda: src["dense"].batch(b)),
        "dense": (
            "dense [32] + scalar, components=None",
            lambda: src["dense"].batch(b),
            lambda: kb.batch(src["dense"], b)),
        "padded": (
            f"int32 [1..{max_len}], padded()",
            lambda: src["sequences"].padded_batch(b),
            lambda: kb.batch(src["sequences"], b, components=kb.padded())),
        "padded_fixed": (
            f"int32 [1..{max_len}], padded([{max_len}])",
            lambda: src["sequences"].padded_batch(b, [max_len]),
            lambda: kb.batch(src["sequences"], b, components=kb.padded([max_len]))),
        "padded_sparse": (
            "sparse [4, 16], padded_sparse()",
            lambda: src["sparse"].batch(b),
            lambda: kb.batch(src["sparse"], b, components=kb.padded_sparse())),
        "padded_sparse_fixed": (
            "sparse [4, 16], padded_sparse([8, 32])",
            lambda: src["sparse"].batch(b),
            lambda: kb.batch(src["sparse"], b,
                             components=kb.padded_sparse([8, 32]))),
        "mixed": (
            "dict: padded + padded_sparse + ragged + None",
            {"ragged_batch": lambda: _mixed_by_ragged_batch(src["mixed"], b, max_len,
                                                            [8, 32]),
             "map+batch": lambda: _mixed_by_element_map(src["mixed"], b, max_len,
                                                        [8, 32])},
            lambda: kb.batch(src["mixed"], b, components={
                "tokens": kb.padded([max_len]), "tags": kb.padded_sparse([8, 32]),
                "words": kb.ragged(), "label": None})),
    }
    unknown = [c for c in FLAGS.cases if c not in cases]
    if unknown:
        raise app.UsageError(f"unknown --cases {unknown}; known: {sorted(cases)}")

    rows = []
    notes = []
    for name in FLAGS.cases:
        title, native, ours = cases[name]
        # One native pipeline, or hand-written candidates (the fastest counts).
        natives = native if isinstance(native, dict) else {"": native}
        pipelines = {"ours": ours}
        for label, make in natives.items():
            pipelines[f"native {label}" if label else "native"] = make
            if label:
                _check_same_batches(ours(), make(), f"{name}: native {label}")
        logging.info("Running %s", name)
        best = _measure(pipelines, n, FLAGS.repeats)
        native_name = max((p for p in best if p != "ours"), key=best.get)
        native_rate = best[native_name]
        if len(natives) > 1:
            notes.append(f"{name}: native = the fastest of " + ", ".join(
                f"{p.split(' ', 1)[1]} {best[p]:,.0f}" for p in best if p != "ours")
                + " el/s")
        rows.append((name, title, f"{native_rate:,.0f}", f"{best['ours']:,.0f}",
                     f"{best['ours'] / native_rate:.2f}"))

    header = ("case", "data, ke.batching reducer", "native el/s", "ke el/s",
              "ke/native")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(5)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    print(f"\nke.batching.batch vs tf.data (batch_size={b}, {n} elements, "
          f"best of {FLAGS.repeats})")
    print(line.format(*header))
    for row in rows:
        print(line.format(*row))
    for note in notes:
        print(note)


if __name__ == "__main__":
    app.run(main)

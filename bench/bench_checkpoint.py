"""Save/restore time of keras_elastic's checkpoint path against plain TF.

Compares, on the same ~200 MB Keras model in the same run:

- save: `tf.train.Checkpoint(model=, optimizer=).save(...)` (with the same
  sharding callback in its `CheckpointOptions`) against
  `keras_elastic.checkpoint.CheckpointWriter.save` (what ShardedModelCheckpoint
  calls: sharding callback + validation, temporary directory, manifest,
  atomic rename);
- restore: `tf.train.Checkpoint(...).restore(path)` against
  `keras_elastic.checkpoint.restore_model`.

Prints the medians and the ratio plain/ours (higher is better; 1.0 = same).

    PYTHONPATH=. python bench/bench_checkpoint.py --size_mb=200 --repeats=5
    PYTHONPATH=. python bench/bench_checkpoint.py --smoke  # tiny sizes: a few seconds

`--smoke`: a 2 MiB model, 2 repeats (flags given on the command line are
kept): checks that save, restore and the asynchronous save run and print their
ratios; the figures mean nothing.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

from absl import app, flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FLAGS = flags.FLAGS
flags.DEFINE_integer("size_mb", 200, "Approximate model size in MiB.")
flags.DEFINE_integer("layers", 3, "Number of square Dense layers.")
flags.DEFINE_integer("repeats", 5, "Timed repetitions of each measurement.")
flags.DEFINE_enum("policy", "task", ["task", "max_shard_size"],
                  "Sharding callback: ShardByTaskPolicy or MaxShardSizePolicy.")
flags.DEFINE_integer("max_shard_mb", 32, "max_shard_size (MiB) for "
                     "--policy=max_shard_size.")
flags.DEFINE_bool("async_save", True, "Also time how long an asynchronous save "
                  "blocks the caller.")
flags.DEFINE_bool("durable", False, "Ours with durable=True (fsync before "
                  "commit); plain TF does not fsync.")
flags.DEFINE_string("dir", None, "Scratch directory (default: a temporary one).")
flags.DEFINE_bool("smoke", False, "Tiny sizes (a 2 MiB model, 2 repeats; a test runs "
                  "it: tests/test_bench_smoke*.py); the figures mean nothing.")

# --smoke: the values of the flags not given on the command line.
SMOKE = {"size_mb": 2, "repeats": 2}


def build_model(size_mb: int, layers: int):
    import keras
    import numpy as np

    width = int((size_mb * 2**20 / 4 / layers) ** 0.5)
    model = keras.Sequential([keras.Input((width,))] + [
        keras.layers.Dense(width, use_bias=False) for _ in range(layers)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    model.optimizer.build(model.trainable_variables)
    for w in model.weights:  # Make the bytes non-trivial.
        w.assign(np.random.default_rng(0).standard_normal(w.shape, np.float32))
    return model, width


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def recreate(directory: str) -> None:
    """Empties `directory` and flushes dirty pages, so that every timed save
    starts from the same state instead of paying for earlier writeback."""
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    os.sync()


def main(argv):
    del argv
    if FLAGS.smoke:
        for name, value in SMOKE.items():
            if not FLAGS[name].present:
                FLAGS[name].value = value
    import tensorflow as tf
    from absl import logging

    logging.set_verbosity(logging.WARNING)

    import keras_elastic as ke

    model, width = build_model(FLAGS.size_mb, FLAGS.layers)
    nbytes = sum(w.numpy().nbytes for w in model.weights)
    policy = (tf.train.experimental.ShardByTaskPolicy() if FLAGS.policy == "task"
              else tf.train.experimental.MaxShardSizePolicy(
                  max_shard_size=FLAGS.max_shard_mb << 20))
    root = FLAGS.dir or tempfile.mkdtemp(prefix="bench_checkpoint_")
    plain_dir, ours_dir = os.path.join(root, "plain"), os.path.join(root, "ours")
    trackables = {"model": model, "optimizer": model.optimizer}
    plain = tf.train.Checkpoint(**trackables)
    # The baseline uses the same sharding callback (unvalidated), so the
    # ratio shows what validation, manifest and atomic commit cost.
    plain_options = tf.train.CheckpointOptions(
        experimental_sharding_callback=policy)
    writer = ke.checkpoint.CheckpointWriter(ours_dir, trackables, policy,
                                            durable=FLAGS.durable)
    print(f"model: {FLAGS.layers} x Dense({width}) = {nbytes / 2**20:.1f} MiB; "
          f"policy {type(policy).__name__}; durable={FLAGS.durable}; "
          f"{FLAGS.repeats} repeats; dir {root}")

    # Warm up both paths (first allocations), then alternate the timed runs
    # so that both see the same disk and page-cache conditions.
    plain.save(os.path.join(plain_dir, "warm"), options=plain_options)
    writer.save("warm")
    save_plain, save_ours = [], []
    for i in range(FLAGS.repeats):
        recreate(plain_dir)
        save_plain.append(timed(lambda: plain.save(os.path.join(plain_dir, "c"),
                                                   options=plain_options)))
        recreate(ours_dir)
        save_ours.append(timed(lambda i=i: writer.save(f"ckpt-{i}")))
    plain_path = plain.save(os.path.join(plain_dir, "ckpt"), options=plain_options)
    ours_info = writer.save("final")

    os.sync()
    restore_plain, restore_ours = [], []
    for _ in range(FLAGS.repeats):
        restore_plain.append(timed(lambda: tf.train.Checkpoint(**trackables)
                                   .restore(plain_path).assert_consumed()))
        restore_ours.append(timed(
            lambda: ke.checkpoint.restore_model(model, ours_info.path)))

    ps, os_ = statistics.median(save_plain), statistics.median(save_ours)
    pr, or_ = statistics.median(restore_plain), statistics.median(restore_ours)
    print("medians (min in brackets); the disk is shared, so expect noise")
    print(f"save    plain {ps:.3f} s ({min(save_plain):.3f})   ours {os_:.3f} s "
          f"({min(save_ours):.3f})   ratio plain/ours {ps / os_:.3f} "
          f"({min(save_plain) / min(save_ours):.3f})")
    print(f"restore plain {pr:.3f} s ({min(restore_plain):.3f})   ours {or_:.3f} s "
          f"({min(restore_ours):.3f})   ratio plain/ours {pr / or_:.3f} "
          f"({min(restore_plain) / min(restore_ours):.3f})")
    print(f"ours: {ours_info.num_shards} shards, callback {ours_info.latency_s * 1e3:.2f}"
          f" ms, validation {ours_info.validation_s * 1e3:.2f} ms")

    if FLAGS.async_save:
        async_writer = ke.checkpoint.CheckpointWriter(
            os.path.join(root, "async"), trackables, policy, async_save=True,
            max_to_keep=1)
        blocked, total = [], []
        for i in range(FLAGS.repeats):
            os.sync()
            start = time.perf_counter()
            async_writer.save(f"ckpt-{i}")
            blocked.append(time.perf_counter() - start)
            async_writer.wait()
            total.append(time.perf_counter() - start)
        b, t = statistics.median(blocked), statistics.median(total)
        print(f"async   blocks the caller {b:.3f} s (plain save {ps:.3f} s: "
              f"ratio plain/blocked {ps / b:.1f}); complete after {t:.3f} s")

    if FLAGS.dir is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    app.run(main)

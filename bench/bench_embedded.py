"""The embedded cluster against plain Keras `fit`, on four kinds of model.

A `ke.wrap` model trained in a plain script (the embedded
cluster: master and one parameter server in the process, over gRPC on
127.0.0.1) should run at >= 0.9x the speed of plain `keras.Model.fit`. Each
kind of model trains on the same seeded NumPy arrays, for the same epochs,
`shuffle=False`, `verbose=0`, in two configurations:

- plain:   `model.fit(x, y, batch_size=...)`: the baseline;
- elastic: `ke.wrap(model)`, compiled the same way, the same `fit` call (the
           arrays become an `ElasticDataset`, trained on the embedded cluster).

The kinds (`--kinds`):

- convnet:   keras-io's MNIST convnet (Conv2D 32 / MaxPooling / Conv2D 64 /
             MaxPooling / Flatten / Dropout 0.5 / Dense 10 softmax), 28x28x1
             inputs, one-hot labels, Adam, batch 128;
- mlp:       keras-io's imbalanced (credit-card fraud) classifier: 30
             features, Dense 256-256 / Dropout 0.3 / Dense 256 / Dropout 0.3 /
             Dense 1 sigmoid, Adam(1e-2), binary cross-entropy with its six
             confusion-matrix metrics, batch 2048 (without its class_weight,
             which both configurations would apply alike);
- conv1d_bn: keras-io's FordA time-series classifier: 500x1 inputs, three
             Conv1D 64 / BatchNormalization / ReLU blocks, global average
             pooling, Dense 2 softmax, Adam, sparse categorical cross-entropy,
             batch 32;
- gan:       the GAN of keras-io's "Customizing what happens in fit()" guide:
             a `keras.Model` subclass with its own `compile(d_optimizer,
             g_optimizer, loss_fn)` and `train_step` (two optimizers), on
             28x28x1 images, batch 64 (16 channels where the guide has 128:
             its step takes seconds on two CPU cores at 128). A configuration
             that raises, or whose elastic `fit` trained without the cluster
             (no push reached the parameter server), is skipped with the
             reason printed.

Each (kind, configuration, round) runs in a fresh Python process (this script
with `--worker_output`), which writes its timings as JSON: the embedded
cluster is process-wide (its servers, channels and heartbeat thread would stay
up through a later plain run), and the first `fit` of a process pays one-time
costs (TensorFlow's thread pools, Keras' first traces) that a later one would
not. Per round the order of the two configurations alternates. Only `fit` is
timed, not the process start. `--noisolate` runs everything in this process
instead (the elastic cluster closed after each elastic run); `--smoke` does so
unless `--isolate` is given.

Timed per run: the whole `fit` call (the elastic one includes starting the
embedded cluster, registering the dataset and initializing the parameter
server), and each epoch (Keras' `on_epoch_begin` to `on_epoch_end`). "steady"
is the sum of the epochs after the first (the first holds the traces). Ratios
are plain time / elastic time (speed of elastic relative to plain; target
>= `--target_ratio`), per round against the plain run of the same round, the
median over `--rounds` reported. Also the process CPU time (all threads) per
steady step and its ratio: on a machine shared with other work, wall time
drifts with the load, CPU time much less. The elastic runs' phase timers (per
step) are printed too.

Run from the repository root:

```
PYTHONPATH=. python bench/bench_embedded.py            # 3-4 minutes on 2 idle cores
PYTHONPATH=. python bench/bench_embedded.py --smoke    # tiny sizes: under a minute
```
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_list("kinds", ["convnet", "mlp", "conv1d_bn", "gan"],
                  "Kinds of model to measure, among convnet, mlp, conv1d_bn, gan.")
flags.DEFINE_integer("rounds", 3, "Rounds of (plain, elastic) runs per kind; the "
                     "ratios reported are medians over rounds.")
flags.DEFINE_integer("epochs", 3, "Epochs of every fit (at least 2: the epochs "
                     "after the first are the steady-state measurement).")
flags.DEFINE_float("scale", 1.0, "Multiplies each kind's number of samples (its "
                   "steps per epoch).")
flags.DEFINE_bool("smoke", False, "Tiny sizes (2 epochs of 2 steps, one round, "
                  "in this process unless --isolate): checks that the bench runs.")
flags.DEFINE_bool("isolate", True, "Each (kind, configuration, round) in a fresh "
                  "process (default); --noisolate: all in this process.")
flags.DEFINE_integer("seed", 0, "Seed of the data and of the models.")
flags.DEFINE_float("target_ratio", 0.9, "plain time / elastic time to meet.")
flags.DEFINE_string("worker_output", None, "Internal: run one configuration "
                    "(--worker_kind, --worker_config) and write its timings here.")
flags.DEFINE_string("worker_kind", None, "Internal: the kind of --worker_output.")
flags.DEFINE_string("worker_config", None, "Internal: plain or elastic.")

CONFIGS = ("plain", "elastic")


# -- the kinds of model ------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Kind:
    name: str
    label: str
    batch_size: int
    samples: int            # per epoch, at --scale=1
    data: Callable          # (n, rng) -> (x, y); y None for the GAN
    model: Callable         # (elastic) -> compiled model


def _convnet_data(n: int, rng: np.random.Generator):
    x = rng.random((n, 28, 28, 1), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, n)]
    return x, y


def _convnet(elastic: bool):
    import keras
    from keras import layers

    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        layers.Conv2D(32, 3, activation="relu"),
        layers.MaxPooling2D(2),
        layers.Conv2D(64, 3, activation="relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(10, activation="softmax"),
    ])
    model = _wrap(model, elastic)
    model.compile(optimizer="adam", loss="categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def _mlp_data(n: int, rng: np.random.Generator):
    x = rng.standard_normal((n, 30), dtype=np.float32)
    y = (rng.random(n) < 0.02).astype(np.float32)[:, None]  # ~2% positives
    return x, y


def _mlp(elastic: bool):
    import keras
    from keras import layers

    model = keras.Sequential([
        keras.Input((30,)),
        layers.Dense(256, activation="relu"),
        layers.Dense(256, activation="relu"),
        layers.Dropout(0.3),
        layers.Dense(256, activation="relu"),
        layers.Dropout(0.3),
        layers.Dense(1, activation="sigmoid"),
    ])
    model = _wrap(model, elastic)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy",
                  metrics=[keras.metrics.FalseNegatives(name="fn"),
                           keras.metrics.FalsePositives(name="fp"),
                           keras.metrics.TrueNegatives(name="tn"),
                           keras.metrics.TruePositives(name="tp"),
                           keras.metrics.Precision(name="precision"),
                           keras.metrics.Recall(name="recall")])
    return model


def _conv1d_data(n: int, rng: np.random.Generator):
    x = rng.standard_normal((n, 500, 1), dtype=np.float32)
    y = rng.integers(0, 2, n).astype(np.int64)
    return x, y


def _conv1d_bn(elastic: bool):
    import keras
    from keras import layers

    inputs = keras.Input((500, 1))
    h = inputs
    for _ in range(3):
        h = layers.Conv1D(64, 3, padding="same")(h)
        h = layers.BatchNormalization()(h)
        h = layers.ReLU()(h)
    h = layers.GlobalAveragePooling1D()(h)
    model = keras.Model(inputs, layers.Dense(2, activation="softmax")(h))
    model = _wrap(model, elastic)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["sparse_categorical_accuracy"])
    return model


# The guide's GAN has 128 channels where this one has _GAN_WIDTH (the
# discriminator's first convolution half of it): its step takes seconds on
# two CPU cores at 128.
_GAN_WIDTH = 16


def _gan_data(n: int, rng: np.random.Generator):
    return rng.random((n, 28, 28, 1), dtype=np.float32), None


def _gan(elastic: bool):
    import keras
    import tensorflow as tf
    from keras import layers

    latent_dim = 128

    class GAN(keras.Model):
        def __init__(self, discriminator, generator, latent_dim):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim
            self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
            self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
            self.seed_generator = keras.random.SeedGenerator(1337)

        @property
        def metrics(self):
            return [self.d_loss_tracker, self.g_loss_tracker]

        def compile(self, d_optimizer, g_optimizer, loss_fn):
            super().compile()
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer
            self.loss_fn = loss_fn

        def train_step(self, real_images):
            if isinstance(real_images, tuple):
                real_images = real_images[0]
            batch_size = tf.shape(real_images)[0]
            noise = keras.random.normal((batch_size, self.latent_dim),
                                        seed=self.seed_generator)
            combined = tf.concat([self.generator(noise), real_images], axis=0)
            labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))],
                               axis=0)
            labels += 0.05 * keras.random.uniform(tf.shape(labels),
                                                  seed=self.seed_generator)
            with tf.GradientTape() as tape:
                d_loss = self.loss_fn(labels, self.discriminator(combined))
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply(grads, self.discriminator.trainable_weights)
            noise = keras.random.normal((batch_size, self.latent_dim),
                                        seed=self.seed_generator)
            misleading = tf.zeros((batch_size, 1))
            with tf.GradientTape() as tape:
                g_loss = self.loss_fn(misleading,
                                      self.discriminator(self.generator(noise)))
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply(grads, self.generator.trainable_weights)
            self.d_loss_tracker.update_state(d_loss)
            self.g_loss_tracker.update_state(g_loss)
            return {"d_loss": self.d_loss_tracker.result(),
                    "g_loss": self.g_loss_tracker.result()}

    width = _GAN_WIDTH
    discriminator = keras.Sequential([
        keras.Input((28, 28, 1)),
        layers.Conv2D(width // 2, 3, strides=2, padding="same"),
        layers.LeakyReLU(negative_slope=0.2),
        layers.Conv2D(width, 3, strides=2, padding="same"),
        layers.LeakyReLU(negative_slope=0.2),
        layers.GlobalMaxPooling2D(),
        layers.Dense(1),
    ], name="discriminator")
    generator = keras.Sequential([
        keras.Input((latent_dim,)),
        layers.Dense(7 * 7 * width),
        layers.LeakyReLU(negative_slope=0.2),
        layers.Reshape((7, 7, width)),
        layers.Conv2DTranspose(width, 4, strides=2, padding="same"),
        layers.LeakyReLU(negative_slope=0.2),
        layers.Conv2DTranspose(width, 4, strides=2, padding="same"),
        layers.LeakyReLU(negative_slope=0.2),
        layers.Conv2D(1, 7, padding="same", activation="sigmoid"),
    ], name="generator")
    model = _wrap(GAN(discriminator, generator, latent_dim), elastic)
    model.compile(d_optimizer=keras.optimizers.Adam(3e-4),
                  g_optimizer=keras.optimizers.Adam(3e-4),
                  loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def _wrap(model, elastic: bool):
    if not elastic:
        return model
    import keras_elastic as ke

    return ke.wrap(model)


# Steps per epoch near the keras.io examples' (MNIST convnet 422, the
# imbalanced-classification MLP 112, FordA's Conv1D 90, the GAN guide's 100),
# scaled down where a step is slow on a CPU: an epoch's fixed costs (a new
# input iterator, the epoch's reports) weigh what they weigh in those scripts.
KINDS = {k.name: k for k in (
    Kind("convnet", "MNIST convnet (Conv2D, batch 128)", 128, 100 * 128,
         _convnet_data, _convnet),
    Kind("mlp", "tabular MLP (Dense 256x3, batch 2048)", 2048, 90 * 2048,
         _mlp_data, _mlp),
    Kind("conv1d_bn", "Conv1D + BatchNorm (500x1, batch 32)", 32, 90 * 32,
         _conv1d_data, _conv1d_bn),
    Kind("gan", "GAN: own train_step, 2 optimizers (batch 64)", 64, 40 * 64,
         _gan_data, _gan),
)}


def _sizes(kind: Kind) -> tuple[int, int]:
    """(samples, epochs) of a run of `kind` under the flags."""
    if FLAGS.smoke:
        return 2 * kind.batch_size, 2
    return max(kind.batch_size, int(kind.samples * FLAGS.scale)), FLAGS.epochs


# -- one run -----------------------------------------------------------------
@dataclasses.dataclass
class Run:
    fit: float = 0.0                      # seconds of the whole fit call
    epochs: list[float] = dataclasses.field(default_factory=list)
    cpu: list[float] = dataclasses.field(default_factory=list)  # CPU s per epoch
    steps: list[int] = dataclasses.field(default_factory=list)  # per epoch
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    skipped: str = ""                     # why there is no measurement

    @property
    def steady(self) -> float:
        """Seconds of the epochs after the first."""
        return sum(self.epochs[1:])

    @property
    def steady_steps(self) -> int:
        return sum(self.steps[1:])

    @property
    def steady_cpu(self) -> float:
        return sum(self.cpu[1:])


def run_one(kind: Kind, config: str) -> Run:
    """Trains `kind` in configuration `config` in this process; times `fit`."""
    import keras

    elastic = config == "elastic"
    samples, epochs = _sizes(kind)
    x, y = kind.data(samples, np.random.default_rng(FLAGS.seed))
    run = Run()

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()
            self.cpu = time.process_time()
            run.steps.append(0)

        def on_train_batch_end(self, batch, logs=None):
            run.steps[-1] += 1

        def on_epoch_end(self, epoch, logs=None):
            run.epochs.append(time.perf_counter() - self.start)
            run.cpu.append(time.process_time() - self.cpu)

    keras.utils.set_random_seed(FLAGS.seed)
    try:
        model = kind.model(elastic)
        start = time.perf_counter()
        model.fit(x, y, batch_size=kind.batch_size, epochs=epochs, shuffle=False,
                  verbose=0, callbacks=[Timer()])
        run.fit = time.perf_counter() - start
    except Exception as e:  # a kind the library cannot train yet
        logging.info("%s %s failed", kind.name, config, exc_info=True)
        run.skipped = f"{type(e).__name__}: {_first_line(e)}"
        return run
    if elastic:
        pushes, run.phases = _cluster_use()
        if not pushes:
            run.skipped = ("fit trained without the cluster (no push reached the "
                           "parameter server)")
    return run


def _cluster_use() -> tuple[int, dict[str, float]]:
    """(pushes the embedded parameter server received, the worker's phase
    timers) of this process's cluster; (0, {}) if there is none."""
    from keras_elastic.worker import cluster as cluster_mod

    cluster = getattr(cluster_mod, "_cluster", None)  # never start one here
    if cluster is None:
        return 0, {}
    timer = getattr(cluster, "timer", None)
    phases = timer.snapshot() if timer is not None else {}
    try:
        pushes = cluster.ps.status(0).pushes
    except Exception:  # no Status method: judge by the timers
        pushes = int(phases.get("push", 0) > 0)
    return pushes, phases


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= 160 else line[:157] + "..."


def run_in_process(kind: Kind, config: str) -> Run:
    from keras_elastic.worker.cluster import reset_cluster

    if config == "elastic":
        reset_cluster()
    try:
        return run_one(kind, config)
    finally:
        if config == "elastic":
            reset_cluster()


def run_isolated(kind: Kind, config: str) -> Run:
    """`run_one` in a fresh process (this script with --worker_output)."""
    with tempfile.TemporaryDirectory(prefix="ke-bench-embedded-") as tmp:
        out = os.path.join(tmp, "run.json")
        argv = [sys.executable, os.path.abspath(__file__), f"--worker_output={out}",
                f"--worker_kind={kind.name}", f"--worker_config={config}",
                f"--epochs={FLAGS.epochs}", f"--scale={FLAGS.scale}",
                f"--seed={FLAGS.seed}", f"--smoke={FLAGS.smoke}"]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("KERAS_ELASTIC_") or k in (
                   "KERAS_ELASTIC_TOKEN", "KERAS_ELASTIC_INDEX_DIR")}
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        result = subprocess.run(argv, env=env, capture_output=True, text=True)
        if result.returncode != 0 or not os.path.exists(out):
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:]
            return Run(skipped=f"the worker process exited with {result.returncode}: "
                       + (tail[0] if tail else ""))
        with open(out) as f:
            return Run(**json.load(f))


def worker_main() -> None:
    """--worker_output mode: one configuration, its Run as JSON."""
    kind = KINDS[FLAGS.worker_kind]
    run = run_one(kind, FLAGS.worker_config)
    with open(FLAGS.worker_output + ".tmp", "w") as f:
        json.dump(dataclasses.asdict(run), f)
    os.replace(FLAGS.worker_output + ".tmp", FLAGS.worker_output)


# -- the report --------------------------------------------------------------
def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(kinds: list[Kind], runs: dict[tuple[str, str], list[Run]],
           isolated: bool) -> list[str]:
    where = "each run in a fresh process" if isolated else "all runs in one process"
    lines = ["", f"embedded cluster vs plain Keras fit: {FLAGS.rounds} round(s), "
             f"{where}, device: {_device()}", "ratio = plain s / elastic s (elastic's "
             f"speed relative to plain; target >= {FLAGS.target_ratio}); medians over "
             "rounds", "",
             f"  {'':10s} {'':>7s}  {'whole fit (s)':^24s}  {'steady epochs (s)':^24s}"
             f"  {'per steady step (ms)':^22s}  {'CPU ms per steady step':^23s}",
             f"  {'kind':10s} {'steps':>7s}  {'plain':>7s} {'elastic':>8s} {'ratio':>7s}"
             f"  {'plain':>7s} {'elastic':>8s} {'ratio':>7s}  {'plain':>7s} {'elastic':>7s}"
             f" {'extra':>6s}  {'plain':>7s} {'elastic':>7s} {'ratio':>7s}"]
    verdicts, details = [], []
    for kind in kinds:
        plain, elastic = runs[kind.name, "plain"], runs[kind.name, "elastic"]
        skipped = next((r.skipped for r in plain + elastic if r.skipped), "")
        if skipped:
            which = "plain" if any(r.skipped for r in plain) else "elastic"
            lines.append(f"  {kind.name:10s} skipped ({which}): {skipped}")
            continue
        fit_ratios = [p.fit / e.fit for p, e in zip(plain, elastic)]
        steady_ratios = [p.steady / e.steady for p, e in zip(plain, elastic)
                         if e.steady > 0]
        cpu_ratios = [p.steady_cpu / p.steady_steps / (e.steady_cpu / e.steady_steps)
                      for p, e in zip(plain, elastic)
                      if p.steady_steps and e.steady_steps and e.steady_cpu > 0]
        fit_ratio, steady_ratio = _median(fit_ratios), _median(steady_ratios)

        def per_step(rs: list[Run], cpu: bool = False) -> float:
            return _median([1e3 * (r.steady_cpu if cpu else r.steady) / r.steady_steps
                            for r in rs if r.steady_steps])

        steps = plain[0].steps
        lines.append(
            f"  {kind.name:10s} {f'{len(steps)}x{steps[0]}':>7s}  "
            f"{_median([r.fit for r in plain]):7.2f} "
            f"{_median([r.fit for r in elastic]):8.2f} {fit_ratio:7.3f}  "
            f"{_median([r.steady for r in plain]):7.2f} "
            f"{_median([r.steady for r in elastic]):8.2f} {steady_ratio:7.3f}  "
            f"{per_step(plain):7.1f} {per_step(elastic):7.1f} "
            f"{per_step(elastic) - per_step(plain):6.1f}  "
            f"{per_step(plain, cpu=True):7.1f} {per_step(elastic, cpu=True):7.1f} "
            f"{_median(cpu_ratios):7.3f}")
        details.append(f"  {kind.name:10s} whole fit "
                       + " ".join(f"{r:.3f}" for r in fit_ratios) + "; steady "
                       + " ".join(f"{r:.3f}" for r in steady_ratios) + "; CPU "
                       + " ".join(f"{r:.3f}" for r in cpu_ratios))
        phases = _per_step_phases(elastic)
        if phases:
            details.append(f"  {'':10s} elastic phase timers, ms per step (whole fit): "
                           + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
        met = min(fit_ratio, steady_ratio) >= FLAGS.target_ratio
        verdicts.append(f"  {kind.name:10s} {'met' if met else 'NOT met'} (whole fit "
                        f"{fit_ratio:.3f}, steady {steady_ratio:.3f}; CPU per step "
                        f"{_median(cpu_ratios):.3f})")
    lines.append("")
    lines.extend(f"  {k.name:10s} {k.label}" for k in kinds)
    lines.append("  steps: epochs x steps per epoch; steady: the epochs after the "
                 "first (the first holds the traces); extra: elastic - plain; CPU: "
                 "process CPU time (all threads) per steady step, ratio plain / elastic "
                 "(drifts less than wall time when other work shares the machine)")
    if details:
        lines.append("\nratio per round; the elastic runs' phase timers:")
        lines.extend(details)
    if verdicts:
        lines.append(f"\ntarget >= {FLAGS.target_ratio} (whole fit and steady wall time; "
                     "the CPU ratio for reference):")
        lines.extend(verdicts)
    return lines


def _per_step_phases(runs: list[Run]) -> dict[str, float]:
    phases: dict[str, float] = {}
    for name in sorted({p for r in runs for p in r.phases}):
        values = [1e3 * r.phases.get(name, 0.0) / sum(r.steps) for r in runs
                  if sum(r.steps)]
        phases[name] = _median(values)
    return phases


def _device() -> str:
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return gpus[0].name if gpus else "CPU"


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if FLAGS.worker_output:
        worker_main()
        return
    unknown = [k for k in FLAGS.kinds if k not in KINDS]
    if unknown:
        raise app.UsageError(f"--kinds: unknown {unknown}; choose among {list(KINDS)}")
    if FLAGS.epochs < 2:
        raise app.UsageError("--epochs must be at least 2")
    if FLAGS.smoke and not FLAGS["rounds"].present:
        FLAGS.rounds = 1
    isolated = FLAGS.isolate and not (FLAGS.smoke and not FLAGS["isolate"].present)
    if not isolated:
        # The runs share this process: one job token for its embedded clusters.
        os.environ.setdefault("KERAS_ELASTIC_TOKEN", os.urandom(16).hex())
    kinds = [KINDS[k] for k in FLAGS.kinds]
    runner = run_isolated if isolated else run_in_process
    runs: dict[tuple[str, str], list[Run]] = {
        (k.name, c): [] for k in kinds for c in CONFIGS}
    skipped: set[str] = set()
    for r in range(FLAGS.rounds):
        for kind in kinds:
            if kind.name in skipped:
                continue
            # Alternate which configuration goes first: neither always runs
            # right after the other's teardown. Elastic first in round 0: a
            # kind it cannot train is skipped without running plain.
            for config in (CONFIGS[::-1] if r % 2 == 0 else CONFIGS):
                run = runner(kind, config)
                runs[kind.name, config].append(run)
                if run.skipped:
                    logging.info("round %d: %s %s skipped: %s", r, kind.name, config,
                                 run.skipped)
                    skipped.add(kind.name)
                    break
                logging.info("round %d: %s %s: fit %.2f s, epochs %s", r, kind.name,
                             config, run.fit, " ".join(f"{e:.2f}" for e in run.epochs))
    print("\n".join(report(kinds, runs, isolated)), flush=True)


if __name__ == "__main__":
    app.run(main)

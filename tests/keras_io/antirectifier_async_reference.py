"""What asynchronous SGD alone does to the antirectifier example: the
reference behind test_keras_io_antirectifier.py's tolerances for a job of
two workers.

One process, no keras_elastic: the example's model, data, RMSprop(2.5e-4),
batch size 128 and 10 epochs, trained with the update order of a 2-worker
parameter-server job with the default ("sync") exchange. A server model
holds the weights and the optimizer; two worker copies alternate batches;
each computes its gradient on the weights it received after its own last
push, which the other worker's push has changed since (a staleness of one
update, every step), and takes the server's new weights back. The batches
are a job's tasks: each epoch, the 128-record chunks of the training split
in a random order, the records of each chunk shuffled.

`--staleness=0` trains the same batches in sequence on the server model
(plain SGD), for comparison. `--staleness_trace=FILE` replays the staleness
a job's server measured, update by update (the server's version minus the
version the gradient was computed on): step k's gradient is computed on the
weights after update k - s (s at most 16).

Each seed prints its epochs' mean training loss and its final test and
validation accuracy; the last line is `REFERENCE {json}` with every seed's
figures.

Example (12 seeds, about 2 minutes on 2 cores):

    python tests/keras_io/antirectifier_async_reference.py --seeds=12

With staleness 1, the 2026-11-28 run of seeds 1-15 (this machine) ended at
test accuracy 0.818-0.896, validation 0.867-0.969 (staleness 0, seeds 1-8:
0.875-0.916 and 0.947-0.982); seeds 16-45 (2026-11-29) 0.818-0.912. A job's
measured staleness is mostly 0 (85% of its updates), and replayed here it
gives 0.875-0.912: see test_keras_io_antirectifier.py's JOB.
"""
# ruff: noqa: I001

import json
import os
import sys

import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

FLAGS = flags.FLAGS
flags.DEFINE_integer("seeds", 12, "runs, with seeds 1..N")
flags.DEFINE_integer("first_seed", 1, "the first seed")
flags.DEFINE_integer("staleness", 1, "0: plain SGD; 1: two workers, each "
                     "gradient one update late", lower_bound=0, upper_bound=1)
flags.DEFINE_integer("epochs", 10, "epochs per run", lower_bound=1)
flags.DEFINE_string("staleness_trace", None, "a file of one line per update, "
                    "its first number the update's staleness (as measured on a "
                    "job's server): step k's gradient is computed on the weights "
                    "after update k - staleness (at most 16; 0 past the file's "
                    "end); overrides --staleness")

BATCH_SIZE = 128
VALIDATION_SPLIT = 0.15


def run(seed: int, staleness: int, epochs: int, trace: list[int] | None = None
        ) -> dict:
    """One training run; its epochs' mean losses and final accuracies."""
    import keras
    import tensorflow as tf
    from keras import layers

    from example_data import load_mnist_like

    keras.utils.set_random_seed(seed)

    class Antirectifier(layers.Layer):
        def build(self, input_shape):
            self.kernel = self.add_weight(shape=(input_shape[-1] * 2, input_shape[-1]),
                                          initializer="he_normal", name="kernel")

        def call(self, inputs):
            centered = inputs - tf.reduce_mean(inputs, axis=-1, keepdims=True)
            both = tf.concat([tf.nn.relu(centered), tf.nn.relu(-centered)], axis=-1)
            return tf.matmul(both, self.kernel)

    def build_model():
        return keras.Sequential([
            keras.Input(shape=(784,)), layers.Dense(256), Antirectifier(),
            layers.Dense(256), Antirectifier(), layers.Dropout(0.5),
            layers.Dense(10)])

    (x, y), (x_test, y_test) = load_mnist_like()
    x = x.reshape(-1, 784).astype("float32") / 255
    x_test = x_test.reshape(-1, 784).astype("float32") / 255
    n = int(len(x) * (1 - VALIDATION_SPLIT))  # Keras' validation_split: the tail
    x_val, y_val, x, y = x[n:], y[n:], x[:n], y[:n]

    server = build_model()
    workers = [build_model() for _ in range(2)]
    for worker in workers:
        worker.set_weights(server.get_weights())
    optimizer = keras.optimizers.RMSprop(learning_rate=2.5e-4)
    optimizer.build(server.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(seed)
    losses = []
    history = [server.get_weights()]  # the weights after each update (trace)
    updates = 0
    for _ in range(epochs):
        batches = [rng.permutation(np.arange(start, min(start + BATCH_SIZE, n)))
                   for start in rng.permutation(np.arange(0, n, BATCH_SIZE))]
        total = 0.0
        for step, batch in enumerate(batches):
            if trace is not None:
                late = trace[updates] if updates < len(trace) else 0
                model = workers[0]
                model.set_weights(history[max(0, len(history) - 1 - late)])
            else:
                model = workers[step % 2] if staleness else server
            with tf.GradientTape() as tape:
                loss = loss_fn(y[batch], model(x[batch], training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, server.trainable_variables))
            updates += 1
            if trace is not None:
                history = history[-16:] + [server.get_weights()]
            elif staleness:
                model.set_weights(server.get_weights())
            total += float(loss) * len(batch)
        losses.append(round(total / n, 4))
    server.compile(loss=loss_fn, metrics=["sparse_categorical_accuracy"])
    _, test_accuracy = server.evaluate(x_test, y_test, verbose=0)
    _, val_accuracy = server.evaluate(x_val, y_val, verbose=0)
    return {"seed": seed, "losses": losses, "test_accuracy": round(test_accuracy, 4),
            "val_accuracy": round(val_accuracy, 4)}


def main(argv):
    del argv
    runs = []
    trace = None
    if FLAGS.staleness_trace:
        with open(FLAGS.staleness_trace) as f:
            trace = [int(line.split()[0]) for line in f if line.strip()]
    for seed in range(FLAGS.first_seed, FLAGS.first_seed + FLAGS.seeds):
        result = run(seed, FLAGS.staleness, FLAGS.epochs, trace)
        runs.append(result)
        print(f"seed {seed}: losses {' '.join(f'{v:.3f}' for v in result['losses'])}"
              f" | test accuracy {result['test_accuracy']:.3f}, validation "
              f"{result['val_accuracy']:.3f}", flush=True)
    tests = [r["test_accuracy"] for r in runs]
    what = (f"staleness trace {FLAGS.staleness_trace}" if trace is not None
            else f"staleness {FLAGS.staleness}")
    print(f"{what}, {len(runs)} seeds: test accuracy "
          f"{min(tests):.3f}-{max(tests):.3f}, median {float(np.median(tests)):.3f}")
    print("REFERENCE " + json.dumps({"staleness": FLAGS.staleness, "runs": runs}),
          flush=True)


if __name__ == "__main__":
    app.run(main)

"""What a Keras script relies on, as every worker of a job runs it (issue 40;
tests/test_keras_semantics_job.py launches it).

1. keras.io's fine-tuning: a frozen base and its head trained, then the base
   unfrozen and the model compiled again with `Adam(1e-5)`-like small steps:
   the second fit trains the base, with the new optimizer.
2. `EarlyStopping(restore_best_weights=True)`: after `fit` the weights are
   the best epoch's, the same on every worker (the chief's restore is the
   job's).
3. `set_weights` between calls: `evaluate` and the weights after it use them.

Prints one line `RESULT {json}`.
"""

import json

import keras
import numpy as np

import keras_elastic as ke


def data(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.random((n, 6)).astype("float32")
    y = (x[:, :3].sum(1) > x[:, 3:].sum(1)).astype("float32")
    return x, y


def checksum(weights):
    return float(sum(np.abs(w).sum() for w in weights))


def main():
    x, y = data(512, 0)
    keras.utils.set_random_seed(3)
    base = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.BatchNormalization()])
    inputs = keras.Input((6,))
    outputs = keras.layers.Dense(1, activation="sigmoid")(base(inputs, training=False))
    model = ke.wrap(keras.Model(inputs, outputs))
    base.trainable = False
    model.compile(keras.optimizers.Adam(1e-2), "binary_crossentropy")
    model.fit(x, y, epochs=2, batch_size=32, verbose=0)
    frozen = base.get_weights()[0].copy()
    base.trainable = True
    model.compile(keras.optimizers.Adam(1e-3), "binary_crossentropy",
                  metrics=["binary_accuracy"])
    model.fit(x, y, epochs=2, batch_size=32, verbose=0)
    base_moved = float(np.abs(base.get_weights()[0] - frozen).max())

    snapshots = []
    keep = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: snapshots.append(model.get_weights()))
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=1, min_delta=10.0,
                                         restore_best_weights=True)
    model.compile(keras.optimizers.SGD(0.5), "binary_crossentropy")
    history = model.fit(x, y, epochs=5, batch_size=32, verbose=0, callbacks=[keep, stop])
    after_fit = model.get_weights()
    best_distance = max(float(np.abs(a - b).max()) for a, b in zip(after_fit, snapshots[0]))

    chosen = [np.full_like(w, 0.25) for w in model.get_weights()]
    model.set_weights(chosen)
    loss = model.evaluate(x, y, verbose=0, return_dict=True)["loss"]
    plain = keras.models.clone_model(model)
    plain.set_weights(chosen)
    plain.compile(loss="binary_crossentropy")
    print("RESULT " + json.dumps({
        "base_moved": base_moved,
        "epochs_run": len(history.history["loss"]),
        "after_fit": checksum(after_fit),
        "best_distance": best_distance,
        "evaluate_loss": loss,
        "plain_loss": plain.evaluate(x, y, verbose=0, return_dict=True)["loss"],
        "after_evaluate": checksum(model.get_weights()),
        "chosen": checksum(chosen),
        "chief": bool(ke.worker.is_chief()),
    }), flush=True)


if __name__ == "__main__":
    main()

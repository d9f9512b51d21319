"""What a callback sees at each epoch's end and at the end of training, in a
2-worker job with Keras' own validation data (tests/test_keras_semantics_job.py
holds one worker out of the first epoch, so that it trains no batch of it).

Prints `RESULT {json}`: the logs of each on_epoch_end and of on_train_end.
"""

import json

import keras
import numpy as np

import keras_elastic as ke


class Logs(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.epochs: list[dict] = []
        self.train_end: dict | None = None

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append({k: float(v) for k, v in (logs or {}).items()})

    def on_train_end(self, logs=None):
        self.train_end = {k: float(v) for k, v in (logs or {}).items()}


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((256, 4)).astype("float32")
    y = (x.sum(axis=1, keepdims=True) > 2).astype("float32")
    x_val, y_val = x[:64] + 0.5, 1 - y[:64]  # far from the training loss
    model = ke.wrap(keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]))
    model.compile(loss="mse", optimizer=keras.optimizers.SGD(0.05), metrics=["mae"])
    logs = Logs()
    model.fit(x, y, batch_size=32, epochs=2, validation_data=(x_val, y_val),
              callbacks=[logs], verbose=0)
    print("RESULT " + json.dumps({"epochs": logs.epochs, "train_end": logs.train_end}),
          flush=True)


if __name__ == "__main__":
    main()

"""A LearningRateScheduler that changes the rate it is given (Keras' own
test's form: `lr * 0.5` from epoch 1 on), in a 2-worker job where the second
worker starts its fit after the chief's epoch-1 change reached the servers
(tests/test_keras_semantics_job.py holds it there with the `follower_sync`
fault point). Every worker must train each epoch with the rate a plain Keras
fit has: the schedule applied once per epoch, not once more on the servers'
already-changed rate.

Prints `RESULT {json}`: the rate at each epoch's start and after the fit.
"""

import json

import keras
import numpy as np

import keras_elastic as ke


class Rates(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.rates: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):  # after the scheduler's
        self.rates.append(float(self.model.optimizer.learning_rate.numpy()))


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((256, 4)).astype("float32")
    y = rng.random((256, 1)).astype("float32")
    model = ke.wrap(keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]))
    model.compile(loss="mse", optimizer=keras.optimizers.SGD(0.04))
    rates = Rates()
    schedule = keras.callbacks.LearningRateScheduler(
        lambda epoch, lr: lr * 0.5 if epoch > 0 else lr)
    model.fit(x, y, batch_size=32, epochs=2, callbacks=[schedule, rates], verbose=0)
    print("RESULT " + json.dumps({
        "rates": rates.rates,
        "after_fit": float(model.optimizer.learning_rate.numpy())}), flush=True)


if __name__ == "__main__":
    main()

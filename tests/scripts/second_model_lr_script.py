"""keras.io's guides train a model per section; in a job the second one's
learning rate set by `ReduceLROnPlateau` at its last epoch's end must reach
the servers and stay the model's (tests/test_keras_semantics_job.py).

Prints `RESULT {json}`: each model's learning rate after its fit.
"""

import json

import keras
import numpy as np

import keras_elastic as ke


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((10, 3)).astype("float32")
    y = rng.random((10, 2)).astype("float32")
    rates = []
    for _ in range(2):
        model = ke.wrap(keras.Sequential([keras.Input((3,)), keras.layers.Dense(5),
                                          keras.layers.Dense(2)]))
        model.compile(loss="mse", optimizer=keras.optimizers.Adam(0.1))
        # min_delta=100: no epoch improves, so the second one's end reduces the rate.
        reduce = keras.callbacks.ReduceLROnPlateau(patience=1, factor=0.1,
                                                   monitor="val_loss", min_delta=100)
        model.fit(x, y, validation_data=(x, y), callbacks=[reduce], epochs=2,
                  verbose=0)
        rates.append(float(model.optimizer.learning_rate.numpy()))
    print("RESULT " + json.dumps({"rates": rates}), flush=True)


if __name__ == "__main__":
    main()

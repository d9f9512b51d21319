"""Scripts a relaunch cannot fix (tests/test_unfixable_failures.py).

`differ`: each worker builds other arrays (its own id in them), as a script
shuffling with its own unseeded generator would; the master refuses all but
the first. `compile`: each worker compiles another loss. `raise`: the script
raises the same error on every worker after its first fit, as a bug would.
"""

import os
import sys

import keras
import numpy as np

import keras_elastic as ke


def main(mode: str) -> None:
    worker = int(os.environ.get("KERAS_ELASTIC_WORKER_ID", "0"))
    x = np.full((256, 4), float(worker) if mode == "differ" else 1.0, "float32")
    y = np.zeros(256, "float32")
    model = ke.wrap(keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]))
    model.compile("sgd", "mse" if mode != "compile" or worker == 0 else "mae")
    model.fit(x, y, epochs=1, batch_size=32, verbose=0)
    if mode == "raise":
        raise ValueError("the script's own bug: a label column is missing")


if __name__ == "__main__":
    main(sys.argv[1])

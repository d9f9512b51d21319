"""A script whose data comes from unseeded global randomness, as keras.io's
addition-RNN and time-series examples build theirs (tests/test_job_seed.py).

Every worker of a job must build the same arrays without the script seeding
anything: keras_elastic seeds the global generators with the job's seed when
imported. Prints `RESULT {json}`: the first draws of each generator (taken
right after the imports, as the script's data is) and the job's accuracy.
"""

import json
import random

import keras
import numpy as np
import tensorflow as tf

import keras_elastic as ke


def first_draws() -> dict:
    """What the script draws first from each global generator."""
    return {"python": random.random(), "numpy": float(np.random.rand()),
            "tensorflow": float(tf.random.uniform(())),
            "keras": float(keras.random.uniform(()))}


def main():
    draws = first_draws()
    x = np.random.rand(512, 4).astype("float32")           # unseeded, as keras.io
    y = (x.sum(axis=1) > 2).astype("float32")
    order = np.random.permutation(len(x))                   # keras.io's shuffle
    x, y = x[order], y[order]
    model = ke.wrap(keras.Sequential([keras.Input((4,)),
                                      keras.layers.Dense(1, activation="sigmoid")]))
    model.compile("adam", "binary_crossentropy", metrics=["binary_accuracy"])
    history = model.fit(x, y, epochs=2, batch_size=32, verbose=0)
    # A reseed from the machine's entropy (Keras' test_utils.get_test_data
    # does it): in a job, the job's.
    np.random.seed()
    random.seed()
    reseeded = {"numpy_reseeded": float(np.random.rand()),
                "python_reseeded": random.random()}
    print("RESULT " + json.dumps({**draws, **reseeded, "data": float(x.sum()),
                                  "accuracy": history.history["binary_accuracy"][-1]}),
          flush=True)


if __name__ == "__main__":
    main()

"""keras.io's serialization guide in a job (tests/test_job_saving.py): the
script saves the model and its weights, then loads them back at once.

Prints `RESULT {json}`: for each file, its modification time in ns right
after this worker's save returned (one writer: the same on every worker),
and whether the loaded model predicts as the saved one.
"""

import json
import os
import sys

import keras
import numpy as np

import keras_elastic as ke


def main(out_dir: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.random((256, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = ke.wrap(keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                                      keras.layers.Dense(1)]))
    model.compile("adam", "mse")
    model.fit(x, y, epochs=1, batch_size=32, verbose=0)
    written, same = {}, {}
    for name, save, load in [
            ("model.keras", model.save, keras.models.load_model),
            ("function.keras", lambda p: keras.saving.save_model(model, p),
             keras.saving.load_model),
            ("model.weights.h5", model.save_weights, None)]:
        path = os.path.join(out_dir, name)
        save(path)
        written[name] = os.stat(path).st_mtime_ns
        if load is None:
            restored = keras.models.clone_model(model)
            restored.load_weights(path)
        else:
            restored = load(path)
        same[name] = bool(np.allclose(restored.predict(x[:8], verbose=0),
                                      model.predict(x[:8], verbose=0)))
    print("RESULT " + json.dumps({"written": written, "same": same,
                                  "chief": bool(ke.worker.is_chief())}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])

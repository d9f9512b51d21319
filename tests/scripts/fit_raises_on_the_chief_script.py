"""A job whose first `fit` raises on the chief only (a callback's error at
its train end), which the script catches; then a second `fit` on every
worker (tests/test_fit_that_raises.py).

Example:

```bash
keras-elastic run --num_workers 2 --num_ps 1 -- \
    python tests/scripts/fit_raises_on_the_chief_script.py
```
"""

import keras
import numpy as np
from absl import app

import keras_elastic as ke
from keras_elastic.worker.cluster import get_cluster, is_chief


class RaiseOnTheChief(keras.callbacks.Callback):
    def on_train_end(self, logs=None):
        if is_chief(get_cluster()):
            raise RuntimeError("the chief's callback failed")


def main(argv):
    del argv
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = ke.wrap(keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]))
    model.compile(optimizer="sgd", loss="mse")
    try:
        model.fit(x, y, batch_size=16, epochs=1, verbose=0,
                  callbacks=[RaiseOnTheChief()])
        print("first fit returned")
    except RuntimeError as e:
        print(f"first fit raised: {e}")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    # Every worker passes the same sync points, in the same order
    # (ElasticSession._sync_point): the count is the same on every worker.
    print(f"second fit done; sync points passed: "
          f"{get_cluster().__dict__.get('_ke_sync_points')}")


if __name__ == "__main__":
    app.run(main)

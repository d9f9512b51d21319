"""A small job whose callbacks write files, as every worker runs it.

NumPy data (every worker builds the same arrays), a dense classifier, and the
callbacks that write files given to `fit` as a user would, all writing under
`--out_dir` (tests/test_file_callbacks.py):

```
<out_dir>/ckpt/model-{epoch:02d}.keras   keras.callbacks.ModelCheckpoint
<out_dir>/best.weights.h5               ModelCheckpoint(save_best_only, weights only)
<out_dir>/log.csv                       keras.callbacks.CSVLogger
<out_dir>/backup/                       keras.callbacks.BackupAndRestore
```

Example:

```bash
keras-elastic run --num_workers 2 --num_ps 1 -- \
    python tests/scripts/file_callbacks_script.py --out_dir /tmp/out --epochs 4
```
"""

import os
import sys

import keras
from absl import app, flags

import keras_elastic as ke

# tests/ on sys.path, for tests/support/.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support.tfrecord_data import NUM_FEATURES, make_arrays  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", None, "Where the callbacks write.", required=True)
flags.DEFINE_integer("epochs", 4, "Epochs.")
flags.DEFINE_integer("rows", 2048, "Training rows.")
flags.DEFINE_bool("worker_0_first", False, "Workers other than 0 register only once "
                  "worker 0 has: worker 0 is the chief (the first to register), "
                  "for a test that kills the chief by its id.")


def wait_for_worker_0() -> None:
    """Waits until worker 0 of this launched job has registered with the
    master, or was lost (asking the master without registering)."""
    import time

    from keras_elastic.common import cluster_env
    from keras_elastic.master.client import MasterClient

    env = cluster_env.read()
    if env is None or env.worker_id == 0:
        return
    master = MasterClient(env.master_address)
    try:
        while True:
            workers = master.job_status().workers
            if 0 in (*workers.alive, *workers.lost_ids, *workers.exited):
                return  # (a replacement of a lost worker 0 goes on at once)
            time.sleep(0.1)
    finally:
        master.close()


def make_model() -> keras.Model:
    """The test's model (the same weights in every process)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((NUM_FEATURES,)),
                              keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def file_callbacks(out_dir: str, **backup_kwargs) -> list[keras.callbacks.Callback]:
    """ModelCheckpoint (two), CSVLogger and BackupAndRestore under `out_dir`."""
    return [
        keras.callbacks.ModelCheckpoint(os.path.join(out_dir, "ckpt",
                                                     "model-{epoch:02d}.keras")),
        keras.callbacks.ModelCheckpoint(os.path.join(out_dir, "best.weights.h5"),
                                        monitor="loss", save_best_only=True,
                                        save_weights_only=True),
        keras.callbacks.CSVLogger(os.path.join(out_dir, "log.csv")),
        keras.callbacks.BackupAndRestore(os.path.join(out_dir, "backup"),
                                         **backup_kwargs),
    ]


def main(argv):
    del argv
    os.makedirs(FLAGS.out_dir, exist_ok=True)  # CSVLogger does not make it
    if FLAGS.worker_0_first:
        wait_for_worker_0()
    x, y = make_arrays(FLAGS.rows)
    model = ke.wrap(make_model())
    model.fit(x, y, batch_size=32, epochs=FLAGS.epochs, verbose=2,
              callbacks=file_callbacks(FLAGS.out_dir))


if __name__ == "__main__":
    app.run(main)

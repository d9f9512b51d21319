"""A small job with a `keras.callbacks.TensorBoard` callback, as every worker runs it.

Tiny NumPy data (every worker builds the same arrays), a dense classifier,
validation on an elastic evaluation dataset after each epoch, and a TensorBoard
callback on `--tensorboard_dir` given to `fit` as a user would (tests/test_tensorboard.py).
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
flags.DEFINE_string("tensorboard_dir", None, "TensorBoard log dir.")
flags.DEFINE_integer("epochs", 2, "Epochs.")


def main(argv):
    del argv
    keras.utils.set_random_seed(0)
    x, y = make_arrays(256)
    xv, yv = make_arrays(64, seed=1)
    model = ke.Sequential([keras.Input((NUM_FEATURES,)),
                           keras.layers.Dense(8, activation="relu"),
                           keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    train = ke.ElasticDataset((x, y), batch_size=16, minibatches_per_task=4)
    validation = ke.ElasticDataset((xv, yv), batch_size=32, minibatches_per_task=1,
                                   mode="evaluation", name="validation")
    model.fit(train, epochs=FLAGS.epochs, verbose=2, validation_data=validation,
              callbacks=[keras.callbacks.TensorBoard(FLAGS.tensorboard_dir,
                                                              histogram_freq=1)])


if __name__ == "__main__":
    app.run(main)

"""A --model_def module for the CLI job tests.

Loaded with `--model_zoo=tests/scripts`: the zoo's parent, tests/, is then on
`sys.path` (keras_elastic/jobs/model_def.py), so tests/support/ imports."""

import keras
from support.tfrecord_data import parse


def custom_model():
    keras.utils.set_random_seed(4)
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(h))
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def dataset_fn(records, mode):
    parsed = records.map(parse)
    if mode == "prediction":
        return parsed.map(lambda x, y: x)
    return parsed

"""Mirrors keras-io guides/training_with_built_in_methods.py ("Training &
evaluation with the built-in methods", the Keras 3 version): all of its NumPy
sections, with inputs written as the guide writes them.

Keras features exercised:
- a functional MLP: `compile(optimizer=keras.optimizers.RMSprop(),
  loss=keras.losses.SparseCategoricalCrossentropy(),
  metrics=[keras.metrics.SparseCategoricalAccuracy()])`, `fit(...,
  validation_data=(x_val, y_val))` and its `history.history`, `evaluate`,
  `predict`; `compile` again on the same model, with string identifiers;
- custom losses: a function of `(y_true, y_pred)` and a `keras.losses.Loss`
  subclass, trained on `keras.ops.one_hot(y_train, num_classes=10)` (a tensor,
  not a NumPy array, as the labels);
- a custom metric (`keras.metrics.Metric` subclass with a state variable:
  `CategoricalTruePositives`, a count over the epoch);
- `self.add_loss()` in a layer (activity regularization), and a model compiled
  without a loss whose `LogisticEndpoint` layer adds it, fitted on a dict of
  its two inputs (`model.fit(data)`, no targets);
- `validation_split=0.2`, `class_weight`, `sample_weight`;
- a model of two inputs and two outputs: losses and metrics as lists and
  dicts, `loss_weights`, an output without a loss, and `fit` on Python lists of
  arrays (`model.fit([img_data, ts_data], [score_targets, class_targets])`) and
  on dicts mapping input and output names to arrays;
- callbacks: `EarlyStopping(monitor="val_loss", min_delta=1e-2, patience=2)`,
  `ModelCheckpoint("mymodel_{epoch}.keras", save_best_only=True,
  monitor="val_loss")`, and the guide's fault-tolerance recipe:
  `make_or_restore_model()` (load the newest file of ./ckpt, else a new model)
  with `ModelCheckpoint(checkpoint_dir + "/model-loss={loss:.2f}.keras",
  save_freq=...)`; a learning-rate schedule and a `TensorBoard` callback
  constructed, as in the guide.

Changed from keras.io:
- MNIST is replaced by scikit-learn's digits upsampled to 28x28
  (tests/keras_io/example_data.py): 1500 training and 297 test images
  flattened to 784 as the guide does (`reshape(len(x), 784)` for its
  `reshape(60000, 784)`); 300 of the training images reserved for validation
  (the guide's 10,000 of 60,000).
- The sections on `tf.data.Dataset`, `keras.utils.PyDataset` and PyTorch
  `DataLoader` inputs are left out: a `tf.data.Dataset` (or any other
  iterator of batches) given to `fit` in a launched job is an error by design
  (README: every worker would train on all of it), so those sections cannot
  run as a job, and the PyTorch one needs torch.
- `keras.utils.plot_model` is left out (it needs pydot and graphviz).
- The return values of `fit` and `evaluate` are kept in variables (the guide
  shows some and drops others) to report them; `fit(..., verbose=2)` (one line
  per epoch), `predict(..., verbose=0)`.
- 5 epochs instead of 2 for the first model (1200 images instead of 50,000),
  and `save_freq=10` instead of 100 for the checkpoint every N batches (an
  epoch of 1200 images in batches of 32 has 38, not 1563).
- The multi-input model is built on one line (the elastic script wraps that
  line in `ke.wrap(...)`).

Every file goes to the working directory. Prints one line `RESULT {json}`.
"""
# ruff: noqa: I001

import glob
import json
import os

import numpy as np
import keras
import keras_elastic as ke
from keras import layers
from keras import ops

from example_data import load_mnist_like

keras.utils.set_random_seed(1337)

# -- API overview: a first end-to-end example -----------------------------------

inputs = keras.Input(shape=(784,), name="digits")
x = layers.Dense(64, activation="relu", name="dense_1")(inputs)
x = layers.Dense(64, activation="relu", name="dense_2")(x)
outputs = layers.Dense(10, activation="softmax", name="predictions")(x)

model = ke.wrap(keras.Model(inputs=inputs, outputs=outputs))

(x_train, y_train), (x_test, y_test) = load_mnist_like()

# Preprocess the data (these are NumPy arrays)
x_train = x_train.reshape(len(x_train), 784).astype("float32") / 255
x_test = x_test.reshape(len(x_test), 784).astype("float32") / 255

y_train = y_train.astype("float32")
y_test = y_test.astype("float32")

# Reserve 300 samples for validation
x_val = x_train[-300:]
y_val = y_train[-300:]
x_train = x_train[:-300]
y_train = y_train[:-300]

model.compile(
    optimizer=keras.optimizers.RMSprop(),  # Optimizer
    # Loss function to minimize
    loss=keras.losses.SparseCategoricalCrossentropy(),
    # List of metrics to monitor
    metrics=[keras.metrics.SparseCategoricalAccuracy()],
)

print("Fit model on training data")
history = model.fit(
    x_train,
    y_train,
    batch_size=64,
    epochs=5,
    # We pass some validation for
    # monitoring validation loss and metrics
    # at the end of each epoch
    validation_data=(x_val, y_val),
    verbose=2,
)

print(history.history)

# Evaluate the model on the test data using `evaluate`
print("Evaluate on test data")
results = model.evaluate(x_test, y_test, batch_size=128, verbose=0)
print("test loss, test acc:", results)

# Generate predictions (probabilities -- the output of the last layer)
# on new data using `predict`
print("Generate predictions for 3 samples")
predictions = model.predict(x_test[:3], verbose=0)
print("predictions shape:", predictions.shape)

first = {
    "first_history_keys": sorted(history.history),
    "first_val_accuracy": float(history.history["val_sparse_categorical_accuracy"][-1]),
    "test_loss": float(results[0]),
    "test_accuracy": float(results[1]),
    "predictions_shape": list(predictions.shape),
    "predictions_sum_to_one": bool(np.allclose(predictions.sum(axis=1), 1.0, atol=1e-5)),
}

# -- The compile() method: specifying a loss, metrics, and an optimizer ----------

model.compile(
    optimizer=keras.optimizers.RMSprop(learning_rate=1e-3),
    loss=keras.losses.SparseCategoricalCrossentropy(),
    metrics=[keras.metrics.SparseCategoricalAccuracy()],
)

model.compile(
    optimizer="rmsprop",
    loss="sparse_categorical_crossentropy",
    metrics=["sparse_categorical_accuracy"],
)


def get_uncompiled_model():
    inputs = keras.Input(shape=(784,), name="digits")
    x = layers.Dense(64, activation="relu", name="dense_1")(inputs)
    x = layers.Dense(64, activation="relu", name="dense_2")(x)
    outputs = layers.Dense(10, activation="softmax", name="predictions")(x)
    model = keras.Model(inputs=inputs, outputs=outputs)
    return model


def get_compiled_model():
    model = get_uncompiled_model()
    model.compile(
        optimizer="rmsprop",
        loss="sparse_categorical_crossentropy",
        metrics=["sparse_categorical_accuracy"],
    )
    return model


# -- Custom losses ------------------------------------------------------------------


def custom_mean_squared_error(y_true, y_pred):
    return ops.mean(ops.square(y_true - y_pred), axis=-1)


model = ke.wrap(get_uncompiled_model())
model.compile(optimizer=keras.optimizers.Adam(), loss=custom_mean_squared_error)

# We need to one-hot encode the labels to use MSE
y_train_one_hot = ops.one_hot(y_train, num_classes=10)
custom_mse_history = model.fit(x_train, y_train_one_hot, batch_size=64, epochs=1,
                               verbose=2)


class CustomMSE(keras.losses.Loss):
    def __init__(self, regularization_factor=0.1, name="custom_mse"):
        super().__init__(name=name)
        self.regularization_factor = regularization_factor

    def call(self, y_true, y_pred):
        mse = ops.mean(ops.square(y_true - y_pred), axis=-1)
        reg = ops.mean(ops.square(0.5 - y_pred), axis=-1)
        return mse + reg * self.regularization_factor


model = ke.wrap(get_uncompiled_model())
model.compile(optimizer=keras.optimizers.Adam(), loss=CustomMSE())

y_train_one_hot = ops.one_hot(y_train, num_classes=10)
custom_mse_class_history = model.fit(x_train, y_train_one_hot, batch_size=64, epochs=1,
                                     verbose=2)

# -- Custom metrics -----------------------------------------------------------------


class CategoricalTruePositives(keras.metrics.Metric):
    def __init__(self, name="categorical_true_positives", **kwargs):
        super().__init__(name=name, **kwargs)
        self.true_positives = self.add_variable(
            shape=(), name="ctp", initializer="zeros"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_pred = ops.reshape(ops.argmax(y_pred, axis=1), (-1, 1))
        values = ops.cast(y_true, "int32") == ops.cast(y_pred, "int32")
        values = ops.cast(values, "float32")
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, "float32")
            values = ops.multiply(values, sample_weight)
        self.true_positives.assign_add(ops.sum(values))

    def result(self):
        return self.true_positives

    def reset_state(self):
        # The state of the metric will be reset at the start of each epoch.
        self.true_positives.assign(0.0)


model = ke.wrap(get_uncompiled_model())
model.compile(
    optimizer=keras.optimizers.RMSprop(learning_rate=1e-3),
    loss=keras.losses.SparseCategoricalCrossentropy(),
    metrics=[CategoricalTruePositives()],
)
true_positives_history = model.fit(x_train, y_train, batch_size=64, epochs=3, verbose=2)

# -- Handling losses and metrics that don't fit the standard signature -----------


class ActivityRegularizationLayer(layers.Layer):
    def call(self, inputs):
        self.add_loss(ops.sum(inputs) * 0.1)
        return inputs  # Pass-through layer.


inputs = keras.Input(shape=(784,), name="digits")
x = layers.Dense(64, activation="relu", name="dense_1")(inputs)

# Insert activity regularization as a layer
x = ActivityRegularizationLayer()(x)

x = layers.Dense(64, activation="relu", name="dense_2")(x)
outputs = layers.Dense(10, name="predictions")(x)

model = ke.wrap(keras.Model(inputs=inputs, outputs=outputs))
model.compile(
    optimizer=keras.optimizers.RMSprop(learning_rate=1e-3),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
)

# The displayed loss will be much higher than before
# due to the regularization component.
activity_history = model.fit(x_train, y_train, batch_size=64, epochs=1, verbose=2)


class LogisticEndpoint(keras.layers.Layer):
    def __init__(self, name=None):
        super().__init__(name=name)
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    def call(self, targets, logits, sample_weights=None):
        # Compute the training-time loss value and add it
        # to the layer using `self.add_loss()`.
        loss = self.loss_fn(targets, logits, sample_weights)
        self.add_loss(loss)

        # Return the inference-time prediction tensor (for `.predict()`).
        return ops.softmax(logits)


inputs = keras.Input(shape=(3,), name="inputs")
targets = keras.Input(shape=(10,), name="targets")
logits = keras.layers.Dense(10)(inputs)
predictions = LogisticEndpoint(name="predictions")(targets, logits)

model = ke.wrap(keras.Model(inputs=[inputs, targets], outputs=predictions))
model.compile(optimizer="adam")  # No loss argument!

data = {
    "inputs": np.random.random((3, 3)),
    "targets": np.random.random((3, 10)),
}
endpoint_history = model.fit(data, verbose=2)

# -- Automatically setting apart a validation holdout set --------------------------

model = ke.wrap(get_compiled_model())
split_history = model.fit(x_train, y_train, batch_size=64, validation_split=0.2,
                          epochs=1, verbose=2)

# -- Using sample weighting and class weighting -------------------------------------

class_weight = {
    0: 1.0,
    1: 1.0,
    2: 1.0,
    3: 1.0,
    4: 1.0,
    # Set weight "2" for class "5",
    # making this class 2x more important
    5: 2.0,
    6: 1.0,
    7: 1.0,
    8: 1.0,
    9: 1.0,
}

print("Fit with class weight")
model = ke.wrap(get_compiled_model())
class_weight_history = model.fit(x_train, y_train, class_weight=class_weight,
                                 batch_size=64, epochs=1, verbose=2)

sample_weight = np.ones(shape=(len(y_train),))
sample_weight[y_train == 5] = 2.0

print("Fit with sample weight")
model = ke.wrap(get_compiled_model())
sample_weight_history = model.fit(
    x_train, y_train, sample_weight=sample_weight, batch_size=64, epochs=1, verbose=2
)

# -- Passing data to multi-input, multi-output models -----------------------------

image_input = keras.Input(shape=(32, 32, 3), name="img_input")
timeseries_input = keras.Input(shape=(None, 10), name="ts_input")

x1 = layers.Conv2D(3, 3)(image_input)
x1 = layers.GlobalMaxPooling2D()(x1)

x2 = layers.Conv1D(3, 3)(timeseries_input)
x2 = layers.GlobalMaxPooling1D()(x2)

x = layers.concatenate([x1, x2])

score_output = layers.Dense(1, name="score_output")(x)
class_output = layers.Dense(5, name="class_output")(x)

model = ke.wrap(keras.Model([image_input, timeseries_input], [score_output, class_output]))

model.compile(
    optimizer=keras.optimizers.RMSprop(1e-3),
    loss=[
        keras.losses.MeanSquaredError(),
        keras.losses.CategoricalCrossentropy(),
    ],
)

model.compile(
    optimizer=keras.optimizers.RMSprop(1e-3),
    loss=[
        keras.losses.MeanSquaredError(),
        keras.losses.CategoricalCrossentropy(),
    ],
    metrics=[
        [
            keras.metrics.MeanAbsolutePercentageError(),
            keras.metrics.MeanAbsoluteError(),
        ],
        [keras.metrics.CategoricalAccuracy()],
    ],
)

model.compile(
    optimizer=keras.optimizers.RMSprop(1e-3),
    loss={
        "score_output": keras.losses.MeanSquaredError(),
        "class_output": keras.losses.CategoricalCrossentropy(),
    },
    metrics={
        "score_output": [
            keras.metrics.MeanAbsolutePercentageError(),
            keras.metrics.MeanAbsoluteError(),
        ],
        "class_output": [keras.metrics.CategoricalAccuracy()],
    },
)

model.compile(
    optimizer=keras.optimizers.RMSprop(1e-3),
    loss={
        "score_output": keras.losses.MeanSquaredError(),
        "class_output": keras.losses.CategoricalCrossentropy(),
    },
    metrics={
        "score_output": [
            keras.metrics.MeanAbsolutePercentageError(),
            keras.metrics.MeanAbsoluteError(),
        ],
        "class_output": [keras.metrics.CategoricalAccuracy()],
    },
    loss_weights={"score_output": 2.0, "class_output": 1.0},
)

# List loss version
model.compile(
    optimizer=keras.optimizers.RMSprop(1e-3),
    loss=[None, keras.losses.CategoricalCrossentropy()],
)

# Or dict loss version
model.compile(
    optimizer=keras.optimizers.RMSprop(1e-3),
    loss={"class_output": keras.losses.CategoricalCrossentropy()},
)

model.compile(
    optimizer=keras.optimizers.RMSprop(1e-3),
    loss=[
        keras.losses.MeanSquaredError(),
        keras.losses.CategoricalCrossentropy(),
    ],
)

# Generate dummy NumPy data
img_data = np.random.random_sample(size=(100, 32, 32, 3))
ts_data = np.random.random_sample(size=(100, 20, 10))
score_targets = np.random.random_sample(size=(100, 1))
class_targets = np.random.random_sample(size=(100, 5))

# Fit on lists
lists_history = model.fit(
    [img_data, ts_data], [score_targets, class_targets], batch_size=32, epochs=1,
    verbose=2,
)

# Alternatively, fit on dicts
dicts_history = model.fit(
    {"img_input": img_data, "ts_input": ts_data},
    {"score_output": score_targets, "class_output": class_targets},
    batch_size=32,
    epochs=1,
    verbose=2,
)

# -- Using callbacks ------------------------------------------------------------------

model = ke.wrap(get_compiled_model())

callbacks = [
    keras.callbacks.EarlyStopping(
        # Stop training when `val_loss` is no longer improving
        monitor="val_loss",
        # "no longer improving" being defined as "no better than 1e-2 less"
        min_delta=1e-2,
        # "no longer improving" being further defined as "for at least 2 epochs"
        patience=2,
        verbose=1,
    )
]
early_stopping_history = model.fit(
    x_train,
    y_train,
    epochs=20,
    batch_size=64,
    callbacks=callbacks,
    validation_split=0.2,
    verbose=2,
)


class LossHistory(keras.callbacks.Callback):
    def on_train_begin(self, logs):
        self.per_batch_losses = []

    def on_batch_end(self, batch, logs):
        self.per_batch_losses.append(logs.get("loss"))


# -- Checkpointing models ---------------------------------------------------------------

model = ke.wrap(get_compiled_model())

callbacks = [
    keras.callbacks.ModelCheckpoint(
        # Path where to save the model
        # The two parameters below mean that we will overwrite
        # the current checkpoint if and only if
        # the `val_loss` score has improved.
        # The saved model name will include the current epoch.
        filepath="mymodel_{epoch}.keras",
        save_best_only=True,  # Only save a model if `val_loss` has improved.
        monitor="val_loss",
        verbose=1,
    )
]
checkpoint_history = model.fit(
    x_train,
    y_train,
    epochs=2,
    batch_size=64,
    callbacks=callbacks,
    validation_split=0.2,
    verbose=2,
)

# Prepare a directory to store all the checkpoints.
checkpoint_dir = "./ckpt"
if not os.path.exists(checkpoint_dir):
    os.makedirs(checkpoint_dir)

restored_from = []


def make_or_restore_model():
    # Either restore the latest model, or create a fresh one
    # if there is no checkpoint available.
    checkpoints = [checkpoint_dir + "/" + name for name in os.listdir(checkpoint_dir)]
    if checkpoints:
        latest_checkpoint = max(checkpoints, key=os.path.getctime)
        print("Restoring from", latest_checkpoint)
        restored_from.append(os.path.basename(latest_checkpoint))
        return keras.models.load_model(latest_checkpoint)
    print("Creating a new model")
    return get_compiled_model()


model = ke.wrap(make_or_restore_model())
callbacks = [
    # This callback saves the model every 10 batches.
    # We include the training loss in the saved model name.
    keras.callbacks.ModelCheckpoint(
        filepath=checkpoint_dir + "/model-loss={loss:.2f}.keras", save_freq=10
    )
]
ckpt_history = model.fit(x_train, y_train, epochs=1, callbacks=callbacks, verbose=2)

# -- Using learning rate schedules ---------------------------------------------------------

initial_learning_rate = 0.1
lr_schedule = keras.optimizers.schedules.ExponentialDecay(
    initial_learning_rate, decay_steps=100000, decay_rate=0.96, staircase=True
)

optimizer = keras.optimizers.RMSprop(learning_rate=lr_schedule)

# -- Visualizing loss and metrics during training with TensorBoard -----------------

keras.callbacks.TensorBoard(
    log_dir="/full_path_to_your_logs",
    histogram_freq=0,  # How often to log histogram visualizations
    embeddings_freq=0,  # How often to log embedding visualizations
    update_freq="epoch",
)  # How often to write logs (default: once per epoch)


def last(history, key):
    return float(history.history[key][-1])


result = {
    **first,
    "custom_mse_loss": last(custom_mse_history, "loss"),
    "custom_mse_class_loss": last(custom_mse_class_history, "loss"),
    "true_positives_history_keys": sorted(true_positives_history.history),
    # The guide's metric compares each prediction, shaped (batch, 1), with every
    # label of its batch, shaped (batch,): the count over the last epoch is of
    # pairs in a batch, not of the 1200 images.
    "true_positives": last(true_positives_history, "categorical_true_positives"),
    "activity_regularization_loss": last(activity_history, "loss"),
    "logistic_endpoint_history_keys": sorted(endpoint_history.history),
    "logistic_endpoint_loss": last(endpoint_history, "loss"),
    "validation_split_val_accuracy": last(split_history, "val_sparse_categorical_accuracy"),
    "class_weight_loss": last(class_weight_history, "loss"),
    "class_weight_accuracy": last(class_weight_history, "sparse_categorical_accuracy"),
    "sample_weight_loss": last(sample_weight_history, "loss"),
    "sample_weight_accuracy": last(sample_weight_history, "sparse_categorical_accuracy"),
    "lists_history_keys": sorted(lists_history.history),
    "lists_loss": last(lists_history, "loss"),
    "dicts_history_keys": sorted(dicts_history.history),
    "dicts_loss": last(dicts_history, "loss"),
    "early_stopping_epochs_run": len(early_stopping_history.history["loss"]),
    "early_stopping_val_accuracy": last(early_stopping_history,
                                        "val_sparse_categorical_accuracy"),
    "checkpoint_files": sorted(glob.glob("mymodel_*.keras")),
    "checkpoint_val_loss": last(checkpoint_history, "val_loss"),
    "restored_from": restored_from,
    "ckpt_files": len(os.listdir(checkpoint_dir)),
    "ckpt_loss": last(ckpt_history, "loss"),
}
print("RESULT " + json.dumps(result), flush=True)

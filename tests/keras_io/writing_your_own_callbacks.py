"""Mirrors keras-io guides/writing_your_own_callbacks.py ("Writing your own
callbacks", the Keras 3 version).

Keras features exercised, every callback of the guide:
- `CustomCallback`, which prints every hook it gets: `on_train_begin/end`,
  `on_epoch_begin/end`, `on_test_begin/end`, `on_predict_begin/end`,
  `on_train_batch_begin/end`, `on_test_batch_begin/end`,
  `on_predict_batch_begin/end`, with the keys of their `logs`; passed to
  `fit(..., validation_split=0.5)`, `evaluate` and `predict`;
- `LossAndErrorPrintingCallback`, which prints `logs["loss"]` at the end of each
  training and test batch and `logs["loss"]`, `logs["mean_absolute_error"]` at
  the end of each epoch;
- `EarlyStoppingAtMinLoss`, which keeps `self.model.get_weights()` of the best
  epoch, sets `self.model.stop_training = True` at the first epoch whose loss is
  not lower, and restores the best weights with `self.model.set_weights`;
- `CustomLearningRateScheduler`, which sets `self.model.optimizer.learning_rate`
  at the beginning of each epoch from a schedule.

What a user relies on, in the RESULT line: the sequence of hooks each call
made (runs of batch hooks shown once, as `train_batches` etc.), each hook's
log keys, the number of batches of each kind, that every batch's begin hook
has its end hook, and that batch indices count 0, 1, 2, ... in each run; the
losses the callbacks printed; for the early stopping, the epoch it stopped at,
the largest difference between the model's weights after `fit` and the best
weights it restored (0 in Keras), and the loss `evaluate` gives after the
restore against the loss of the best weights computed in NumPy (the same in
Keras); the learning rate of each epoch and the optimizer's after `fit`.

Changed from keras.io:
- MNIST is replaced by scikit-learn's digits upsampled to 28x28
  (tests/keras_io/example_data.py), flattened to 784 as the guide does; the
  guide's "first 1000 samples" are 1000 training and all 297 test images.
- The guide's callbacks report by printing: each `fit`/`evaluate`/`predict`
  call runs in a `with printed_lines() as lines:` block that captures what it
  prints (and prints it after), and the RESULT line is made from those lines.
  The `EarlyStoppingAtMinLoss()` instance is named (`early_stopping`) to read
  its best weights after `fit`. `np.Inf` is `np.inf` (NumPy 2).
- `predict(..., verbose=0)`: its progress bar would not add anything.

Prints one line `RESULT {json}` at the end.
"""
# ruff: noqa: I001

import contextlib
import io
import json
import re
import sys

import numpy as np
import keras

from example_data import load_mnist_like

keras.utils.set_random_seed(1337)


@contextlib.contextmanager
def printed_lines():
    """Captures what the block prints into the list it yields (and prints it
    after the block)."""
    lines = []
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            yield lines
    finally:
        sys.stdout.write(buffer.getvalue())
        sys.stdout.flush()
        lines.extend(buffer.getvalue().splitlines())


# What CustomCallback prints, per hook.
HOOK_LINES = [
    ("train_begin", r"Starting training; got log keys: (.*)"),
    ("train_end", r"Stop training; got log keys: (.*)"),
    ("epoch_begin", r"Start epoch (\d+) of training; got log keys: (.*)"),
    ("epoch_end", r"End epoch (\d+) of training; got log keys: (.*)"),
    ("test_begin", r"Start testing; got log keys: (.*)"),
    ("test_end", r"Stop testing; got log keys: (.*)"),
    ("predict_begin", r"Start predicting; got log keys: (.*)"),
    ("predict_end", r"Stop predicting; got log keys: (.*)"),
    ("train_batch_begin", r"\.\.\.Training: start of batch (\d+); got log keys: (.*)"),
    ("train_batch_end", r"\.\.\.Training: end of batch (\d+); got log keys: (.*)"),
    ("test_batch_begin", r"\.\.\.Evaluating: start of batch (\d+); got log keys: (.*)"),
    ("test_batch_end", r"\.\.\.Evaluating: end of batch (\d+); got log keys: (.*)"),
    ("predict_batch_begin",
     r"\.\.\.Predicting: start of batch (\d+); got log keys: (.*)"),
    ("predict_batch_end", r"\.\.\.Predicting: end of batch (\d+); got log keys: (.*)"),
]


def hook_calls(lines):
    """[(hook, batch or epoch index or None, log keys)] of CustomCallback's lines."""
    calls = []
    for line in lines:
        for hook, pattern in HOOK_LINES:
            m = re.fullmatch(pattern, line.strip())
            if m:
                index = int(m[1]) if m.lastindex == 2 else None
                calls.append((hook, index, m[m.lastindex]))
                break
    return calls


def hook_summary(calls):
    """The hook sequence with each run of batch hooks of one kind shown once
    (`train_batches`, with the log keys its begin and end hooks got); the
    number of batches of each kind (batches ended); the number of batch begin
    hooks without their end hook; and whether the batch indices of every run
    count 0, 1, 2, ... (each batch's begin and end with the same index)."""
    sequence, counts, unmatched, consecutive = [], {}, 0, True
    run = None  # [kind, next index, begin keys, end keys, begun and not ended]
    for hook, index, keys in calls:
        if "_batch_" not in hook:
            unmatched += bool(run and run[4])
            run = None
            sequence.append(f"{hook} {keys}" if index is None else f"{hook} {index} {keys}")
            continue
        kind, edge = hook.split("_batch_")
        if run is None or run[0] != kind:
            unmatched += bool(run and run[4])
            run = [kind, 0, set(), set(), False]
            sequence.append(run)
        if edge == "begin":
            unmatched += run[4]
            consecutive &= index == run[1]
            run[2].add(keys)
            run[4] = True
        else:
            consecutive &= index == run[1] and run[4]
            counts[kind] = counts.get(kind, 0) + 1
            run[1] += 1
            run[3].add(keys)
            run[4] = False
    unmatched += bool(run and run[4])
    sequence = [item if isinstance(item, str) else
                f"{item[0]}_batches begin {' | '.join(sorted(item[2]))} "
                f"end {' | '.join(sorted(item[3]))}"
                for item in sequence]
    return sequence, counts, unmatched, consecutive


LOSS_LINE = re.compile(r"The average loss for epoch (\d+) is +(\S+) and mean absolute "
                       r"error is +(\S+)\.")
LR_LINE = re.compile(r"Epoch (\d+): Learning rate is (\S+)\.")


def epoch_losses(lines):
    """[(loss, mae)] per epoch, as LossAndErrorPrintingCallback printed them."""
    return [(float(m[2]), float(m[3])) for m in map(LOSS_LINE.search, lines) if m]


# A basic example


# Define the Keras model to add callbacks to
def get_model():
    model = keras.Sequential()
    model.add(keras.layers.Dense(1))
    model.compile(
        optimizer=keras.optimizers.RMSprop(learning_rate=0.1),
        loss="mean_squared_error",
        metrics=["mean_absolute_error"],
    )
    return model


# Load example MNIST data and pre-process it
(x_train, y_train), (x_test, y_test) = load_mnist_like()
x_train = x_train.reshape(-1, 784).astype("float32") / 255.0
x_test = x_test.reshape(-1, 784).astype("float32") / 255.0

# Limit the data to 1000 samples
x_train = x_train[:1000]
y_train = y_train[:1000]
x_test = x_test[:1000]
y_test = y_test[:1000]


class CustomCallback(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        keys = list(logs.keys())
        print(f"Starting training; got log keys: {keys}")

    def on_train_end(self, logs=None):
        keys = list(logs.keys())
        print(f"Stop training; got log keys: {keys}")

    def on_epoch_begin(self, epoch, logs=None):
        keys = list(logs.keys())
        print(f"Start epoch {epoch} of training; got log keys: {keys}")

    def on_epoch_end(self, epoch, logs=None):
        keys = list(logs.keys())
        print(f"End epoch {epoch} of training; got log keys: {keys}")

    def on_test_begin(self, logs=None):
        keys = list(logs.keys())
        print(f"Start testing; got log keys: {keys}")

    def on_test_end(self, logs=None):
        keys = list(logs.keys())
        print(f"Stop testing; got log keys: {keys}")

    def on_predict_begin(self, logs=None):
        keys = list(logs.keys())
        print(f"Start predicting; got log keys: {keys}")

    def on_predict_end(self, logs=None):
        keys = list(logs.keys())
        print(f"Stop predicting; got log keys: {keys}")

    def on_train_batch_begin(self, batch, logs=None):
        keys = list(logs.keys())
        print(f"...Training: start of batch {batch}; got log keys: {keys}")

    def on_train_batch_end(self, batch, logs=None):
        keys = list(logs.keys())
        print(f"...Training: end of batch {batch}; got log keys: {keys}")

    def on_test_batch_begin(self, batch, logs=None):
        keys = list(logs.keys())
        print(f"...Evaluating: start of batch {batch}; got log keys: {keys}")

    def on_test_batch_end(self, batch, logs=None):
        keys = list(logs.keys())
        print(f"...Evaluating: end of batch {batch}; got log keys: {keys}")

    def on_predict_batch_begin(self, batch, logs=None):
        keys = list(logs.keys())
        print(f"...Predicting: start of batch {batch}; got log keys: {keys}")

    def on_predict_batch_end(self, batch, logs=None):
        keys = list(logs.keys())
        print(f"...Predicting: end of batch {batch}; got log keys: {keys}")


model = get_model()
with printed_lines() as fit_lines:
    model.fit(
        x_train,
        y_train,
        batch_size=128,
        epochs=1,
        verbose=0,
        validation_split=0.5,
        callbacks=[CustomCallback()],
    )

with printed_lines() as evaluate_lines:
    res = model.evaluate(
        x_test, y_test, batch_size=128, verbose=0, callbacks=[CustomCallback()]
    )

with printed_lines() as predict_lines:
    res = model.predict(x_test, batch_size=128, verbose=0, callbacks=[CustomCallback()])

fit_hooks, fit_batches, fit_unmatched, fit_consecutive = hook_summary(
    hook_calls(fit_lines))
evaluate_hooks, evaluate_batches, evaluate_unmatched, evaluate_consecutive = hook_summary(
    hook_calls(evaluate_lines))
predict_hooks, predict_batches, predict_unmatched, predict_consecutive = hook_summary(
    hook_calls(predict_lines))
predictions_shape = list(res.shape)

# Usage of `logs` dict


class LossAndErrorPrintingCallback(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        print("Up to batch {}, the average loss is {:7.2f}.".format(batch, logs["loss"]))

    def on_test_batch_end(self, batch, logs=None):
        print("Up to batch {}, the average loss is {:7.2f}.".format(batch, logs["loss"]))

    def on_epoch_end(self, epoch, logs=None):
        print(
            "The average loss for epoch {} is {:7.2f} "
            "and mean absolute error is {:7.2f}.".format(
                epoch, logs["loss"], logs["mean_absolute_error"]
            )
        )


model = get_model()
with printed_lines() as logs_fit_lines:
    model.fit(
        x_train,
        y_train,
        batch_size=128,
        epochs=2,
        verbose=0,
        callbacks=[LossAndErrorPrintingCallback()],
    )

with printed_lines() as logs_evaluate_lines:
    res = model.evaluate(
        x_test,
        y_test,
        batch_size=128,
        verbose=0,
        callbacks=[LossAndErrorPrintingCallback()],
    )
logs_epochs = epoch_losses(logs_fit_lines)
logs_evaluate = [float(v) for v in res]
# "Up to batch {}, the average loss is ...": one line per training batch (8 of
# 128 in an epoch of 1000) and per test batch (3 of 128 for 297).
logs_batch_lines = sum("Up to batch" in line for line in logs_fit_lines)
logs_test_batch_lines = sum("Up to batch" in line for line in logs_evaluate_lines)

# Early stopping at minimum loss


class EarlyStoppingAtMinLoss(keras.callbacks.Callback):
    """Stop training when the loss is at its min, i.e. the loss stops decreasing.

    Arguments:
        patience: Number of epochs to wait after min has been hit. After this
        number of no improvement, training stops.
    """

    def __init__(self, patience=0):
        super().__init__()
        self.patience = patience
        # best_weights to store the weights at which the minimum loss occurs.
        self.best_weights = None

    def on_train_begin(self, logs=None):
        # The number of epoch it has waited when loss is no longer minimum.
        self.wait = 0
        # The epoch the training stops at.
        self.stopped_epoch = 0
        # Initialize the best as infinity.
        self.best = np.inf

    def on_epoch_end(self, epoch, logs=None):
        current = logs.get("loss")
        if np.less(current, self.best):
            self.best = current
            self.wait = 0
            # Record the best weights if current results is better (less).
            self.best_weights = self.model.get_weights()
        else:
            self.wait += 1
            if self.wait >= self.patience:
                self.stopped_epoch = epoch
                self.model.stop_training = True
                print("Restoring model weights from the end of the best epoch.")
                self.model.set_weights(self.best_weights)

    def on_train_end(self, logs=None):
        if self.stopped_epoch > 0:
            print(f"Epoch {self.stopped_epoch + 1}: early stopping")


model = get_model()
early_stopping = EarlyStoppingAtMinLoss()
with printed_lines() as early_stopping_lines:
    model.fit(
        x_train,
        y_train,
        batch_size=64,
        epochs=30,
        verbose=0,
        callbacks=[LossAndErrorPrintingCallback(), early_stopping],
    )

# The restored weights: the model's weights now, against the best ones kept.
restored_distance = max(float(np.max(np.abs(w - b)))
                        for w, b in zip(model.get_weights(), early_stopping.best_weights))
# The loss of the best weights on the training data, in NumPy (Dense(1): x @ kernel
# + bias), against what evaluate() of the restored model gives.
kernel, bias = early_stopping.best_weights
best_weights_loss = float(np.mean((x_train @ kernel + bias - y_train[:, None]) ** 2))
restored_loss = float(model.evaluate(x_train, y_train, batch_size=64, verbose=0)[0])
early_stopping_epochs = epoch_losses(early_stopping_lines)

# Learning rate scheduling


class CustomLearningRateScheduler(keras.callbacks.Callback):
    """Learning rate scheduler which sets the learning rate according to schedule.

    Arguments:
        schedule: a function that takes an epoch index
            (integer, indexed from 0) and current learning rate
            as inputs and returns a new learning rate as output (float).
    """

    def __init__(self, schedule):
        super().__init__()
        self.schedule = schedule

    def on_epoch_begin(self, epoch, logs=None):
        if not hasattr(self.model.optimizer, "learning_rate"):
            raise ValueError('Optimizer must have a "learning_rate" attribute.')
        # Get the current learning rate from model's optimizer.
        lr = self.model.optimizer.learning_rate
        # Call schedule function to get the scheduled learning rate.
        scheduled_lr = self.schedule(epoch, lr)
        # Set the value back to the optimizer before this epoch starts
        self.model.optimizer.learning_rate = scheduled_lr
        print(f"\nEpoch {epoch}: Learning rate is {float(np.array(scheduled_lr))}.")


LR_SCHEDULE = [
    # (epoch to start, learning rate) tuples
    (3, 0.05),
    (6, 0.01),
    (9, 0.005),
    (12, 0.001),
]


def lr_schedule(epoch, lr):
    """Helper function to retrieve the scheduled learning rate based on epoch."""
    if epoch < LR_SCHEDULE[0][0] or epoch > LR_SCHEDULE[-1][0]:
        return lr
    for i in range(len(LR_SCHEDULE)):
        if epoch == LR_SCHEDULE[i][0]:
            return LR_SCHEDULE[i][1]
    return lr


model = get_model()
with printed_lines() as schedule_lines:
    model.fit(
        x_train,
        y_train,
        batch_size=64,
        epochs=15,
        verbose=0,
        callbacks=[
            LossAndErrorPrintingCallback(),
            CustomLearningRateScheduler(lr_schedule),
        ],
    )
schedule_epochs = epoch_losses(schedule_lines)

result = {
    "fit_hooks": fit_hooks,
    "fit_batches": fit_batches,
    "fit_unmatched_batch_begins": fit_unmatched,
    "fit_batch_indices_consecutive": fit_consecutive,
    "evaluate_hooks": evaluate_hooks,
    "evaluate_batches": evaluate_batches,
    "evaluate_unmatched_batch_begins": evaluate_unmatched,
    "evaluate_batch_indices_consecutive": evaluate_consecutive,
    "predict_hooks": predict_hooks,
    "predict_batches": predict_batches,
    "predict_unmatched_batch_begins": predict_unmatched,
    "predict_batch_indices_consecutive": predict_consecutive,
    "predictions_shape": predictions_shape,
    "logs_epochs_run": len(logs_epochs),
    "logs_first_epoch_loss": logs_epochs[0][0] if logs_epochs else None,
    "logs_last_epoch_loss": logs_epochs[-1][0] if logs_epochs else None,
    "logs_last_epoch_mae": logs_epochs[-1][1] if logs_epochs else None,
    "logs_evaluate_loss": logs_evaluate[0],
    "logs_evaluate_mae": logs_evaluate[1],
    "logs_batch_lines": logs_batch_lines,
    "logs_test_batch_lines": logs_test_batch_lines,
    "early_stopping_epochs_run": len(early_stopping_epochs),
    "early_stopping_stopped_epoch": early_stopping.stopped_epoch,
    "early_stopping_best_loss": float(early_stopping.best),
    "early_stopping_restored_distance": restored_distance,
    "early_stopping_best_weights_loss": best_weights_loss,
    "early_stopping_restored_loss": restored_loss,
    "early_stopping_restored_minus_best": restored_loss - best_weights_loss,
    # (to float32's 7 significant digits: the schedule's Python floats and the
    # optimizer's float32 variable print differently)
    "schedule_learning_rates": [float(f"{float(m[2]):.7g}")
                                for m in map(LR_LINE.search, schedule_lines) if m],
    "schedule_final_optimizer_lr": float(
        f"{float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)):.7g}"),
    "schedule_epochs_run": len(schedule_epochs),
    "schedule_last_loss": schedule_epochs[-1][0] if schedule_epochs else None,
    "schedule_last_mae": schedule_epochs[-1][1] if schedule_epochs else None,
}
print("RESULT " + json.dumps(result), flush=True)

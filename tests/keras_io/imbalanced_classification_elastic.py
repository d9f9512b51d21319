"""Mirrors keras-io examples/structured_data/imbalanced_classification.py
("Imbalanced classification: credit card fraud detection").

Keras features exercised:
- a `keras.Sequential` MLP: `keras.Input`, `Dense` (relu, sigmoid), `Dropout`;
- `compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy",
  metrics=[...])` with the metrics `FalseNegatives`, `FalsePositives`,
  `TrueNegatives`, `TruePositives`, `Precision`, `Recall`, named fn/fp/tn/tp/
  precision/recall;
- `fit(..., class_weight={0: w0, 1: w1}, validation_data=(x_val, y_val),
  batch_size=..., verbose=2)` on NumPy arrays;
- the callback `keras.callbacks.ModelCheckpoint("fraud_model_at_epoch_{epoch}.keras")`
  (a full `.keras` model file per epoch, written to the working directory);
- added here: `keras.models.load_model` of the last epoch's checkpoint and
  `evaluate(..., return_dict=True)` of it (keras-io stops at fit).

Data: instead of the Kaggle CSV, 8000 generated transactions of the same
layout (30 float32 features, uint8 targets of shape (n, 1), about 3% fraud;
tests/keras_io/example_data.py). Batches of 512 and 6 epochs instead of 2048
and 30.

Prints one line `RESULT {json}` at the end.
"""
# ruff: noqa: I001

import glob
import json

import keras
import keras_elastic as ke
import numpy as np

from example_data import load_creditcard_like

keras.utils.set_random_seed(1337)

features, targets = load_creditcard_like()
print("features.shape:", features.shape, "targets.shape:", targets.shape)

# The last 20% for validation.
num_val_samples = int(len(features) * 0.2)
train_features = features[:-num_val_samples]
train_targets = targets[:-num_val_samples]
val_features = features[-num_val_samples:]
val_targets = targets[-num_val_samples:]

counts = np.bincount(train_targets[:, 0])
print(f"positive training samples: {counts[1]} "
      f"({100 * float(counts[1]) / len(train_targets):.2f}% of {len(train_targets)})")
weight_for_0 = 1.0 / counts[0]
weight_for_1 = 1.0 / counts[1]

# Standardize with the training set's statistics.
mean = np.mean(train_features, axis=0)
train_features -= mean
val_features -= mean
std = np.std(train_features, axis=0)
train_features /= std
val_features /= std


def build_classifier():
    return keras.Sequential(
        [
            keras.Input(shape=train_features.shape[1:]),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )


model = ke.wrap(build_classifier())
model.summary()

metrics = [
    keras.metrics.FalseNegatives(name="fn"),
    keras.metrics.FalsePositives(name="fp"),
    keras.metrics.TrueNegatives(name="tn"),
    keras.metrics.TruePositives(name="tp"),
    keras.metrics.Precision(name="precision"),
    keras.metrics.Recall(name="recall"),
]
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy",
              metrics=metrics)

callbacks = [keras.callbacks.ModelCheckpoint("fraud_model_at_epoch_{epoch}.keras")]
class_weight = {0: weight_for_0, 1: weight_for_1}

epochs = 6
history = model.fit(
    train_features,
    train_targets,
    batch_size=512,
    epochs=epochs,
    verbose=2,
    callbacks=callbacks,
    validation_data=(val_features, val_targets),
    class_weight=class_weight,
)

last = {name: float(values[-1]) for name, values in history.history.items()}
val_positives = int(val_targets.sum())
print(f"validation: caught {last['val_tp']:.0f} of {val_positives} frauds, "
      f"flagged {last['val_fp']:.0f} of {len(val_targets) - val_positives} legitimate")

# The checkpoints written to the working directory; the last one loads.
checkpoints = sorted(glob.glob("fraud_model_at_epoch_*.keras"))
reloaded = keras.models.load_model(f"fraud_model_at_epoch_{epochs}.keras")
reloaded_recall = reloaded.evaluate(val_features, val_targets, verbose=0,
                                    return_dict=True)["recall"]

result = {
    "loss": last["loss"],
    "val_loss": last["val_loss"],
    "val_recall": last["val_recall"],
    "val_precision": last["val_precision"],
    "val_tp": last["val_tp"],
    "val_fp": last["val_fp"],
    "val_fn": last["val_fn"],
    "val_tn": last["val_tn"],
    "val_fp_rate": last["val_fp"] / (len(val_targets) - val_positives),
    "val_positives": val_positives,
    "checkpoints": len(checkpoints),
    "reloaded_val_recall": float(reloaded_recall),
    "epochs_run": len(history.history["loss"]),
}
print("RESULT " + json.dumps(result), flush=True)

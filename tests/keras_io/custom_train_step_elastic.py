"""Mirrors keras-io guides/custom_train_step_in_tensorflow.py ("Customizing what
happens in `fit()` with TensorFlow"), its first four sections (the GAN that
ends the guide is gan.py).

Keras features exercised, one model per section, each a subclass of
`keras.Model` built functionally (`Model(inputs, outputs)`):
1. `train_step` with a `tf.GradientTape`, the compiled loss through
   `self.compute_loss(y=..., y_pred=...)`, `self.optimizer.apply(...)` and the
   compiled metrics updated by walking `self.metrics` (the "loss" tracker gets
   the loss); `compile(optimizer="adam", loss="mse", metrics=["mae"])`, `fit(x, y)`;
2. going lower-level: `compile(optimizer="adam")` only, the model's own
   `keras.losses.MeanSquaredError`, its own `keras.metrics.Mean` and
   `MeanAbsoluteError` trackers listed in a `metrics` property (reset by fit
   at each epoch);
3. `sample_weight`: the train step unpacks `(x, y, sample_weight)` and passes
   the weights to `compute_loss` and to the compiled metrics;
   `fit(x, y, sample_weight=sw)`;
4. `test_step` for `evaluate`: a model compiled with `compile(loss="mse",
   metrics=["mae"])` (no optimizer, never fitted) and `evaluate(x, y)`.

Each section reseeds (`keras.utils.set_random_seed`), so its model starts
from the same weights whatever the sections before it drew.

Data: the guide's shapes (1000 x 32 features, 1 target), from a seeded
generator, with a linear target plus noise instead of pure noise so the losses
mean something. Epochs as in the guide (3, 5, 3).

Prints one line `RESULT {json}` at the end.
"""
# ruff: noqa: I001

import json

import keras
import keras_elastic as ke
import numpy as np
import tensorflow as tf

rng = np.random.default_rng(1337)
true_w = rng.normal(scale=0.3, size=(32, 1))
x = rng.random((1000, 32)).astype("float32")
y = (x @ true_w + 0.05 * rng.normal(size=(1000, 1))).astype("float32")
sw = rng.random((1000, 1)).astype("float32")

result = {}


# 1. A train_step using the compiled loss and metrics.
class CompiledLossModel(keras.Model):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)
        self.optimizer.apply(gradients, trainable_vars)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


keras.utils.set_random_seed(1337)  # each section starts from the same weights
inputs = keras.Input(shape=(32,))
outputs = keras.layers.Dense(1)(inputs)
model = ke.wrap(CompiledLossModel(inputs, outputs))
model.compile(optimizer="adam", loss="mse", metrics=["mae"])
history = model.fit(x, y, epochs=3, verbose=2)
result["compiled_loss"] = float(history.history["loss"][-1])
result["compiled_mae"] = float(history.history["mae"][-1])


# 2. Lower level: the model's own loss function and metric trackers.
class OwnMetricsModel(keras.Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
        self.loss_fn = keras.losses.MeanSquaredError()

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.loss_fn(y, y_pred)
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)
        self.optimizer.apply(gradients, trainable_vars)
        self.loss_tracker.update_state(loss)
        self.mae_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

    @property
    def metrics(self):
        # Listed here, so that fit() resets them at the start of every epoch.
        return [self.loss_tracker, self.mae_metric]


keras.utils.set_random_seed(1337)  # each section starts from the same weights
inputs = keras.Input(shape=(32,))
outputs = keras.layers.Dense(1)(inputs)
model = ke.wrap(OwnMetricsModel(inputs, outputs))
model.compile(optimizer="adam")
history = model.fit(x, y, epochs=5, verbose=2)
result["own_metrics_loss"] = float(history.history["loss"][-1])
result["own_metrics_mae"] = float(history.history["mae"][-1])


# 3. sample_weight through the compiled loss and metrics.
class SampleWeightModel(keras.Model):
    def train_step(self, data):
        if len(data) == 3:
            x, y, sample_weight = data
        else:
            sample_weight = None
            x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred, sample_weight=sample_weight)
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)
        self.optimizer.apply(gradients, trainable_vars)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred, sample_weight=sample_weight)
        return {m.name: m.result() for m in self.metrics}


keras.utils.set_random_seed(1337)  # each section starts from the same weights
inputs = keras.Input(shape=(32,))
outputs = keras.layers.Dense(1)(inputs)
model = ke.wrap(SampleWeightModel(inputs, outputs))
model.compile(optimizer="adam", loss="mse", metrics=["mae"])
history = model.fit(x, y, sample_weight=sw, epochs=3, verbose=2)
result["weighted_loss"] = float(history.history["loss"][-1])
result["weighted_mae"] = float(history.history["mae"][-1])


# 4. A test_step for evaluate().
class OwnTestStepModel(keras.Model):
    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        loss = self.compute_loss(y=y, y_pred=y_pred)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


keras.utils.set_random_seed(1337)  # each section starts from the same weights
inputs = keras.Input(shape=(32,))
outputs = keras.layers.Dense(1)(inputs)
model = ke.wrap(OwnTestStepModel(inputs, outputs))
model.compile(loss="mse", metrics=["mae"])
eval_loss, eval_mae = model.evaluate(x, y, verbose=0)
result["eval_loss"] = float(eval_loss)
result["eval_mae"] = float(eval_mae)

print("RESULT " + json.dumps(result), flush=True)

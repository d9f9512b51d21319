"""Mirrors keras-io guides/transfer_learning.py ("Transfer learning &
fine-tuning", the Keras 3 version).

Keras features exercised:
- the `trainable` API: `weights`, `trainable_weights`, `non_trainable_weights`
  of a `Dense` and a `BatchNormalization` layer, a frozen layer
  (`layer.trainable = False`) whose weights `fit` leaves unchanged, and
  `trainable` set recursively on a model of models;
- the guide's end-to-end workflow: a base model with `BatchNormalization`
  layers, frozen (`base_model.trainable = False`), called in inference mode
  (`base_model(x, training=False)`) under a new head (`Rescaling`,
  `GlobalAveragePooling2D`, `Dropout`, `Dense(1)`), `compile(optimizer=
  keras.optimizers.Adam(), loss=keras.losses.BinaryCrossentropy(
  from_logits=True), metrics=[keras.metrics.BinaryAccuracy()])` and `fit`
  with `validation_data`; then fine-tuning: `base_model.trainable = True`,
  `compile` again with `keras.optimizers.Adam(1e-5)`, `fit` again, and
  `evaluate` on the test split;
- `model.summary(show_trainable=True)`.

What the RESULT line records, besides the accuracies: the frozen layer and the
frozen base are not changed by `fit` (not even the base's BatchNormalization
moving statistics: a BatchNormalization layer with `trainable = False` runs in
inference mode); after `base_model.trainable = True` and the new compile, the
base's weights move by steps of the new optimizer's learning rate (1e-5: Adam
moves a weight by about its learning rate per step, at most, so the largest
change over the fine-tuning steps, divided by 1e-5 per step, is about 1; a
server that kept Adam() would give about 100, a base still frozen 0). The
guide's BatchNormalization point is that `base_model(x, training=False)` keeps
the moving statistics unchanged during fine-tuning; in Keras 3 it does not:
`fit` calls the model with `training=True`, which the functional model passes
on to every layer it calls, over the `training=False` of the graph
(keras-team/keras#20285), so the unfrozen BatchNormalization layers update
their statistics. The RESULT records what Keras does (the largest change of a
moving statistic during fine-tuning), which an elastic run must reproduce.

Changed from keras.io:
- `keras.applications.Xception(weights="imagenet", include_top=False)` cannot
  be downloaded here: a small convolutional base with BatchNormalization
  (`make_base_model`) is pretrained in the script itself, with plain Keras, on a
  stand-in for ImageNet (`load_imagenet_like`: the frequency band of gratings,
  4 classes) and used as the guide uses Xception. It stands in for the download,
  so the elastic script does not wrap it.
- TFDS "cats_vs_dogs" is replaced by `load_cats_vs_dogs_like` (coarse vs fine
  gratings, uint8 RGB, label 0/1), 48x48 instead of resized to 150x150 (the
  stand-in images already have one size, so there is no `Resizing` step), split
  40% / 10% / 10% of 2000 images as the guide splits its 25,000.
- The guide maps its augmentation (`RandomFlip("horizontal")`,
  `RandomRotation(0.1)`) over the training `tf.data.Dataset`; here the data are
  NumPy arrays (a `tf.data.Dataset` in a launched job is an error by design,
  README), so the same two layers are the model's first layers, as the guide's
  earlier (2020) version has them: active in training only, like the guide's
  augmentation of the training split only.
- `fit(x, y, batch_size=64, ...)` on arrays instead of datasets batched by 64;
  6 + 2 epochs instead of the guide's 2 + 1 (its Xception features are better
  than a base pretrained in seconds); the guide's plots are left out.
- The base's BatchNormalization layers have `momentum=0.9` (Keras' default
  0.99 would leave the moving statistics of a base pretrained for 76 steps
  mostly at their initial values, and the frozen base useless).

Prints one line `RESULT {json}` at the end.
"""
# ruff: noqa: I001

import json

import numpy as np
import keras
from keras import layers

from example_data import load_cats_vs_dogs_like, load_imagenet_like

keras.utils.set_random_seed(1337)


def weight_counts(layer):
    return [len(layer.weights), len(layer.trainable_weights),
            len(layer.non_trainable_weights)]


def max_change(before, after):
    return float(max((np.max(np.abs(a - b)) for a, b in zip(before, after)),
                     default=0.0))


# -- Freezing layers: understanding the `trainable` attribute ------------------

layer = keras.layers.Dense(3)
layer.build((None, 4))  # Create the weights

print("weights:", len(layer.weights))
print("trainable_weights:", len(layer.trainable_weights))
print("non_trainable_weights:", len(layer.non_trainable_weights))
dense_weight_counts = weight_counts(layer)

layer = keras.layers.BatchNormalization()
layer.build((None, 4))  # Create the weights

print("weights:", len(layer.weights))
print("trainable_weights:", len(layer.trainable_weights))
print("non_trainable_weights:", len(layer.non_trainable_weights))
bn_weight_counts = weight_counts(layer)

layer = keras.layers.Dense(3)
layer.build((None, 4))  # Create the weights
layer.trainable = False  # Freeze the layer

print("weights:", len(layer.weights))
print("trainable_weights:", len(layer.trainable_weights))
print("non_trainable_weights:", len(layer.non_trainable_weights))
frozen_dense_weight_counts = weight_counts(layer)

# Make a model with 2 layers
layer1 = keras.layers.Dense(3, activation="relu")
layer2 = keras.layers.Dense(3, activation="sigmoid")
model = keras.Sequential([keras.Input(shape=(3,)), layer1, layer2])

# Freeze the first layer
layer1.trainable = False

# Keep a copy of the weights of layer1 for later reference
initial_layer1_weights_values = layer1.get_weights()
initial_layer2_weights_values = layer2.get_weights()

# Train the model
model.compile(optimizer="adam", loss="mse")
model.fit(np.random.random((2, 3)), np.random.random((2, 3)))

# Check that the weights of layer1 have not changed during training
final_layer1_weights_values = layer1.get_weights()
frozen_layer1_change = max_change(initial_layer1_weights_values,
                                  final_layer1_weights_values)
trained_layer2_change = max_change(initial_layer2_weights_values, layer2.get_weights())
np.testing.assert_allclose(
    initial_layer1_weights_values[0], final_layer1_weights_values[0]
)
np.testing.assert_allclose(
    initial_layer1_weights_values[1], final_layer1_weights_values[1]
)

# -- Recursive setting of the `trainable` attribute ----------------------------

inner_model = keras.Sequential(
    [
        keras.Input(shape=(3,)),
        keras.layers.Dense(3, activation="relu"),
        keras.layers.Dense(3, activation="relu"),
    ]
)

model = keras.Sequential(
    [
        keras.Input(shape=(3,)),
        inner_model,
        keras.layers.Dense(3, activation="sigmoid"),
    ]
)

model.trainable = False  # Freeze the outer model

assert inner_model.trainable == False  # noqa: E712 (the guide's spelling)
assert inner_model.layers[0].trainable == False  # noqa: E712

# -- The "pretrained" base model (stands in for the Xception download) ---------

image_size = (48, 48)


def make_base_model():
    """A small convolutional base with BatchNormalization, `include_top=False`
    style: images scaled to [-1, 1] in, a feature map out."""
    inputs = keras.Input(shape=image_size + (3,))
    x = inputs
    for filters, strides in ((16, 2), (32, 2), (32, 2), (64, 1)):
        x = layers.Conv2D(filters, 3, strides=strides, padding="same",
                          use_bias=False)(x)
        # momentum 0.9 (Keras' default 0.99 would leave the moving statistics
        # of a base pretrained for 76 steps mostly at their initial values).
        x = layers.BatchNormalization(momentum=0.9)(x)
        x = layers.ReLU()(x)
    return keras.Model(inputs, x, name="base_model")


def pretrain(base_model):
    """Trains `base_model` with a 4-class head on the ImageNet stand-in (plain
    Keras: this is the download the guide does, not part of its workflow)."""
    images, labels = load_imagenet_like(size=image_size[0])
    classifier = keras.Sequential([base_model, layers.GlobalAveragePooling2D(),
                                   layers.Dense(4)])
    classifier.compile(optimizer=keras.optimizers.Adam(1e-3),
                       loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                       metrics=["accuracy"])
    history = classifier.fit(images.astype("float32") / 127.5 - 1.0, labels,
                             batch_size=64, epochs=4, verbose=2)
    return float(history.history["accuracy"][-1])


# -- Getting the data -----------------------------------------------------------

images, labels = load_cats_vs_dogs_like(num_images=2000, size=image_size[0])
# Reserve 10% for validation and 10% for test, as the guide's
# split=["train[:40%]", "train[40%:50%]", "train[50%:60%]"].
n = len(images)
train_x, train_y = images[: n * 4 // 10], labels[: n * 4 // 10]
validation_x, validation_y = images[n * 4 // 10 : n // 2], labels[n * 4 // 10 : n // 2]
test_x, test_y = images[n // 2 : n * 6 // 10], labels[n // 2 : n * 6 // 10]

print(f"Number of training samples: {len(train_x)}")
print(f"Number of validation samples: {len(validation_x)}")
print(f"Number of test samples: {len(test_x)}")

# -- Using random data augmentation ----------------------------------------------

data_augmentation = keras.Sequential(
    [
        layers.RandomFlip("horizontal"),
        layers.RandomRotation(0.1),
    ]
)

# -- Build a model ----------------------------------------------------------------

base_model = make_base_model()  # weights="imagenet": pretrained below
pretrain_accuracy = pretrain(base_model)

# Freeze the base_model
base_model.trainable = False

# Create new model on top
inputs = keras.Input(shape=image_size + (3,))
x = data_augmentation(inputs)  # Apply random data augmentation

# Pre-trained Xception weights requires that input be scaled
# from (0, 255) to a range of (-1., +1.), the rescaling layer
# outputs: `(inputs * scale) + offset`
scale_layer = keras.layers.Rescaling(scale=1 / 127.5, offset=-1)
x = scale_layer(x)

# The base model contains batchnorm layers. We want to keep them in inference mode
# when we unfreeze the base model for fine-tuning, so we make sure that the
# base_model is running in inference mode here.
x = base_model(x, training=False)
x = keras.layers.GlobalAveragePooling2D()(x)
x = keras.layers.Dropout(0.2)(x)  # Regularize with dropout
outputs = keras.layers.Dense(1)(x)
model = keras.Model(inputs, outputs)

model.summary(show_trainable=True)

# -- Train the top layer ------------------------------------------------------------

model.compile(
    optimizer=keras.optimizers.Adam(),
    loss=keras.losses.BinaryCrossentropy(from_logits=True),
    metrics=[keras.metrics.BinaryAccuracy()],
)
head_trainable_weights = len(model.trainable_weights)

base_before_head = base_model.get_weights()
epochs = 6
print("Fitting the top layer of the model")
head_history = model.fit(train_x, train_y, batch_size=64, epochs=epochs,
                         validation_data=(validation_x, validation_y), verbose=2)
base_after_head = base_model.get_weights()

# -- Do a round of fine-tuning of the entire model ------------------------------------

# Unfreeze the base_model. Note that it keeps running in inference mode
# since we passed `training=False` when calling it. This means that
# the batchnorm layers will not update their batch statistics.
# This prevents the batchnorm layers from undoing all the training
# we've done so far.
base_model.trainable = True
model.summary(show_trainable=True)

model.compile(
    optimizer=keras.optimizers.Adam(1e-5),  # Low learning rate
    loss=keras.losses.BinaryCrossentropy(from_logits=True),
    metrics=[keras.metrics.BinaryAccuracy()],
)
finetune_trainable_weights = len(model.trainable_weights)

base_trainable_before = [v.numpy() for v in base_model.trainable_weights]
base_statistics_before = [v.numpy() for v in base_model.non_trainable_weights]
epochs = 2
print("Fitting the end-to-end model")
finetune_history = model.fit(train_x, train_y, batch_size=64, epochs=epochs,
                             validation_data=(validation_x, validation_y), verbose=2)
base_trainable_after = [v.numpy() for v in base_model.trainable_weights]
base_statistics_after = [v.numpy() for v in base_model.non_trainable_weights]

print("Test dataset evaluation")
test_loss, test_accuracy = model.evaluate(test_x, test_y, batch_size=64, verbose=0)
print("test loss, test accuracy:", test_loss, test_accuracy)

# The fine-tuning steps (batches of 64) over both epochs: Adam moves each weight
# by about its learning rate per step, at most.
finetune_steps = epochs * int(np.ceil(len(train_x) / 64))
result = {
    "dense_weight_counts": dense_weight_counts,
    "bn_weight_counts": bn_weight_counts,
    "frozen_dense_weight_counts": frozen_dense_weight_counts,
    "frozen_layer1_change": frozen_layer1_change,
    "trained_layer2_change": trained_layer2_change,
    "pretrain_accuracy": pretrain_accuracy,
    "head_trainable_weights": head_trainable_weights,
    "finetune_trainable_weights": finetune_trainable_weights,
    "base_change_while_frozen": max_change(base_before_head, base_after_head),
    "base_kernel_change_finetune": max_change(base_trainable_before,
                                              base_trainable_after),
    "base_kernel_change_per_lr_step": max_change(
        base_trainable_before, base_trainable_after) / (1e-5 * finetune_steps),
    "bn_statistics_change_finetune": max_change(base_statistics_before,
                                                base_statistics_after),
    "head_val_accuracy": float(head_history.history["val_binary_accuracy"][-1]),
    "finetune_val_accuracy": float(finetune_history.history["val_binary_accuracy"][-1]),
    "finetune_val_loss": float(finetune_history.history["val_loss"][-1]),
    "test_loss": float(test_loss),
    "test_accuracy": float(test_accuracy),
    "finetune_learning_rate": float(
        keras.ops.convert_to_numpy(model.optimizer.learning_rate)),
}
print("RESULT " + json.dumps(result), flush=True)

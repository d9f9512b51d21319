"""Mirrors keras-io guides/distributed_training_with_tensorflow.py ("Multi-GPU
distributed training with TensorFlow"): its end-to-end example and its
"Using callbacks to ensure fault tolerance" section.

Keras features exercised:
- a functional MLP (`Dense` 256, 256, 10 logits) compiled with
  `keras.optimizers.Adam()`,
  `keras.losses.SparseCategoricalCrossentropy(from_logits=True)` and
  `keras.metrics.SparseCategoricalAccuracy()`, inside a `get_compiled_model()`;
- `tf.data.Dataset.from_tensor_slices((x, y)).batch(32)` for training,
  validation and test: `fit(train_dataset, epochs=..., callbacks=...,
  validation_data=val_dataset)` and `evaluate(test_dataset)` on tf.data
  Datasets;
- fault tolerance as the guide does it:
  `ModelCheckpoint(filepath="./ckpt/ckpt-{epoch}.keras", save_freq="epoch")`,
  and `make_or_restore_model()`, which `keras.models.load_model`s the newest
  checkpoint if there is one (a compiled model, optimizer state included);
  `run_training` is called twice, the second call resuming from the first
  one's checkpoint.

Left out: `tf.distribute.MirroredStrategy` and its scope (one CPU here, and
the data parallelism is keras-elastic's job).

Data: instead of MNIST, scikit-learn's digits upsampled to 28x28 and flattened
(tests/keras_io/example_data.py), float32 labels as in the guide; the last 300
training images for validation.

Every file goes to ./ckpt in the working directory. Prints one line
`RESULT {json}` at the end.
"""
# ruff: noqa: I001

import json
import os

import keras
import tensorflow as tf

from example_data import load_mnist_like

keras.utils.set_random_seed(1337)


def get_compiled_model():
    inputs = keras.Input(shape=(784,))
    x = keras.layers.Dense(256, activation="relu")(inputs)
    x = keras.layers.Dense(256, activation="relu")(x)
    outputs = keras.layers.Dense(10)(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    return model


def get_dataset():
    batch_size = 32
    num_val_samples = 300
    (x_train, y_train), (x_test, y_test) = load_mnist_like()
    x_train = x_train.reshape(-1, 784).astype("float32") / 255
    x_test = x_test.reshape(-1, 784).astype("float32") / 255
    y_train = y_train.astype("float32")
    y_test = y_test.astype("float32")
    x_val, y_val = x_train[-num_val_samples:], y_train[-num_val_samples:]
    x_train, y_train = x_train[:-num_val_samples], y_train[:-num_val_samples]
    return (
        tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(batch_size),
        tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(batch_size),
        tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(batch_size),
    )


train_dataset, val_dataset, test_dataset = get_dataset()

checkpoint_dir = "./ckpt"
os.makedirs(checkpoint_dir, exist_ok=True)
restored_from = []


def make_or_restore_model():
    """The newest checkpoint's model, or a new one when there is none."""
    checkpoints = [os.path.join(checkpoint_dir, f) for f in os.listdir(checkpoint_dir)]
    if checkpoints:
        latest_checkpoint = max(checkpoints, key=os.path.getctime)
        print("Restoring from", latest_checkpoint)
        restored_from.append(os.path.basename(latest_checkpoint))
        return keras.models.load_model(latest_checkpoint)
    print("Creating a new model")
    return get_compiled_model()


def run_training(epochs=1):
    model = make_or_restore_model()
    callbacks = [
        # A whole model after every epoch; the epoch in the file name.
        keras.callbacks.ModelCheckpoint(filepath=checkpoint_dir + "/ckpt-{epoch}.keras",
                                        save_freq="epoch"),
    ]
    history = model.fit(train_dataset, epochs=epochs, callbacks=callbacks,
                        validation_data=val_dataset, verbose=2)
    return model, history


# The first run creates the model; the second resumes from its checkpoint.
_, first = run_training(epochs=2)
model, second = run_training(epochs=2)
test_loss, test_accuracy = model.evaluate(test_dataset, verbose=0)

result = {
    "test_loss": float(test_loss),
    "test_accuracy": float(test_accuracy),
    "first_val_accuracy": float(first.history["val_sparse_categorical_accuracy"][-1]),
    "second_val_accuracy": float(second.history["val_sparse_categorical_accuracy"][-1]),
    "first_epoch_loss": float(first.history["loss"][0]),
    "resumed_epoch_loss": float(second.history["loss"][0]),
    "restored_from": restored_from,
    "checkpoints": sorted(os.listdir(checkpoint_dir)),
    "epochs_run": len(first.history["loss"]) + len(second.history["loss"]),
}
print("RESULT " + json.dumps(result), flush=True)

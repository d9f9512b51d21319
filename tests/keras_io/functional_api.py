"""Mirrors keras-io guides/functional_api.py ("The Functional API", the Keras 3
version).

Keras features exercised:
- a functional MLP (`keras.Input`, layers called on tensors, `keras.Model(
  inputs=..., outputs=..., name=...)`), `compile(loss=keras.losses.
  SparseCategoricalCrossentropy(from_logits=True), optimizer=keras.optimizers.
  RMSprop(), metrics=["accuracy"])`, `fit(..., validation_split=0.2)`,
  `evaluate`; `model.save("my_model.keras")`, `del model`,
  `keras.models.load_model("my_model.keras")`;
- one graph of layers for several models (encoder, autoencoder), models called
  like layers (encoder and decoder chained), an ensemble averaging three models;
- a model of three inputs (two `Embedding` + `LSTM` text branches and a tags
  vector) and two named outputs (dict), compiled with losses and loss weights
  as lists and then as dicts, and trained on dicts of NumPy arrays;
- a toy ResNet (residual connections with `layers.add`) trained with
  `validation_split=0.2`;
- a shared `Embedding` layer, a feature-extraction model made of the outputs of
  every layer of another model, a custom layer (`CustomDense`) with
  `get_config` and `keras.Model.from_config(config, custom_objects=...)`, and
  functional and subclassed layers mixed (`CustomRNN`).

Changed from keras.io:
- MNIST is replaced by scikit-learn's digits upsampled to 28x28 and CIFAR-10
  by the same digits upsampled to 32x32 in colour (uint8, labels (n, 1))
  (tests/keras_io/example_data.py); `reshape(len(x), 784)` for the guide's
  `reshape(60000, 784)`. 5 epochs instead of 2 for the MLP (1200 training
  images instead of 48,000). The toy ResNet trains for one epoch on 1000
  images, as in the guide: 13 batches leave it near chance (its loss near
  ln 10), which the RESULT line reports as it is.
- `keras.utils.plot_model` is left out (it needs pydot and graphviz).
- The issue-ticket model: a vocabulary of 1000 words instead of 10,000 and
  bodies of 50 words instead of 100 (seconds on two cores); its two outputs
  are a dict named on the line before the model's (the elastic script wraps
  that line in `ke.wrap(...)`).
- `keras.applications.VGG19()` downloads ImageNet weights (and has 143 million
  parameters): a small convolutional `keras.Sequential` named "vgg19" stands in
  for it, and the feature-extraction model is made of its layers' outputs
  the same way, run on a random 64x64 image instead of 224x224.
- After `load_model`, the reloaded model is evaluated on the test images (the
  guide stops at loading it): the RESULT line compares it with the trained one.
- `fit(..., verbose=2)`, `evaluate(..., verbose=0)`.

Every file goes to the working directory. Prints one line `RESULT {json}`.
"""
# ruff: noqa: I001

import json

import numpy as np
import keras
from keras import layers
from keras import ops

from example_data import load_cifar10_like, load_mnist_like

keras.utils.set_random_seed(1337)

# -- Introduction ---------------------------------------------------------------

inputs = keras.Input(shape=(784,))

# Just for demonstration purposes.
img_inputs = keras.Input(shape=(32, 32, 3))

print(inputs.shape, inputs.dtype)

dense = layers.Dense(64, activation="relu")
x = dense(inputs)

x = layers.Dense(64, activation="relu")(x)
outputs = layers.Dense(10)(x)

model = keras.Model(inputs=inputs, outputs=outputs, name="mnist_model")

model.summary()

# -- Training, evaluation, and inference -----------------------------------------

(x_train, y_train), (x_test, y_test) = load_mnist_like()

x_train = x_train.reshape(len(x_train), 784).astype("float32") / 255
x_test = x_test.reshape(len(x_test), 784).astype("float32") / 255

model.compile(
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    optimizer=keras.optimizers.RMSprop(),
    metrics=["accuracy"],
)

history = model.fit(x_train, y_train, batch_size=64, epochs=5, validation_split=0.2,
                    verbose=2)

test_scores = model.evaluate(x_test, y_test, verbose=0)
print("Test loss:", test_scores[0])
print("Test accuracy:", test_scores[1])

# -- Save and serialize --------------------------------------------------------------

model.save("my_model.keras")
del model
# Recreate the exact same model purely from the file:
model = keras.models.load_model("my_model.keras")

reloaded_scores = model.evaluate(x_test, y_test, verbose=0)
print("Reloaded model's test loss and accuracy:", reloaded_scores)

# -- Use the same graph of layers to define multiple models -------------------------

encoder_input = keras.Input(shape=(28, 28, 1), name="img")
x = layers.Conv2D(16, 3, activation="relu")(encoder_input)
x = layers.Conv2D(32, 3, activation="relu")(x)
x = layers.MaxPooling2D(3)(x)
x = layers.Conv2D(32, 3, activation="relu")(x)
x = layers.Conv2D(16, 3, activation="relu")(x)
encoder_output = layers.GlobalMaxPooling2D()(x)

encoder = keras.Model(encoder_input, encoder_output, name="encoder")
encoder.summary()

x = layers.Reshape((4, 4, 1))(encoder_output)
x = layers.Conv2DTranspose(16, 3, activation="relu")(x)
x = layers.Conv2DTranspose(32, 3, activation="relu")(x)
x = layers.UpSampling2D(3)(x)
x = layers.Conv2DTranspose(16, 3, activation="relu")(x)
decoder_output = layers.Conv2DTranspose(1, 3, activation="relu")(x)

autoencoder = keras.Model(encoder_input, decoder_output, name="autoencoder")
autoencoder.summary()
autoencoder_output_shape = list(autoencoder.output_shape)

# -- All models are callable, just like layers ------------------------------------------

encoder_input = keras.Input(shape=(28, 28, 1), name="original_img")
x = layers.Conv2D(16, 3, activation="relu")(encoder_input)
x = layers.Conv2D(32, 3, activation="relu")(x)
x = layers.MaxPooling2D(3)(x)
x = layers.Conv2D(32, 3, activation="relu")(x)
x = layers.Conv2D(16, 3, activation="relu")(x)
encoder_output = layers.GlobalMaxPooling2D()(x)

encoder = keras.Model(encoder_input, encoder_output, name="encoder")
encoder.summary()

decoder_input = keras.Input(shape=(16,), name="encoded_img")
x = layers.Reshape((4, 4, 1))(decoder_input)
x = layers.Conv2DTranspose(16, 3, activation="relu")(x)
x = layers.Conv2DTranspose(32, 3, activation="relu")(x)
x = layers.UpSampling2D(3)(x)
x = layers.Conv2DTranspose(16, 3, activation="relu")(x)
decoder_output = layers.Conv2DTranspose(1, 3, activation="relu")(x)

decoder = keras.Model(decoder_input, decoder_output, name="decoder")
decoder.summary()

autoencoder_input = keras.Input(shape=(28, 28, 1), name="img")
encoded_img = encoder(autoencoder_input)
decoded_img = decoder(encoded_img)
autoencoder = keras.Model(autoencoder_input, decoded_img, name="autoencoder")
autoencoder.summary()


def get_model():
    inputs = keras.Input(shape=(128,))
    outputs = layers.Dense(1)(inputs)
    return keras.Model(inputs, outputs)


model1 = get_model()
model2 = get_model()
model3 = get_model()

inputs = keras.Input(shape=(128,))
y1 = model1(inputs)
y2 = model2(inputs)
y3 = model3(inputs)
outputs = layers.average([y1, y2, y3])
ensemble_model = keras.Model(inputs=inputs, outputs=outputs)

# -- Models with multiple inputs and outputs -----------------------------------------------

num_tags = 12  # Number of unique issue tags
num_words = 1000  # Size of vocabulary obtained when preprocessing text data
num_departments = 4  # Number of departments for predictions

title_input = keras.Input(shape=(None,), name="title")  # Variable-length sequence of ints
body_input = keras.Input(shape=(None,), name="body")  # Variable-length sequence of ints
tags_input = keras.Input(shape=(num_tags,), name="tags")  # Binary vectors, `num_tags` long

# Embed each word in the title into a 64-dimensional vector
title_features = layers.Embedding(num_words, 64)(title_input)
# Embed each word in the text into a 64-dimensional vector
body_features = layers.Embedding(num_words, 64)(body_input)

# Reduce sequence of embedded words in the title into a single 128-dimensional vector
title_features = layers.LSTM(128)(title_features)
# Reduce sequence of embedded words in the body into a single 32-dimensional vector
body_features = layers.LSTM(32)(body_features)

# Merge all available features into a single large vector via concatenation
x = layers.concatenate([title_features, body_features, tags_input])

# Stick a logistic regression for priority prediction on top of the features
priority_pred = layers.Dense(1, name="priority")(x)
# Stick a department classifier on top of the features
department_pred = layers.Dense(num_departments, name="department")(x)

# Instantiate an end-to-end model predicting both priority and department
ticket_outputs = {"priority": priority_pred, "department": department_pred}
model = keras.Model(inputs=[title_input, body_input, tags_input], outputs=ticket_outputs)

model.compile(
    optimizer=keras.optimizers.RMSprop(1e-3),
    loss=[
        keras.losses.BinaryCrossentropy(from_logits=True),
        keras.losses.CategoricalCrossentropy(from_logits=True),
    ],
    loss_weights=[1.0, 0.2],
)

model.compile(
    optimizer=keras.optimizers.RMSprop(1e-3),
    loss={
        "priority": keras.losses.BinaryCrossentropy(from_logits=True),
        "department": keras.losses.CategoricalCrossentropy(from_logits=True),
    },
    loss_weights={"priority": 1.0, "department": 0.2},
)

# Dummy input data
title_data = np.random.randint(num_words, size=(1280, 10))
body_data = np.random.randint(num_words, size=(1280, 50))
tags_data = np.random.randint(2, size=(1280, num_tags)).astype("float32")

# Dummy target data
priority_targets = np.random.random(size=(1280, 1))
dept_targets = np.random.randint(2, size=(1280, num_departments))

ticket_history = model.fit(
    {"title": title_data, "body": body_data, "tags": tags_data},
    {"priority": priority_targets, "department": dept_targets},
    epochs=2,
    batch_size=32,
    verbose=2,
)

# -- A toy ResNet model ----------------------------------------------------------------

inputs = keras.Input(shape=(32, 32, 3), name="img")
x = layers.Conv2D(32, 3, activation="relu")(inputs)
x = layers.Conv2D(64, 3, activation="relu")(x)
block_1_output = layers.MaxPooling2D(3)(x)

x = layers.Conv2D(64, 3, activation="relu", padding="same")(block_1_output)
x = layers.Conv2D(64, 3, activation="relu", padding="same")(x)
block_2_output = layers.add([x, block_1_output])

x = layers.Conv2D(64, 3, activation="relu", padding="same")(block_2_output)
x = layers.Conv2D(64, 3, activation="relu", padding="same")(x)
block_3_output = layers.add([x, block_2_output])

x = layers.Conv2D(64, 3, activation="relu")(block_3_output)
x = layers.GlobalAveragePooling2D()(x)
x = layers.Dense(256, activation="relu")(x)
x = layers.Dropout(0.5)(x)
outputs = layers.Dense(10)(x)

model = keras.Model(inputs, outputs, name="toy_resnet")
model.summary()

(x_train, y_train), (x_test, y_test) = load_cifar10_like()

x_train = x_train.astype("float32") / 255.0
x_test = x_test.astype("float32") / 255.0
y_train = keras.utils.to_categorical(y_train, 10)
y_test = keras.utils.to_categorical(y_test, 10)

model.compile(
    optimizer=keras.optimizers.RMSprop(1e-3),
    loss=keras.losses.CategoricalCrossentropy(from_logits=True),
    metrics=["acc"],
)
# We restrict the data to the first 1000 samples so as to limit execution time
# on Colab. Try to train on the entire dataset until convergence!
resnet_history = model.fit(
    x_train[:1000],
    y_train[:1000],
    batch_size=64,
    epochs=1,
    validation_split=0.2,
    verbose=2,
)

# -- Shared layers -------------------------------------------------------------------------

# Embedding for 1000 unique words mapped to 128-dimensional vectors
shared_embedding = layers.Embedding(1000, 128)

# Variable-length sequence of integers
text_input_a = keras.Input(shape=(None,), dtype="int32")

# Variable-length sequence of integers
text_input_b = keras.Input(shape=(None,), dtype="int32")

# Reuse the same layer to encode both inputs
encoded_input_a = shared_embedding(text_input_a)
encoded_input_b = shared_embedding(text_input_b)

# -- Extract and reuse nodes in the graph of layers ------------------------------------

# keras.applications.VGG19() in the guide: a small stand-in, built the same way
vgg19_input = keras.Input(shape=(64, 64, 3))
x = layers.Conv2D(8, 3, activation="relu", padding="same")(vgg19_input)
x = layers.MaxPooling2D(2)(x)
x = layers.Conv2D(16, 3, activation="relu", padding="same")(x)
x = layers.MaxPooling2D(2)(x)
x = layers.Flatten()(x)
vgg19 = keras.Model(vgg19_input, layers.Dense(10, activation="softmax")(x), name="vgg19")

features_list = [layer.output for layer in vgg19.layers]

feat_extraction_model = keras.Model(inputs=vgg19.input, outputs=features_list)

img = np.random.random((1, 64, 64, 3)).astype("float32")
extracted_features = feat_extraction_model(img)

# -- Extend the API using custom layers ------------------------------------------------


class CustomDense(layers.Layer):
    def __init__(self, units=32):
        super().__init__()
        self.units = units

    def build(self, input_shape):
        self.w = self.add_weight(
            shape=(input_shape[-1], self.units),
            initializer="random_normal",
            trainable=True,
        )
        self.b = self.add_weight(
            shape=(self.units,), initializer="random_normal", trainable=True
        )

    def call(self, inputs):
        return ops.matmul(inputs, self.w) + self.b


inputs = keras.Input((4,))
outputs = CustomDense(10)(inputs)

model = keras.Model(inputs, outputs)


class CustomDense(layers.Layer):  # noqa: F811 (the guide's second version)
    def __init__(self, units=32):
        super().__init__()
        self.units = units

    def build(self, input_shape):
        self.w = self.add_weight(
            shape=(input_shape[-1], self.units),
            initializer="random_normal",
            trainable=True,
        )
        self.b = self.add_weight(
            shape=(self.units,), initializer="random_normal", trainable=True
        )

    def call(self, inputs):
        return ops.matmul(inputs, self.w) + self.b

    def get_config(self):
        return {"units": self.units}


inputs = keras.Input((4,))
outputs = CustomDense(10)(inputs)

model = keras.Model(inputs, outputs)
config = model.get_config()

new_model = keras.Model.from_config(config, custom_objects={"CustomDense": CustomDense})

# -- Mix-and-match API styles -------------------------------------------------------------

units = 32
timesteps = 10
input_dim = 5

# Define a Functional model
inputs = keras.Input((None, units))
x = layers.GlobalAveragePooling1D()(inputs)
outputs = layers.Dense(1)(x)
model = keras.Model(inputs, outputs)


class CustomRNN(layers.Layer):
    def __init__(self):
        super().__init__()
        self.units = units
        self.projection_1 = layers.Dense(units=units, activation="tanh")
        self.projection_2 = layers.Dense(units=units, activation="tanh")
        # Our previously-defined Functional model
        self.classifier = model

    def call(self, inputs):
        outputs = []
        state = ops.zeros(shape=(inputs.shape[0], self.units))
        for t in range(inputs.shape[1]):
            x = inputs[:, t, :]
            h = self.projection_1(x)
            y = h + self.projection_2(state)
            state = y
            outputs.append(y)
        features = ops.stack(outputs, axis=1)
        print(features.shape)
        return self.classifier(features)


rnn_model = CustomRNN()
_ = rnn_model(ops.zeros((1, timesteps, input_dim)))

units = 32
timesteps = 10
input_dim = 5
batch_size = 16


class CustomRNN(layers.Layer):  # noqa: F811 (the guide's second version)
    def __init__(self):
        super().__init__()
        self.units = units
        self.projection_1 = layers.Dense(units=units, activation="tanh")
        self.projection_2 = layers.Dense(units=units, activation="tanh")
        self.classifier = layers.Dense(1)

    def call(self, inputs):
        outputs = []
        state = ops.zeros(shape=(inputs.shape[0], self.units))
        for t in range(inputs.shape[1]):
            x = inputs[:, t, :]
            h = self.projection_1(x)
            y = h + self.projection_2(state)
            state = y
            outputs.append(y)
        features = ops.stack(outputs, axis=1)
        return self.classifier(features)


# Note that you specify a static batch size for the inputs with the `batch_shape`
# arg, because the inner computation of `CustomRNN` requires a static batch size
# (when you create the `state` zeros tensor).
inputs = keras.Input(batch_shape=(batch_size, timesteps, input_dim))
x = layers.Conv1D(32, 3)(inputs)
outputs = CustomRNN()(x)

model = keras.Model(inputs, outputs)

rnn_model = CustomRNN()
_ = rnn_model(ops.zeros((1, 10, 5)))


def last(history, key):
    return float(history.history[key][-1])


result = {
    "mnist_val_accuracy": last(history, "val_accuracy"),
    "test_loss": float(test_scores[0]),
    "test_accuracy": float(test_scores[1]),
    "reloaded_test_loss": float(reloaded_scores[0]),
    "reloaded_test_accuracy": float(reloaded_scores[1]),
    "autoencoder_output_shape": autoencoder_output_shape,
    "ticket_history_keys": sorted(ticket_history.history),
    "ticket_loss": last(ticket_history, "loss"),
    "ticket_priority_loss": last(ticket_history, "priority_loss"),
    "ticket_department_loss": last(ticket_history, "department_loss"),
    "resnet_accuracy": last(resnet_history, "acc"),
    "resnet_val_accuracy": last(resnet_history, "val_acc"),
    "resnet_loss": last(resnet_history, "loss"),
    "extracted_features": len(extracted_features),
    "from_config_layers": [type(layer).__name__ for layer in new_model.layers],
}
print("RESULT " + json.dumps(result), flush=True)

"""Mirrors keras-io examples/nlp/addition_rnn.py ("Sequence to sequence
learning for performing number addition", the Keras 3 version).

Keras features exercised:
- data made with NumPy's global random generator, unseeded, as keras.io makes
  it: `np.random.choice` and `np.random.randint` draw the questions,
  `np.random.shuffle` shuffles them, `np.random.randint` picks the validation
  samples shown after each iteration. Nothing in the script seeds anything
  (not even Keras' initializers): in a job every worker runs this code, and
  every worker must build the same arrays without the user seeding anything;
- a `keras.Sequential()` built with `model.add(...)`: `layers.Input`, an `LSTM`
  encoder, `RepeatVector`, an `LSTM(return_sequences=True)` decoder and a
  softmax `Dense` applied to every time step; `compile(loss=
  "categorical_crossentropy", optimizer="adam", metrics=["accuracy"])` on
  boolean one-hot arrays;
- `fit(x_train, y_train, batch_size=32, epochs=1, validation_data=(x_val,
  y_val))` called once per iteration of a Python loop (each call trains on), and
  `predict` of one validation sample at a time between the calls.

The RESULT line has a fingerprint of the arrays (sha256 of x and y after the
shuffle): the same on every worker of a job.

Changed from keras.io:
- 2 digits instead of 3 and 4000 questions instead of 50,000 (of the 5050
  distinct sums of two numbers below 100), 8 iterations instead of 30 (a
  model that gets about half of the answer characters right, 0.52..0.57).
- `fit(..., verbose=2)` (one line per epoch), `predict(rowx, verbose=0)`, and
  the return value of each `fit` kept (`history`) to report the last one.
- `dtype=bool` for keras.io's `dtype=np.bool`.

Prints one line `RESULT {json}` at the end.
"""
# ruff: noqa: I001

import hashlib
import json

import keras
import keras_elastic as ke
from keras import layers
import numpy as np

# Parameters for the model and dataset.
TRAINING_SIZE = 4000
DIGITS = 2
REVERSE = True

# Maximum length of input is 'int + int' (e.g., '345+678'). Maximum length of
# int is DIGITS.
MAXLEN = DIGITS + 1 + DIGITS


class CharacterTable:
    """Given a set of characters:
    + Encode them to a one-hot integer representation
    + Decode the one-hot or integer representation to their character output
    + Decode a vector of probabilities to their character output
    """

    def __init__(self, chars):
        """Initialize character table.
        # Arguments
            chars: Characters that can appear in the input.
        """
        self.chars = sorted(set(chars))
        self.char_indices = dict((c, i) for i, c in enumerate(self.chars))
        self.indices_char = dict((i, c) for i, c in enumerate(self.chars))

    def encode(self, C, num_rows):
        """One-hot encode given string C.
        # Arguments
            C: string, to be encoded.
            num_rows: Number of rows in the returned one-hot encoding. This is
                used to keep the # of rows for each data the same.
        """
        x = np.zeros((num_rows, len(self.chars)))
        for i, c in enumerate(C):
            x[i, self.char_indices[c]] = 1
        return x

    def decode(self, x, calc_argmax=True):
        """Decode the given vector or 2D array to their character output.
        # Arguments
            x: A vector or a 2D array of probabilities or one-hot representations;
                or a vector of character indices (used with `calc_argmax=False`).
            calc_argmax: Whether to find the character index with maximum
                probability, defaults to `True`.
        """
        if calc_argmax:
            x = x.argmax(axis=-1)
        return "".join(self.indices_char[x] for x in x)


# All the numbers, plus sign and space for padding.
chars = "0123456789+ "
ctable = CharacterTable(chars)

questions = []
expected = []
seen = set()
print("Generating data...")
while len(questions) < TRAINING_SIZE:
    f = lambda: int(  # noqa: E731 (keras.io's spelling)
        "".join(
            np.random.choice(list("0123456789"))
            for i in range(np.random.randint(1, DIGITS + 1))
        )
    )
    a, b = f(), f()
    # Skip any addition questions we've already seen
    # Also skip any such that x+Y == Y+x (hence the sorting).
    key = tuple(sorted((a, b)))
    if key in seen:
        continue
    seen.add(key)
    # Pad the data with spaces such that it is always MAXLEN.
    q = "{}+{}".format(a, b)  # noqa: UP032 (keras.io's spelling)
    query = q + " " * (MAXLEN - len(q))
    ans = str(a + b)
    # Answers can be of maximum size DIGITS + 1.
    ans += " " * (DIGITS + 1 - len(ans))
    if REVERSE:
        # Reverse the query, e.g., '12+345  ' becomes '  543+21'. (Note the
        # space used for padding.)
        query = query[::-1]
    questions.append(query)
    expected.append(ans)
print("Total questions:", len(questions))

print("Vectorization...")
x = np.zeros((len(questions), MAXLEN, len(chars)), dtype=bool)
y = np.zeros((len(questions), DIGITS + 1, len(chars)), dtype=bool)
for i, sentence in enumerate(questions):
    x[i] = ctable.encode(sentence, MAXLEN)
for i, sentence in enumerate(expected):
    y[i] = ctable.encode(sentence, DIGITS + 1)

# Shuffle (x, y) in unison as the later parts of x will almost all be larger
# digits.
indices = np.arange(len(y))
np.random.shuffle(indices)
x = x[indices]
y = y[indices]

# Explicitly set apart 10% for validation data that we never train over.
split_at = len(x) - len(x) // 10
(x_train, x_val) = x[:split_at], x[split_at:]
(y_train, y_val) = y[:split_at], y[split_at:]

print("Training Data:")
print(x_train.shape)
print(y_train.shape)

print("Validation Data:")
print(x_val.shape)
print(y_val.shape)

data_sha256 = hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest()

print("Build model...")
num_layers = 1  # Try to add more LSTM layers!

model = ke.wrap(keras.Sequential())
# "Encode" the input sequence using a LSTM, producing an output of size 128.
# Note: In a situation where your input sequences have a variable length,
# use input_shape=(None, num_feature).
model.add(layers.Input((MAXLEN, len(chars))))
model.add(layers.LSTM(128))
# As the decoder RNN's input, repeatedly provide with the last output of
# RNN for each time step. Repeat 'DIGITS + 1' times as that's the maximum
# length of output, e.g., when DIGITS=3, max output is 999+999=1998.
model.add(layers.RepeatVector(DIGITS + 1))
# The decoder RNN could be multiple layers stacked or a single layer.
for _ in range(num_layers):
    # By setting return_sequences to True, return not only the last output but
    # all the outputs so far in the form of (num_samples, timesteps,
    # output_dim). This is necessary as TimeDistributed in the below expects
    # the first dimension to be the timesteps.
    model.add(layers.LSTM(128, return_sequences=True))

# Apply a dense layer to the every temporal slice of an input. For each of step
# of the output sequence, decide which character should be chosen.
model.add(layers.Dense(len(chars), activation="softmax"))
model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
model.summary()

epochs = 9
batch_size = 32

shown = 0
shown_correct = 0

# Train the model each generation and show predictions against the validation
# dataset.
for epoch in range(1, epochs):
    print()
    print("Iteration", epoch)
    history = model.fit(
        x_train,
        y_train,
        batch_size=batch_size,
        epochs=1,
        validation_data=(x_val, y_val),
        verbose=2,
    )
    # Select 10 samples from the validation set at random so we can visualize
    # errors.
    for i in range(10):  # noqa: B007 (keras.io's spelling)
        ind = np.random.randint(0, len(x_val))
        rowx, rowy = x_val[np.array([ind])], y_val[np.array([ind])]
        preds = np.argmax(model.predict(rowx, verbose=0), axis=-1)
        q = ctable.decode(rowx[0])
        correct = ctable.decode(rowy[0])
        guess = ctable.decode(preds[0], calc_argmax=False)
        print("Q", q[::-1] if REVERSE else q, end=" ")
        print("T", correct, end=" ")
        if correct == guess:
            print("☑ " + guess)
        else:
            print("☒ " + guess)
        shown += 1
        shown_correct += correct == guess

result = {
    "questions": len(questions),
    "train_shape": list(x_train.shape),
    "data_sha256": data_sha256,
    "iterations": epochs - 1,
    "accuracy": float(history.history["accuracy"][-1]),
    "val_accuracy": float(history.history["val_accuracy"][-1]),
    "val_loss": float(history.history["val_loss"][-1]),
    "shown": shown,
    "shown_correct": int(shown_correct),
}
print("RESULT " + json.dumps(result), flush=True)

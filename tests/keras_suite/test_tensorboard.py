"""Keras' own `keras/src/callbacks/tensorboard_test.py`, unchanged, against
elastic models (the plugin: conftest.py; the manifest: expected.py)."""

from keras.src.callbacks.tensorboard_test import TestTensorBoardV2  # noqa: F401

"""Keras' own `keras/src/callbacks/early_stopping_test.py`, unchanged, against
elastic models (the plugin: conftest.py; the manifest: expected.py)."""

from keras.src.callbacks.early_stopping_test import EarlyStoppingTest  # noqa: F401

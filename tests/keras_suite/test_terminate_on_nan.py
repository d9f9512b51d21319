"""Keras' own `keras/src/callbacks/terminate_on_nan_test.py`, unchanged, against
elastic models (the plugin: conftest.py; the manifest: expected.py)."""

from keras.src.callbacks.terminate_on_nan_test import TerminateOnNaNTest  # noqa: F401

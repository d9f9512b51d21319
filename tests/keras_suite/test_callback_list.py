"""Keras' own `keras/src/callbacks/callback_test.py (the callback list)`, unchanged, against
elastic models (the plugin: conftest.py; the manifest: expected.py)."""

from keras.src.callbacks.callback_test import CallbackTest  # noqa: F401

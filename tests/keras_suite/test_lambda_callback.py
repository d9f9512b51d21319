"""Keras' own `keras/src/callbacks/lambda_callback_test.py`, unchanged, against
elastic models (the plugin: conftest.py; the manifest: expected.py)."""

from keras.src.callbacks.lambda_callback_test import LambdaCallbackTest  # noqa: F401

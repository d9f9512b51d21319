"""Keras' own `keras/src/callbacks/swap_ema_weights_test.py`, unchanged, against
elastic models (the plugin: conftest.py; the manifest: expected.py)."""

from keras.src.callbacks.swap_ema_weights_test import SwapEMAWeightsTest  # noqa: F401

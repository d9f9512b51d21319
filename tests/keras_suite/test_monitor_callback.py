"""Keras' own `keras/src/callbacks/monitor_callback_test.py`, unchanged, against
elastic models (the plugin: conftest.py; the manifest: expected.py)."""

from keras.src.callbacks.monitor_callback_test import MonitorCallbackTest  # noqa: F401

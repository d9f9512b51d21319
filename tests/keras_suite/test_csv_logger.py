"""Keras' own `keras/src/callbacks/csv_logger_test.py`, unchanged, against
elastic models (the plugin: conftest.py; the manifest: expected.py)."""

from keras.src.callbacks.csv_logger_test import CSVLoggerTest  # noqa: F401

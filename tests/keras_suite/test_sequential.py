"""Keras' own `keras/src/models/sequential_test.py`, unchanged, against
elastic models (the plugin: conftest.py; the manifest: expected.py)."""

from keras.src.models.sequential_test import SequentialTest  # noqa: F401

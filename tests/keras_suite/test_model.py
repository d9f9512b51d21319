"""Keras' own `keras/src/models/model_test.py`, unchanged, against
elastic models (the plugin: conftest.py; the manifest: expected.py)."""

from keras.src.models.model_test import ModelTest  # noqa: F401

"""Keras' own `keras/src/models/functional_test.py`, unchanged, against
elastic models (the plugin: conftest.py; the manifest: expected.py)."""

from keras.src.models.functional_test import FunctionalTest  # noqa: F401

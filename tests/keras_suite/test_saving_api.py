"""Keras' own `keras/src/saving/saving_api_test.py`, unchanged, against
elastic models (the plugin: conftest.py; the manifest: expected.py)."""

from keras.src.saving.saving_api_test import (  # noqa: F401
    LoadModelTests,
    LoadWeightsTests,
    SaveModelTests,
)

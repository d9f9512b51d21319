"""Keras' own `keras/src/callbacks/reduce_lr_on_plateau_test.py`, unchanged, against
elastic models (the plugin: conftest.py; the manifest: expected.py)."""

from keras.src.callbacks.reduce_lr_on_plateau_test import ReduceLROnPlateauTest  # noqa: F401

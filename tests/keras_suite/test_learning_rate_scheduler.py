"""Keras' own `keras/src/callbacks/learning_rate_scheduler_test.py`, unchanged, against
elastic models (the plugin: conftest.py; the manifest: expected.py)."""

from keras.src.callbacks.learning_rate_scheduler_test import LearningRateSchedulerTest  # noqa: F401

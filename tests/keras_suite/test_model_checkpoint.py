"""Keras' own `keras/src/callbacks/model_checkpoint_test.py`, unchanged,
against elastic models: Keras' ModelCheckpoint on ke models (the port to our
ShardedModelCheckpoint is tests/test_keras_model_checkpoint_parity.py). The
plugin: conftest.py; the manifest: expected.py."""

from keras.src.callbacks.model_checkpoint_test import ModelCheckpointTest  # noqa: F401

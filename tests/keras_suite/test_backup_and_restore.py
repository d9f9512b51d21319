"""Keras' own `keras/src/callbacks/backup_and_restore_test.py`, unchanged, against
elastic models (the plugin: conftest.py; the manifest: expected.py)."""

from keras.src.callbacks.backup_and_restore_test import BackupAndRestoreCallbackTest  # noqa: F401

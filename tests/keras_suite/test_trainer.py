"""Keras' own `keras/src/trainers/trainer_test.py` against elastic models.

It cannot run unchanged (it imports jax at the top): the copy in
upstream/trainer_test.py differs by upstream/trainer_test.py.diff only
(test_upstream_diffs.py checks it). The plugin: conftest.py; the manifest:
expected.py.
"""

from .upstream.trainer_test import (  # noqa: F401
    JAXTrainerCorrectnessTest,
    TestTrainer,
)

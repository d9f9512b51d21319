"""Errors of the data an elastic job reads (`keras_elastic.data`)."""

from __future__ import annotations

from keras_elastic.common import errors


class NondeterministicDatasetError(errors.DataError, RuntimeError):
    """`dataset_fn` gave other elements for the same records than before.

    Exactly-once training replays a task after a failure by running
    `dataset_fn` again and skipping what the parameter servers already
    applied, which needs the same elements in the same order. Seed its
    shuffles and random ops, or pass `ElasticDataset(deterministic=False)`
    when it only augments each record at random.
    """

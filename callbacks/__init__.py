"""Keras callbacks of keras-elastic, importable as `keras_elastic.callbacks`."""

from .periodic_evaluation import PeriodicEvaluation
from .sharded_model_checkpoint import ShardedModelCheckpoint

__all__ = ["PeriodicEvaluation", "ShardedModelCheckpoint"]

"""The project card's top-level `callbacks/` folder: a thin re-export of
`keras_elastic.callbacks`, whose modules live in keras_elastic/callbacks/.

From a source checkout (`PYTHONPATH=.`), `import callbacks` and
`import keras_elastic.callbacks` give the same classes.
"""

from keras_elastic.callbacks import PeriodicEvaluation, ShardedModelCheckpoint

__all__ = ["PeriodicEvaluation", "ShardedModelCheckpoint"]

"""Keras callbacks of keras-elastic (`ke.callbacks`).

`ShardedModelCheckpoint` saves `tf.train.Checkpoint`s through checkpoint
sharding callbacks; `PeriodicEvaluation` evaluates every N model versions
during training.

May import: common, checkpoint, dataset, worker, model. Callbacks are the top
of the library: what a user's script adds to `fit`.
Nothing below imports them; the worker finds a restoring checkpoint callback
through `worker.checkpoint_resume.RestoringCheckpoint`, which it implements.

Example:

```python
model.fit(train, epochs=3, callbacks=[
    ke.callbacks.ShardedModelCheckpoint("/tmp/ckpts/")])
```
"""

from keras_elastic.callbacks.periodic_evaluation import PeriodicEvaluation
from keras_elastic.callbacks.sharded_model_checkpoint import ShardedModelCheckpoint

__all__ = ["PeriodicEvaluation", "ShardedModelCheckpoint"]

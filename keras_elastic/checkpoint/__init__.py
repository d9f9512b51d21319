"""Sharded, validated, crash-safe checkpoints (seed 001).

Write checkpoints through any `tf.train.experimental.ShardingCallback`, with
the callback's shards checked before anything is written, each checkpoint
appearing atomically as a directory with a `manifest.json`:

```python
import keras
import numpy as np
import tensorflow as tf
import keras_elastic as ke

model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
x, y = np.ones((8, 4)), np.ones((8, 1))
model.fit(x, y, epochs=2, verbose=0, callbacks=[
    ke.callbacks.ShardedModelCheckpoint(
        "/tmp/ckpts/", sharding_callback=tf.train.experimental.MaxShardSizePolicy(
            max_shard_size=1 << 20))])
info = ke.checkpoint.latest("/tmp/ckpts")
print(info.epoch, info.num_shards, info.description)
ke.checkpoint.restore_model(model, "/tmp/ckpts")
```
"""

from keras_elastic.checkpoint.errors import CheckpointError, ShardingCallbackError
from keras_elastic.checkpoint.export import export_keras
from keras_elastic.checkpoint.layout import (
    delete_checkpoint,
    latest,
    list_checkpoints,
    prune,
    remove_stale,
)
from keras_elastic.checkpoint.manifest import (
    MANIFEST_NAME,
    SaveInfo,
    read_manifest,
    write_manifest,
)
from keras_elastic.checkpoint.reader import (
    initial_epoch,
    resolve,
    restore_model,
    restore_trackables,
)
from keras_elastic.checkpoint.validation import (
    ValidatingShardingCallback,
    validate_shards,
)
from keras_elastic.checkpoint.writer import CheckpointWriter, save_trackables

__all__ = [
    "MANIFEST_NAME",
    "CheckpointError",
    "CheckpointWriter",
    "SaveInfo",
    "ShardingCallbackError",
    "ValidatingShardingCallback",
    "delete_checkpoint",
    "export_keras",
    "initial_epoch",
    "latest",
    "list_checkpoints",
    "prune",
    "read_manifest",
    "remove_stale",
    "resolve",
    "restore_model",
    "restore_trackables",
    "save_trackables",
    "validate_shards",
    "write_manifest",
]

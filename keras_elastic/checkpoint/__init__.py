"""Sharded, validated, crash-safe checkpoints.

May import: common, layers.

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

import importlib

# Imported on first use: the launcher reads and writes manifests (layout,
# manifest, errors) without TensorFlow.
_LAZY = {
    "CheckpointError": "errors", "ModelMismatchError": "errors",
    "ShardingCallbackError": "errors", "NoIntactCheckpointError": "errors",
    "export_keras": "export",
    "delete_checkpoint": "layout", "latest": "layout", "list_checkpoints": "layout",
    "latest_intact": "layout", "verify": "integrity",
    "prune": "layout", "remove_stale": "layout",
    "MANIFEST_NAME": "manifest", "SaveInfo": "manifest", "read_manifest": "manifest",
    "write_manifest": "manifest",
    "initial_epoch": "reader", "resolve": "reader", "restore_model": "reader",
    "restore_trackables": "reader",
    "ValidatingShardingCallback": "validation", "validate_shards": "validation",
    "CheckpointWriter": "writer", "save_trackables": "writer",
}


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(f"keras_elastic.checkpoint.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'keras_elastic.checkpoint' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))


__all__ = [
    "MANIFEST_NAME",
    "CheckpointError",
    "CheckpointWriter",
    "ModelMismatchError",
    "NoIntactCheckpointError",
    "SaveInfo",
    "ShardingCallbackError",
    "ValidatingShardingCallback",
    "delete_checkpoint",
    "export_keras",
    "initial_epoch",
    "latest",
    "latest_intact",
    "list_checkpoints",
    "prune",
    "read_manifest",
    "remove_stale",
    "resolve",
    "restore_model",
    "restore_trackables",
    "save_trackables",
    "validate_shards",
    "verify",
    "write_manifest",
]

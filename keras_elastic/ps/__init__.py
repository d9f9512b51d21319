"""Parameter servers: own the variables, apply gradients with a Keras optimizer.

May import: common, proto, checkpoint.
The client (`ps.client`), the partitioning and the task log import no
TensorFlow: the launcher uses them.
"""

import importlib

# Pure Python, imported now: the function `partition` must shadow its module.
from keras_elastic.ps.partition import partition, ps_for

_LAZY = {
    "PSClient": "keras_elastic.ps.client",
    "ParameterServer": "keras_elastic.ps.server",
    "ParameterStore": "keras_elastic.ps.store",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'keras_elastic.ps' has no attribute {name!r}")


__all__ = ["PSClient", "ParameterServer", "ParameterStore", "partition", "ps_for"]

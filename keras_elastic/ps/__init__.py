"""Parameter servers: own the variables, apply gradients with a Keras optimizer.

May import: keras_elastic.common, keras_elastic.proto, keras_elastic.checkpoint.
"""

from keras_elastic.ps.client import PSClient
from keras_elastic.ps.partition import partition, ps_for
from keras_elastic.ps.server import ParameterServer
from keras_elastic.ps.store import ParameterStore

__all__ = ["PSClient", "ParameterServer", "ParameterStore", "partition", "ps_for"]

"""The worker side: the cluster connection, the task-fed input stream, the link
between a Keras model and the parameter servers.

May import: common, proto, data, batching, prediction, layers, checkpoint,
master, ps, dataset. Of master and ps: their clients, their servers only to
start the embedded cluster. Never keras_elastic.callbacks, the model or the
CLI above it (a checkpoint callback is found by
`checkpoint_resume.RestoringCheckpoint`).
"""

from keras_elastic.common.variable_keys import variable_keys
from keras_elastic.worker.cluster import Cluster, get_cluster, is_chief, reset_cluster
from keras_elastic.worker.model_sync import ModelSync
from keras_elastic.worker.task_stream import TaskStream

__all__ = ["Cluster", "ModelSync", "TaskStream", "get_cluster", "is_chief",
           "reset_cluster", "variable_keys"]

"""The master: cuts data into tasks, hands them out per epoch, tracks workers.

May import: common, proto. Never TensorFlow: the
master runs without it.
"""

from keras_elastic.master.client import MasterClient
from keras_elastic.master.server import MasterServer
from keras_elastic.master.task_queue import DatasetSpec, DatasetTasks, Task

__all__ = ["DatasetSpec", "DatasetTasks", "MasterClient", "MasterServer", "Task"]

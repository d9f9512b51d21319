"""Data sources the master cuts into tasks and workers read task by task.

A source has named shards with a known number of records each; a task is a
record range `[start, end)` of one shard. `TFRecordSource` reads TFRecord files
through a cached record-offset index (a task seeks to its first record);
`ArraySource` serves in-memory NumPy arrays (every worker builds the same
arrays); `ArrayRecordSource` reads ArrayRecord files at random (counts from
their footers, no index); `TFDSSource` reads the files of a prepared
TensorFlow Datasets split (counts from its dataset info) and decodes them with
the dataset's features (`ElasticDataset.from_tfds`).

May import: common. `source.py` is the interface, `factory.py` (`as_source`)
chooses among the sources.
"""

from keras_elastic.data.array_record import ArrayRecordSource
from keras_elastic.data.arrays import ArraySource
from keras_elastic.data.factory import as_source
from keras_elastic.data.source import DataSource
from keras_elastic.data.tfds import TFDSSource
from keras_elastic.data.tfrecord import TFRecordSource

__all__ = ["ArrayRecordSource", "ArraySource", "DataSource", "TFDSSource",
           "TFRecordSource", "as_source"]

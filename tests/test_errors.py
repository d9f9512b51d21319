"""Bad input gets a clear error naming what is wrong and where."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from support.tfrecord_data import make_arrays

import keras_elastic as ke
from keras_elastic.data import DataSource
from keras_elastic.master.client import JobFailedError
from keras_elastic.master.server import MasterServer
from keras_elastic.worker import cluster as cluster_mod


def small_model(cls=ke.Model, units=2):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    model = cls(inputs, keras.layers.Dense(units, activation="softmax")(inputs))
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return model


def test_dataset_fn_returning_wrong_structure(embedded_cluster):
    x, y = make_arrays(64)

    def features_only(records, mode):
        return records.map(lambda xi, yi: {"x": xi})

    ds = ke.ElasticDataset((x, y), dataset_fn=features_only, batch_size=8)
    with pytest.raises(ValueError, match=r"dataset_fn '.*features_only' returned "
                       r"elements of structure .*in training mode each element must "
                       r"be a tuple \(features, labels\)"):
        small_model().fit(ds, epochs=1, verbose=0)


def test_dataset_fn_not_returning_a_dataset(embedded_cluster):
    x, y = make_arrays(64)
    ds = ke.ElasticDataset((x, y), dataset_fn=lambda records, mode: [1, 2],
                           batch_size=8)
    with pytest.raises(TypeError, match="must return a tf.data.Dataset of unbatched "
                       "elements, but returned list"):
        small_model().fit(ds, epochs=1, verbose=0)


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
    ({"minibatches_per_task": -1}, "minibatches_per_task must be a positive integer"),
    ({"mode": "train"}, "mode must be one of"),
    ({"dataset_fn": 3}, "dataset_fn must be callable, got int"),
])
def test_elastic_dataset_argument_errors(kwargs, message):
    x, y = make_arrays(8)
    with pytest.raises((ValueError, TypeError), match=message):
        ke.ElasticDataset((x, y), **kwargs)


def test_fit_arguments_that_do_not_apply(embedded_cluster):
    x, y = make_arrays(64)
    with pytest.raises(ValueError, match="needs an ElasticDataset in 'training' mode"):
        small_model().fit(ke.ElasticDataset((x, y), mode="evaluation"))


class FlakyDisk(DataSource):
    """Arrays whose shard 'b' cannot be read (a real exception each time)."""

    def __init__(self):
        self.x, self.y = make_arrays(40)

    def shards(self):
        return [("a", 20), ("b", 20)]

    def read(self, shard, start, end):
        if shard == "b":
            raise OSError(f"read error on /data/b at record {start}")
        return self.x[start:end], self.y[start:end]

    @property
    def record_spec(self):
        return (tf.TensorSpec([8], tf.float32), tf.TensorSpec([], tf.int64))


def test_task_failing_repeatedly_fails_the_job_naming_task_file_and_cause(
        embedded_cluster):
    ds = ke.ElasticDataset(FlakyDisk(), batch_size=10, minibatches_per_task=2)
    with pytest.raises(JobFailedError, match=(
            r"dataset 'training': task 1 \(b records \[0, 20\)\) of epoch 0 failed 3 "
            r"times; last error, on worker 0: OSError: read error on /data/b at "
            r"record 0")):
        small_model().fit(ds, epochs=1, verbose=0)


def test_a_different_model_on_the_parameter_server_is_refused(embedded_cluster):
    x, y = make_arrays(64)
    small_model().fit(ke.ElasticDataset((x, y), batch_size=8), epochs=1, verbose=0)
    # Another worker of the job whose script builds a different first model:
    # a fresh process numbers its models from the first again.
    embedded_cluster.__dict__["_ke_models"] = 0
    with pytest.raises(ValueError, match=r"already holds a different model: variable "
                       r"'0000/kernel' is \('float32', \(8, 2\), True\) there but "
                       r"\('float32', \(8, 3\), True\) in this worker's model"):
        small_model(units=3).fit(ke.ElasticDataset((x, y), batch_size=8, name="other"),
                                 epochs=1, verbose=0)


def test_unreachable_parameter_server_is_named(monkeypatch):
    cluster_mod.reset_cluster()
    master = MasterServer()
    try:
        monkeypatch.setenv("KERAS_ELASTIC_MASTER", master.address)
        monkeypatch.setenv("KERAS_ELASTIC_PS", "127.0.0.1:1")
        monkeypatch.setenv("KERAS_ELASTIC_CONNECT_TIMEOUT", "1")
        with pytest.raises(ConnectionError, match=r"cannot reach the parameter server "
                           r"at 127\.0\.0\.1:1 within 1 s"):
            cluster_mod.get_cluster()
    finally:
        master.stop()
        cluster_mod.reset_cluster()


def test_unreachable_master_is_named(monkeypatch):
    cluster_mod.reset_cluster()
    monkeypatch.setenv("KERAS_ELASTIC_MASTER", "127.0.0.1:2")
    monkeypatch.setenv("KERAS_ELASTIC_PS", "127.0.0.1:1")
    monkeypatch.setenv("KERAS_ELASTIC_CONNECT_TIMEOUT", "1")
    with pytest.raises(ConnectionError, match=r"cannot reach the master at "
                       r"127\.0\.0\.1:2"):
        cluster_mod.get_cluster()
    cluster_mod.reset_cluster()


def test_bad_cluster_environment(monkeypatch):
    cluster_mod.reset_cluster()
    monkeypatch.setenv("KERAS_ELASTIC_MASTER", "127.0.0.1:2")
    monkeypatch.setenv("KERAS_ELASTIC_PS", "")
    with pytest.raises(ValueError, match="KERAS_ELASTIC_PS is empty"):
        cluster_mod.get_cluster()
    cluster_mod.reset_cluster()


def test_model_must_be_compiled(embedded_cluster):
    x, y = make_arrays(16)
    inputs = keras.Input((8,))
    model = ke.Model(inputs, keras.layers.Dense(2)(inputs))
    with pytest.raises(ValueError, match="compile the model"):
        model.fit(ke.ElasticDataset((x, y), batch_size=8), epochs=1, verbose=0)


def test_wrap_rejects_non_models():
    with pytest.raises(TypeError, match=r"ke.wrap expects a keras.Model .*, got Dense"):
        ke.wrap(keras.layers.Dense(2))


def test_another_backend_is_refused(monkeypatch):
    from keras_elastic import _backend

    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    with pytest.raises(ImportError, match="needs Keras 3 with the TensorFlow backend, "
                       "but Keras is using the 'jax' backend"):
        _backend.check_tensorflow_backend()


def test_arrays_of_different_lengths_in_fit(embedded_cluster):
    with pytest.raises(ValueError, match="different numbers of records"):
        small_model().fit(np.zeros((10, 8), "float32"), np.zeros(9, "int64"), verbose=0)

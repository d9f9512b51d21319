"""ElasticDL model-zoo compatibility: `keras-elastic train | evaluate | predict
--model_zoo=DIR --model_def=package.module.custom_model` runs modules written
in ElasticDL's conventions (tests/model_zoo/) without edits.

Fast in-process tests for the flag mapping, the refused flags, the `elasticdl`
import path (active only while such a module loads), the exact per-example
metrics, the loss hook and the learning-rate schedule; then one real 2-worker
job per module: train with validation, evaluate and predict on one checkpoint.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, subprocess_env

from keras_elastic.common.errors import DataError
from keras_elastic.jobs import job_flags, zoo_hooks
from keras_elastic.jobs.elasticdl_compat import ElasticDLFinder
from keras_elastic.jobs.model_def import ModelDefError, check_model_def, load_model_def

TESTS = os.path.dirname(os.path.abspath(__file__))
ZOO = os.path.join(TESTS, "model_zoo")


def cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "keras_elastic", *args],
                          env=subprocess_env(**(env or {})), capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


# -- flags ------------------------------------------------------------------
def test_elasticdl_flag_names_are_rewritten_or_refused():
    assert job_flags.rewrite_elasticdl_args(
        ["--num_ps_pods=2", "--relaunch_on_worker_failure", "5",
         "--checkpoint_dir_for_init=/c/", "--minibatch_size=8", "--grads_to_wait=2",
         "--use_async=true", "--distribution_strategy=ParameterServerStrategy"]) == [
        "--num_ps=2", "--max_worker_restarts", "5", "--checkpoint_dir=/c/",
        "--minibatch_size=8", "--grads_to_wait=2", "--use_async=true",
        "--distribution_strategy=ParameterServerStrategy"]
    for arg, instead in [
            ("--image_name=reg/zoo:v1", "--backend ray"),
            ("--image_base=python:3.6", "without a Docker image"),
            ("--docker_image_repository=reg", "without a Docker image"),
            ("--master_resource_request=cpu=1", "--master_resources"),
            ("--worker_pod_priority=high", "--min_workers/--max_workers"),
            ("--volume=host_path=/d,mount_path=/d", "every process"),
            ("--cluster_spec=spec.py", "--backend ray --ray_address"),
            ("--job_name=j", "--job_dir"),
            ("--need_tf_config", "no counterpart"),
            ("--custom_data_reader=r", "TFRecord"),
            ("--num_ps_pods=0", "--num_ps=N")]:
        with pytest.raises(ValueError) as e:
            job_flags.rewrite_elasticdl_args(["--minibatch_size=8", arg,
                                              "--checkpoint_dir=/c/"])
        assert "does not apply" in str(e.value) and instead in str(e.value), arg
    with pytest.raises(ValueError, match="is --checkpoint_dir here, which is given too "
                       "with another value: give one"):
        job_flags.rewrite_elasticdl_args(["--checkpoint_dir_for_init=/a/",
                                          "--checkpoint_dir=/b/"])


@pytest.mark.multiprocess
def test_refused_flags_through_the_cli(tmp_path):
    model_def = ["--model_zoo=tests/model_zoo",
                 "--model_def=mnist.mnist_functional_api.custom_model"]
    result = cli("train", *model_def, "--training_data=/x", "--image_name=zoo:v1")
    assert result.returncode == 2
    assert "--image_name (an ElasticDL flag) does not apply" in result.stderr
    data = tmp_path / "d"
    data.mkdir()
    (data / "a.tfrecord").write_bytes(b"")
    for args, message in [
            (["--distribution_strategy=AllreduceStrategy"],
             "--distribution_strategy=AllreduceStrategy does not apply: keras-elastic "
             "trains with parameter servers"),
            (["--model_def=mnist.nothing_here.custom_model"],
             "module 'mnist.nothing_here' is not in the model zoo"),
            (["--model_def=mnist.mnist_functional_api.CustomModel"],
             "does not define 'CustomModel' (the model function)"),
            (["--model_params=a"], "--model_params: 'a' is not name=value"),
            (["--loss=my_loss"], "--loss=my_loss: the module "
             f"{ZOO}/mnist/mnist_functional_api.py does not define 'my_loss' (the "
             "default is 'loss')"),
            (["--prediction_outputs_processor=Processor"],
             "--prediction_outputs_processor=Processor: the module"),
            (["--ps_embedding_admit_after=2"], "--ps_embedding_admit_after apply to "
             "the tables --ps_embeddings_above puts on the parameter servers: give "
             "--ps_embeddings_above too")]:
        result = cli("train", *model_def, f"--training_data={data}", *args)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr, result.stderr
        assert "started worker" not in result.stderr


def test_model_def_forms():
    path = os.path.join(ZOO, "mnist", "mnist_subclass.py")
    assert check_model_def("mnist.mnist_subclass.CustomModel", ZOO) == path
    assert check_model_def("mnist.mnist_subclass:CustomModel", ZOO) == path
    assert check_model_def("x.CustomModel", path) == path  # --model_zoo=file.py
    assert check_model_def("deepfm.deepfm_functional_api.custom_model", ZOO,
                           feed="feed").endswith("deepfm_functional_api.py")
    with pytest.raises(ModelDefError, match="does not define 'my_feed' \\(--feed\\)"):
        check_model_def("mnist.mnist_subclass.CustomModel", ZOO, feed="my_feed")
    with pytest.raises(ModelDefError, match="must look like 'package.module:function'"):
        check_model_def("custom_model")
    assert zoo_hooks and job_flags.worker_data(os.path.join(ZOO, "mnist")) == sorted(
        glob.glob(os.path.join(ZOO, "mnist", "*.py")))
    assert job_flags.worker_data("a-*,b") == ["a-*", "b"]


# -- the elasticdl import path ------------------------------------------------
def _elasticdl_importable() -> bool:
    try:
        __import__("elasticdl.python.common.constants")
    except ImportError:
        return False
    return True


def test_elasticdl_import_path_only_while_a_module_loads():
    assert not _elasticdl_importable()
    module, model_fn, feed = load_model_def(
        "mnist.mnist_subclass.CustomModel", ZOO)
    assert module.Mode.PREDICTION == "prediction" and model_fn is module.CustomModel
    assert feed is module.feed
    assert module.LearningRateScheduler(lambda v: 0.1).schedule(3) == 0.1
    # Gone after the import: not importable, not in sys.modules or sys.meta_path.
    assert not _elasticdl_importable()
    assert not [k for k in sys.modules if k.split(".")[0] == "elasticdl"]
    assert not [f for f in sys.meta_path if isinstance(f, ElasticDLFinder)]
    # Modules without a stand-in say what to use instead.
    finder = ElasticDLFinder()
    with pytest.raises(ImportError, match="use keras_elastic.layers.Embedding"):
        finder.find_spec("elasticdl.python.elasticdl.layers.embedding")
    with pytest.raises(ImportError, match="Keras preprocessing layers"):
        finder.find_spec("elasticdl.python.elasticdl.feature_column")
    with pytest.raises(ImportError, match="convert RecordIO/CSV/ODPS data to TFRecord"):
        finder.find_spec("elasticdl.python.data.reader.csv_reader")
    assert finder.find_spec("numpy") is None


def test_a_ctr_module_importing_the_recordio_reader_loads_and_its_hook_says_why_not():
    # ElasticDL's CTR modules import RecordIODataReader at the top for their
    # optional custom_data_reader hook: the module loads; the hook, which
    # keras-elastic never calls, fails with what to do if called.
    module, _, _ = load_model_def("deepfm.deepfm_functional_api.custom_model", ZOO,
                                  feed="feed")
    with pytest.raises(DataError, match="RecordIO is not a keras-elastic data "
                                        "format: convert the data to TFRecord"):
        module.custom_data_reader("data/")
    assert not _elasticdl_importable()


# -- hooks --------------------------------------------------------------------
def test_per_example_metric_is_an_exact_mean_across_batches_and_workers():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, size=(103, 1)).astype("int32")
    logits = rng.normal(size=(103, 3)).astype("float32")

    def accuracy(y, p):
        return tf.equal(tf.argmax(p, 1, output_type=tf.int32),
                        tf.cast(tf.reshape(y, [-1]), tf.int32))

    expected = float(np.mean(logits.argmax(1) == labels[:, 0]))
    # Two "workers" with uneven batches; their states summed, as the master does.
    states = []
    for part in (slice(0, 61), slice(61, 103)):
        m = zoo_hooks.PerExampleMean("accuracy", accuracy)
        x, y = logits[part], labels[part]
        for start in range(0, len(x), 17):
            m.update_state(y[start:start + 17], x[start:start + 17])
        states.append([v.numpy() for v in m.variables])
    total = zoo_hooks.PerExampleMean("accuracy", accuracy)
    for variable, *values in zip(total.variables, *states):
        variable.assign(sum(values))
    assert float(total.result()) == pytest.approx(expected, abs=1e-7)
    assert float(total.count.numpy()) == 103
    assert all(getattr(v, "aggregation", "sum") == "sum" for v in total.variables)
    # A scalar is a batch mean, weighed by the batch size.
    m = zoo_hooks.PerExampleMean("mean_acc", lambda y, p: tf.reduce_mean(
        tf.cast(accuracy(y, p), tf.float32)))
    m.update_state(labels[:3], logits[:3])
    m.update_state(labels[3:103], logits[3:103])
    assert float(m.result()) == pytest.approx(expected, abs=1e-6)
    # Sample weights weigh examples.
    m = zoo_hooks.PerExampleMean("w", lambda y, p: tf.reshape(y, [-1]))
    m.update_state(np.array([[1], [3]]), logits[:2], sample_weight=np.array([3.0, 1.0]))
    assert float(m.result()) == pytest.approx(1.5)
    pairs = zoo_hooks.eval_metrics({"logits": {"acc": accuracy},
                                    "probs": {"auc": tf.keras.metrics.AUC()}},
                                   ["logits", "probs"])
    assert [(o, m.name) for o, m in pairs] == [("logits", "logits_acc"),
                                               ("probs", "probs_auc")]
    with pytest.raises(ValueError, match="'prob' is not an output"):
        zoo_hooks.eval_metrics({"prob": {"auc": accuracy}}, ["logits", "probs"])


def test_loss_hook_sees_raw_labels_and_leaves_out_weighed_out_elements():
    seen = {}

    def loss(labels, predictions):
        seen["dtype"] = labels.dtype
        return tf.reduce_mean(tf.cast(tf.reshape(labels, [-1]), tf.float32)
                              * predictions["logits"])

    y = tf.constant([[1], [2], [4]], tf.int32)
    pred = {"logits": tf.constant([1.0, 1.0, 1.0])}
    assert float(zoo_hooks.zoo_loss(loss, y, pred, None)) == pytest.approx(7 / 3)
    assert seen["dtype"] == tf.int32
    weights = tf.constant([1.0, 0.0, 1.0])
    assert float(zoo_hooks.zoo_loss(loss, y, pred, weights)) == pytest.approx(2.5)
    assert float(zoo_hooks.zoo_loss(loss, y, pred, tf.zeros([3]))) == 0.0
    # A per-example loss: the weighted mean.
    per_example = zoo_hooks.zoo_loss(lambda a, b: tf.cast(a[:, 0], tf.float32), y,
                                     pred, weights)
    assert float(per_example) == pytest.approx(2.5)


def test_loss_in_elasticdl_older_output_labels_order_gets_them_in_that_order():
    def old(output, labels):  # ElasticDL's first model zoo
        return tf.reduce_mean(output["logits"] - tf.cast(labels, tf.float32))

    def new(labels, predictions):
        return tf.reduce_mean(predictions["logits"] - tf.cast(labels, tf.float32))

    y = tf.constant([1, 2, 4], tf.int32)
    pred = {"logits": tf.constant([10.0, 10.0, 10.0])}
    for loss in (old, new):
        assert float(zoo_hooks.zoo_loss(zoo_hooks.labels_first(loss), y, pred,
                                        None)) == pytest.approx(10 - 7 / 3), loss


# -- TensorFlow functions on symbolic tensors (Keras 2 modules) ------------------
def test_tf_functions_on_symbolic_tensors_become_layers_that_save_and_load(tmp_path):
    import keras
    import tensorflow.keras.backend as K

    from keras_elastic.jobs import tf_op_layers

    tf_op_layers.enable()
    inputs = keras.Input((3, 2))
    summed = K.sum(inputs, axis=1)  # tf.keras.backend, as ElasticDL's deepfm
    halved = 0.5 * keras.layers.Subtract()([summed, K.square(summed)])
    outputs = tf.cast(tf.reshape(tf.sigmoid(halved), (-1, 1)) > 0.5, tf.float32)
    model = keras.Model(inputs, {"p": tf.sigmoid(halved), "bit": outputs})
    assert sum(type(layer).__name__ == "TFOpLayer" for layer in model.layers) == 6
    x = np.random.default_rng(0).normal(size=(4, 3, 2)).astype("float32")
    got = model(x)
    s = x.sum(axis=1)
    p = 1 / (1 + np.exp(-0.5 * (s - s * s)))
    np.testing.assert_allclose(got["p"], p, rtol=1e-5)
    np.testing.assert_array_equal(got["bit"], (p.reshape(-1, 1) > 0.5).astype("float32"))
    # A .keras file names each function by its TensorFlow API name.
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(loaded(x)["p"], p, rtol=1e-5)
    names = {layer.get_config()["function"] for layer in loaded.layers
             if type(layer).__name__ == "TFOpLayer"}
    assert names == {"math.reduce_sum", "math.square", "reshape", "math.sigmoid",
                     "cast"}, names
    # A NumPy array argument is kept with its dtype.
    picked = keras.Model(inputs, tf.gather(inputs, np.array([2, 0], "int64"), axis=1))
    picked.save(tmp_path / "g.keras")
    np.testing.assert_array_equal(keras.saving.load_model(tmp_path / "g.keras")(x),
                                  x[:, [2, 0]])
    # Calls on real tensors are TensorFlow's as before.
    assert float(tf.reduce_sum(tf.ones([2, 2]))) == 4.0


def test_a_tf_function_layer_that_cannot_be_saved_says_why(tmp_path):
    import keras

    from keras_elastic.jobs import tf_op_layers

    tf_op_layers.enable()
    # A dispatchable function with no TensorFlow API name, refusing symbolic
    # tensors as TensorFlow's functions do.
    def add_one(x):
        if isinstance(x, keras.KerasTensor):
            raise TypeError("a symbolic tensor")
        return x + 1.0

    plus_one = tf.__internal__.dispatch.add_dispatch_support(add_one)
    inputs = keras.Input((2,))
    model = keras.Model(inputs, plus_one(inputs))
    assert float(model(np.zeros((1, 2), "float32"))[0, 0]) == 1.0
    with pytest.raises(NotImplementedError, match="no TensorFlow API name, so it "
                       "cannot be saved in a .keras file: save a checkpoint, or use "
                       "keras.ops or a Keras layer for it"):
        model.save(tmp_path / "m.keras")
    # An argument a .keras file cannot hold (NumPy arrays, dtypes, shapes can).
    inputs = keras.Input((3,))
    picked = tf.gather(inputs, np.array([2, 0]), axis=1)
    model = keras.Model(inputs, tf.gather(picked, tf.constant([1]), axis=1))
    np.testing.assert_array_equal(model(np.array([[1.0, 2.0, 3.0]], "float32")), [[1.0]])
    with pytest.raises(NotImplementedError, match=r"calls a TensorFlow function with an "
                       r"argument of type EagerTensor \(.*\), which a .keras file "
                       "cannot hold: save a checkpoint, or use keras.ops or a Keras "
                       "layer for it"):
        model.save(tmp_path / "m2.keras")
    with pytest.raises(ValueError, match=r"TFOpLayer: tf.math.no_such_op is not a "
                       "TensorFlow function of this TensorFlow version"):
        tf_op_layers.TFOpLayer("math.no_such_op")


def test_learning_rate_scheduler_becomes_a_schedule_of_the_servers_version():
    import keras

    rate = zoo_hooks.tabulate_schedule(lambda v: 0.5 if v < 100 else 0.2, 300)
    optimizer = zoo_hooks.with_learning_rate(keras.optimizers.SGD(0.01), rate)
    # What a parameter server builds from the worker's config.
    on_server = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    for version, expected in [(0, 0.5), (99, 0.5), (100, 0.2), (10_000, 0.2)]:
        on_server.iterations.assign(version)
        assert float(on_server.learning_rate) == pytest.approx(expected), version
    assert zoo_hooks.tabulate_schedule(lambda v: 0.1, 50) == 0.1
    with pytest.raises(ValueError, match="LearningRateSchedule from optimizer"):
        zoo_hooks.tabulate_schedule(lambda v: 1.0 / (v + 1), 5000)


def test_hooks_a_job_does_not_use_are_named():
    """ElasticDL's mnist_functional_api.py has prepare_data_for_a_single_file
    (its data conversion hook); a module may define both dataset_fn and feed,
    or learning_rate_scheduler beside a LearningRateScheduler callback; a
    compiled model leaves loss, optimizer and eval_metrics_fn unused."""
    import types

    from keras_elastic.jobs.runner import unused_hooks

    module, _, _ = load_model_def("mnist.mnist_functional_api.custom_model", ZOO)
    assert [n for n, _ in unused_hooks(module, False, "dataset_fn", None)] == [
        "prepare_data_for_a_single_file"]
    unused = dict(unused_hooks(module, True, "dataset_fn", None))
    assert list(unused) == ["loss", "optimizer", "eval_metrics_fn",
                            "prepare_data_for_a_single_file"]
    assert "returned a compiled model" in unused["loss"]
    assert "keras-elastic reads TFRecord files as they are" in unused[
        "prepare_data_for_a_single_file"]
    both = types.ModuleType("both")
    both.dataset_fn = both.feed = both.learning_rate_scheduler = lambda *a: None
    both.CustomDataReader = object
    unused = dict(unused_hooks(both, False, "dataset_fn",
                               "from callbacks(): LearningRateScheduler"))
    assert unused == {
        "feed": "'dataset_fn' is the dataset function (--feed=feed uses this one "
                "instead)",
        "learning_rate_scheduler": "callbacks() returns ElasticDL's "
        "LearningRateScheduler, whose schedule is applied instead",
        "CustomDataReader": "keras-elastic reads TFRecord or ArrayRecord files: give "
        "them as --training_data/--validation_data/--prediction_data"}
    assert [n for n, _ in unused_hooks(both, False, "feed", "learning_rate_scheduler",
                                       feed="feed")] == ["dataset_fn",
                                                         "CustomDataReader"]


def test_callbacks_hook_that_returns_none_or_no_list(caplog):
    """ElasticDL's cifar10_functional_api.py builds its LearningRateScheduler in
    callbacks() and returns nothing: no callback, and a warning saying so
    (it was a TypeError deep in the worker)."""
    import types

    import keras

    from keras_elastic.jobs.runner import module_callbacks

    module = types.ModuleType("cifar10_like")
    module.callbacks = lambda: None
    with caplog.at_level("WARNING"):
        assert module_callbacks(module) == []
    assert "the module's callbacks() returned None, so the job has none of its " \
        "callbacks" in caplog.text
    stop = keras.callbacks.TerminateOnNaN()
    module.callbacks = lambda: [stop]
    assert module_callbacks(module) == [stop]
    module.my_callbacks = stop
    assert module_callbacks(module, "my_callbacks") == [stop]
    assert module_callbacks(types.ModuleType("none")) == []
    module.callbacks = 3
    with pytest.raises(TypeError, match="the module's callbacks must be a list of "
                       "Keras callbacks, or a function returning one; got int"):
        module_callbacks(module)


def test_dataset_fn_shuffle_is_seeded_for_exact_replays():
    module, _, feed = load_model_def("mnist.mnist_functional_api.custom_model", ZOO)
    fn = zoo_hooks.elastic_dataset_fn(feed)
    records = _digits_records(40)

    def run():
        ds = fn(tf.data.Dataset.from_tensor_slices(records), "training")
        return [int(y[0]) for _, y in ds.as_numpy_iterator()]

    first = run()
    assert first == run() and sorted(first) != first  # shuffled, the same each time
    # ElasticDL's first model zoo wrote dataset_fn(dataset, mode): seeded too.
    two_args = zoo_hooks.elastic_dataset_fn(
        lambda dataset, mode: dataset.shuffle(buffer_size=100))
    orders = [list(two_args(tf.data.Dataset.range(50), "training").as_numpy_iterator())
              for _ in range(2)]
    assert orders[0] == orders[1] and orders[0] != sorted(orders[0]), orders


def test_a_one_entry_feature_dict_feeds_a_model_of_one_unnamed_input():
    # Keras 2 fed it whatever the key (ElasticDL's deepfm: {"feature": x} and
    # an unnamed Input); Keras 3 matches keys to input names.
    import keras

    def dataset_fn(records, mode):
        return records.map(lambda x: ({"feature": x}, x[0]))

    records = tf.data.Dataset.from_tensor_slices(np.ones((4, 3), "float32"))
    unnamed = keras.Model(inputs := keras.Input((3,)), keras.layers.Dense(1)(inputs))
    features, label = next(iter(zoo_hooks.keras2_single_input(dataset_fn, unnamed)(
        records, "training")))
    assert features.shape == (3,) and float(label) == 1.0
    unnamed.compile(loss="mse")
    unnamed.fit(zoo_hooks.keras2_single_input(dataset_fn, unnamed)(records, "training")
                .batch(2), verbose=0)
    # An input named by the key, or a model of two inputs: the dict as given.
    named = keras.Model(inputs := keras.Input((3,), name="feature"),
                        keras.layers.Dense(1)(inputs))
    two = keras.Model([a := keras.Input((3,)), b := keras.Input((3,))],
                      keras.layers.Add()([a, b]))
    for model in (named, two):
        features, _ = next(iter(zoo_hooks.keras2_single_input(dataset_fn, model)(
            records, "training")))
        assert set(features) == {"feature"}


# -- data -------------------------------------------------------------------------
def _example(**features) -> bytes:
    def feature(v):
        v = np.asarray(v).reshape(-1)
        if v.dtype.kind in "SUO":
            return tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[str(s).encode() for s in v]))
        if v.dtype.kind == "f":
            return tf.train.Feature(float_list=tf.train.FloatList(value=v))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=v))

    return tf.train.Example(features=tf.train.Features(feature={
        k: feature(v) for k, v in features.items()})).SerializeToString()


def _digits_records(n: int, offset: int = 0) -> list[bytes]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    idx = range(offset, offset + n)
    return [_example(image=digits.images[i].astype("float32"),
                     label=np.int64(digits.target[i])) for i in idx]


def _census_records(n: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        education = rng.choice(["HS", "BSc", "MSc", "PhD"])
        age = float(rng.integers(18, 70))
        label = int(education in ("MSc", "PhD") or age > 55)
        out.append(_example(workclass=np.array(rng.choice(["Private", "Gov", "Self"])),
                            education=np.array(education),
                            occupation=np.array(rng.choice(["a", "b", "c", "d"])),
                            age=np.float32(age),
                            **{"hours-per-week": np.float32(rng.integers(10, 60))},
                            label=np.int64(label)))
    return out


def _ctr_records(n: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        feature = rng.integers(0, 100, size=10)
        out.append(_example(feature=feature.astype("int64"),
                            label=np.int64(feature[0] < 50)))
    return out


def _write(directory: str, prefix: str, records: list[bytes], shards: int = 2):
    os.makedirs(directory, exist_ok=True)
    for i, part in enumerate(np.array_split(np.arange(len(records)), shards)):
        with tf.io.TFRecordWriter(os.path.join(directory,
                                               f"{prefix}-{i:05d}.tfrecord")) as w:
            for j in part:
                w.write(records[j])


MODULES = {
    "mnist_functional": ("mnist.mnist_functional_api.custom_model", "digits", None),
    "mnist_subclass": ("mnist.mnist_subclass.CustomModel", "digits",
                       "from callbacks(): LearningRateScheduler"),
    "census_sequential": ("census.census_sequential.custom_model", "census",
                          "learning_rate_scheduler"),
    "deepfm_ctr": ("deepfm.deepfm_functional_api.custom_model", "ctr",
                   "from callbacks(): LearningRateScheduler"),
}
# More flags of a module's jobs: deepfm's two keras.layers.Embedding tables
# (100 rows) go to the parameter servers, as ke.wrap(ps_embeddings_above=)
# puts them in Python (issue 27).
# A TTL longer than the job (its versions) keeps every row it uses.
JOB_FLAGS = {"deepfm_ctr": ("--ps_embeddings_above=50", "--ps_embedding_admit_after=2",
                            "--ps_embedding_max_rows=80",
                            "--ps_embedding_ttl_versions=100000")}


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo_data")
    makers = {"digits": lambda n, s: _digits_records(n, offset=s * 1000),
              "census": _census_records, "ctr": _ctr_records}
    dirs = {}
    for kind, make in makers.items():
        train, val = str(root / kind / "train"), str(root / kind / "val")
        _write(train, "train", make(320, 0))
        _write(val, "val", make(96, 1))
        dirs[kind] = (train, val)
    return dirs


# -- real jobs --------------------------------------------------------------------
def _in_parallel(calls):
    """Runs the modules' jobs of one phase side by side (CI time)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


@pytest.mark.multiprocess
def test_modules_train_evaluate_and_predict_with_two_workers(data_dirs, tmp_path):
    """Each module: train with validation, then evaluate, then predict, from
    the same checkpoint, with 2 workers and ElasticDL's flag forms (data
    directories, --checkpoint_dir_for_init, --keep_checkpoint_max, ...). The
    four modules' jobs of a phase run at the same time."""
    def job(name, subcommand, *args, env=None, job_dir=None, succeeds=True):
        model_def, _, _ = MODULES[name]
        result = cli(subcommand, "--model_zoo=tests/model_zoo",
                     f"--model_def={model_def}", "--minibatch_size=16",
                     "--num_minibatches_per_task=4", "--num_workers=2", "--num_ps=1",
                     "--log_level=INFO", *JOB_FLAGS.get(name, ()), *args,
                     f"--job_dir={job_dir or tmp_path / name / subcommand}", env=env)
        assert (result.returncode == 0) == succeeds, (
            name, subcommand, result.returncode, result.stdout[-4000:]
            + result.stderr[-4000:])
        return result.stdout + result.stderr

    def train(name):
        kind = MODULES[name][1]
        return job(name, "train", f"--training_data={data_dirs[kind][0]}",
                   f"--validation_data={data_dirs[kind][1]}", "--num_epochs=1",
                   f"--checkpoint_dir={tmp_path / name / 'ckpt'}",
                   "--checkpoint_steps=0", "--keep_checkpoint_max=2",
                   "--grads_to_wait=1")

    def evaluate(name):
        kind = MODULES[name][1]
        job(name, "evaluate", f"--validation_data={data_dirs[kind][1]}",
            f"--checkpoint_dir_for_init={tmp_path / name / 'ckpt'}",
            f"--output={tmp_path / name / 'eval.json'}")
        return json.loads((tmp_path / name / "eval.json").read_text())

    def predict(name):
        kind = MODULES[name][1]
        processed = tmp_path / name / "processed"
        processed.mkdir()
        job(name, "predict", f"--prediction_data={data_dirs[kind][1]}",
            f"--checkpoint_dir={tmp_path / name / 'ckpt'}",
            f"--output={tmp_path / name / 'preds'}",
            env={"ZOO_PROCESSOR_DIR": str(processed)})

    def resume_another_model():
        """A training job whose --checkpoint_dir (no trailing slash) holds a
        checkpoint of another model (deepfm with a narrower hidden layer):
        the job fails, naming the checkpoint and the variable that differs."""
        ckpt = tmp_path / "other_model_ckpt"
        shutil.copytree(tmp_path / "deepfm_ctr" / "ckpt", ckpt)
        return job("deepfm_ctr", "train", f"--training_data={data_dirs['ctr'][0]}",
                   "--num_epochs=2", f"--checkpoint_dir={ckpt}",
                   "--model_params=fc_unit=4", "--max_worker_restarts=1",
                   job_dir=tmp_path / "other_model_job", succeeds=False)

    names = list(MODULES)
    outputs = dict(zip(names, _in_parallel([lambda n=n: train(n) for n in names])))
    # --checkpoint_dir without a trailing slash is the directory the job saves
    # its checkpoints into (it used to be a checkpoint name in its parent).
    for name in names:
        assert sorted(os.listdir(tmp_path / name)) == ["ckpt", "train"], name
        assert sorted(os.listdir(tmp_path / name / "ckpt")) == ["ckpt-0001"], name
    all_metrics = dict(zip(names, _in_parallel([lambda n=n: evaluate(n)
                                                for n in names])))
    *_, mismatch = _in_parallel([lambda n=n: predict(n) for n in names]
                                + [resume_another_model])
    ckpt_path = tmp_path / "other_model_ckpt" / "ckpt-0001"
    assert f"Checkpoint {ckpt_path} does not match model" in mismatch, mismatch[-4000:]
    assert "[launcher] job FAILED" in mismatch
    assert re.search(r"kernel: shape \[\d+, 8\] in the checkpoint, \[\d+, 4\] in the "
                     r"model", mismatch), mismatch[-4000:]
    assert (f"failed the same way: --checkpoint_dir={tmp_path / 'other_model_ckpt'} "
            f"holds a checkpoint of another model ({ckpt_path}; 3 variable(s) "
            "differ, e.g. ") in mismatch, mismatch[-4000:]
    assert ("resume it with the --model_def and --model_params it was saved with, "
            "or give a new --checkpoint_dir to train afresh") in mismatch
    assert not (tmp_path / "other_model_ckpt" / "ckpt-0002").exists()

    from keras_elastic.prediction import read_predictions

    for name in names:
        _, kind, schedule = MODULES[name]
        out, metrics = outputs[name], all_metrics[name]
        metric = "logits_accuracy" if kind == "ctr" else "accuracy"
        assert f"val_{metric}" in out and "val_loss" in out, (name, out[-3000:])
        if schedule:
            assert f"learning_rate_scheduler ({schedule})" in out, (name, out[-3000:])
        # Every worker that trained a batch logs the job's training metrics
        # for the epoch (states summed by the master), whatever share of the
        # tasks it trained (Keras prints no epoch line on a worker that trained
        # none); the final metrics (the chief's, idle or not) are those numbers.
        epoch_lines = {}
        for line in out.splitlines():
            found = re.match(r"\[worker-(\d+)\] (.* - loss: .*)$", line)
            if found and "final metrics" not in line:
                epoch_lines[found.group(1)] = dict(
                    re.findall(r"(\w+): ([-0-9.e]+)", found.group(2)))
        logged = list(epoch_lines.values())
        assert logged and all(line == logged[0] for line in logged), (name, epoch_lines)
        final = ast.literal_eval(re.search(r"final metrics: (\{.*\})", out).group(1))
        assert f"{final['loss']:.4f}" == logged[0]["loss"], (name, final, logged)
        assert float(logged[0]["loss"]) > 0
        if name == "deepfm_ctr":  # its tables were on the servers
            assert "'custom_data_reader' is not used" in out, out[-3000:]
            manifest = next(glob.iglob(str(tmp_path / name / "ckpt" / "**" / "ps-000" /
                                           "manifest.json"), recursive=True))
            with open(manifest) as f:
                tables = json.load(f)["tables"]
            assert len(tables) == 2 and all(
                t["admit_after"] == 2 and t["max_rows"] == 80
                for t in tables.values()), tables
            # The launcher's summary counts the tables' rows over the servers.
            counted = re.findall(r"embedding table '[^']+': (\d+) rows .* (\d+) "
                                 r"admitted, (\d+) evicted", out)
            assert len(counted) == 2, out[-3000:]
            assert all(int(rows) <= 80 for rows, _, _ in counted), counted
        if name == "mnist_functional":  # ElasticDL's data conversion hook
            assert ("the module's 'prepare_data_for_a_single_file' is not used: it "
                    "converts raw files to records") in out
        predictions = read_predictions(str(tmp_path / name / "preds"))
        files = sorted(glob.glob(os.path.join(data_dirs[kind][1], "*")))
        labels = np.array([tf.train.Example.FromString(r).features.feature[
            "label"].int64_list.value[0] for r in tf.data.TFRecordDataset(
                files).as_numpy_iterator()])
        # The job's metrics equal the same metrics computed here from the
        # predictions of the same checkpoint: exact across 2 workers.
        if kind == "digits":
            assert predictions.shape == (96, 10)
            accuracy = np.mean(predictions.argmax(1) == labels)
            assert metrics["accuracy"] == pytest.approx(accuracy, abs=1e-6), name
        elif kind == "census":
            assert predictions.shape == (96, 1)
            accuracy = np.mean(np.round(predictions[:, 0]) == labels)
            assert metrics["accuracy"] == pytest.approx(accuracy, abs=1e-6), name
        else:
            assert predictions["logits"].shape == (96,)
            accuracy = np.mean((predictions["logits"] > 0) == labels)
            assert metrics["logits_accuracy"] == pytest.approx(accuracy, abs=1e-6)
            auc = tf.keras.metrics.AUC()
            auc.update_state(labels.reshape(-1, 1), predictions["probs"])
            assert metrics["probs_auc"] == pytest.approx(float(auc.result()), abs=1e-5)
        assert metrics["loss"] > 0, (name, metrics)
    # The parameter servers' optimizer carries the modules' schedules (what
    # they saved with the checkpoint): callbacks()' LearningRateScheduler and
    # learning_rate_scheduler(model_version), in place of optimizer()'s rate.
    def server_learning_rate(name):
        path = next(glob.iglob(str(tmp_path / name / "ckpt" / "**" / "ps-000" /
                                   "manifest.json"), recursive=True))
        with open(path) as f:
            return json.load(f)["optimizer_config"]["config"]["learning_rate"]

    rate = server_learning_rate("mnist_subclass")
    assert rate["class_name"] == "PiecewiseConstantDecay"
    assert (rate["config"]["boundaries"], rate["config"]["values"]) == ([3], [0.2, 0.1])
    rate = server_learning_rate("census_sequential")
    assert (rate["config"]["boundaries"], rate["config"]["values"]) == ([4], [0.02, 0.01])
    assert server_learning_rate("deepfm_ctr") == pytest.approx(0.5)
    assert server_learning_rate("mnist_functional") == pytest.approx(0.1)  # optimizer()
    # PredictionOutputsProcessor.process got every prediction, on both workers.
    processed = tmp_path / "mnist_subclass" / "processed"
    parts = [np.load(p) for p in sorted(processed.glob("*.npy"))]
    assert sum(len(p) for p in parts) == 96 and parts[0].shape[1:] == (10,)
    assert {p.name.split("-")[0] for p in processed.glob("*.npy")} <= {"w0", "w1"}

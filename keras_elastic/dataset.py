"""`ElasticDataset`: data that the master hands out, task by task.

The worker's pipeline (one dataset shared by the tasks a worker trains):

```
master task -> records of the task (seek, no scan) -> dataset_fn(records, mode)
            -> tag each element with the task's seq -> batch -> prefetch
```

Example:

```python
def parse(records, mode):
    spec = {"x": tf.io.FixedLenFeature([64], tf.float32),
            "y": tf.io.FixedLenFeature([], tf.int64)}
    return records.map(lambda r: tf.io.parse_single_example(r, spec)).map(
        lambda e: (e["x"], e["y"]))

train = ke.ElasticDataset("data/train-*.tfrecord", dataset_fn=parse,
                          batch_size=64)   # task size: the master chooses
model.fit(train, epochs=3)      # model is a ke.Model / ke.wrap(...) model
```
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from keras_elastic._backend import check_tensorflow_backend
from keras_elastic.data import fingerprint as _fingerprint
from keras_elastic.data.errors import NondeterministicDatasetError
from keras_elastic.data.factory import as_source
from keras_elastic.data.feed import generator_dataset
from keras_elastic.data.source import DataSource
from keras_elastic.proto import master_pb2

check_tensorflow_backend()

MODES = ("training", "evaluation", "prediction")


class ElasticDataset:
    """A dataset whose records are handed out by the master in tasks.

    Args:
        data: TFRecord file pattern(s) (a string or a list; ArrayRecord files
            when every file is named `*.array_record`), a nest of NumPy
            arrays (every worker must build the same arrays: registration
            compares a fingerprint of each), or a
            `keras_elastic.data.DataSource`. `ElasticDataset.from_tfds`
            reads a prepared TensorFlow Datasets split.
        dataset_fn: `dataset_fn(records, mode)` (or `dataset_fn(records)`) maps
            a `tf.data.Dataset` of one task's records (scalar strings for
            TFRecord and ArrayRecord; array rows for arrays; decoded feature
            dicts for `from_tfds`) to *unbatched* elements: `(x, y)`
            or `(x, y, sample_weight)` for training and evaluation, `x` (or
            `(x,)`) for prediction. It may filter or expand records. None:
            records are the elements.
        batch_size: elements per batch.
        minibatches_per_task: a task is `batch_size * minibatches_per_task`
            records (ElasticDL's `num_minibatches_per_task`). None (the
            default): the master chooses, so that an epoch has at least 4
            tasks per worker (counting up to the job's maximum number of
            workers), with 1 to 32 minibatches per task; the first worker to
            register the dataset decides, and `records_per_task` gives the
            job's value once registered.
        mode: "training", "evaluation" or "prediction".
        name: the dataset's name in the job (default: the mode); two datasets
            of one job need different names.
        shuffle: shuffle the order of tasks each epoch (the master does) and
            the records within each task (the worker does), with `seed`.
        batching: how elements are batched: None (like `Dataset.batch`), a
            `keras_elastic.batching` reducer or nest of reducers matching the
            element (e.g. `{"tokens": kb.padded(), "tags": kb.padded_sparse(),
            "label": None}`), or a `keras_elastic.batching.Batching`.
        drop_remainder: drop a last partial batch.
        prefetch: batches to prefetch (default: autotune).
        index_dir: where TFRecord offset indexes are cached.
        output_dir: prediction mode: `predict` writes each task's outputs here
            (`keras_elastic.prediction.read_predictions` reads them back).
        output_writer: prediction mode: a `keras_elastic.prediction.
            PredictionWriter` to use instead of the default NumPy files.
        deterministic: training: `dataset_fn` gives the same elements, in the
            same order, every time it runs on the same records (seeded
            shuffles and random ops are fine). A task trained again after a
            failure is then replayed exactly: the elements whose gradients are
            already applied are skipped by position, and checked against
            fingerprints of what was applied (a mismatch is an error, never a
            silent double count). `fit` checks this on the first records
            before training. Pass False if `dataset_fn` augments each record at
            random on purpose (same records, same order, other values): replays
            then skip by position without comparing contents; a `dataset_fn`
            that shuffles or samples records at random cannot be replayed
            exactly either way.
    """

    def __init__(self, data: Any, dataset_fn: Callable | None = None,
                 batch_size: int = 32, minibatches_per_task: int | None = None,
                 mode: str = "training", name: str | None = None,
                 shuffle: bool = False, seed: int = 0, batching: Any = None,
                 drop_remainder: bool = False, prefetch: int | None = None,
                 index_dir: str | None = None, output_dir: str | None = None,
                 output_writer: Any = None, deterministic: bool = True) -> None:
        if mode not in MODES:
            raise ValueError(f"ElasticDataset: mode must be one of {MODES}, got {mode!r}")
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"ElasticDataset: batch_size must be a positive integer, "
                             f"got {batch_size!r}")
        if minibatches_per_task is not None and (
                not isinstance(minibatches_per_task, int) or minibatches_per_task <= 0):
            raise ValueError("ElasticDataset: minibatches_per_task must be a positive "
                             f"integer (or None: the master chooses), got "
                             f"{minibatches_per_task!r}")
        if dataset_fn is not None and not callable(dataset_fn):
            raise TypeError(f"ElasticDataset: dataset_fn must be callable, got "
                            f"{type(dataset_fn).__name__}")
        self.source: DataSource = as_source(data, index_dir=index_dir)
        self.dataset_fn = dataset_fn
        self.batch_size = batch_size
        self.minibatches_per_task = minibatches_per_task
        self._job_records_per_task = 0  # the job's, once registered
        self.mode = mode
        self.name = name or mode
        self.shuffle = shuffle
        self.seed = seed
        self.batching, self.drop_remainder = _batching_components(
            batching, batch_size, drop_remainder)
        self.prefetch = prefetch
        self.output_dir = output_dir
        self.output_writer = output_writer
        self.deterministic = bool(deterministic)
        self._determinism_checked = False
        if (output_dir or output_writer) and mode != "prediction":
            raise ValueError("output_dir and output_writer only apply to "
                             f"mode='prediction', not {mode!r}")
        self._element_spec = None
        # Maps applied to dataset_fn's elements (Keras' class weights).
        self._element_maps: tuple = ()

    @classmethod
    def from_tfds(cls, name_or_builder: Any, split: str = "train",
                  data_dir: str | None = None, *, as_supervised: bool = False,
                  decode: bool = True, decoders: Any = None,
                  **kwargs: Any) -> ElasticDataset:
        """An `ElasticDataset` over a prepared TensorFlow Datasets split.

        Reads the dataset's own files (TFRecord or ArrayRecord, as prepared);
        the shards and their record counts come from its dataset info, so a
        task is a record range of one shard and nothing is scanned first.
        Nothing is downloaded: prepare the dataset beforehand
        (`builder.download_and_prepare()` or `tfds build`).

        Args:
            name_or_builder: a registered dataset name (`"mnist"`,
                `"mnist:3.0.1"`, `"name/config"`), a `tfds` `DatasetBuilder`
                (instance or class) or the directory of a prepared version
                (`.../mnist/3.0.1`, read without the dataset's code).
            split: a split of the dataset, sliced or combined as TFDS allows
                (`"train[:90%]"`, `"train+test"`).
            data_dir: where the dataset is prepared (TFDS' default if None).
            as_supervised: elements are `(input, target)` from the dataset's
                `supervised_keys` (no `dataset_fn` needed).
            decode: records are decoded with the dataset's features before
                `dataset_fn` sees them (a dict of features, as `tfds.load`
                gives). False: `dataset_fn` gets the raw serialized examples
                (scalar strings) and decodes them itself.
            decoders: per-feature decoders, as in `tfds.load` (e.g.
                `{"image": tfds.decode.SkipDecoding()}`).
            **kwargs: `ElasticDataset` arguments (`dataset_fn`, `batch_size`,
                `mode`, `name`, `shuffle`, ...).

        Raises:
            FileNotFoundError: the dataset is not prepared in `data_dir` (or
                not known at all), or a file of the split is missing.
            ValueError: `split` is not a split of the dataset (the message
                lists them), or the dataset is stored in another file format.

        Example:

        >>> import numpy as np
        >>> import tensorflow_datasets as tfds
        >>> class Pairs(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        ...     VERSION = tfds.core.Version("1.0.0")  # 20 examples: x [i, -i], label i % 2
        ...     code_path = None                      # defined here, not in a file
        ...     def _info(self):
        ...         features = tfds.features.FeaturesDict({
        ...             "x": tfds.features.Tensor(shape=(2,), dtype=np.float32),
        ...             "label": tfds.features.ClassLabel(num_classes=2)})
        ...         return tfds.core.DatasetInfo(builder=self, features=features,
        ...                                      supervised_keys=("x", "label"))
        ...     def _split_generators(self, dl_manager):
        ...         return {"train": self._generate_examples()}
        ...     def _generate_examples(self):
        ...         for i in range(20):
        ...             yield i, {"x": [i, -i], "label": i % 2}
        >>> tfds.disable_progress_bar()
        >>> Pairs(data_dir="tensorflow_datasets").download_and_prepare()
        Downloading and preparing dataset ...
        Dataset pairs downloaded and prepared to tensorflow_datasets/pairs/1.0.0. ...
        >>> import keras_elastic as ke
        >>> train = ke.ElasticDataset.from_tfds(
        ...     Pairs, split="train[:80%]", data_dir="tensorflow_datasets",
        ...     as_supervised=True, batch_size=4, shuffle=True)
        >>> train.source.shards()
        [('.../pairs-train.tfrecord-00000-of-00001[0:16]', 16)]
        """
        from keras_elastic.data.tfds import TFDSSource, load_builder

        builder = load_builder(name_or_builder, data_dir)
        source = TFDSSource(builder, split, decode=decode, as_supervised=as_supervised,
                            decoders=decoders)
        return cls(source, **kwargs)

    def renamed(self, name: str) -> ElasticDataset:
        """The same dataset under another name (another dataset of the job:
        its own registration, tasks and rounds).

        >>> import numpy as np
        >>> ElasticDataset(np.zeros((8, 2)), batch_size=4).renamed("val@2").name
        'val@2'
        """
        import copy

        if name == self.name:
            return self
        out = copy.copy(self)
        out.name = name
        return out

    def take(self, count: int) -> ElasticDataset:
        """The same dataset over its first `count` batches' records (`count *
        batch_size` records in shard order), like `tf.data.Dataset.take` on
        an unshuffled batched dataset; `shuffle=True` shuffles within them.

        Example:

        >>> import numpy as np
        >>> ds = ElasticDataset(np.zeros((1000, 2)), batch_size=64)
        >>> ds.take(10).source.num_records()
        640
        """
        import copy

        from keras_elastic.data.source import FirstRecords

        if not isinstance(count, int) or count < 0:
            raise ValueError(f"ElasticDataset.take: count must be an integer >= 0, got "
                             f"{count!r}")
        out = copy.copy(self)
        out.source = FirstRecords(self.source, count * self.batch_size)
        return out

    @property
    def records_per_task(self) -> int:
        """Records per task: the job's once registered (`registered`); before,
        `batch_size * minibatches_per_task`, or, with `minibatches_per_task=None`,
        the master's choice for one worker (an estimate: the job's may be
        smaller)."""
        if self._job_records_per_task:
            return self._job_records_per_task
        if self.minibatches_per_task is not None:
            return self.batch_size * self.minibatches_per_task
        from keras_elastic.master.task_queue import auto_records_per_task

        return auto_records_per_task(tuple(self.source.shards()), self.batch_size, 1)

    def registration(self, num_epochs: int, records_per_epoch: int = 0,
                     call: str = "", model: str = ""
                     ) -> master_pb2.RegisterDatasetRequest:
        """What the master needs to cut this dataset into tasks.

        Args:
            num_epochs: epochs (evaluation rounds) of the job; 0: unbounded.
            records_per_epoch: records per epoch or round (`steps_per_epoch *
                batch_size`); 0: the whole dataset. Epoch e then covers
                records `[e * R, (e + 1) * R)` in shard order, continuing
                across epochs and wrapping around at the end.
            call: the user's call, quoted by the master's error when this
                worker's dataset differs from the job's
                (`keras_elastic.data.describe.describe_call`).
            model: the model as compiled (`describe_compile`), which every
                worker's registration must match.

        Example:

        >>> import numpy as np
        >>> ds = ElasticDataset((np.zeros((100, 2)), np.zeros(100)), batch_size=10)
        >>> request = ds.registration(3, call="fit(...)")
        >>> request.records_per_task, request.batch_size  # 0: the master chooses
        (0, 10)
        >>> [f.path for f in request.fingerprints]
        ['x', 'y']
        """
        explicit = self.minibatches_per_task is not None
        return master_pb2.RegisterDatasetRequest(
            dataset=self.name, mode=self.mode,
            shards=[master_pb2.Shard(name=s, num_records=n)
                    for s, n in self.source.shards()],
            records_per_task=self.batch_size * self.minibatches_per_task
            if explicit else 0,
            batch_size=self.batch_size, num_epochs=num_epochs,
            shuffle=self.shuffle, seed=self.seed, records_per_epoch=records_per_epoch,
            fingerprints=[master_pb2.ArrayFingerprint(path=p, hash=h)
                          for p, h in self.source.content_fingerprints()],
            call=call, model=model)

    def registered(self, response: master_pb2.RegisterDatasetResponse) -> None:
        """Takes the job's answer to `registration` (from
        `MasterClient.register_dataset`): `records_per_task` is the job's from
        now on."""
        if response.records_per_task > 0:
            self._job_records_per_task = int(response.records_per_task)

    # -- the user's dataset_fn --------------------------------------------
    def with_class_weight(self, class_weight: dict) -> ElasticDataset:
        """A copy whose elements `(x, y)` get Keras' class weight as their
        sample weight, `(x, y, class_weight[y])` (what `fit(class_weight=...)`
        does with it).

        Example:

        >>> import numpy as np
        >>> ds = ElasticDataset((np.zeros((4, 2)), np.array([0, 1, 1, 0])))
        >>> len(ds.with_class_weight({1: 3.0}).element_spec)
        3
        """
        import copy

        from keras_elastic.data.keras_arguments import class_weight_map

        out = copy.copy(self)
        out._element_maps = self._element_maps + (class_weight_map(class_weight),)
        out._element_spec = None
        return out

    def _records_are_elements(self) -> bool:
        """No dataset_fn, decoding or map: a task's elements are its records."""
        return self.dataset_fn is None and not self._element_maps and (
            type(self.source).decode is DataSource.decode)

    def elements_of(self, records: Any) -> tf.data.Dataset:
        """The unbatched elements this dataset makes of `records` (a task's
        raw records, as the source reads them): decoded, through
        `dataset_fn` and the element maps, as every worker's pipeline makes
        them. The worker replays a task with it after a failure.

        Example:

        >>> import numpy as np
        >>> ds = ElasticDataset((np.arange(4.0), np.arange(4)), batch_size=2)
        >>> [int(y) for _, y in ds.elements_of(ds.source.read("arrays", 1, 3))]
        [1, 2]
        """
        return self._apply_dataset_fn(tf.data.Dataset.from_tensor_slices(records))

    def _apply_dataset_fn(self, records: tf.data.Dataset) -> tf.data.Dataset:
        out = self._apply_user_dataset_fn(records)
        for element_map in self._element_maps:
            out = out.map(element_map)
        return out

    def _apply_user_dataset_fn(self, records: tf.data.Dataset) -> tf.data.Dataset:
        records = self.source.decode(records)
        if self.dataset_fn is None:
            return records
        fn = self.dataset_fn
        try:
            params = inspect.signature(fn).parameters
            takes_mode = len(params) >= 2 or any(
                p.kind == p.VAR_POSITIONAL for p in params.values())
        except (TypeError, ValueError):
            takes_mode = True
        out = fn(records, self.mode) if takes_mode else fn(records)
        if not isinstance(out, tf.data.Dataset):
            raise TypeError(
                f"dataset_fn {_fn_name(fn)} must return a tf.data.Dataset of "
                f"unbatched elements, but returned {type(out).__name__}.")
        return out

    def _check_structure(self, spec: Any) -> None:
        fn = _fn_name(self.dataset_fn) if self.dataset_fn else "(no dataset_fn)"
        if self.mode in ("training", "evaluation"):
            if isinstance(spec, tuple) and len(spec) not in (1, 2, 3):
                raise ValueError(
                    f"dataset_fn {fn} returned elements of structure {spec}; in "
                    f"{self.mode} mode each element must be a tuple (features, "
                    "labels) or (features, labels, sample_weight), or (features,) "
                    "for a model whose train_step needs no labels.")
        for leaf in tf.nest.flatten(spec):
            if not isinstance(leaf, (tf.TensorSpec, tf.SparseTensorSpec,
                                     tf.RaggedTensorSpec)):
                raise ValueError(f"dataset_fn {fn} returned elements with a component "
                                 f"of type {leaf}; expected tensors.")

    def require_labels(self) -> None:
        """Raises ValueError unless each element carries labels: a model
        trained or evaluated on its compiled loss needs (features, labels)."""
        spec = self.element_spec
        if isinstance(spec, tuple) and len(spec) in (2, 3):
            return
        fn = _fn_name(self.dataset_fn) if self.dataset_fn else "(no dataset_fn)"
        raise ValueError(
            f"dataset_fn {fn} returned elements of structure {spec}; in "
            f"{self.mode} mode each element must be a tuple (features, labels) "
            "or (features, labels, sample_weight): the model computes its "
            "compiled loss from the labels. (A model whose train_step computes "
            "its own loss may take features alone.)")

    @property
    def element_spec(self) -> Any:
        """Spec of one unbatched element, as `dataset_fn` produces it."""
        if self._element_spec is None:
            records = tf.data.Dataset.from_tensor_slices(
                tf.nest.map_structure(
                    lambda s: tf.zeros([0] + list(s.shape), s.dtype),
                    self.source.record_spec))
            spec = self._apply_dataset_fn(records).element_spec
            self._check_structure(spec)
            self._element_spec = spec
        return self._element_spec

    @property
    def batched_spec(self) -> Any:
        """Spec of one batch as the model sees it (without the task tag)."""
        if self.batching is None and _fingerprint.is_dense(self.element_spec):
            size = self.batch_size if self.drop_remainder else None
            return tf.nest.map_structure(
                lambda s: tf.TensorSpec([size, *s.shape], s.dtype), self.element_spec)
        return self.build(_no_tasks, per_task=self.mode != "training").element_spec[1]

    def build(self, generator: Callable, per_task: bool = False) -> tf.data.Dataset:
        """The tagged, batched pipeline over `generator` (yields `(seq, skip,
        records)`).

        Training (`per_task=False`): batches span tasks, elements stay in task
        order, the first `skip` elements of a task are dropped (already
        applied), and each batch is `(tags, user_batch)` with `tags[i] = [seq,
        position in its task, fingerprint]` per element. Evaluation and
        prediction (`per_task=True`): a batch never spans tasks, so results can
        be attributed to one task; each batch is `(seq, user_batch)`.
        """
        self.element_spec  # validate dataset_fn before anything runs  # noqa: B018
        # Not from_generator: its op pins glibc's mmap threshold process-wide
        # and slows every training step (see keras_elastic/data/feed.py).
        tasks = generator_dataset(
            generator, output_signature=(tf.TensorSpec([], tf.int64),
                                         tf.TensorSpec([], tf.int64),
                                         self.source.batched_spec()))

        def records_of(records):
            return self._apply_dataset_fn(tf.data.Dataset.from_tensor_slices(records))

        if per_task:
            def batches_of_task(seq, skip, records):
                batched = self._batch_untagged(records_of(records))
                return batched.map(lambda *b: (seq, b[0] if len(b) == 1 else b))

            batched = tasks.flat_map(batches_of_task)
        elif self.batching is None and _fingerprint.is_dense(self.element_spec):
            # Dense elements, plain batching: each task becomes chunks of up to
            # batch_size elements (the whole task when its records are the
            # elements), tagged and fingerprinted a chunk at a time, then
            # re-batched across tasks: no per-element work in the pipeline.
            batch_size = self.batch_size
            deterministic = self.deterministic
            whole_task = self._records_are_elements()

            def tagged_chunks_of_task(seq, skip, records):
                if whole_task:
                    chunks = tf.data.Dataset.from_tensors(
                        tf.nest.map_structure(lambda r: r[skip:], records))
                else:
                    chunks = records_of(records).skip(skip).batch(batch_size)

                @tf.autograph.experimental.do_not_convert
                def tag(i, chunk):
                    n = tf.shape(tf.nest.flatten(chunk)[0], out_type=tf.int64)[0]
                    positions = skip + i * batch_size + tf.range(n, dtype=tf.int64)
                    fingerprints = (_fingerprint.batch_fingerprints(chunk)
                                    if deterministic else tf.zeros_like(positions))
                    return tf.stack([tf.fill([n], seq), positions, fingerprints],
                                    axis=1), chunk

                return chunks.enumerate().map(tag)

            batched = tasks.flat_map(tagged_chunks_of_task).rebatch(
                batch_size, drop_remainder=self.drop_remainder)
        else:
            fingerprint = self._fingerprint_fn()

            def elements_of_task(seq, skip, records):
                return records_of(records).enumerate().skip(skip).map(
                    lambda i, e: (tf.stack([seq, i, fingerprint(e)]), e))

            elements = tasks.flat_map(elements_of_task)
            if self.batching is None:
                batched = elements.batch(self.batch_size,
                                         drop_remainder=self.drop_remainder)
            else:
                batched = self._batch_tagged(elements)
        # Each epoch (and segment) iterates the pipeline anew: tf.data's static
        # rewrites would run again each time (~15 ms per iterator made).
        options = tf.data.Options()
        options.experimental_optimization.apply_default_optimizations = False
        return batched.prefetch(self.prefetch or tf.data.AUTOTUNE).with_options(options)

    def _fingerprint_fn(self) -> Callable:
        if not self.deterministic:
            return lambda e: tf.constant(0, tf.int64)
        return _fingerprint.element_fingerprint

    def check_deterministic(self, max_records: int = 256) -> None:
        """Runs `dataset_fn` twice on the first records of the first shard and
        raises `NondeterministicDatasetError` if the elements differ (training
        with `deterministic=True`; done once, by `fit`)."""
        if self._determinism_checked or not self.deterministic or (
                self.mode != "training") or self._records_are_elements():
            return
        shard, n = next(((s, n) for s, n in self.source.shards() if n), (None, 0))
        if shard is None:
            return
        records = self.source.read(shard, 0, min(n, max_records,
                                                 self.records_per_task))
        fingerprint = self._fingerprint_fn()

        def run() -> list[int]:
            elements = self._apply_dataset_fn(tf.data.Dataset.from_tensor_slices(records))
            return [int(f) for f in elements.map(tf.autograph.experimental.do_not_convert(
                lambda *e: fingerprint(e[0] if len(e) == 1 else e))).as_numpy_iterator()]

        first, second = run(), run()
        self._determinism_checked = True
        if first == second:
            return
        where = (f"{len(first)} then {len(second)} elements" if len(first) != len(
            second) else "element #" + str(next(
                i for i, (a, b) in enumerate(zip(first, second)) if a != b)) + " differs")
        raise NondeterministicDatasetError(
            f"ElasticDataset '{self.name}': dataset_fn {_fn_name(self.dataset_fn)} gave "
            f"other elements on a second run over the same records of {shard} ({where})."
            " Exactly-once training replays a task after a failure by running "
            "dataset_fn again and skipping what was already applied, which needs the "
            "same elements in the same order. Seed its shuffles and random ops, or, if "
            "it only augments each record at random (same records, same order), pass "
            "ElasticDataset(..., deterministic=False).")

    def batch_tagged_elements(self, tagged: tf.data.Dataset) -> tf.data.Dataset:
        """Batches `(tag, element)` pairs as the training pipeline batches its
        elements (every batch, the last partial one included): the worker
        replays a task's elements with it after a failure."""
        if self.batching is None:
            return tagged.batch(self.batch_size)
        import keras_elastic.batching as ke_batching

        return ke_batching.batch(tagged, self.batch_size, components=(None, self.batching))

    def _batch_untagged(self, elements: tf.data.Dataset) -> tf.data.Dataset:
        if self.batching is None:
            return elements.batch(self.batch_size, drop_remainder=self.drop_remainder)
        import keras_elastic.batching as ke_batching

        return ke_batching.batch(elements, self.batch_size, components=self.batching,
                                 drop_remainder=self.drop_remainder)

    def _batch_tagged(self, elements: tf.data.Dataset) -> tf.data.Dataset:
        import keras_elastic.batching as ke_batching

        # The task tag is a scalar: batched natively (None) beside the element.
        return ke_batching.batch(elements, self.batch_size,
                                 components=(None, self.batching),
                                 drop_remainder=self.drop_remainder)

    def describe(self) -> str:
        return (f"ElasticDataset '{self.name}' ({self.mode}): {self.source.describe()}, "
                f"batch_size={self.batch_size}, {self.records_per_task} records per "
                "task")


def _no_tasks():
    return iter(())


def _fn_name(fn: Callable) -> str:
    name = getattr(fn, "__qualname__", None) or repr(fn)
    module = getattr(fn, "__module__", None)
    return f"'{module}.{name}'" if module else f"'{name}'"


def _batching_components(batching: Any, batch_size: int,
                         drop_remainder: bool) -> tuple[Any, bool]:
    """`(components, drop_remainder)` from what `ElasticDataset(batching=...)`
    accepts: None, a reducer or nest of reducers, or a `Batching`."""
    if batching is None:
        return None, drop_remainder
    import keras_elastic.batching as ke_batching

    if isinstance(batching, ke_batching.Batching):
        if batching.batch_size != batch_size:
            raise ValueError(
                f"ElasticDataset: batch_size={batch_size} but batching="
                f"Batching({batching.batch_size}, ...): give one batch size")
        return batching.components, batching.drop_remainder or drop_remainder
    leaves = tf.nest.flatten(batching)
    bad = [x for x in leaves if x is not None and not isinstance(x, ke_batching.Reducer)]
    if bad:
        raise TypeError(
            "ElasticDataset(batching=...) takes keras_elastic.batching reducers (one, "
            "or a nest matching the element, e.g. {'tokens': kb.padded(), 'label': "
            f"None}}) or a kb.Batching; got {type(bad[0]).__name__}")
    return batching, drop_remainder

"""TFDS datasets and ArrayRecord files as data sources (issue 13, item 5).

A small TFDS dataset is defined here (`tfds_digits.KeDigits`, scikit-learn's
digits) and prepared offline into temporary data dirs, in both TFDS file
formats. Shards and record counts come from its dataset info (nothing
scanned before training); tasks read record ranges; records are decoded with
the builder's features. One real job (launcher, 2 workers, a worker killed
after a push) trains on TFDS files, validates on the other format, evaluates
on plain ArrayRecord files, and keeps the ledger exactly once.
"""

import json
import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, assert_exactly_once, launch, read_ledger
from support import tfds_digits

import keras_elastic as ke
from keras_elastic.data import ArrayRecordSource, TFDSSource, as_source
from keras_elastic.data.tfrecord_index import CorruptRecordError

FORMATS = ("tfrecord", "array_record")
SHARDS = 3


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """{format: builder} of KeDigits prepared in a temporary data_dir."""
    root = tmp_path_factory.mktemp("tfds")
    return {fmt: tfds_digits.prepare(str(root / fmt), fmt, SHARDS) for fmt in FORMATS}


@pytest.fixture(scope="module")
def array_record_files(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("array_record"))
    return {split: tfds_digits.write_array_record(directory, split, n)
            for split, n in (("train", 3), ("validation", 2))}


def raw_records(builder, fmt, path):
    if fmt == "tfrecord":
        return list(tf.data.TFRecordDataset(path).as_numpy_iterator())
    from array_record.python.array_record_module import ArrayRecordReader

    return ArrayRecordReader(path).read_all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_shards_come_from_the_dataset_info_and_ranges_read_exactly(
        tmp_path, prepared, fmt):
    builder = prepared[fmt]
    train = ke.ElasticDataset.from_tfds("ke_digits", split="train",
                                        data_dir=os.path.dirname(os.path.dirname(
                                            builder.data_dir)), as_supervised=True)
    src = train.source
    assert isinstance(src, TFDSSource) and src.format == fmt
    lengths = builder.info.splits["train"].shard_lengths
    assert [n for _, n in src.shards()] == lengths and len(lengths) == SHARDS
    assert all(f".{fmt}-0000{i}-of-00003" in name
               for i, (name, _) in enumerate(src.shards()))
    # A task's range, raw, is the file's records [start, end).
    shard, n = src.shards()[1]
    everything = raw_records(builder, fmt, shard)
    assert len(everything) == n
    assert list(src.read(shard, 7, 19)) == everything[7:19]
    assert list(src.read(shard, n - 2, n)) == everything[n - 2:]
    # Decoded with the builder's features; as_supervised: (image, label).
    assert train.element_spec == (tf.TensorSpec([64], tf.float32),
                                  tf.TensorSpec([], tf.int64))
    decoded = list(src.decode(tf.data.Dataset.from_tensor_slices(
        src.read(shard, 0, 3))).as_numpy_iterator())
    expected = [builder.info.features.deserialize_example_np(r) for r in everything[:3]]
    for (image, label), ex in zip(decoded, expected):
        np.testing.assert_array_equal(image, ex["image"])
        assert label == ex["label"]
    # Without as_supervised, dataset_fn gets the decoded feature dicts.
    dicts = ke.ElasticDataset.from_tfds(
        builder, split="validation",
        dataset_fn=lambda ds: ds.map(lambda ex: (ex["image"], ex["label"])))
    assert dicts.element_spec == train.element_spec
    # No offset index was built (nothing in the index cache).
    assert not (tmp_path / "index-cache").exists()
    # A sliced split: ranges of the files, counted from the dataset info.
    sliced = TFDSSource(builder, "train[:10%]+validation[-5:]")
    assert [n for _, n in sliced.shards()][-1] == 5
    assert sum(n for _, n in sliced.shards()) == round(
        0.1 * builder.info.splits["train"].num_examples) + 5
    last, _ = sliced.shards()[-1]
    path = last.rsplit("[", 1)[0]
    assert list(sliced.read(last, 0, 5)) == raw_records(builder, fmt, path)[-5:]


def digits_model(seed=0):
    sys.path.insert(0, os.path.join(REPO, "examples", "digits"))
    import model_def

    keras.utils.set_random_seed(seed)
    return ke.wrap(model_def.custom_model())

@pytest.mark.parametrize("fmt", FORMATS)
def test_decoders_as_in_tfds_load(prepared, fmt):
    """`from_tfds(..., decoders=)`: per-feature decoders, as `tfds.load`
    takes them: a custom decoder replaces one feature's decoding before
    `dataset_fn` sees the example; the other features decode as stored."""
    import tensorflow_datasets as tfds

    builder = prepared[fmt]

    @tfds.decode.make_decoder()
    def negated(serialized, feature):
        return -feature.decode_example(serialized)

    seen = {}

    def dataset_fn(records, mode):
        def check(ex):
            seen["spec"] = {k: (v.dtype, v.shape.as_list()) for k, v in ex.items()}
            return ex["image"], ex["label"]
        return records.map(check)

    custom = ke.ElasticDataset.from_tfds(
        builder, split="validation", decoders={"image": negated()},
        dataset_fn=dataset_fn, batch_size=1000, mode="evaluation", name="negated")
    shard, n = custom.source.shards()[0]
    records = custom.source.read(shard, 0, n)
    images, labels = zip(*custom.elements_of(records).as_numpy_iterator())
    expected = [builder.info.features.deserialize_example_np(r)
                for r in raw_records(builder, fmt, shard)]
    np.testing.assert_array_equal(images, [-e["image"] for e in expected])
    np.testing.assert_array_equal(labels, [e["label"] for e in expected])
    assert np.abs(images).sum() > 0
    assert seen["spec"] == {"image": (tf.float32, [64]), "label": (tf.int64, [])}
    # Without decoders the same records decode to the stored values.
    plain = ke.ElasticDataset.from_tfds(builder, split="validation",
                                        dataset_fn=dataset_fn, batch_size=1000,
                                        mode="evaluation", name="plain")
    np.testing.assert_array_equal(
        [image for image, _ in plain.elements_of(records).as_numpy_iterator()],
        np.negative(images))


@pytest.mark.parametrize("fmt", FORMATS)
def test_fit_and_evaluate_in_process(prepared, fmt, embedded_cluster):
    builder = prepared[fmt]
    train = ke.ElasticDataset.from_tfds(builder, split="train", as_supervised=True,
                                        batch_size=32, minibatches_per_task=8,
                                        shuffle=True)
    validation = ke.ElasticDataset.from_tfds(
        builder.data_dir, split="validation", as_supervised=True, batch_size=128,
        minibatches_per_task=1, mode="evaluation", name="validation")
    model = digits_model()
    history = model.fit(train, epochs=2, verbose=0, validation_data=validation)
    assert history.history["val_accuracy"][-1] >= 0.8, history.history
    status = embedded_cluster.master.status()["datasets"]["training"]
    assert status["tasks_per_epoch"] == sum(
        -(-n // 256) for n in builder.info.splits["train"].shard_lengths)

    # decode=False: dataset_fn gets the serialized examples and decodes them.
    features = builder.info.features

    def dataset_fn(records, mode):
        return records.map(features.deserialize_example).map(
            lambda ex: (ex["image"], ex["label"]))

    raw = ke.ElasticDataset.from_tfds(builder, split="validation", decode=False,
                                      dataset_fn=dataset_fn, batch_size=128,
                                      mode="evaluation", name="raw")
    assert raw.source.record_spec == tf.TensorSpec([], tf.string)
    logs = model.evaluate(raw, return_dict=True, verbose=0)
    np.testing.assert_allclose(logs["accuracy"], history.history["val_accuracy"][-1],
                               atol=1e-6)


def test_plain_array_record_files(array_record_files, embedded_cluster):
    sys.path.insert(0, os.path.join(REPO, "examples", "digits"))
    import model_def
    from array_record.python.array_record_module import ArrayRecordReader

    files = array_record_files["train"]
    pattern = os.path.join(os.path.dirname(files[0]), "train-*.array_record")
    src = as_source(pattern)
    assert isinstance(src, ArrayRecordSource)
    counts = [ArrayRecordReader(f).num_records() for f in files]
    assert src.shards() == list(zip(files, counts))
    assert list(src.read(files[1], 3, 11)) == ArrayRecordReader(files[1]).read_all()[3:11]
    with pytest.raises(IndexError, match=r"records \[0, 9999\) out of range"):
        src.read(files[0], 0, 9999)
    other = os.path.join(os.path.dirname(files[0]), "other.tfrecord")
    open(other, "wb").close()
    with pytest.raises(ValueError, match=r"the files mix ArrayRecord files .* with "
                       rf"others read as TFRecord \({other}\)"):
        as_source([pattern, other])
    os.remove(other)
    train = ke.ElasticDataset(pattern, dataset_fn=model_def.dataset_fn, batch_size=32,
                              minibatches_per_task=8, shuffle=True)
    validation = ke.ElasticDataset(array_record_files["validation"],
                                   dataset_fn=model_def.dataset_fn, batch_size=128,
                                   minibatches_per_task=1, mode="evaluation",
                                   name="validation")
    model = digits_model()
    history = model.fit(train, epochs=2, verbose=0, validation_data=validation)
    assert history.history["val_accuracy"][-1] >= 0.8, history.history


def test_errors_name_the_problem(tmp_path, prepared):
    data_dir = os.path.dirname(os.path.dirname(prepared["tfrecord"].data_dir))
    # Not prepared: by name, by builder, by directory; nothing is downloaded.
    with pytest.raises(FileNotFoundError, match=r"'ke_digits' is not prepared in .*"
                       r"download_and_prepare"):
        ke.ElasticDataset.from_tfds("ke_digits", data_dir=str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match=r"'ke_digits' is not prepared in"):
        ke.ElasticDataset.from_tfds(tfds_digits.KeDigits, data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"nowhere/ke_digits/1.0.0 is not a "
                       r"prepared TFDS dataset version \(no dataset_info.json"):
        ke.ElasticDataset.from_tfds(str(tmp_path / "nowhere" / "ke_digits" / "1.0.0"))
    with pytest.raises(FileNotFoundError, match=r"no TFDS dataset 'no_such_digits': it "
                       r"is neither registered .* nor prepared in " + data_dir):
        ke.ElasticDataset.from_tfds("no_such_digits", data_dir=data_dir)
    with pytest.raises(ValueError, match=r"cannot load TFDS dataset 'ke_digits:9.0.0'"
                       r".*only: 1.0.0"):
        ke.ElasticDataset.from_tfds("ke_digits:9.0.0", data_dir=data_dir)
    # Unknown or malformed splits name the dataset's splits.
    with pytest.raises(ValueError, match=r"no split 'tset' \(it has \['train', "
                       r"'validation'\]\)"):
        ke.ElasticDataset.from_tfds("ke_digits", split="tset", data_dir=data_dir)
    with pytest.raises(ValueError, match=r"no split 'train\[:300%\]'"):
        TFDSSource(prepared["tfrecord"], "train[:300%]")
    with pytest.raises(ValueError, match="as_supervised=True needs decode=True"):
        TFDSSource(prepared["tfrecord"], as_supervised=True, decode=False)
    with pytest.raises(TypeError, match="from_tfds expects a dataset name"):
        ke.ElasticDataset.from_tfds(42)

    # A prepared dataset with a file missing.
    builder = tfds_digits.prepare(str(tmp_path / "gone"), "array_record", 2)
    gone = builder.info.splits["validation"].file_instructions[1].filename
    os.remove(gone)
    with pytest.raises(FileNotFoundError, match=r"'ke_digits' in .* is incomplete: 1 "
                       rf"file\(s\) of split 'validation' are missing, e.g. {gone}"):
        TFDSSource(builder, "validation")
    # A TFRecord shard whose records do not match the dataset info.
    builder = tfds_digits.prepare(str(tmp_path / "cut"), "tfrecord", 1)
    src = TFDSSource(builder, "validation")
    (shard, n), = src.shards()
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 100)
    with pytest.raises(CorruptRecordError, match=rf"{shard}: record #{n - 1} at byte "
                       "offset .* is cut short"):
        src.read(shard, 0, 1)


def damage(path, offset, length=16):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\xff" * length)


def test_corrupt_array_record_files_are_named(tmp_path, array_record_files,
                                              embedded_cluster):
    sys.path.insert(0, os.path.join(REPO, "examples", "digits"))
    import model_def

    # Not an ArrayRecord file at all, cut short (no footer), empty.
    bad = tmp_path / "bad.array_record"
    bad.write_bytes(b"not an array record file" * 10)
    with pytest.raises(ValueError, match=rf"{bad}: not a readable ArrayRecord file"):
        ArrayRecordSource(str(bad))
    good = open(array_record_files["validation"][0], "rb").read()
    cut = tmp_path / "cut.array_record"
    cut.write_bytes(good[:-40])
    with pytest.raises(ValueError, match=rf"{cut}: not a readable ArrayRecord file"):
        as_source(str(cut))
    (tmp_path / "empty.array_record").write_bytes(b"")
    with pytest.raises(ValueError, match="empty.array_record: not a readable"):
        ArrayRecordSource(str(tmp_path / "empty.array_record"))
    # A damaged record inside: the footer is fine, the read names the file,
    # the range and the checksum failure; a job fails with that message.
    broken = str(tmp_path / "validation-00000.array_record")
    with open(broken, "wb") as f:
        f.write(good)
    damage(broken, 200)
    src = ArrayRecordSource(broken)
    (_, n), = src.shards()
    with pytest.raises(ValueError, match=rf"{broken}: cannot read records \[0, {n}\): "
                       "Corrupted .*hash mismatch"):
        src.read(broken, 0, n)
    data = ke.ElasticDataset(broken, dataset_fn=model_def.dataset_fn, batch_size=64,
                             mode="evaluation", name="broken")
    model = ke.wrap(model_def.custom_model())
    with pytest.raises(Exception, match=rf"{broken}: cannot read records"):
        model.evaluate(data, verbose=0)
    # The same inside a TFDS ArrayRecord dataset.
    builder = tfds_digits.prepare(str(tmp_path / "tfds"), "array_record", 1)
    tfds_src = TFDSSource(builder, "validation")
    (shard, n), = tfds_src.shards()
    damage(shard, 300)
    with pytest.raises(ValueError, match=rf"{shard}: cannot read records \[0, {n}\)"):
        tfds_src.read(shard, 0, n)


# (training, validation, evaluation, fault): every source trains the digits
# model through the launcher, each job with a worker killed mid-epoch.
JOBS = {
    "tfds-array_record": ("tfds_dir:array_record", "tfds:tfrecord", "files:validation",
                          "after_push@6:w1"),
    "tfds-tfrecord": ("tfds_dir:tfrecord", "files:validation", "tfds:array_record",
                      "after_push@4:w0"),
    "array_record-files": ("files:train", "tfds_dir:tfrecord", "tfds_dir:array_record",
                           "after_claim@5:w1"),
}


EPOCHS = 8  # with the script's decaying rate, 0.98 at the end (0.94-0.97 at 5 epochs)


def job_source(spec, prepared, array_record_files):
    """A tfds_job_script.py source flag for a JOBS entry."""
    kind, _, what = spec.partition(":")
    if kind == "files":
        return "files:" + os.path.join(os.path.dirname(
            array_record_files[what][0]), f"{what}-*.array_record")
    version_dir = prepared[what].data_dir
    return f"{kind}:" + (version_dir if kind == "tfds_dir" else
                         os.path.dirname(os.path.dirname(version_dir)))


@pytest.mark.multiprocess
@pytest.mark.parametrize("job", list(JOBS))
def test_job_with_a_killed_worker_trains_once_per_record(
        tmp_path, prepared, array_record_files, job):
    train, validation, final, fault = JOBS[job]
    out = tmp_path / "out.json"
    job_dir = str(tmp_path / "job")
    result = launch(
        job_dir, os.path.join(REPO, "tests", "scripts", "tfds_job_script.py"),
        "--num_workers=2", "--num_ps=1", "--max_worker_restarts=1",
        script_args=(*(f"--{flag}=" + job_source(spec, prepared, array_record_files)
                       for flag, spec in (("train", train), ("validation", validation),
                                          ("evaluate", final))),
                     f"--epochs={EPOCHS}", "--sleep_per_batch=0.01", f"--output={out}"),
        env={"KERAS_ELASTIC_FAULTS": fault}, timeout=400)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    logs = "".join(open(os.path.join(job_dir, n)).read() for n in os.listdir(job_dir)
                   if n.startswith("worker-"))
    point = fault.split("@")[0]
    assert f"SIGKILL at '{point}'" in logs, output[-3000:]
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["workers_lost"] == 1 and summary["worker_restarts"] == 1
    # Tasks are record ranges of the shards the dataset info (or the
    # ArrayRecord footers) count.
    if train.startswith("files:"):
        from array_record.python.array_record_module import ArrayRecordReader

        lengths = [ArrayRecordReader(f).num_records() for f in array_record_files["train"]]
    else:
        lengths = prepared[train.split(":")[1]].info.splits["train"].shard_lengths
    training = summary["datasets"]["training"]
    assert training["tasks_per_epoch"] == sum(-(-n // 256) for n in lengths)
    assert_exactly_once(read_ledger(job_dir)["training"], num_epochs=EPOCHS,
                        tasks_per_epoch=training["tasks_per_epoch"])
    metrics = json.loads(out.read_text())
    print(job, metrics["history"]["val_accuracy"], metrics["final_accuracy"])
    for spec, described in zip((train, validation, final), metrics["sources"]):
        kind, _, what = spec.partition(":")
        assert (f"({what}, " if kind.startswith("tfds") else
                "ArrayRecord file(s)") in described, metrics["sources"]
    assert metrics["history"]["val_accuracy"][-1] >= 0.95, metrics
    assert metrics["final_accuracy"] >= 0.95, metrics

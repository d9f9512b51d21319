"""Checkpoint files on disk: manifest, atomic commit, listing, readers, export."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_elastic as ke
from keras_elastic.checkpoint import layout


def module(value: float = 0.0, shape=(4, 4)) -> tf.Module:
    m = tf.Module()
    m.w = tf.Variable(tf.fill(shape, value))
    return m


def dense_model(units: int = 3) -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(units)])
    model.compile(optimizer=keras.optimizers.SGD(momentum=0.5), loss="mse")
    return model


def test_manifest_records_callback_shards_and_extras(tmp_path):
    info = ke.checkpoint.save_trackables(
        str(tmp_path), "ps-0", {"vars": module(1.0, (64, 4))},
        tf.train.experimental.MaxShardSizePolicy(max_shard_size=512),
        extra_manifest={"epoch": 3, "batch": 0, "step": 120, "ps_count": 2,
                        "progress": {"tasks_done": 17}})
    assert info.path == os.path.join(str(tmp_path), "ps-0")
    with open(os.path.join(info.path, "manifest.json")) as f:
        raw = json.load(f)
    assert raw["format"] == "keras_elastic.checkpoint" and raw["version"] == 1
    assert raw["description"] == "Split tensors into shards with a max shard size."
    assert raw["callback_class"].endswith("sharding_policies.MaxShardSizePolicy")
    assert raw["num_shards"] == 2 and raw["shard_sizes"][0] == 512
    assert raw["ps_count"] == 2 and raw["progress"] == {"tasks_done": 17}
    assert raw["latency_s"] > 0 and raw["write_s"] >= raw["latency_s"]
    read = ke.checkpoint.read_manifest(info.path)
    assert (read.epoch, read.batch, read.step) == (3, 0, 120)
    assert read.extra == {"ps_count": 2, "progress": {"tasks_done": 17}}
    assert read.initial_epoch == 3 and read.sequence == 1
    assert read.shard_sizes == [os.path.getsize(f"{info.tf_prefix}.data-0000{i}-of-00002")
                                for i in range(2)]
    # Manifest keys unknown to this version stay readable, in `extra`.
    raw["written_by_a_newer_version"] = True
    with open(os.path.join(info.path, "manifest.json"), "w") as f:
        json.dump(raw, f)
    assert ke.checkpoint.read_manifest(info.path).extra["written_by_a_newer_version"]


def test_restore_trackables_roundtrip_and_sequence(tmp_path):
    directory = str(tmp_path)
    source = module(2.0)
    first = ke.checkpoint.save_trackables(directory, "a", {"vars": source})
    source.w.assign(tf.fill((4, 4), 5.0))
    second = ke.checkpoint.save_trackables(directory, "b", {"vars": source})
    assert (first.sequence, second.sequence) == (1, 2)
    target = module()
    assert ke.checkpoint.restore_trackables(directory, {"vars": target}).name == "b"
    assert float(target.w[0, 0]) == 5.0
    ke.checkpoint.restore_trackables(first.path, {"vars": target})
    assert float(target.w[0, 0]) == 2.0


def test_same_name_is_replaced_atomically(tmp_path):
    directory = str(tmp_path)
    source = module(1.0)
    ke.checkpoint.save_trackables(directory, "best", {"vars": source})
    source.w.assign(tf.fill((4, 4), 7.0))
    info = ke.checkpoint.save_trackables(directory, "best", {"vars": source})
    assert os.listdir(directory) == ["best"] and info.sequence == 2
    target = module()
    ke.checkpoint.restore_trackables(directory, {"vars": target})
    assert float(target.w[0, 0]) == 7.0


def test_max_to_keep_prunes_oldest(tmp_path):
    directory = str(tmp_path)
    writer = ke.checkpoint.CheckpointWriter(directory, {"vars": module()},
                                            max_to_keep=2)
    for i in range(4):
        writer.save(f"c{i}", {"step": i})
    assert sorted(os.listdir(directory)) == ["c2", "c3"]
    assert [c.step for c in ke.checkpoint.list_checkpoints(directory)] == [2, 3]


def test_incomplete_and_foreign_directories_are_not_checkpoints(tmp_path):
    directory = str(tmp_path)
    ke.checkpoint.save_trackables(directory, "good", {"vars": module()})
    os.makedirs(os.path.join(directory, "no-manifest"))
    os.makedirs(os.path.join(directory, ".tmp-half-host-1-abcdef12"))
    bad = os.path.join(directory, "foreign")
    os.makedirs(bad)
    with open(os.path.join(bad, "manifest.json"), "w") as f:
        json.dump({"format": "something-else"}, f)
    assert [c.name for c in ke.checkpoint.list_checkpoints(directory)] == ["good"]
    with pytest.raises(ke.checkpoint.CheckpointError,
                       match="no-manifest has no manifest.json, so it is not a "
                             "complete checkpoint"):
        ke.checkpoint.read_manifest(os.path.join(directory, "no-manifest"))
    with pytest.raises(ke.checkpoint.CheckpointError,
                       match=r"foreign/manifest.json is not a keras_elastic "
                             r"checkpoint manifest \(format='something-else'"):
        ke.checkpoint.read_manifest(bad)


@pytest.mark.multiprocess
def test_stale_temporary_directories_of_dead_savers_are_removed(tmp_path):
    directory = str(tmp_path)
    host = socket.gethostname().replace("-", "_")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = os.path.join(directory, f".tmp-c-{host}-{dead.stdout.strip()}-0123abcd")
    alive = os.path.join(directory, f".tmp-c-{host}-{os.getpid()}-0123abcd")
    other_host = os.path.join(directory, ".tmp-c-elsewhere-1-0123abcd")
    deleting = os.path.join(directory, ".del-c-0123abcd")
    for path in (stale, alive, other_host, deleting):
        os.makedirs(path)
    assert sorted(layout.remove_stale(directory)) == sorted([stale, deleting])
    assert sorted(os.listdir(directory)) == sorted(
        os.path.basename(p) for p in (alive, other_host))


def test_checkpoint_replaced_when_the_saver_died_is_still_found(tmp_path):
    # The state a crash between the two renames of a replacement leaves.
    directory = str(tmp_path)
    info = ke.checkpoint.save_trackables(directory, "best", {"vars": module(3.0)})
    old = os.path.join(directory, ".old-best-0123abcd")
    os.rename(info.path, old)
    assert [c.path for c in ke.checkpoint.list_checkpoints(directory)] == [old]
    target = module()
    ke.checkpoint.restore_trackables(directory, {"vars": target})
    assert float(target.w[0, 0]) == 3.0
    layout.remove_stale(directory)
    assert os.listdir(directory) == ["best"]


def test_restore_model_builds_optimizer_and_restores_slots(tmp_path):
    model = dense_model()
    x, y = np.ones((8, 4), "float32"), np.zeros((8, 3), "float32")
    model.fit(x, y, epochs=2, verbose=0)
    ke.checkpoint.save_trackables(str(tmp_path), "c",
                                  {"model": model, "optimizer": model.optimizer},
                                  extra_manifest={"epoch": 2})
    fresh = dense_model()
    assert not fresh.optimizer.built
    info = ke.checkpoint.restore_model(fresh, str(tmp_path))
    assert info.initial_epoch == 2 == ke.checkpoint.initial_epoch(str(tmp_path))
    for a, b in zip(model.optimizer.variables, fresh.optimizer.variables,
                    strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert np.abs(fresh.optimizer.variables[-1].numpy()).sum() > 0  # a momentum


def test_reader_errors_name_what_is_wrong(tmp_path):
    directory = str(tmp_path / "ckpts")
    with pytest.raises(ke.checkpoint.CheckpointError,
                       match=f"No checkpoint to restore: {directory} does not exist"):
        ke.checkpoint.resolve(directory)
    os.makedirs(directory)
    with pytest.raises(ke.checkpoint.CheckpointError,
                       match="is neither a complete checkpoint"):
        ke.checkpoint.resolve(directory)
    assert ke.checkpoint.initial_epoch(directory) == 0
    ke.checkpoint.save_trackables(directory, "c", {"model": dense_model(3)})
    with pytest.raises(ke.checkpoint.CheckpointError,
                       match=r"holds \['model'\], not \['optimizer'\]"):
        ke.checkpoint.restore_trackables(directory, {"optimizer": module()})
    with pytest.raises(ke.checkpoint.CheckpointError,
                       match=r"Cannot read checkpoint .*/c: .*shape"):
        ke.checkpoint.restore_model(dense_model(5), directory)
    bigger = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                               keras.layers.Dense(2)])
    with pytest.raises(ke.checkpoint.CheckpointError,
                       match=r"does not match model .*: it has no value for 2 of "
                             r"its 4 weights, e.g. \['sequential\w*/dense\w*/kernel'"):
        ke.checkpoint.restore_model(bigger, directory)
    with pytest.raises(ke.checkpoint.CheckpointError,
                       match=r"does not match the objects being restored"):
        ke.checkpoint.restore_trackables(directory, {"model": bigger})
    unbuilt = keras.Sequential([keras.layers.Dense(3)])
    with pytest.raises(ke.checkpoint.CheckpointError, match="is not built"):
        ke.checkpoint.restore_model(unbuilt, directory)


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "a/b"}, "must be a single, non-hidden path component"),
    ({"name": ".hidden"}, "must be a single, non-hidden path component"),
    ({"extra_manifest": {"sequence": 4}}, "'sequence' is reserved"),
    ({"extra_manifest": {"epoch": "3"}}, r"extra_manifest\['epoch'\] must be an int"),
    ({"extra_manifest": {"when": object()}}, "cannot be stored as JSON"),
    ({"trackables": {}}, "trackables must be a non-empty dict"),
    ({"trackables": {"not ok": 1}}, "must be a Python identifier"),
    ({"max_to_keep": 0}, "max_to_keep must be a positive int"),
])
def test_writer_argument_errors(tmp_path, kwargs, message):
    args = {"directory": str(tmp_path), "name": "c",
            "trackables": {"vars": module()}, **kwargs}
    with pytest.raises(ke.checkpoint.CheckpointError, match=message):
        ke.checkpoint.save_trackables(**args)
    assert ke.checkpoint.list_checkpoints(str(tmp_path)) == []


def test_weights_only_checkpoint_restores_weights(tmp_path):
    model = dense_model()
    ke.checkpoint.save_trackables(str(tmp_path), "w",
                                  {"weights": list(model.weights)})
    fresh = dense_model()
    ke.checkpoint.restore_model(fresh, str(tmp_path))
    for a, b in zip(model.weights, fresh.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_export_keras_is_atomic_and_loadable(tmp_path):
    model = dense_model()
    model.fit(np.ones((4, 4)), np.ones((4, 3)), verbose=0)
    path = ke.checkpoint.export_keras(model, str(tmp_path / "out" / "final.keras"))
    assert os.listdir(tmp_path / "out") == ["final.keras"]
    loaded = keras.saving.load_model(path)
    x = np.arange(8, dtype="float32").reshape(2, 4)
    np.testing.assert_allclose(loaded.predict(x, verbose=0),
                               model.predict(x, verbose=0))
    with pytest.raises(ValueError, match="the path must end in '.keras', got "
                                         ".*final.h5"):
        ke.checkpoint.export_keras(model, str(tmp_path / "final.h5"))


def test_restore_model_saved_before_the_optimizer_had_slots(tmp_path):
    untrained = dense_model()
    ke.checkpoint.save_trackables(str(tmp_path), "c", {"model": untrained})
    model = dense_model()
    model.fit(np.ones((4, 4)), np.ones((4, 3)), verbose=0)  # has momentum now
    ke.checkpoint.restore_model(model, str(tmp_path))
    for a, b in zip(untrained.weights, model.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_durable_save(tmp_path):
    writer = ke.checkpoint.CheckpointWriter(str(tmp_path), {"vars": module(4.0)},
                                            durable=True)
    info = writer.save("c")
    target = module()
    ke.checkpoint.restore_trackables(info.path, {"vars": target})
    assert float(target.w[1, 1]) == 4.0
    assert sorted(os.listdir(info.path)) == [
        "ckpt.data-00000-of-00001", "ckpt.index", "manifest.json"]

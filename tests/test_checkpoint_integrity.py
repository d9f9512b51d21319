"""Damaged checkpoints are found before they are used (issue 25, item 3).

Every save records the CRC-32 of each of its files; `verify` names a file
missing, cut short or changed; the readers (`latest_intact`, `resolve`,
`ShardedModelCheckpoint`'s restore) fall back to the newest intact
checkpoint, and fail with every checkpoint and its faults named when none is.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_elastic as ke
from keras_elastic.checkpoint import integrity, layout
from keras_elastic.checkpoint.errors import CheckpointError, NoIntactCheckpointError
from keras_elastic.checkpoint.writer import save_trackables


def save(directory, name, value):
    return save_trackables(str(directory), name,
                           {"v": tf.Variable(np.full(1000, value, np.float32))})


def data_file(info):
    return next(os.path.join(info.path, n) for n in info.checksums if ".data-" in n)


def flip_a_byte(path, at=100):
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_save_records_its_files_checksums_and_verifies(tmp_path):
    info = save(tmp_path, "ckpt-1", 1.0)
    assert sorted(info.checksums) == sorted(
        n for n in os.listdir(info.path) if n != "manifest.json")
    assert info.checksums == integrity.file_checksums(info.path)
    assert integrity.verify(layout.read_manifest(info.path)) == []


@pytest.mark.parametrize("damage, fault", [
    (flip_a_byte, "CRC-32"),
    (lambda p: os.truncate(p, 10), "has 10 bytes, the manifest says"),
    (os.remove, "is missing"),
])
def test_a_damaged_file_is_named(tmp_path, damage, fault):
    info = save(tmp_path, "ckpt-1", 1.0)
    damage(data_file(info))
    faults = integrity.verify(info)
    assert len(faults) == 1 and fault in faults[0]
    assert os.path.basename(data_file(info)) in faults[0]


def test_the_newest_intact_checkpoint_is_used_and_damaged_ones_are_named(tmp_path):
    old = save(tmp_path, "ckpt-1", 1.0)
    new = save(tmp_path, "ckpt-2", 2.0)
    flip_a_byte(data_file(new))
    assert layout.latest_intact(str(tmp_path)).path == old.path
    # resolve() (what restores use) falls back too; the damaged one, named
    # directly, is refused with its fault instead of TensorFlow's traceback.
    assert ke.checkpoint.resolve(str(tmp_path)).path == old.path
    with pytest.raises(CheckpointError, match="ckpt-2 is damaged: .*CRC-32"):
        ke.checkpoint.resolve(new.path)
    # Every one damaged: one error naming each with its fault.
    flip_a_byte(data_file(old))
    with pytest.raises(NoIntactCheckpointError) as e:
        layout.latest_intact(str(tmp_path))
    message = str(e.value)
    assert "each of the 2 is damaged" in message
    assert old.path in message and new.path in message and "CRC-32" in message
    assert layout.latest_intact(str(tmp_path / "empty")) is None


def test_restore_on_start_skips_a_damaged_newest_checkpoint(tmp_path):
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)

    def model():
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        m.compile(optimizer="sgd", loss="mse")
        return m

    directory = str(tmp_path / "ckpts")
    first = model()
    first.fit(x, y, epochs=2, verbose=0, callbacks=[
        ke.callbacks.ShardedModelCheckpoint(directory + "/")])
    checkpoints = layout.list_checkpoints(directory)
    assert [c.epoch for c in checkpoints] == [1, 2]
    flip_a_byte(data_file(checkpoints[-1]))
    again = ke.callbacks.ShardedModelCheckpoint(directory + "/")
    restored = again.restore(model())
    assert restored.path == checkpoints[0].path and again.initial_epoch == 1

"""ShardedModelCheckpoint on a plain Keras model (no cluster), in-process."""

from __future__ import annotations

import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_elastic as ke

ShardedModelCheckpoint = ke.callbacks.ShardedModelCheckpoint
RNG = np.random.default_rng(1)
X = RNG.random((64, 8), dtype=np.float32)
Y = X @ RNG.random((8, 1), dtype=np.float32)


def make_model(seed: int = 0, momentum: float = 0.0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.02, momentum=momentum),
                  loss="mse")
    return model


def fit(model, callbacks, epochs=3, **kwargs):
    return model.fit(X, Y, batch_size=16, epochs=epochs, shuffle=False, verbose=0,
                     callbacks=callbacks, **kwargs)


def names(directory):
    return [c.name for c in ke.checkpoint.list_checkpoints(directory)]


class KernelRecorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.kernels = []

    def on_epoch_end(self, epoch, logs=None):
        self.kernels.append(self.model.layers[0].kernel.numpy().copy())


def test_saves_every_epoch_with_manifest_and_save_info(tmp_path):
    directory = str(tmp_path / "ckpts")
    cb = ShardedModelCheckpoint(directory + "/")
    assert isinstance(cb, keras.callbacks.ModelCheckpoint)
    model = make_model()
    fit(model, [cb])
    assert names(directory) == ["ckpt-0001", "ckpt-0002", "ckpt-0003"]
    infos = ke.checkpoint.list_checkpoints(directory)
    assert [(i.epoch, i.batch, i.step) for i in infos] == [(1, 0, 4), (2, 0, 8),
                                                          (3, 0, 12)]
    info = cb.last_save_info
    assert info.name == "ckpt-0003" and info.trackables == ["model", "optimizer"]
    assert info.description == (
        "Split tensors into shards based on their device spec task.")
    assert info.num_shards == 1 and info.shard_sizes == [
        os.path.getsize(info.tf_prefix + ".data-00000-of-00001")]
    assert info.latency_s > 0 and info.extra["monitor"] == "val_loss"
    assert ke.checkpoint.read_manifest(info.path) == info


def test_filepath_format_fields_and_existing_directory(tmp_path):
    directory = tmp_path / "ckpts"
    cb = ShardedModelCheckpoint(str(directory / "ep{epoch:02d}-{loss:.3f}"))
    fit(make_model(), [cb], epochs=2)
    found = names(str(directory))
    assert len(found) == 2
    assert all(re.fullmatch(r"ep0[12]-\d+\.\d{3}", n) for n in found), found
    # An existing directory (not itself a checkpoint) holds ckpt-NNNN names.
    cb = ShardedModelCheckpoint(str(directory), max_to_keep=None,
                                restore_on_start=False)
    fit(make_model(), [cb], epochs=1)
    assert "ckpt-0001" in names(str(directory))


@pytest.mark.parametrize("mode, threshold, expected", [
    ("min", None, ["ckpt-0001", "ckpt-0002", "ckpt-0003"]),
    ("max", None, ["ckpt-0001"]),
    ("min", 0.0, []),
])
def test_save_best_only_monitor_mode(tmp_path, mode, threshold, expected):
    directory = str(tmp_path)
    cb = ShardedModelCheckpoint(directory + "/", monitor="loss", mode=mode,
                                save_best_only=True,
                                initial_value_threshold=threshold)
    history = fit(make_model(), [cb])
    losses = history.history["loss"]
    assert losses[0] > losses[1] > losses[2]  # so "min" improves every epoch
    assert names(directory) == expected
    for info in ke.checkpoint.list_checkpoints(directory):
        assert info.extra["best"] == pytest.approx(losses[info.epoch - 1])
    if not expected:
        assert cb.last_save_info is None


def test_best_checkpoint_under_a_fixed_name_and_best_survives_resume(tmp_path):
    directory = str(tmp_path)
    cb = ShardedModelCheckpoint(os.path.join(directory, "best"), monitor="loss",
                                mode="min", save_best_only=True)
    history = fit(make_model(), [cb])
    assert os.listdir(directory) == ["best"]
    info = ke.checkpoint.latest(directory)
    assert (info.epoch, info.sequence) == (3, 3)
    resumed = ShardedModelCheckpoint(os.path.join(directory, "best"),
                                     monitor="loss", mode="min",
                                     save_best_only=True)
    resumed.restore(make_model(seed=3))
    assert resumed.best == pytest.approx(history.history["loss"][-1])


def test_max_to_keep(tmp_path):
    cb = ShardedModelCheckpoint(str(tmp_path) + "/", max_to_keep=2)
    fit(make_model(), [cb], epochs=4)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-0003", "ckpt-0004"]


def test_save_every_n_batches(tmp_path):
    cb = ShardedModelCheckpoint(str(tmp_path) + "/", save_freq=3)
    fit(make_model(), [cb], epochs=2)  # 4 batches per epoch: steps 3 and 6
    infos = ke.checkpoint.list_checkpoints(str(tmp_path))
    assert [(i.name, i.epoch, i.batch, i.step) for i in infos] == [
        ("ckpt-0001-000003", 0, 3, 3), ("ckpt-0002-000002", 1, 2, 6)]


def test_save_best_only_every_n_batches(tmp_path):
    cb = ShardedModelCheckpoint(str(tmp_path) + "/", save_freq=2, monitor="loss",
                                mode="min", save_best_only=True, max_to_keep=None)
    fit(make_model(), [cb], epochs=1)
    infos = ke.checkpoint.list_checkpoints(str(tmp_path))
    assert [i.step for i in infos] == [2, 4]
    assert infos[1].extra["best"] < infos[0].extra["best"]


def test_async_save_writes_what_the_model_held_at_each_save(tmp_path):
    directory = str(tmp_path)
    cb = ShardedModelCheckpoint(
        directory + "/", async_save=True, max_to_keep=None,
        sharding_callback=tf.train.experimental.MaxShardSizePolicy(
            max_shard_size=256))
    recorder = KernelRecorder()  # runs right after the save, same weights
    fit(make_model(momentum=0.9), [cb, recorder], epochs=3)
    infos = ke.checkpoint.list_checkpoints(directory)
    assert [i.name for i in infos] == ["ckpt-0001", "ckpt-0002", "ckpt-0003"]
    assert cb.last_save_info.name == "ckpt-0003"
    for info, kernel in zip(infos, recorder.kernels, strict=True):
        assert info.async_save and info.num_shards > 1
        restored = make_model(seed=9)
        ke.checkpoint.restore_model(restored, info.path)
        np.testing.assert_array_equal(restored.layers[0].kernel.numpy(), kernel)


def test_restore_on_start_resumes_from_the_saved_epoch(tmp_path):
    directory = str(tmp_path)
    first = make_model(momentum=0.9)
    fit(first, [ShardedModelCheckpoint(directory + "/")], epochs=2)
    model = make_model(seed=5, momentum=0.9)
    cb = ShardedModelCheckpoint(directory + "/", restore_on_start=True)
    history = fit(model, [cb], epochs=3)
    assert len(history.history["loss"]) == 1  # epoch 3 only
    assert cb.restored_from.name == "ckpt-0002" and cb.initial_epoch == 2
    assert names(directory) == ["ckpt-0001", "ckpt-0002", "ckpt-0003"]
    assert model._initial_epoch is None  # fit's resume hook is put back
    # Only the first fit after a restore resumes.
    assert len(fit(model, [cb], epochs=1).history["loss"]) == 1
    assert ke.checkpoint.latest(directory).name == "ckpt-0001"


def test_explicit_restore_then_initial_epoch(tmp_path):
    directory = str(tmp_path)
    fit(make_model(), [ShardedModelCheckpoint(directory + "/")], epochs=2)
    model = make_model(seed=4)
    cb = ShardedModelCheckpoint(directory + "/", restore_on_start=False)
    assert cb.restore(model).name == "ckpt-0002"
    history = fit(model, [cb], epochs=4, initial_epoch=cb.initial_epoch)
    assert len(history.history["loss"]) == 2
    assert ke.checkpoint.initial_epoch(directory) == 4


def test_weights_only(tmp_path):
    model = make_model(momentum=0.9)
    cb = ShardedModelCheckpoint(str(tmp_path) + "/", save_weights_only=True)
    fit(model, [cb], epochs=1)
    assert cb.last_save_info.trackables == ["weights"]
    fresh = make_model(seed=2)
    ke.checkpoint.restore_model(fresh, str(tmp_path))
    for a, b in zip(model.weights, fresh.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


class _DropOnSecondSave(tf.train.experimental.ShardingCallback):
    description = "Drops a kernel from the second save on."

    def __init__(self):
        self.saves = 0

    def __call__(self, shardable_tensors):
        self.saves += 1
        shard = {}
        for st in shardable_tensors:
            if self.saves >= 2 and tuple(st.shape) == (8, 16):
                continue
            shard.setdefault(st.checkpoint_key, {})[st.slice_spec] = st.tensor
        return [shard]


@pytest.mark.parametrize("async_save", [False, True])
def test_broken_callback_stops_fit_and_keeps_previous_checkpoint(tmp_path,
                                                                async_save):
    directory = str(tmp_path)
    model = make_model()
    recorder = KernelRecorder()
    cb = ShardedModelCheckpoint(directory + "/", async_save=async_save,
                                sharding_callback=_DropOnSecondSave())
    with pytest.raises(ke.checkpoint.ShardingCallbackError,
                       match=r"Drops a kernel from the second save on.*broke the "
                             r"rule 'tensors must not be removed' for tensor "
                             r"'[^']+': it is missing from every shard"):
        fit(model, [cb, recorder], epochs=3)
    assert os.listdir(directory) == ["ckpt-0001"]
    fresh = make_model(seed=7)
    ke.checkpoint.restore_model(fresh, directory)
    np.testing.assert_array_equal(fresh.layers[0].kernel.numpy(),
                                  recorder.kernels[0])


def test_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="only the last path component may hold "
                                         "format fields"):
        ShardedModelCheckpoint(str(tmp_path / "e{epoch}" / "ckpt"))
    with pytest.raises(ValueError, match="Unrecognized save_freq: 'often'"):
        ShardedModelCheckpoint(str(tmp_path) + "/", save_freq="often")
    with pytest.raises(ValueError, match="Unrecognized save_freq: 2.5"):
        ShardedModelCheckpoint(str(tmp_path) + "/", save_freq=2.5)
    with pytest.raises(ValueError, match="must not start with '.'"):
        ShardedModelCheckpoint(str(tmp_path / ".hidden"))
    with pytest.raises(TypeError, match="is the class MaxShardSizePolicy; pass "
                                        "an instance"):
        ShardedModelCheckpoint(str(tmp_path) + "/", sharding_callback=(
            tf.train.experimental.MaxShardSizePolicy))
    with pytest.raises(ValueError, match="max_to_keep must be a positive int"):
        ShardedModelCheckpoint(str(tmp_path) + "/", max_to_keep=0)
    with pytest.raises(ValueError, match=r"restore\(\) needs the model"):
        ShardedModelCheckpoint(str(tmp_path) + "/").restore()


# -- Keras parity of the defaults, and resuming that is never silent (issue 13) --
def test_defaults_are_keras_keep_everything_restore_nothing(tmp_path):
    # Another run's checkpoints in the directory: a new fit with the defaults
    # trains every epoch, keeps every checkpoint, and leaves the others alone.
    directory = str(tmp_path) + "/"
    fit(make_model(), [ShardedModelCheckpoint(directory)], epochs=7)
    assert names(directory) == [f"ckpt-{e:04d}" for e in range(1, 8)]
    model = make_model(seed=3)
    kernel = model.layers[0].kernel.numpy()
    cb = ShardedModelCheckpoint(directory)
    history = fit(model, [cb], epochs=7)
    assert len(history.history["loss"]) == 7 and cb.restored_from is None
    assert not np.allclose(model.layers[0].kernel.numpy(), kernel)
    assert len(names(directory)) == 7  # replaced, nothing pruned


def test_restore_on_start_with_another_model_names_the_difference(tmp_path):
    directory = str(tmp_path) + "/"
    fit(make_model(), [ShardedModelCheckpoint(directory)], epochs=1)
    keras.utils.set_random_seed(0)
    other = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4),
                              keras.layers.Dense(1)])
    other.compile(optimizer="sgd", loss="mse")
    kernel = other.layers[0].kernel.numpy()
    with pytest.raises(ke.checkpoint.CheckpointError,
                       match=r"(?s)does not match model .*0000/kernel: shape \[8, 16\] "
                             r"in the checkpoint, \[8, 4\] in the model") as e:
        fit(other, [ShardedModelCheckpoint(directory, restore_on_start=True)])
    np.testing.assert_array_equal(other.layers[0].kernel.numpy(), kernel)
    # A ModelMismatchError says which checkpoint and what differs (the CLI
    # restates it in its flags' terms).
    assert isinstance(e.value, ke.checkpoint.ModelMismatchError)
    assert e.value.path == str(tmp_path / "ckpt-0001")
    assert e.value.differences[0] == ("0000/kernel: shape [8, 16] in the checkpoint, "
                                      "[8, 4] in the model")


def test_a_restore_that_leaves_no_epoch_warns_with_its_epoch(tmp_path, caplog):
    directory = str(tmp_path) + "/"
    fit(make_model(), [ShardedModelCheckpoint(directory)], epochs=3)
    cb = ShardedModelCheckpoint(directory, restore_on_start=True)
    with caplog.at_level("WARNING"):
        history = fit(make_model(seed=1), [cb], epochs=2)
    assert history.history == {}
    assert re.search(r"restored .*ckpt-0003, saved at epoch 3: fit\(epochs=2\) has no "
                     r"epoch left to train", caplog.text), caplog.text


def test_another_callbacks_checkpoints_are_neither_restored_nor_pruned(tmp_path):
    directory = str(tmp_path)
    best = ShardedModelCheckpoint(os.path.join(directory, "best"), monitor="loss",
                                  save_best_only=True)
    fit(make_model(), [best], epochs=2)
    series = ShardedModelCheckpoint(os.path.join(directory, "e{epoch:02d}"),
                                    max_to_keep=2)
    fit(make_model(seed=1), [series], epochs=4)
    assert sorted(names(directory)) == ["best", "e03", "e04"]  # "best" kept
    assert series.latest().name == "e04" and best.latest().name == "best"
    # A restore picks the callback's own latest, not the directory's newest.
    resumed = ShardedModelCheckpoint(os.path.join(directory, "best"), monitor="loss",
                                     save_best_only=True, restore_on_start=True)
    fit(make_model(seed=2), [resumed], epochs=3)
    assert resumed.restored_from.name == "best"


def test_save_freq_takes_what_keras_takes(tmp_path):
    # An int (batches; 0 saves after every batch, as in Keras) or "epoch".
    cb = ShardedModelCheckpoint(str(tmp_path) + "/", save_freq=0)
    fit(make_model(), [cb], epochs=1)
    assert len(names(str(tmp_path))) == 4  # 64 samples / batch 16


def test_another_runs_checkpoint_is_left_untouched_and_not_restored(tmp_path):
    # Issue 13: a directory holding another run's checkpoint (another name).
    # A new fit with the defaults trains every epoch and leaves it byte-equal;
    # asked to restore with a mismatching model, a clear error.
    directory = str(tmp_path)
    fit(make_model(), [ShardedModelCheckpoint(
        os.path.join(directory, "other-{epoch:02d}"))], epochs=2)

    def snapshot() -> dict:
        out = {}
        for root, _, files in os.walk(directory):
            for name in files:
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    out[os.path.relpath(path, directory)] = f.read()
        return out

    before = snapshot()
    cb = ShardedModelCheckpoint(directory + "/")
    history = fit(make_model(seed=4), [cb], epochs=3)
    assert len(history.history["loss"]) == 3 and cb.restored_from is None
    after = snapshot()
    assert {k: v for k, v in after.items() if k.startswith("other-")} == before
    keras.utils.set_random_seed(0)
    other = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4),
                              keras.layers.Dense(1)])
    other.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ke.checkpoint.CheckpointError, match=r"\[8, 16\].*\[8, 4\]"):
        fit(other, [ShardedModelCheckpoint(directory + "/", restore_on_start=True)])

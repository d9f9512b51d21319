"""Checkpoints of parameter-server jobs: every server's share, restore onto a
different number of servers, resume mid-epoch, export."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from support.tfrecord_data import make_arrays

import keras_elastic as ke
from keras_elastic.checkpoint import ps_layout
from keras_elastic.ps.checkpoint_part import named_variables

CKPT = "{}/ckpt/"  # a directory (trailing slash): ckpt-0001, ckpt-0002, ...


def build_model():
    keras.utils.set_random_seed(7)
    inputs = keras.Input((8,))
    h = keras.layers.Dense(32, activation="relu")(inputs)
    h = keras.layers.Dense(32, activation="relu")(h)
    model = ke.Model(inputs, keras.layers.Dense(2, activation="softmax")(h))
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss="sparse_categorical_crossentropy")
    return model


def server_values(servers):
    out = {}
    for server in servers:
        out.update({n: v.numpy() for n, v in named_variables(server.store).items()})
    return out


@pytest.mark.parametrize("restore_ps", [1, 3])
def test_save_with_two_servers_restores_onto_another_count(tmp_path, start_cluster,
                                                          restore_ps):
    x, y = make_arrays(512)
    _, servers = start_cluster(2)
    callback = ke.callbacks.ShardedModelCheckpoint(
        CKPT.format(tmp_path),
        sharding_callback=tf.train.experimental.MaxShardSizePolicy(max_shard_size=2048))
    model = build_model()
    model.fit(ke.ElasticDataset((x, y), batch_size=32, minibatches_per_task=4),
              epochs=2, verbose=0, callbacks=[callback])
    info = callback.last_save_info
    assert info.extra["layout"] == "parameter_servers" and info.extra["num_ps"] == 2
    assert info.extra["parts"] == ["ps-000", "ps-001"]
    assert all(server.store.variables for server in servers)  # both servers saved
    for part in ps_layout.part_infos(info):  # every data file within the limit,
        for size, tensors in zip(part.shard_sizes, part.shard_tensors):
            assert size <= 2048 or "_CHECKPOINTABLE_OBJECT_GRAPH" in tensors
    saved = server_values(servers)
    assert any("momentum" in n for n in saved)  # Adam slots are in the checkpoint

    _, servers = start_cluster(restore_ps)
    resumed = build_model()  # other initial values: the checkpoint must win
    history = resumed.fit(ke.ElasticDataset((x, y), batch_size=32,
                                            minibatches_per_task=4),
                          epochs=2, verbose=0, callbacks=[
                              ke.callbacks.ShardedModelCheckpoint(CKPT.format(tmp_path),
                                            restore_on_start=True)])
    assert history.history == {}  # resumed after epoch 2 of 2: nothing left to do
    restored = server_values(servers)
    iterations = [n for n in saved if n.endswith("iteration")]
    assert set(restored) == set(saved)
    for name, value in saved.items():
        if name in iterations:  # each server counted its own updates
            continue
        np.testing.assert_array_equal(restored[name], value, err_msg=name)
    for a, b in zip(model.get_weights(), resumed.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_job_stopped_mid_epoch_resumes_with_only_the_remaining_tasks(tmp_path,
                                                                    start_cluster):
    x, y = make_arrays(1024)
    dataset = ke.ElasticDataset((x, y), batch_size=16, minibatches_per_task=4)  # 16
    cluster, _ = start_cluster(1)

    class Crash(keras.callbacks.Callback):  # 64 batches per epoch
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch == 1 and batch == 40:  # after the save at batch 80 (16)
                raise KeyboardInterrupt("stopped")

    checkpoint = ke.callbacks.ShardedModelCheckpoint(CKPT.format(tmp_path),
                                                     save_freq=80)
    with pytest.raises(KeyboardInterrupt):
        build_model().fit(dataset, epochs=3, verbose=0, callbacks=[checkpoint, Crash()])
    info = ke.checkpoint.latest(CKPT.format(tmp_path))
    progress = info.extra["progress"]["training"]
    assert progress["epoch"] == 1 and 0 < len(progress["done_task_ids"]) < 16

    cluster, _ = start_cluster(1)
    build_model().fit(dataset, epochs=3, verbose=0, callbacks=[
        ke.callbacks.ShardedModelCheckpoint(CKPT.format(tmp_path),
                                            restore_on_start=True)])
    ledger = cluster.master.status(include_ledger=True)["datasets"]["training"]["ledger"]
    epoch1 = sorted(e["task_id"] for e in ledger if e["epoch"] == 1)
    assert epoch1 == sorted(set(range(16)) - set(progress["done_task_ids"]))
    assert sorted(e["task_id"] for e in ledger if e["epoch"] == 2) == list(range(16))
    assert not [e for e in ledger if e["epoch"] == 0]


def test_export_after_elastic_training_and_restore_into_a_plain_model(tmp_path,
                                                                     start_cluster):
    x, y = make_arrays(256)
    start_cluster(2)
    model = build_model()
    model.fit(ke.ElasticDataset((x, y), batch_size=32), epochs=1, verbose=0,
              callbacks=[ke.callbacks.ShardedModelCheckpoint(CKPT.format(tmp_path))])
    path = ke.checkpoint.export_keras(model, str(tmp_path / "final.keras"))
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0),
                               atol=1e-6)
    plain = build_model()  # a fresh model, weights from the servers' checkpoint
    ke.checkpoint.restore_model(plain, CKPT.format(tmp_path))
    for a, b in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_restoring_another_models_checkpoint_is_refused(tmp_path, start_cluster):
    x, y = make_arrays(128)
    start_cluster(1)
    build_model().fit(ke.ElasticDataset((x, y), batch_size=32), epochs=1, verbose=0,
                      callbacks=[ke.callbacks.ShardedModelCheckpoint(
                          CKPT.format(tmp_path))])
    start_cluster(1)
    keras.utils.set_random_seed(7)
    inputs = keras.Input((8,))
    h = keras.layers.Dense(32, activation="relu")(inputs)
    h = keras.layers.Dense(32, activation="relu")(h)
    h = keras.layers.Dense(32, activation="relu")(h)  # one layer more
    bigger = ke.Model(inputs, keras.layers.Dense(2, activation="softmax")(h))
    bigger.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    # The difference is named, variable by variable, before anything is restored.
    with pytest.raises(ValueError, match=r"(?s)does not match model .*4 variable\(s\) "
                       r"differ.*0004/kernel: shape \[32, 2\] in the checkpoint, "
                       r"\[32, 32\] in the model.*0006/kernel: in the model, not in "
                       "the checkpoint"):
        bigger.fit(ke.ElasticDataset((x, y), batch_size=32), epochs=2, verbose=0,
                   callbacks=[ke.callbacks.ShardedModelCheckpoint(CKPT.format(tmp_path),
                                            restore_on_start=True)])

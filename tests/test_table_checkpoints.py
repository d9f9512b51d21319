"""Incremental checkpoints of embedding tables (issue 27): a checkpoint holds
the rows changed since its base; the chain restores what a full save holds.

Real servers (gRPC on 127.0.0.1, in this process), real checkpoint files.
"""

import os

import keras
import numpy as np
import pytest

from keras_elastic.checkpoint import integrity, layout, ps_layout
from keras_elastic.checkpoint.errors import CheckpointError
from keras_elastic.checkpoint.manifest import read_manifest
from keras_elastic.checkpoint.reader import resolve
from keras_elastic.ps import ParameterServer, PSClient
from keras_elastic.ps.checkpoint_coordinator import save_checkpoint
from keras_elastic.ps.update import Update

TABLE = {"dim": 4, "dtype": "float32", "input_dim": None, "initializer": "uniform",
         "max_rows": 400}
ADAGRAD = keras.optimizers.serialize(keras.optimizers.Adagrad(0.1))


@pytest.fixture
def servers():
    started = [ParameterServer(partition=i, num_partitions=2) for i in range(2)]
    yield started
    for s in started:
        s.stop(0)


def _client(servers) -> PSClient:
    client = PSClient([s.address for s in servers])
    client.init({"w": (np.zeros(3, np.float32), True)}, ADAGRAD, tables={"t": TABLE})
    return client


def _train(client, rng, ids_high, steps=4, batch=64):
    for _ in range(steps):
        ids = np.unique(rng.integers(0, ids_high, batch)).astype(np.int64)
        client.lookup({"t": ids})
        client.send(Update(grads={"w": np.ones(3, np.float32)}, rows={
            "t": (ids, rng.normal(size=(len(ids), 4)).astype(np.float32))}))


def _rows(path):
    """Table "t" of a checkpoint, by id (a full one lists each part's rows)."""
    ids, values, slots = ps_layout.read_table(resolve(path), "t", ["accumulator"])
    order = np.argsort(ids)
    return ids[order], values[order], {s: a[order] for s, a in slots.items()}


def _part_ids(part):
    """The ids of table "t" one server's part holds."""
    import tensorflow as tf

    return tf.train.load_checkpoint(part.tf_prefix).get_tensor(
        f"{ps_layout.TRACKABLE}/{ps_layout.table_tensor_name('t', 'ids')}"
        "/.ATTRIBUTES/VARIABLE_VALUE")


def _assert_same(a, b):
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[2]["accumulator"], b[2]["accumulator"])


def test_a_chain_of_incremental_checkpoints_restores_what_a_full_one_holds(
        servers, tmp_path):
    client, rng = _client(servers), np.random.default_rng(0)
    directory = str(tmp_path / "ckpts")
    _train(client, rng, 1000)
    full, _ = save_checkpoint(client, directory, "ckpt-000001", None)
    paths = [full.path]
    for k in (2, 3, 4):
        # New ids (and, past 400 rows, evictions), and updates of old ones.
        _train(client, rng, 1000 + 300 * k)
        info, _ = save_checkpoint(client, directory, f"ckpt-{k:06d}", None,
                                  table_base=paths[-1])
        assert info.extra["table_base"] == os.path.basename(paths[-1])
        paths.append(info.path)
    evicted = sum(s.table_stats["t"]["evicted"] for s in client.status_all())
    assert evicted > 0  # the chain holds removals too
    reference, _ = save_checkpoint(client, str(tmp_path / "full"), "ckpt-000001", None)
    _assert_same(_rows(paths[-1]), _rows(reference.path))
    # A delta part holds the rows changed since its base, not the table.
    _train(client, rng, 50, steps=1, batch=8)  # a few rows change
    small, _ = save_checkpoint(client, directory, "ckpt-000005", None,
                               table_base=paths[-1])
    held = sum(len(_part_ids(p)) for p in ps_layout.part_infos(small))
    assert 0 < held <= 8 < len(_rows(small.path)[0])
    # Restored onto 3 servers: every row and slot as saved.
    others = [ParameterServer(partition=i, num_partitions=3) for i in range(3)]
    try:
        resumed = PSClient([s.address for s in others], worker_id=1)
        resumed.init({"w": (np.zeros(3, np.float32), True)}, ADAGRAD,
                     tables={"t": TABLE}, restore_from=small.path)
        ids, values, slots = _rows(small.path)
        exported = [s.store.tables["t"].export() for s in others]
        got = np.concatenate([e[0] for e in exported])
        order = np.argsort(got)
        np.testing.assert_array_equal(got[order], ids)
        np.testing.assert_array_equal(np.concatenate([e[1] for e in exported])[order],
                                      values)
    finally:
        for s in others:
            s.stop(0)


def test_a_damaged_link_damages_its_successors_and_pruning_keeps_the_chain(
        servers, tmp_path):
    client, rng = _client(servers), np.random.default_rng(1)
    directory = str(tmp_path / "ckpts")
    paths = []
    for k in (1, 2, 3):
        _train(client, rng, 500)
        info, _ = save_checkpoint(client, directory, f"ckpt-{k:06d}", None,
                                  table_base=paths[-1] if paths else "",
                                  max_to_keep=1)
        paths.append(info.path)
    # Only ckpt-3 is kept, but its bases stay: its rows need them.
    assert sorted(os.listdir(directory)) == ["ckpt-000001", "ckpt-000002",
                                             "ckpt-000003"]
    data = next(n for n in os.listdir(os.path.join(paths[1], "ps-000"))
                if ".data-" in n)
    with open(os.path.join(paths[1], "ps-000", data), "r+b") as f:
        f.seek(0)
        f.write(b"\xff" * 8)  # a bit flip in the middle link
    faults = integrity.verify(read_manifest(paths[2]))
    assert faults and all(f.startswith("base ckpt-000002: ps-000/") for f in faults)
    with pytest.raises(CheckpointError, match="ckpt-000003 is damaged: base "
                                              "ckpt-000002: ps-000/.*CRC-32"):
        resolve(paths[2])
    assert layout.latest_intact(directory).path == paths[0]


def test_an_incremental_save_after_a_restore_is_refused_and_a_full_one_works(
        servers, tmp_path):
    client, rng = _client(servers), np.random.default_rng(2)
    directory = str(tmp_path / "ckpts")
    _train(client, rng, 300)
    first, _ = save_checkpoint(client, directory, "ckpt-000001", None)
    client.restore_all(first.path)  # a new incarnation of the servers' state
    _train(client, rng, 300)
    with pytest.raises(ValueError, match="is not of this server's state .* an "
                                         "incremental save needs a full one first"):
        save_checkpoint(client, directory, "ckpt-000002", None, table_base=first.path)
    assert sorted(os.listdir(directory)) == ["ckpt-000001"]  # nothing half-written
    save_checkpoint(client, directory, "ckpt-000002", None)


def test_automatic_checkpoints_save_tables_in_full_every_n_and_after_a_resume(
        servers, tmp_path):
    # The launcher's AutoCheckpointer with --ps_checkpoint_full_every=3: a full
    # save, then two holding the rows changed since the save before; a resume
    # (servers restored or restarted) makes the next one full again.
    from types import SimpleNamespace

    from keras_elastic.launcher.auto_checkpointer import AutoCheckpointer

    client, rng = _client(servers), np.random.default_rng(3)
    checkpointer = AutoCheckpointer(str(tmp_path / "auto"), [s.address for s in servers],
                                    master=None, keep=10, full_every=3)
    checkpointer._has_tables = True  # what its loop learns from the servers' Status
    no_training = SimpleNamespace(datasets={})
    bases = []
    try:
        for k in range(6):
            if k == 4:
                checkpointer.pause()
                checkpointer.resume()
            _train(client, rng, 500, steps=1)
            bases.append(checkpointer.save(no_training).extra.get("table_base") or "")
    finally:
        checkpointer.stop()
    assert bases == ["", "ckpt-000001", "ckpt-000002", "", "", "ckpt-000005"], bases

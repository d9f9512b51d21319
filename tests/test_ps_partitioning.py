"""Variables split over parameter servers (issue 26): the layout, Keras'
optimizers on slices, checkpoints restored onto other server counts.

The servers are real (gRPC on 127.0.0.1, in this process); the layout is a
pure function, tested without them.
"""

import keras
import numpy as np
import pytest

from keras_elastic.checkpoint import ps_layout
from keras_elastic.checkpoint.errors import CheckpointError
from keras_elastic.checkpoint.manifest import read_manifest
from keras_elastic.checkpoint.ps_manifest import write_ps_manifest
from keras_elastic.checkpoint.reader import resolve
from keras_elastic.common import variable_slices
from keras_elastic.ps import ParameterServer, PSClient
from keras_elastic.ps.checkpoint_part import init_from_checkpoint
from keras_elastic.ps.partition import (
    PARTITION_BYTES_ENV,
    Spec,
    elementwise,
    layout,
    partition_bytes,
    ps_for,
)
from keras_elastic.ps.store import ParameterStore
from keras_elastic.ps.update import Update


def _held(specs, pieces, num_ps):
    by_key = {s.key: s for s in specs}
    held = [0] * num_ps
    for parts in pieces.values():
        for p in parts:
            held[p.server] += (p.end - p.begin) * by_key[p.key].itemsize
    return held


# -- the layout ------------------------------------------------------------------
def test_slices_cover_each_variable_in_order_and_balance_the_servers():
    specs = [Spec(f"{i:04d}/dense/kernel", size, 4, True)
             for i, size in enumerate([90_000, 7, 5_000, 30_000, 1])]
    for num_ps in (2, 3, 4, 7):
        pieces = layout(specs, num_ps, 1024)
        assert pieces == layout(specs, num_ps, 1024)  # a pure function
        for spec in specs:
            parts = pieces[spec.key]
            assert parts[0].begin == 0 and parts[-1].end == spec.size
            assert all(a.end == b.begin for a, b in zip(parts, parts[1:]))
            assert all(p.begin < p.end for p in parts)
        held = _held(specs, pieces, num_ps)
        assert max(held) - min(held) <= 4 * (7 + 1), (num_ps, held)  # the whole ones
        # At most num_ps - 1 cuts beyond one piece per variable.
        assert sum(len(p) for p in pieces.values()) <= len(specs) + num_ps - 1


def test_what_is_never_split():
    specs = [Spec("w", 100_000, 4, True), Spec("moving_mean", 2_000, 4, False),
             Spec("small", 100, 4, True), Spec("one", 1, 4, True)]
    for key, parts in layout(specs, 1, 16).items():  # one server
        assert [(p.name, p.server) for p in parts] == [(key, 0)]
    for key, parts in layout(specs, 3, None).items():  # partitioning off
        assert [(p.name, p.server) for p in parts] == [(key, ps_for(key, 3))]
    split = layout(specs, 3, 1024)
    assert len(split["w"]) == 3
    for key in ("moving_mean", "small", "one"):  # not trainable, small, one element
        assert [(p.name, p.server) for p in split[key]] == [(key, ps_for(key, 3))]


def test_a_server_holding_a_large_whole_variable_gets_no_slices():
    big = Spec("not_trainable", 60_000, 4, False)
    specs = [big, Spec("w", 60_000, 4, True)]
    pieces = layout(specs, 2, 1024)
    hot = ps_for("not_trainable", 2)
    assert {p.server for p in pieces["w"]} == {1 - hot}
    assert _held(specs, pieces, 2) == [240_000, 240_000]


def test_the_threshold_and_which_optimizers_may_be_split(monkeypatch):
    monkeypatch.delenv(PARTITION_BYTES_ENV, raising=False)
    assert partition_bytes() == 64 << 10
    monkeypatch.setenv(PARTITION_BYTES_ENV, "0")
    assert partition_bytes() is None
    monkeypatch.setenv(PARTITION_BYTES_ENV, "lots")
    with pytest.raises(ValueError, match=f"{PARTITION_BYTES_ENV}='lots' is not a "
                                         "number of bytes"):
        partition_bytes()
    for optimizer, expected in [
            (keras.optimizers.Adam(), True), (keras.optimizers.Lion(), True),
            (keras.optimizers.SGD(momentum=0.9, nesterov=True), True),
            (keras.optimizers.SGD(clipnorm=1.0), False),
            (keras.optimizers.Adam(global_clipnorm=1.0), False),
            (keras.optimizers.Adafactor(), False), (keras.optimizers.Lamb(), False),
            (keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD()), False)]:
        assert elementwise(keras.optimizers.serialize(optimizer)) is expected, optimizer


def test_slice_names_survive_the_servers_and_checkpoints_renaming():
    name = variable_slices.slice_name("0003/dense/kernel", 4, 8, 12)
    slot = "0003_dense_kernel__slice_4_8_of_12_momentum"  # a server's slot name
    assert variable_slices.parse(slot).whole == "0003_dense_kernel_momentum"
    saved = ps_layout.variable_name(name)  # v_0003_dense_kernel__slice_4_8_of_12
    assert variable_slices.parse(saved).whole == ps_layout.variable_name(
        "0003/dense/kernel")
    with pytest.raises(ValueError, match="bad slice"):
        variable_slices.slice_name("w", 3, 3, 4)
    pieces = {variable_slices.slice_name("w", 0, 2, 5): np.arange(2.0),
              variable_slices.slice_name("w", 3, 5, 5): np.arange(2.0)}
    assert variable_slices.assemble(pieces) == {}  # element 2 is in no slice
    assert variable_slices.missing_slices(pieces) == ["w"]
    whole = np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(variable_slices.value_of({"w": whole}, variable_slices
                                                           .slice_name("w", 5, 7, 12)),
                                  [5.0, 6.0])
    with pytest.raises(ValueError, match="of 10 elements, the value has 12"):
        variable_slices.cut(whole, variable_slices.slice_name("w", 0, 2, 10))


# -- over real servers -----------------------------------------------------------
@pytest.fixture
def servers(request):
    count = getattr(request, "param", 3)
    started = [ParameterServer(partition=i, num_partitions=count) for i in range(count)]
    yield started
    for s in started:
        s.stop(0)


def _model_values(rng):
    return {"0000/wide/kernel": rng.normal(size=(40, 30)).astype(np.float32),
            "0001/wide/bias": rng.normal(size=30).astype(np.float32),
            "0002/out/kernel": rng.normal(size=(30, 5)).astype(np.float32)}


OPTIMIZERS = [
    lambda: keras.optimizers.SGD(0.1),
    lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    lambda: keras.optimizers.Adam(0.01, amsgrad=True),
    lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),
    lambda: keras.optimizers.Adamax(0.01),
    lambda: keras.optimizers.Nadam(0.01),
    lambda: keras.optimizers.Adagrad(0.1),
    lambda: keras.optimizers.Adadelta(1.0),
    lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, centered=True),
    lambda: keras.optimizers.Ftrl(0.1, l1_regularization_strength=0.01),
    lambda: keras.optimizers.Lion(0.001),
]


@pytest.mark.parametrize("make", OPTIMIZERS, ids=[
    "sgd", "sgd_nesterov", "adam_amsgrad", "adamw", "adamax", "nadam", "adagrad",
    "adadelta", "rmsprop_centered", "ftrl", "lion"])
def test_every_elementwise_optimizer_on_slices_equals_keras(servers, make):
    rng = np.random.default_rng(0)
    values = _model_values(rng)
    client = PSClient([s.address for s in servers])
    client.init({k: (v, True) for k, v in values.items()},
                keras.optimizers.serialize(make()), partition_bytes=256)
    held = [sorted(s.store.variables) for s in servers]
    assert all(any("__slice_" in k for k in keys) for keys in held), held
    local = {k: keras.Variable(v, name=k.replace("/", "_")) for k, v in values.items()}
    optimizer = make()
    for _ in range(4):
        grads = {k: rng.normal(size=v.shape).astype(np.float32)
                 for k, v in values.items()}
        remote = client.send(Update(grads=grads)).values
        optimizer.apply(list(grads.values()), list(local.values()))
    assert set(remote) == set(values)
    for key, variable in local.items():
        np.testing.assert_allclose(remote[key], variable.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=key)
    # The optimizer's slots come back whole (flat): what Keras saves of them.
    state = client.pull_optimizer_state()
    slots = 0
    for variable in optimizer.variables:
        name = variable.path.split("/", 1)[-1]
        if any(name.startswith(k.replace("/", "_") + "_") for k in values):
            np.testing.assert_allclose(
                np.reshape(state[name], variable.shape), variable.numpy(),
                rtol=1e-5, atol=1e-6, err_msg=name)
            slots += 1
    assert slots >= (3 if type(optimizer).__name__ != "SGD" or optimizer.momentum
                     else 0), state.keys()


def test_a_non_elementwise_optimizer_keeps_variables_whole(servers):
    values = _model_values(np.random.default_rng(0))
    client = PSClient([s.address for s in servers])
    client.init({k: (v, True) for k, v in values.items()},
                keras.optimizers.serialize(keras.optimizers.SGD(0.1, clipnorm=1.0)),
                partition_bytes=256)
    held = sorted(k for s in servers for k in s.store.variables)
    assert held == sorted(values)


def test_a_trained_optimizers_slots_are_split_with_their_variable(servers):
    rng = np.random.default_rng(1)
    values = _model_values(rng)
    # Named as the servers name them: Keras' slot names then match theirs.
    local = {k: keras.Variable(v, name=k.replace("/", "_")) for k, v in values.items()}
    optimizer = keras.optimizers.Adam(0.01)
    grads = [rng.normal(size=v.shape).astype(np.float32) for v in values.values()]
    optimizer.apply(grads, list(local.values()))  # trained once, then connected
    state = {}
    for variable in optimizer.variables:
        name = variable.path.split("/", 1)[-1]
        owner = next((k for k in values if name.startswith(k.replace("/", "_") + "_")),
                     None)
        state[name] = (variable.numpy(), owner)
    client = PSClient([s.address for s in servers])
    client.init({k: (v.numpy(), True) for k, v in local.items()},
                keras.optimizers.serialize(optimizer), optimizer_state=state,
                partition_bytes=256)
    pulled = client.pull_optimizer_state()
    for name, (value, _) in state.items():
        np.testing.assert_array_equal(np.reshape(pulled[name], np.shape(value)), value)
    more = [rng.normal(size=v.shape).astype(np.float32) for v in values.values()]
    remote = client.send(Update(grads=dict(zip(values, more)))).values
    optimizer.apply(more, list(local.values()))
    for key, variable in local.items():
        np.testing.assert_allclose(remote[key], variable.numpy(), rtol=1e-5, atol=1e-6)


def _save(client, directory) -> str:
    parts = client.save_all(directory)
    write_ps_manifest(directory, directory, parts, progress=None, sequence=0)
    return directory


@pytest.mark.parametrize("servers", [2], indirect=True)
@pytest.mark.parametrize("onto", [1, 3])
def test_a_checkpoint_of_split_variables_restores_onto_other_server_counts(
        servers, onto, tmp_path):
    rng = np.random.default_rng(2)
    values = _model_values(rng)
    config = keras.optimizers.serialize(keras.optimizers.Adam(0.01))
    client = PSClient([s.address for s in servers])
    client.init({k: (v, True) for k, v in values.items()}, config, partition_bytes=256)
    grads = [{k: rng.normal(size=v.shape).astype(np.float32) for k, v in values.items()}
             for _ in range(3)]
    client.send(Update(grads=grads[0]))
    saved = client.pull()
    saved_state = client.pull_optimizer_state()
    path = _save(client, str(tmp_path / "ckpt"))
    after = client.send(Update(grads=grads[1])).values  # the job goes on from the save...
    # ...and is resumed from it onto `onto` servers: the workers' Init restores.
    others = [ParameterServer(partition=i, num_partitions=onto) for i in range(onto)]
    try:
        resumed = PSClient([s.address for s in others], worker_id=1)
        restored = resumed.init({k: (np.zeros_like(v), True) for k, v in values.items()},
                                config, restore_from=path, partition_bytes=256)
        for key in values:
            np.testing.assert_array_equal(restored[key], saved[key], err_msg=key)
        state = resumed.pull_optimizer_state()
        for name, value in saved_state.items():
            np.testing.assert_array_equal(np.reshape(state[name], -1),
                                          np.reshape(value, -1), err_msg=name)
        if onto == 3:
            assert all(any("__slice_" in k for k in s.store.variables) for s in others)
        # The same next update from the same state: the same values.
        again = resumed.send(Update(grads=grads[1])).values
        for key in values:
            np.testing.assert_allclose(again[key], after[key], rtol=1e-6, err_msg=key)
    finally:
        for s in others:
            s.stop(0)
    # The whole values, read from the checkpoint (export, `load_weights`).
    whole = ps_layout.read_values(resolve(path),
                                  [ps_layout.variable_name(k) for k in values])
    for key in values:
        np.testing.assert_array_equal(
            ps_layout.fit_shape(whole[ps_layout.variable_name(key)], values[key].shape),
            saved[key])


@pytest.mark.parametrize("servers", [2], indirect=True)
def test_a_restarted_server_rebuilds_its_slices_from_the_checkpoint(servers, tmp_path):
    values = _model_values(np.random.default_rng(3))
    config = keras.optimizers.serialize(keras.optimizers.SGD(0.1))
    client = PSClient([s.address for s in servers])
    client.init({k: (v, True) for k, v in values.items()}, config, partition_bytes=256)
    path = _save(client, str(tmp_path / "ckpt"))
    for index in (0, 1):  # as the launcher restarts a crashed server
        store = ParameterStore()
        init_from_checkpoint(store, index, 2, path)
        assert sorted(store.variables) == sorted(servers[index].store.variables)
        for key, variable in store.variables.items():
            np.testing.assert_array_equal(
                variable.numpy(), servers[index].store.variables[key].numpy())
    # Another server count cannot be guessed from the slices alone: said so.
    with pytest.raises(ValueError, match="was saved by 2 servers with variables split "
                                         "over them: a server 0 of 3 cannot be created"):
        init_from_checkpoint(ParameterStore(), 0, 3, path)


def test_launch_flags_of_partitioning_and_table_checkpoints_are_checked():
    from keras_elastic.launcher import LaunchConfig

    with pytest.raises(ValueError, match="--ps_partition_bytes must not be negative, "
                                         "got -1"):
        LaunchConfig(ps_partition_bytes=-1).validate()
    with pytest.raises(ValueError, match="--ps_checkpoint_full_every must be at least "
                                         "1, got 0"):
        LaunchConfig(ps_checkpoint_full_every=0).validate()


def test_a_slot_of_another_shape_than_its_split_variable_is_refused(servers):
    values = _model_values(np.random.default_rng(4))
    client = PSClient([s.address for s in servers])
    state = {"0000_wide_kernel_momentum": (np.zeros(7, np.float32), "0000/wide/kernel")}
    with pytest.raises(ValueError, match="optimizer variable '0000_wide_kernel_momentum' "
                                         "of '0000/wide/kernel' is not a slot of its "
                                         r"shape \[40, 30\]"):
        client.init({k: (v, True) for k, v in values.items()},
                    keras.optimizers.serialize(keras.optimizers.Adam()),
                    optimizer_state=state, partition_bytes=256)


@pytest.mark.parametrize("servers", [2], indirect=True)
def test_a_checkpoint_missing_a_slice_says_so(servers, tmp_path):
    values = _model_values(np.random.default_rng(5))
    client = PSClient([s.address for s in servers])
    client.init({k: (v, True) for k, v in values.items()},
                keras.optimizers.serialize(keras.optimizers.SGD()), partition_bytes=256)
    info = read_manifest(_save(client, str(tmp_path / "ckpt")))
    info.extra["parts"] = info.extra["parts"][:1]  # server 1's part lost
    name = ps_layout.variable_name("0000/wide/kernel")
    with pytest.raises(CheckpointError, match=r"the slices of \['v_0000_wide_kernel'\] "
                                              r"do not cover them \(a part is missing\?\)"):
        ps_layout.read_values(info, [name])

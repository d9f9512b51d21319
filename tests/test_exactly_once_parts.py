"""The parts of exactly-once updates, one at a time: the servers' task log, the
replay plan, claims and idempotent pushes over real gRPC, a checkpoint that
carries the log, and the `dataset_fn` determinism check."""

import os

import numpy as np
import pytest
import tensorflow as tf

import keras_elastic as ke
from keras_elastic.checkpoint.ps_manifest import write_ps_manifest
from keras_elastic.proto import ps_pb2
from keras_elastic.ps import ParameterServer, PSClient
from keras_elastic.ps.client import TaskClaim
from keras_elastic.ps.task_log import (
    DUPLICATE,
    FENCED,
    OVERLAP,
    Applied,
    Range,
    StaleLeaseError,
    TaskLog,
)
from keras_elastic.ps.update import Update
from keras_elastic.worker.replay import NondeterministicDatasetError, plan_replay

SGD1 = {"class_name": "SGD", "config": {"learning_rate": 1.0}}
TASK = ("training", 0, 3)


# -- the task log -------------------------------------------------------------
def test_task_log_applies_each_range_once_and_fences_old_leases():
    log = TaskLog()
    assert log.claim(TASK, lease=10) == {}
    first = Range(TASK, 10, 0, 16, fingerprint=7)
    assert log.check([first]) is None
    log.record([first])
    assert log.check([first]) == DUPLICATE          # a retried push
    assert log.check([Range(TASK, 10, 8, 24)]) == OVERLAP
    log.record([Range(TASK, 10, 16, 32, fingerprint=5)])
    assert log.applied(TASK) == [(0, 32)]           # merged
    # A new hand-out claims it: the old lease may no longer push.
    assert log.claim(TASK, lease=11) == {"": Applied([(0, 32)], 12)}
    assert log.check([Range(TASK, 10, 32, 48)]) == FENCED
    with pytest.raises(StaleLeaseError, match="held by a newer lease"):
        log.claim(TASK, lease=10)
    # Unclaimed task: fenced.
    assert log.check([Range(("training", 0, 4), 11, 0, 8)]) == FENCED


def test_task_log_prunes_old_epochs_and_survives_json():
    log = TaskLog()
    log.claim(("t", 0, 1), 1)
    log.record([Range(("t", 0, 1), 1, 0, 4, 9)])
    log.claim(("t", 1, 1), 2)
    assert len(log) == 2
    log.claim(("t", 2, 1), 3)                       # epoch 0 is over
    assert log.applied(("t", 0, 1)) == []
    with pytest.raises(StaleLeaseError, match="epoch 0 is over"):
        log.claim(("t", 0, 2), 4)
    log.record([Range(("t", 2, 1), 3, 0, 8, (1 << 64) - 1)])
    again = TaskLog.from_json(log.to_json())
    assert again.to_json() == log.to_json()
    assert again.claim(("t", 2, 1), 5) == {"": Applied([(0, 8)], (1 << 64) - 1)}


def test_each_update_of_a_step_is_logged_apart():
    # A GAN's step pushes the same elements twice: the discriminator
    # optimizer's update, then the generator's. Neither is a duplicate of the
    # other; each is idempotent on its own.
    log = TaskLog()
    log.claim(TASK, lease=1)
    d = Range(TASK, 1, 0, 16, fingerprint=3, update="d_optimizer")
    g = Range(TASK, 1, 0, 16, fingerprint=3, update="g_optimizer")
    log.record([d])
    assert log.check([g]) is None
    assert log.check([d]) == DUPLICATE
    log.record([g])
    assert log.claim(TASK, lease=2) == {"d_optimizer": Applied([(0, 16)], 3),
                                        "g_optimizer": Applied([(0, 16)], 3)}
    again = TaskLog.from_json(log.to_json())
    assert again.to_json() == log.to_json()
    # A worker died between the two updates of elements [16, 32): the next
    # one must run them again, the servers then apply only the missing update.
    log.record([Range(TASK, 2, 16, 32, 1, update="d_optimizer")])
    claim = TaskClaim([], 0, log.claim(TASK, lease=3))
    plan = plan_replay([claim], {(0, "d_optimizer"), (0, "g_optimizer")})
    assert plan.frontier == 32
    assert plan.segments == ((16, 32, (0,)),)


def test_task_log_intersection_keeps_what_every_part_applied():
    a, b = TaskLog(), TaskLog()
    for log, end in ((a, 32), (b, 16)):
        log.claim(TASK, 1)
        log.record([Range(TASK, 1, 0, end)])
    merged, differing = TaskLog.intersection([a, b])
    assert merged.applied(TASK) == [(0, 16)]
    assert differing == 16


# -- the replay plan ------------------------------------------------------------
@pytest.mark.parametrize("applied, frontier, segments", [
    ([[], []], 0, ()),
    ([[(0, 32)], [(0, 32)]], 32, ()),
    ([[(0, 48)], [(0, 32)]], 48, ((32, 48, (1,)),)),        # a push cut mid-way
    ([[(0, 16), (32, 48)], [(0, 48)]], 48, ((16, 32, (0,)),)),
    ([[(0, 8)], [], [(0, 8)]], 8, ((0, 8, (1,)),)),
])
def test_plan_replay(applied, frontier, segments):
    plan = plan_replay([TaskClaim(a, 0) for a in applied])
    assert plan.frontier == frontier
    assert plan.segments == segments


# -- claims and pushes over real gRPC -----------------------------------------
@pytest.fixture
def two_servers():
    started = [ParameterServer(partition=i, num_partitions=2) for i in range(2)]
    yield started
    for s in started:
        s.stop(0)


def _range(lease, start, end, fingerprint=0):
    return ps_pb2.TaskRange(dataset=TASK[0], epoch=TASK[1], task_id=TASK[2],
                            lease=lease, start=start, end=end, fingerprint=fingerprint)


def test_pushes_are_idempotent_per_range_on_every_server(two_servers):
    client = PSClient([s.address for s in two_servers], worker_id=0)
    names = [f"w{i}" for i in range(6)]
    client.init({n: (np.zeros(2, np.float32), True) for n in names}, SGD1)
    owners = {client.owner(n) for n in names}
    assert owners == {0, 1}  # both servers hold some
    assert client.claim(*TASK, lease=5) == [TaskClaim([], 0), TaskClaim([], 0)]
    grads = {n: np.full(2, -1, np.float32) for n in names}
    reply = client.send(Update(grads=grads, ranges=[_range(5, 0, 4, 11)]))
    assert reply.accepted and set(reply.statuses.values()) == {"applied"}
    # The same push again (its reply was lost): acknowledged, not applied.
    again = client.send(Update(grads=grads, ranges=[_range(5, 0, 4, 11)]))
    assert again.accepted and set(again.statuses.values()) == {"duplicate"}
    values = client.pull()
    assert all((values[n] == 1).all() for n in names), values
    # A push that reached server 0 only (the worker died); the next hand-out
    # sees it and completes server 1 only.
    client.send(Update(grads=grads, ranges=[_range(5, 4, 8, 13)]), targets=[0])
    claims = client.claim(*TASK, lease=6)
    assert claims == [TaskClaim([(0, 8)], 24), TaskClaim([(0, 4)], 11)]
    plan = plan_replay(claims)
    assert plan.frontier == 8 and plan.segments == ((4, 8, (1,)),)
    done = client.send(Update(grads=grads, ranges=[_range(6, 4, 8, 13)]), targets=[1])
    assert done.accepted
    assert all((v == 2).all() for v in client.pull().values())
    # The dead worker's lease is fenced everywhere.
    late = client.send(Update(grads=grads, ranges=[_range(5, 8, 12)]))
    assert not late.accepted and set(late.refusals().values()) == {"fenced"}
    assert client.claim(*TASK, lease=5) is None
    status = client.status_all()
    assert [s.duplicates for s in status] == [1, 1]


def test_checkpoint_carries_the_task_log(two_servers, tmp_path):
    client = PSClient([s.address for s in two_servers], worker_id=0)
    names = [f"w{i}" for i in range(6)]
    client.init({n: (np.zeros(2, np.float32), True) for n in names}, SGD1)
    client.claim(*TASK, lease=5)
    grads = {n: np.full(2, -1, np.float32) for n in names}
    client.send(Update(grads=grads, ranges=[_range(5, 0, 4, 3)]))
    temp, path = str(tmp_path / ".tmp-ckpt"), str(tmp_path / "ckpt")
    parts = client.save_all(temp)
    write_ps_manifest(temp, path, parts, progress={})
    client.send(Update(grads=grads, ranges=[_range(5, 4, 8, 3)]))          # after the save
    client.restore_all(path)
    # Values and log are back to the save: elements 4..8 are not applied.
    assert all((v == 1).all() for v in client.pull().values())
    assert client.claim(*TASK, lease=7) == [TaskClaim([(0, 4)], 3)] * 2


# -- dataset_fn determinism ----------------------------------------------------
def _records(tmp_path, n=64):
    path = str(tmp_path / "data.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for i in range(n):
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i]))}))
                .SerializeToString())
    return path


def _parse(records):
    spec = {"x": tf.io.FixedLenFeature([1], tf.float32)}
    return records.map(lambda r: tf.io.parse_single_example(r, spec)["x"])


def unseeded_shuffle(records, mode):
    return _parse(records).shuffle(64).map(lambda x: (x, x))


def random_augment(records, mode):
    # Unseeded noise (a fresh generator each call: a global seed set by another
    # test does not make it repeat).
    noise = tf.random.Generator.from_non_deterministic_state()
    return _parse(records).map(lambda x: (x + noise.uniform([1]), x))


def seeded_shuffle(records, mode):
    return _parse(records).shuffle(64, seed=3).map(lambda x: (x, x))


def test_nondeterministic_dataset_fn_is_an_error_naming_it(tmp_path):
    ds = ke.ElasticDataset(_records(tmp_path), dataset_fn=unseeded_shuffle,
                           batch_size=8)
    with pytest.raises(NondeterministicDatasetError, match="unseeded_shuffle"):
        ds.check_deterministic()


def test_random_augmentation_needs_deterministic_false(tmp_path):
    strict = ke.ElasticDataset(_records(tmp_path), dataset_fn=random_augment,
                               batch_size=8)
    with pytest.raises(NondeterministicDatasetError, match="deterministic=False"):
        strict.check_deterministic()
    ke.ElasticDataset(_records(tmp_path), dataset_fn=random_augment, batch_size=8,
                      deterministic=False).check_deterministic()
    ke.ElasticDataset(_records(tmp_path), dataset_fn=seeded_shuffle,
                      batch_size=8).check_deterministic()


def test_an_unexpected_server_error_is_internal_and_named_a_bug(two_servers,
                                                                monkeypatch):
    """An exception that is not a KerasElasticError (a bug of the server) is
    answered INTERNAL with the server, the method and the exception, never as
    a refusal of the request."""
    client = PSClient([s.address for s in two_servers], worker_id=0)
    names = [f"w{i}" for i in range(6)]
    client.init({n: (np.zeros(2, np.float32), True) for n in names}, SGD1)

    def broken(*args, **kwargs):
        raise RuntimeError("the store broke")

    monkeypatch.setattr(two_servers[0].store, "push", broken)
    with pytest.raises(ValueError) as e:
        client.send(Update(grads={n: np.ones(2, np.float32) for n in names},
                           ranges=[_range(5, 0, 4)]))
    message = str(e.value)
    assert "parameter server 0 (of 2), Push" in message
    assert "RuntimeError: the store broke (a bug of the parameter server" in message


def test_save_and_restore_requests_without_their_arguments_are_named(two_servers):
    client = PSClient([two_servers[0].address], worker_id=0)
    with pytest.raises(ValueError, match="Save needs a checkpoint directory"):
        client.save_all("")
    with pytest.raises(ValueError, match="Restore needs a checkpoint path"):
        client.restore(0, "")


def test_claims_handed_out_before_a_rollback_are_refused():
    # A worker still holds a task of a later epoch, handed out before the job
    # rolled back: claiming it must not retire the epochs being redone.
    log = TaskLog()
    log.claim(("t", 1, 0), 100)
    log.min_lease = 200                              # the rollback's floor
    with pytest.raises(StaleLeaseError, match="before the job rolled back"):
        log.claim(("t", 4, 2), 150)
    assert log.claim(("t", 1, 3), 201) == {}         # epoch 1 goes on
    assert TaskLog.from_json(log.to_json()).min_lease == 200


def test_paused_server_refuses_data_calls_until_resumed(two_servers):
    client = PSClient([s.address for s in two_servers], worker_id=0,
                      reconnect_timeout=0.5)
    names = [f"w{i}" for i in range(6)]
    client.init({n: (np.zeros(2, np.float32), True) for n in names}, SGD1)
    client.pause(1)
    assert client.status(1).paused is True
    with pytest.raises(ConnectionError, match="paused while the job rolls back"):
        client.claim(*TASK, lease=5)
    with pytest.raises(ConnectionError, match="paused"):
        client.pull()
    with pytest.raises(ValueError, match="Resume: min_lease must not be negative"):
        client.resume(1, min_lease=-1)
    client.resume(1, min_lease=5)
    assert client.claim(*TASK, lease=5) == [TaskClaim([], 0), TaskClaim([], 0)]
    assert set(client.pull()) == set(names)
    assert client.claim("training", 3, 1, lease=4) is None  # before the floor


def test_replay_check_names_a_dataset_fn_that_changed(tmp_path):
    from keras_elastic.proto import master_pb2
    from keras_elastic.worker.replay import Replay, Replayer

    ds = ke.ElasticDataset(_records(tmp_path), dataset_fn=seeded_shuffle, batch_size=8)
    records = ds.source.read(next(iter(ds.source.shards()))[0], 0, 64)
    task = master_pb2.Task(task_id=3, epoch=0, shard="data.tfrecord", start=0, end=64)
    checker = Replayer(model=None, dataset=ds, sync=None, runtime=None)

    def replay(claims):
        return Replay(0, task, records, claims, plan_replay(claims))

    # The servers applied 4 elements with other contents.
    with pytest.raises(NondeterministicDatasetError, match="fingerprints differ"):
        checker._check(replay([TaskClaim([(0, 4)], 123)]))
    # The servers applied more elements than dataset_fn now gives.
    with pytest.raises(NondeterministicDatasetError, match="now gives only 64"):
        checker._check(replay([TaskClaim([(0, 80)], None)]))


def test_bad_fault_plan_is_named():
    from keras_elastic.common import faults

    with pytest.raises(ValueError, match="bad entry 'mid_psh@2'"):
        faults._parse("mid_psh@2", "w0")
    with pytest.raises(ValueError, match="bad entry 'ps_push@2=melt'"):
        faults._parse("ps_push@2=melt", "ps0")
    assert faults._parse("mid_push@2:w1,after_push@3", "w0") == {
        "after_push": faults.Fault("after_push@3", 3)}
    assert faults._parse("ps_push@5:ps1=freeze,master_task@2:master=hang",
                         "ps1") == {
        "ps_push": faults.Fault("ps_push@5:ps1=freeze", 5, "freeze")}


def test_a_fault_fires_once_per_job_with_a_faults_dir(tmp_path, monkeypatch):
    """With KERAS_ELASTIC_FAULTS_DIR, a replacement of the role (same WHO)
    does not act again: the marker of the first firing is there."""
    from keras_elastic.common import faults

    monkeypatch.setenv(faults.ENV, "ps_push@2:ps0=freeze")
    monkeypatch.setenv(faults.DIR_ENV, str(tmp_path / "faults"))
    for _ in range(2):  # the process, then its replacement
        monkeypatch.setattr(faults, "_counts", {})
        faults.set_role("ps0")
        first = [faults.due("ps_push") for _ in range(3)]
        if _ == 0:
            assert first == [None, "freeze", None]
        else:
            assert first == [None, None, None]
    assert os.listdir(tmp_path / "faults") == ["ps_push@2_ps0_freeze.fired"]
    faults.set_role(None)


def test_a_hold_fault_waits_for_the_test_to_let_it_go(tmp_path, monkeypatch):
    """`hold`: the thread that reached the point says so (its pid) and waits
    until the test releases it, so a test does its outside fault (a SIGSTOP,
    a partition) at the code's moment, not at a guess from polling."""
    import threading

    from keras_elastic.common import faults

    entry = "ps_push@2:ps0=hold"
    monkeypatch.setenv(faults.ENV, entry)
    monkeypatch.setenv(faults.DIR_ENV, str(tmp_path))
    monkeypatch.setattr(faults, "_counts", {})
    faults.set_role("ps0")
    passed = []

    def server():
        for i in range(3):
            faults.reached("ps_push")
            passed.append(i)

    thread = threading.Thread(target=server, daemon=True)
    thread.start()
    assert faults.wait_held(str(tmp_path), entry, timeout=30) == os.getpid()
    thread.join(timeout=0.5)
    assert thread.is_alive() and passed == [0], passed  # held at its 2nd reach
    faults.release(str(tmp_path), entry)
    thread.join(timeout=30)
    assert passed == [0, 1, 2]
    faults.set_role(None)
    with pytest.raises(TimeoutError, match="'ps_push@9=hold' was not reached"):
        faults.wait_held(str(tmp_path), "ps_push@9=hold", timeout=0.1)

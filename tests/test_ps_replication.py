"""A parameter server and its backup in this process (ps/replication.py):
what is forwarded, the copy a new backup starts from, and what happens when
the backup cannot follow. The jobs with backups are tests/test_ps_replicas.py.
"""

import os

import numpy as np
import pytest

from keras_elastic.common.tensor_codec import bundle_bytes
from keras_elastic.proto import ps_pb2
from keras_elastic.ps import ParameterServer, ps_for
from keras_elastic.ps.client import PSClient
from keras_elastic.ps.replication import Backup, is_replicated, marker_path
from keras_elastic.ps.update import Update

SGD = {"class_name": "SGD", "config": {"learning_rate": 0.5}}
TABLE = {"emb": {"dim": 2, "initializer": "zeros"}}


@pytest.fixture
def servers(tmp_path):
    primary, backup = ParameterServer(), ParameterServer()
    primary.servicer.job_dir = str(tmp_path)
    primary.servicer.backup_timeout = 1.0
    clients = []

    def client(server):
        c = PSClient([server.address])
        clients.append(c)
        return c

    yield primary, backup, client
    for c in clients:
        c.close()
    primary.stop()
    backup.stop()


def ranges(task, start, end):
    return [ps_pb2.TaskRange(dataset="training", epoch=0, task_id=task, lease=1,
                             start=start, end=end)]


def train(client, task, start, end):
    """One push of elements [start, end) of `task`, claimed first."""
    client.claim("training", 0, task, 1)
    return client.send(Update(grads={"w": np.ones(2, "float32")},
                              rows={"emb": (np.array([3, 7], "int64"),
                                            np.ones((2, 2), "float32"))},
                              ranges=ranges(task, start, end)))


def state(client):
    status = client.status(0)
    values = client.pull()
    rows = client.lookup({"emb": np.array([3, 7], "int64")}, create=False)["emb"]
    return (values["w"].tolist(), rows.tolist(), status.tasks_logged)


def test_every_call_that_changes_the_state_reaches_the_backup(servers):
    primary, backup, client = servers
    c = client(primary)
    c.attach_backup(0, backup.address)
    c.init({"w": (np.ones(2, "float32"), True)}, SGD, tables=TABLE)
    train(c, 0, 0, 4)
    train(c, 1, 0, 4)
    # A repeat of a push both applied: a duplicate on both.
    again = c.send(Update(grads={"w": np.ones(2, "float32")}, ranges=ranges(1, 0, 4)))
    assert again.statuses == {0: "duplicate"}
    assert state(client(backup)) == state(c) == ([0.0, 0.0], [[-1.0, -1.0]] * 2, 2)
    assert c.status(0).replicated and c.status(0).backup == backup.address
    assert is_replicated(primary.servicer.job_dir, 0)


def test_a_new_backup_starts_from_a_copy_of_the_server(servers, tmp_path):
    primary, backup, client = servers
    c = client(primary)
    c.init({"w": (np.ones(2, "float32"), True)}, SGD, tables=TABLE)
    train(c, 0, 0, 4)
    # Attached late: refused without a copy of the state...
    with pytest.raises(ValueError, match="needs a copy of it"):
        c.attach_backup(0, backup.address)
    c.attach_backup(0, backup.address, copy_dir=str(tmp_path / "copies"))
    train(c, 1, 0, 4)  # ... and forwarded after it
    b = client(backup)
    assert state(b) == state(c) == ([0.0, 0.0], [[-1.0, -1.0]] * 2, 2)
    assert b.status(0).incarnation != c.status(0).incarnation
    assert os.listdir(tmp_path / "copies") == []  # the copy is removed


def test_a_backup_that_stops_answering_is_detached_with_the_marker(servers):
    primary, backup, client = servers
    c = client(primary)
    c.attach_backup(0, backup.address)
    c.init({"w": (np.ones(2, "float32"), True)}, SGD)
    backup.stop()
    # The push is applied here and answered after the backup timeout (1 s):
    # from then on the server runs alone, and says so on disk first.
    reply = c.send(Update(grads={"w": np.ones(2, "float32")}))
    assert reply.statuses == {0: "applied"}
    marker = marker_path(primary.servicer.job_dir, 0)
    assert "did not answer PushSmall for 1 s" in open(marker).read()
    assert not is_replicated(primary.servicer.job_dir, 0)
    assert not c.status(0).replicated


def test_the_launcher_detaches_a_lost_backup_at_once(servers):
    primary, backup, client = servers
    c = client(primary)
    c.attach_backup(0, backup.address)
    c.attach_backup(0, "")
    assert not c.status(0).replicated
    assert "the launcher detached it" in open(
        marker_path(primary.servicer.job_dir, 0)).read()


def test_a_backup_is_refused_without_a_job_directory(servers):
    _, backup, client = servers
    plain = ParameterServer()
    try:
        with pytest.raises(ValueError, match="no job directory"):
            client(plain).attach_backup(0, backup.address)
    finally:
        plain.stop()


def test_a_backup_that_refuses_a_call_is_detached(servers, tmp_path):
    # A backup whose state differs (here: another model) refuses the push
    # the primary applied: it can no longer stand in for the primary.
    primary, backup, client = servers
    client(backup).init({"v": (np.ones(3, "float32"), True)}, SGD)
    link = Backup(backup.address, 0, str(tmp_path / "marker"), timeout=1)
    header = ps_pb2.PushHeader(forwarded=True)
    assert not link.forward("PushSmall", bundle_bytes(
        header, [("w", np.ones(2, "float32"))]))
    assert "it refused PushSmall: NOT_FOUND" in open(tmp_path / "marker").read()


def test_a_copy_that_cannot_be_made_or_taken_is_named(servers, tmp_path):
    primary, backup, client = servers
    c = client(primary)
    c.init({"w": (np.ones(2, "float32"), True)}, SGD)
    once = PSClient([primary.address], reconnect_timeout=0)
    try:
        blocked = tmp_path / "a-file"
        blocked.write_text("")
        with pytest.raises(ValueError, match="could not copy its state for its backup"):
            once.attach_backup(0, backup.address, copy_dir=str(blocked / "copies"))
        # Nobody listens there: the copy is not taken (after the 1 s timeout).
        with pytest.raises(ConnectionError, match="did not take the copy"):
            once.attach_backup(0, "127.0.0.1:1", copy_dir=str(tmp_path / "copies"))
    finally:
        once.close()
    assert not c.status(0).replicated


def test_replicas_other_than_one_or_two_are_refused():
    from keras_elastic.launcher.config import LaunchConfig

    with pytest.raises(ValueError, match=r"--ps_replicas must be 1 \(no backup\) or 2"):
        LaunchConfig(ps_replicas=3).validate()


def test_a_copy_of_a_server_holding_slices_of_split_variables_makes_its_backup(
        tmp_path):
    """A variable split over 2 servers: server 0's copy holds only its
    slices, which its new backup (or a move's target) restores as they are
    (it was refused: "the slices of ['w'] do not cover them")."""
    servers = [ParameterServer(partition=p, num_partitions=2) for p in range(2)]
    backup = ParameterServer(partition=0, num_partitions=2)
    servers[0].servicer.job_dir = str(tmp_path)
    c = PSClient([s.address for s in servers])
    b = PSClient([backup.address], partitions=[0])
    try:
        c.init({"w": (np.arange(64, dtype="float32"), True)}, SGD, partition_bytes=64)
        assert any("__slice_" in k for k in servers[0].store.variables), (
            servers[0].store.variables)
        c.send(Update(grads={"w": np.ones(64, "float32")}))
        c.attach_backup(0, backup.address, copy_dir=str(tmp_path / "copies"))
        c.send(Update(grads={"w": np.ones(64, "float32")}))  # forwarded
        mine = {k: v.tolist() for k, v in servers[0].store.values_since(-1).items()}
        theirs = {k: v.tolist() for k, v in backup.store.values_since(-1).items()}
        assert theirs == mine and mine, (theirs, mine)
    finally:
        c.close()
        b.close()
        for s in [*servers, backup]:
            s.stop()


def test_a_copy_of_a_server_that_holds_no_variable_makes_its_backup(tmp_path):
    """One variable over 3 partitions: a partition holds none (issue 49: a
    move or a backup of it was refused, "does not record its variables";
    `scale` then never reached its size). Its copy restores as an empty,
    initialized server, which takes the pushes forwarded to it."""
    servers = [ParameterServer(partition=p, num_partitions=3) for p in range(3)]
    empty = next(p for p in range(3) if p != ps_for("w", 3))
    backup = ParameterServer(partition=empty, num_partitions=3)
    servers[empty].servicer.job_dir = str(tmp_path)
    c = PSClient([s.address for s in servers])
    try:
        c.init({"w": (np.arange(4, dtype="float32"), True)}, SGD)
        assert not servers[empty].store.variables
        c.attach_backup(empty, backup.address, copy_dir=str(tmp_path / "copies"))
        assert backup.store.initialized and not backup.store.variables
        c.send(Update(grads={"w": np.ones(4, "float32")}))  # forwarded: nothing
        assert servers[ps_for("w", 3)].store.values_since(-1)["w"].tolist() == [
            -0.5, 0.5, 1.5, 2.5]
    finally:
        c.close()
        for s in [*servers, backup]:
            s.stop()

"""Partitions of the parameter servers held by one process, and moved between
processes while a worker pushes (issue 43, item 3: `ps/host.py`,
`ps/moves.py`). In-process servers over real gRPC, a real cluster.json."""

import json
import os
import threading
from types import SimpleNamespace

import grpc
import numpy as np
import pytest

from keras_elastic.common import rpc
from keras_elastic.common.resolver import ClusterResolver
from keras_elastic.proto import ps_pb2, ps_pb2_grpc
from keras_elastic.ps import ParameterServer, PSClient
from keras_elastic.ps.moves import MoveError, move_partition
from keras_elastic.ps.update import Update

SGD1 = {"class_name": "SGD", "config": {"learning_rate": 1.0}}
NAMES = [f"w{i}" for i in range(8)]


def write_cluster(job_dir: str, ps: list[str]) -> None:
    path = os.path.join(job_dir, "cluster.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"master": "127.0.0.1:1", "ps": ps}, f)
    os.replace(path + ".tmp", path)


def task_range(task_id: int, lease: int, start: int, end: int):
    return ps_pb2.TaskRange(dataset="train", epoch=0, task_id=task_id, lease=lease,
                            start=start, end=end)


@pytest.fixture
def job(tmp_path):
    """Process `a` holds both partitions of 2; `b` holds none yet."""
    job_dir = str(tmp_path)
    a = ParameterServer(num_partitions=2, partitions=[0, 1])
    b = ParameterServer(num_partitions=2, partitions=[])
    for server in (a, b):
        server.configure(job_dir=job_dir)
    write_cluster(job_dir, [a.address, a.address])
    yield job_dir, a, b
    for server in (a, b):
        server.stop(0)


def pushes(client: PSClient, task_id: int, count: int, lease: int = 1) -> None:
    """`count` pushes of one task, each adding 1 to every element."""
    assert client.claim("train", 0, task_id, lease) is not None
    grads = {n: np.full(3, -1, np.float32) for n in NAMES}
    for k in range(count):
        reply = client.send(Update(grads=grads,
                                   ranges=[task_range(task_id, lease, k, k + 1)]))
        assert reply.accepted, reply.statuses


def test_one_process_holds_several_partitions_each_its_own(job):
    job_dir, a, _ = job
    client = PSClient([a.address, a.address], resolver=ClusterResolver(job_dir))
    client.init({n: (np.zeros(3, np.float32), True) for n in NAMES}, SGD1)
    assert {client.owner(n) for n in NAMES} == {0, 1}
    pushes(client, task_id=0, count=3)
    assert all((v == 3).all() for v in client.pull().values())
    # Each partition has its own store and task log.
    held = {p: a.host.servicer(p).store for p in (0, 1)}
    assert sorted(sum((list(s.variables) for s in held.values()), [])) == sorted(NAMES)
    assert all(s.log.applied(("train", 0, 0)) == [(0, 3)] for s in held.values())
    # A call that names no partition, to a process holding two: refused.
    channel = rpc.make_channel(a.address, resolver=None)
    with pytest.raises(grpc.RpcError, match="a call must name its partition"):
        ps_pb2_grpc.ParameterServerStub(channel).Status(ps_pb2.PSStatusRequest())
    channel.close()
    client.close()


def test_a_partition_moves_while_a_worker_pushes_and_nothing_is_lost_or_doubled(job):
    job_dir, a, b = job
    client = PSClient([a.address, a.address], resolver=ClusterResolver(job_dir),
                      reconnect_timeout=30)
    client.init({n: (np.zeros(3, np.float32), True) for n in NAMES}, SGD1)
    moved_names = [n for n in NAMES if client.owner(n) == 1]
    assert moved_names
    # A client that does not push while the partition moves (it learns of
    # the move from the old process's answer, after it).
    idle = PSClient([a.address, a.address], resolver=ClusterResolver(job_dir),
                    reconnect_timeout=30)
    idle.pull()
    errors: list[BaseException] = []
    done = threading.Event()
    count = 0

    def worker():
        nonlocal count
        try:
            assert client.claim("train", 0, 7, 1) is not None
            grads = {n: np.full(3, -1, np.float32) for n in NAMES}
            while not done.is_set() or count < 60:
                reply = client.send(Update(grads=grads, ranges=[
                    task_range(7, 1, count, count + 1)]))
                assert reply.accepted, reply.statuses
                count += 1
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            errors.append(e)

    thread = threading.Thread(target=worker)
    thread.start()
    while count < 20 and thread.is_alive():
        threading.Event().wait(0.01)
    seconds = move_partition(1, a.address, b.address,
                             copy_dir=os.path.join(job_dir, "moves"),
                             switch=lambda: write_cluster(job_dir, [a.address, b.address]))
    done.set()
    thread.join(60)
    assert not errors, errors
    assert seconds < 30
    assert a.host.held() == [0] and b.host.held() == [1]
    # Every push exactly once on both partitions, wherever it was applied.
    values = client.pull()
    wrong = {n: values[n] for n in NAMES if not (values[n] == count).all()}
    assert not wrong, f"{count} pushes; wrong: {wrong}; moved: {moved_names}"
    moved = b.host.servicer(1).store
    assert sorted(moved.variables) == sorted(moved_names)
    assert moved.log.applied(("train", 0, 7)) == [(0, count)]
    # The old process answers the moved partition's calls UNAVAILABLE (the
    # callers follow cluster.json), not with stale state.
    channel = rpc.make_channel(a.address, resolver=None, partition=1)
    with pytest.raises(grpc.RpcError) as refused:
        ps_pb2_grpc.ParameterServerStub(channel).Status(ps_pb2.PSStatusRequest())
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "it moved" in refused.value.details()
    channel.close()
    # A push without task ranges is not repeated after a lost reply (it could
    # be applied twice), but one the old process refused, applying nothing,
    # is sent where the partition is now: applied once.
    reply = idle.send(Update(grads={n: np.full(3, -1, np.float32) for n in NAMES}))
    assert reply.accepted and set(reply.statuses.values()) == {"applied"}
    values = client.pull()
    assert all((values[n] == count + 1).all() for n in NAMES), (count, values)
    idle.close()
    client.close()


def test_a_move_that_cannot_copy_leaves_the_partition_where_it_was(job, tmp_path):
    job_dir, a, b = job
    client = PSClient([a.address, a.address], resolver=ClusterResolver(job_dir))
    client.init({n: (np.zeros(3, np.float32), True) for n in NAMES}, SGD1)
    pushes(client, task_id=0, count=2)
    b.stop(0)  # the target is gone
    switched = []
    with pytest.raises(MoveError, match="partition 1: no copy from"):
        move_partition(1, a.address, b.address, copy_dir=str(tmp_path / "moves"),
                       switch=lambda: switched.append(True), timeout=5)
    assert not switched and a.host.held() == [0, 1]
    pushes(client, task_id=1, count=1)
    assert all((v == 3).all() for v in client.pull().values())
    client.close()


def test_what_a_partitioned_server_refuses_names_what_is_wrong(job):
    job_dir, a, b = job
    with pytest.raises(ValueError, match=r"partitions \[0, 2\]: each must be one of "
                                         r"0..1 \(--num_partitions\), once"):
        ParameterServer(num_partitions=2, partitions=[0, 2])
    with pytest.raises(ValueError, match="once"):
        ParameterServer(num_partitions=2, partitions=[1, 1])
    stub = ps_pb2_grpc.ParameterServerStub(rpc.make_channel(b.address, resolver=None))
    with pytest.raises(grpc.RpcError, match="HostPartition: partition -1 is negative"):
        stub.HostPartition(ps_pb2.HostPartitionRequest(partition=-1))
    # A partition number that is not one.
    channel = grpc.intercept_channel(rpc.make_channel(a.address, resolver=None),
                                     _Metadata((rpc.PARTITION_METADATA, "one")))
    with pytest.raises(grpc.RpcError, match="metadata ke-partition='one' is not a "
                                            "partition number"):
        ps_pb2_grpc.ParameterServerStub(channel).Status(ps_pb2.PSStatusRequest())
    # A partition with a backup is not moved (its replica would go stale).
    a.host.servicer(1).backup = SimpleNamespace(address="127.0.0.1:1")  # its backup
    try:
        with pytest.raises(ValueError, match="partition 1 has a backup"):
            move_partition(1, a.address, b.address, os.path.join(job_dir, "moves"),
                           switch=lambda: None, timeout=5)
    finally:
        a.host.servicer(1).backup = None
    assert a.host.held() == [0, 1] and b.host.held() == []


class _Metadata(grpc.UnaryUnaryClientInterceptor):
    def __init__(self, item):
        self.item = item

    def intercept_unary_unary(self, continuation, details, request):
        metadata = list(details.metadata or []) + [self.item]
        return continuation(details._replace(metadata=metadata), request)

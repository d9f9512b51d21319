"""Hostile input against live servers (issue 9): every bad request gets a clear
gRPC error, changes nothing, and the server answers a normal call after it.

The requests are raw bytes sent over a channel from `rpc.make_channel` (so they
carry the job's token), to real in-process gRPC servers: a `MasterServer` and
two parameter servers (one partition each, `num_partitions=2`, so that one can
be asked about a variable the other owns).
"""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest

from keras_elastic.common import rpc
from keras_elastic.common.tensor_codec import MAX_MESSAGE_BYTES, encode
from keras_elastic.master.client import MasterClient, TaskNotHeldError
from keras_elastic.master.server import MasterServer
from keras_elastic.master.status import JobStatus
from keras_elastic.proto import master_pb2, master_pb2_grpc, ps_pb2, tensor_pb2
from keras_elastic.ps import ParameterServer, PSClient, ps_for
from keras_elastic.ps.client import ServerStatus
from keras_elastic.ps.update import Update

PS_SERVICE = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"]
MASTER_SERVICE = master_pb2.DESCRIPTOR.services_by_name["Master"]
SGD = {"class_name": "SGD", "config": {"learning_rate": 0.5, "momentum": 0.9}}
TASK = ("train", 0, 3)  # (dataset, epoch, task_id) pushed for in the fixture
LEASE = 7


def _owned_by(partition: int, prefix: str) -> str:
    """The first name `prefix0`, `prefix1`... that partition `partition` of
    two owns (each served by its own parameter server here)."""
    return next(f"{prefix}{i}" for i in range(100)
                if ps_for(f"{prefix}{i}", 2) == partition)


W = _owned_by(0, "w")    # trainable, float32 [2, 3], on server 0
BN = _owned_by(0, "bn")  # non-trainable, float32 [2], on server 0
V = _owned_by(1, "v")    # trainable, float32 [4], on server 1


# -- helpers -------------------------------------------------------------------
def raw_call(channel: grpc.Channel, service, method: str, request):
    """Calls `service/method` with `request` as raw bytes (a list of them for a
    streaming request); returns the raw response (a list for a stream)."""
    m = service.methods_by_name[method]
    path = f"/{service.full_name}/{method}"
    if m.client_streaming:
        make = channel.stream_stream if m.server_streaming else channel.stream_unary
        response = make(path)(iter(request), timeout=30)
    else:
        make = channel.unary_stream if m.server_streaming else channel.unary_unary
        response = make(path)(request, timeout=30)
    return list(response) if m.server_streaming else response


def refused(code: grpc.StatusCode, call, *args) -> str:
    """Runs `call(*args)`, expects an RpcError with `code`; returns its details."""
    with pytest.raises(grpc.RpcError) as info:
        call(*args)
    error = info.value
    assert error.code() == code, (error.code(), error.details())
    return error.details()


def chunk(name: str = W, dtype: str = "float32", shape=(2, 3), offset: int = 0,
          total_bytes: int | None = None, content: bytes | None = None
          ) -> tensor_pb2.TensorChunk:
    """A tensor chunk whose header fields can each be made wrong."""
    if content is None:
        content = bytes(int(np.prod(shape, dtype=np.int64)) * 4) if all(
            d >= 0 for d in shape) else b""
    if total_bytes is None:
        total_bytes = len(content)
    return tensor_pb2.TensorChunk(name=name, dtype=dtype, shape=list(shape),
                                  offset=offset, total_bytes=total_bytes,
                                  content=content)


def push_bundle(*tensors, ranges=(), hyperparameters=None) -> bytes:
    return ps_pb2.PushBundle(header=ps_pb2.PushHeader(
        worker_id=9, ranges=list(ranges), hyperparameters=hyperparameters or {}),
        tensors=list(tensors)).SerializeToString()


def push_stream(*tensors, header: bool = True, ranges=(),
                num_tensors: int | None = None, hyperparameters=None) -> list[bytes]:
    if num_tensors is None:
        num_tensors = len({c.name for c in tensors})
    messages = [ps_pb2.PushRequest(header=ps_pb2.PushHeader(
        worker_id=9, ranges=list(ranges), num_tensors=num_tensors,
        hyperparameters=hyperparameters or {}))] if header else []
    messages += [ps_pb2.PushRequest(chunk=c) for c in tensors]
    return [m.SerializeToString() for m in messages]


def task_range(start: int, end: int, lease: int = LEASE) -> ps_pb2.TaskRange:
    return ps_pb2.TaskRange(dataset=TASK[0], epoch=TASK[1], task_id=TASK[2],
                            lease=lease, start=start, end=end)


def ps_state(servers) -> list[dict]:
    """Everything a push could change on each server: variables, optimizer
    slots, version, per-variable versions, task log, counters (Status)."""
    states = []
    for server in servers:
        store = server.store
        with store.lock:
            states.append({
                "values": {n: v.tolist() for n, v in store.values_since(-1).items()}
                if store.initialized else {},
                "slots": [v.numpy().tolist() for g in store.optimizers.values()
                          for v in g.optimizer.variables],
                "optimizers": sorted(store.optimizers),
                "version": store.version,
                "updated_at": dict(store.updated_at),
                "log": store.log.to_json(),
                "pending": sum(len(g.pending) for g in store.optimizers.values()),
                # (cpu_seconds: the process's clock, not the server's state)
                "status": {k: v for k, v in ServerStatus.from_proto(
                    server.servicer.Status(ps_pb2.PSStatusRequest(), None)
                ).to_dict().items() if k != "cpu_seconds"},
            })
    return states


def assert_ps_serving(servers, channels) -> None:
    """Status and Pull answer normally over the wire on every server."""
    for server, channel in zip(servers, channels):
        status = ps_pb2.PSStatusResponse.FromString(
            raw_call(channel, PS_SERVICE, "Status", b""))
        assert status.initialized and status.version == server.store.version
        if status.variables:
            pulled = raw_call(channel, PS_SERVICE, "Pull", ps_pb2.PullRequest(
                since_version=-1).SerializeToString())
            assert ps_pb2.ModelChunk.FromString(pulled[0]).header.version == (
                server.store.version)
            assert len(pulled) == 1 + len(status.variables)


# -- fixtures ------------------------------------------------------------------
@pytest.fixture(scope="module")
def ps_cluster():
    """Two initialized parameter servers with one push applied (a task log
    entry, optimizer momentum, version 1); a client; raw channels."""
    servers = [ParameterServer(partition=i, num_partitions=2) for i in range(2)]
    client = PSClient([s.address for s in servers], worker_id=0)
    client.init({W: (np.arange(6, dtype=np.float32).reshape(2, 3), True),
                 BN: (np.zeros(2, np.float32), False),
                 V: (np.ones(4, np.float32), True)}, SGD)
    assert client.claim(*TASK, lease=LEASE) is not None
    reply = client.send(Update(
        grads={W: np.ones((2, 3), np.float32), V: np.ones(4, np.float32)},
        assigns={BN: np.full(2, 5, np.float32)}, ranges=[task_range(0, 4)]))
    assert reply.accepted
    channels = [rpc.make_channel(s.address) for s in servers]
    yield servers, client, channels
    for channel in channels:
        channel.close()
    client.close()
    for s in servers:
        s.stop(0)


@pytest.fixture
def ps(ps_cluster):
    """The cluster, checked after the test: nothing changed, still serving."""
    servers, client, channels = ps_cluster
    before = ps_state(servers)
    yield servers, channels
    assert ps_state(servers) == before
    assert_ps_serving(servers, channels)


@pytest.fixture
def master():
    server = MasterServer()
    channel = rpc.make_channel(server.address)
    yield server, channel, master_pb2_grpc.MasterStub(channel)
    channel.close()
    server.stop()


def master_state(stub) -> dict:
    status = JobStatus.from_proto(stub.GetStatus(
        master_pb2.StatusRequest(include_ledger=True), timeout=10),
        include_ledger=True).to_dict()
    status.pop("uptime")
    return status


# -- malformed protobuf ----------------------------------------------------------
@pytest.mark.parametrize("method", [m.name for m in PS_SERVICE.methods])
def test_malformed_protobuf_to_parameter_server(ps, method):
    servers, channels = ps
    streaming = PS_SERVICE.methods_by_name[method].client_streaming
    details = refused(grpc.StatusCode.INVALID_ARGUMENT, raw_call, channels[0],
                      PS_SERVICE, method, [b"\x00"] if streaming else b"\x00")
    request_type = PS_SERVICE.methods_by_name[method].input_type.full_name
    assert f"keras_elastic.ParameterServer/{method}" in details, details
    assert f"is not a valid {request_type}" in details, details
    # protobuf's parser's words, or those of tensor_codec's (the pushes,
    # read without protobuf: RAW_REQUESTS).
    assert any(w in details for w in ("Wire format was corrupt", "parsing",
                                      "malformed message")), details


def test_malformed_message_inside_a_stream_is_named(ps):
    servers, channels = ps
    good = push_stream(*encode(W, np.ones((2, 3), np.float32)))
    details = refused(grpc.StatusCode.INVALID_ARGUMENT, raw_call, channels[0],
                      PS_SERVICE, "Push", [good[0], b"\x0a\xff\xff", good[1]])
    assert ("keras_elastic.ParameterServer/Push: message 1 of the request stream "
            "(3 bytes) is not a valid keras_elastic.PushRequest") in details, details


@pytest.mark.parametrize("method", [m.name for m in MASTER_SERVICE.methods])
def test_malformed_protobuf_to_master(master, method):
    server, channel, stub = master
    before = master_state(stub)
    details = refused(grpc.StatusCode.INVALID_ARGUMENT, raw_call, channel,
                      MASTER_SERVICE, method, b"\x0a\xff\xff")
    assert f"keras_elastic.Master/{method}" in details, details
    request_type = MASTER_SERVICE.methods_by_name[method].input_type.full_name
    assert f"(3 bytes) is not a valid {request_type}" in details, details
    assert master_state(stub) == before
    assert stub.RegisterWorker(master_pb2.WorkerRequest(worker_id=-1),
                               timeout=10).accepted


# -- oversized messages ----------------------------------------------------------
def _oversized_channel(address: str) -> grpc.Channel:
    """A client whose own send limit is above the servers' receive limit."""
    return rpc.make_channel(address, [("grpc.max_send_message_length",
                                       2 * MAX_MESSAGE_BYTES)])


def test_oversized_messages_to_parameter_server(ps):
    servers, channels = ps
    channel = _oversized_channel(servers[0].address)
    try:
        big = ps_pb2.SaveRequest(
            directory="x" * (MAX_MESSAGE_BYTES + 1024)).SerializeToString()
        details = refused(grpc.StatusCode.RESOURCE_EXHAUSTED, raw_call, channel,
                          PS_SERVICE, "Status", big)
        assert "larger than max" in details, details
        # One message of a stream above the limit, after a good header. (The
        # server's request stream then ends as if the client had closed it: the
        # header's count of tensors tells it the push is incomplete.)
        chunk_too_big = ps_pb2.PushRequest(chunk=chunk(
            content=bytes(MAX_MESSAGE_BYTES + 1024))).SerializeToString()
        refused(grpc.StatusCode.RESOURCE_EXHAUSTED, raw_call, channel, PS_SERVICE,
                "Push", push_stream(num_tensors=1) + [chunk_too_big])
        # The same client's normal calls still work.
        assert ps_pb2.PSStatusResponse.FromString(
            raw_call(channel, PS_SERVICE, "Status", b"")).initialized
    finally:
        channel.close()


def test_oversized_message_to_master(master):
    server, channel, stub = master
    before = master_state(stub)
    big_channel = _oversized_channel(server.address)
    try:
        request = master_pb2.WorkerRequest(reason="x" * (MAX_MESSAGE_BYTES + 1024))
        details = refused(grpc.StatusCode.RESOURCE_EXHAUSTED, raw_call, big_channel,
                          MASTER_SERVICE, "RegisterWorker", request.SerializeToString())
        assert "larger than max" in details, details
    finally:
        big_channel.close()
    assert master_state(stub) == before
    assert stub.RegisterWorker(master_pb2.WorkerRequest(worker_id=-1),
                               timeout=10).accepted


def test_channels_and_servers_set_both_limits_explicitly():
    for options in (rpc._OPTIONS, rpc._CHANNEL_OPTIONS):
        limits = dict(options)
        assert limits["grpc.max_send_message_length"] == MAX_MESSAGE_BYTES
        assert limits["grpc.max_receive_message_length"] == MAX_MESSAGE_BYTES


# -- wrong tensor headers --------------------------------------------------------
BAD_TENSORS = {
    "too few bytes": (
        [chunk(content=bytes(20), total_bytes=24)], f"stream ended with incomplete "
        f"tensors: {W}"),
    "total_bytes not the shape's size": (
        [chunk(content=bytes(20), total_bytes=20)],
        f"tensor '{W}': total_bytes is 20, but float32 of shape [2, 3] is 24 bytes"),
    "too many bytes": (
        [chunk(content=bytes(28), total_bytes=24)],
        f"tensor '{W}': chunk bytes [0, 28) are outside the tensor's 24 bytes"),
    "unknown dtype": (
        [chunk(dtype="float33")], f"tensor '{W}': unknown dtype 'float33'"),
    "object dtype": (
        [chunk(dtype="O", content=bytes(48))],
        f"tensor '{W}': dtype 'O' cannot travel as raw bytes"),
    "negative dimension": (
        [chunk(shape=(-2, 3))], f"tensor '{W}': negative dimension in shape [-2, 3]"),
    "negative offset": (
        [chunk(offset=-8, content=bytes(8), total_bytes=24)],
        f"tensor '{W}': chunk bytes [-8, 0) are outside the tensor's 24 bytes"),
    "first chunk not at offset 0": (
        [chunk(offset=8, content=bytes(8), total_bytes=24)],
        f"tensor '{W}': first chunk has offset 8, expected 0"),
    "chunk beyond the end": (
        [chunk(content=bytes(16), total_bytes=24),
         chunk(offset=16, content=bytes(16), total_bytes=24)],
        f"tensor '{W}': chunk bytes [16, 32) are outside the tensor's 24 bytes"),
    "gap between chunks": (
        [chunk(content=bytes(8), total_bytes=24),
         chunk(offset=16, content=bytes(8), total_bytes=24)],
        f"tensor '{W}': chunk at offset 16, expected 8"),
    "chunks disagree on the shape": (
        [chunk(shape=(2, 3), content=bytes(8), total_bytes=24),
         chunk(shape=(3, 2), offset=8, content=bytes(16), total_bytes=24)],
        f"tensor '{W}': chunk at offset 8 says float32 of shape [3, 2], but its first "
        "chunk said float32 of shape [2, 3]"),
    "tensor sent twice": (
        [chunk(), chunk()], f"tensor '{W}' was sent twice"),
    "gradient of the wrong shape": (
        [chunk(shape=(3, 2))], f"the gradient of variable '{W}' is float32 of shape "
        "[3, 2], but the variable is float32 of shape [2, 3]"),
    "gradient of the wrong dtype": (
        list(encode(W, np.ones((2, 3), np.float64))),
        f"the gradient of variable '{W}' is float64 of shape [2, 3], but the variable "
        "is float32 of shape [2, 3]"),
    "value of the wrong shape": (
        list(encode("=" + BN, np.ones(3, np.float32))),
        f"the value of variable '{BN}' is float32 of shape [3], but the variable is "
        "float32 of shape [2]"),
    "gradient of a non-trainable variable": (
        list(encode(BN, np.ones(2, np.float32))),
        f"variable '{BN}' is not trainable: a push carries its value, not a gradient"),
}


@pytest.mark.parametrize("method", ["PushSmall", "Push"])
@pytest.mark.parametrize("case", sorted(BAD_TENSORS))
def test_push_with_a_wrong_tensor_header(ps, method, case):
    servers, channels = ps
    tensors, message = BAD_TENSORS[case]
    # A good tensor of another variable first: the whole push is refused.
    good = (encode("=" + BN, np.full(2, 9, np.float32)) if tensors[0].name == W
            else encode(W, np.ones((2, 3), np.float32)))
    tensors = list(good) + tensors
    request = (push_bundle(*tensors) if method == "PushSmall"
               else push_stream(*tensors))
    details = refused(grpc.StatusCode.INVALID_ARGUMENT, raw_call, channels[0],
                      PS_SERVICE, method, request)
    assert details.startswith(f"parameter server 0 (of 2), {method}: "), details
    assert message in details, details


def test_push_with_a_good_tensor_then_a_bad_one_changes_nothing(ps):
    servers, channels = ps
    good = list(encode(W, np.ones((2, 3), np.float32))) + list(
        encode("=" + BN, np.full(2, 9, np.float32)))
    bad = chunk(name="=" + BN, shape=(5,), content=bytes(20))
    for method, request in [("PushSmall", push_bundle(*good[:1], bad)),
                            ("Push", push_stream(*good, chunk(shape=(1, 1),
                                                             content=bytes(4))))]:
        refused(grpc.StatusCode.INVALID_ARGUMENT, raw_call, channels[0], PS_SERVICE,
                method, request)


@pytest.mark.parametrize("ranges, message", [
    ([task_range(6, 4)], "task 3 of epoch 0 of dataset 'train': element range [6, 4) "
                         "is empty or negative"),
    ([task_range(-2, 4)], "element range [-2, 4) is empty or negative"),
    ([task_range(4, 4)], "element range [4, 4) is empty or negative"),
    ([task_range(4, 8), task_range(6, 10)],
     "element ranges [4, 8) and [6, 10) of one push overlap"),
])
def test_push_with_malformed_element_ranges(ps, ranges, message):
    servers, channels = ps
    # Valid tensors (a gradient and a value): only the ranges are wrong, found
    # by the store before it assigns or applies anything.
    tensors = list(encode(W, np.ones((2, 3), np.float32))) + list(
        encode("=" + BN, np.full(2, 9, np.float32)))
    for method, request in [("PushSmall", push_bundle(*tensors, ranges=ranges)),
                            ("Push", push_stream(*tensors, ranges=ranges))]:
        details = refused(grpc.StatusCode.INVALID_ARGUMENT, raw_call, channels[0],
                          PS_SERVICE, method, request)
        assert message in details, details


@pytest.mark.parametrize("hyperparameters, message", [
    ({"learning_rate": float("nan")},
     "learning_rate=nan: a learning rate must be a finite number >= 0"),
    ({"learning_rate": float("inf")}, "learning_rate=inf: a learning rate must be"),
    ({"learning_rate": -0.1}, "learning_rate=-0.1: a learning rate must be"),
    ({"beta_1": 0.5}, "unknown optimizer hyperparameter 'beta_1': a push may set "
                      "only ['learning_rate']"),
    ({"learning_rate": 0.01, "momentum": 0.0}, "unknown optimizer hyperparameter "
                                               "'momentum'"),
])
def test_push_with_a_bad_hyperparameter(ps, hyperparameters, message):
    servers, channels = ps
    # Valid tensors and ranges: only the optimizer hyperparameters are wrong,
    # refused before the learning rate, a value or a gradient changes.
    tensors = list(encode(W, np.ones((2, 3), np.float32))) + list(
        encode("=" + BN, np.full(2, 9, np.float32)))
    ranges = [task_range(4, 6)]
    for method, request in [
            ("PushSmall", push_bundle(*tensors, ranges=ranges,
                                      hyperparameters=hyperparameters)),
            ("Push", push_stream(*tensors, ranges=ranges,
                                 hyperparameters=hyperparameters))]:
        details = refused(grpc.StatusCode.INVALID_ARGUMENT, raw_call, channels[0],
                          PS_SERVICE, method, request)
        assert details.startswith(f"parameter server 0 (of 2), {method}: "), details
        assert message in details, details


def test_push_stream_without_header_or_with_empty_messages(ps):
    servers, channels = ps
    tensors = list(encode(W, np.ones((2, 3), np.float32)))
    details = refused(grpc.StatusCode.INVALID_ARGUMENT, raw_call, channels[0],
                      PS_SERVICE, "Push", push_stream(*tensors, header=False))
    assert "Push stream had no header" in details, details
    details = refused(grpc.StatusCode.INVALID_ARGUMENT, raw_call, channels[0],
                      PS_SERVICE, "Push", push_stream(*tensors) + [b""])
    assert "message 2 of the stream has neither a header nor a chunk" in details
    details = refused(grpc.StatusCode.INVALID_ARGUMENT, raw_call, channels[0],
                      PS_SERVICE, "Push", push_stream(*tensors) + push_stream())
    assert "message 2 of the stream is a second header" in details, details


def test_push_stream_with_fewer_tensors_than_announced(ps):
    # What a stream cut short looks like to the server (gRPC Python ends the
    # request iterator as if the client had closed it): not applied.
    servers, channels = ps
    tensors = list(encode(W, np.ones((2, 3), np.float32)))
    details = refused(grpc.StatusCode.INVALID_ARGUMENT, raw_call, channels[0],
                      PS_SERVICE, "Push", push_stream(*tensors, num_tensors=2))
    assert "the header announces 2 tensors, the stream carried 1" in details, details


# -- variables a server does not own -----------------------------------------------
def test_push_for_a_variable_the_server_does_not_own(ps):
    servers, channels = ps
    for method, make in [("PushSmall", push_bundle), ("Push", push_stream)]:
        # V lives on server 1.
        details = refused(grpc.StatusCode.NOT_FOUND, raw_call, channels[0], PS_SERVICE,
                          method, make(*encode(V, np.ones(4, np.float32))))
        assert details == (f"parameter server 0 (of 2), {method}: this parameter "
                           f"server does not own ['{V}'] ('{V}' belongs to parameter "
                           "server 1)"), details
        # A name no server holds (it hashes to server 0).
        nope = _owned_by(0, "nope")
        details = refused(grpc.StatusCode.NOT_FOUND, raw_call, channels[0], PS_SERVICE,
                          method, make(*encode(W, np.ones((2, 3), np.float32)),
                                       *encode("=" + nope, np.ones(1, np.float32))))
        assert f"does not own ['{nope}']: not a variable of the model it holds" in details


def test_pull_of_a_variable_the_server_does_not_own(ps):
    servers, channels = ps
    details = refused(grpc.StatusCode.NOT_FOUND, raw_call, channels[1], PS_SERVICE,
                      "Pull", ps_pb2.PullRequest(since_version=-1, names=[V, W])
                      .SerializeToString())
    assert details == (f"parameter server 1 (of 2), Pull: this parameter server does "
                       f"not own ['{W}'] ('{W}' belongs to parameter server 0)"), details


def test_init_with_wrong_headers_on_an_initialized_server(ps):
    servers, channels = ps
    spec = ps_pb2.VariableSpec(name=W, dtype="float32", shape=[2, 3], trainable=True)

    def init(variables, *tensors, optimizer=json.dumps(SGD), header=True):
        messages = [ps_pb2.InitRequest(header=ps_pb2.InitHeader(
            optimizer_config=optimizer, variables=variables))] if header else []
        messages += [ps_pb2.InitRequest(chunk=c) for c in tensors]
        return [m.SerializeToString() for m in messages]

    value = list(encode(W, np.ones((2, 3), np.float32)))
    cases = [
        (init([spec], chunk(content=bytes(20), total_bytes=20)),
         f"tensor '{W}': total_bytes is 20, but float32 of shape [2, 3] is 24 bytes"),
        (init([spec], chunk(shape=(6,))),
         f"the value of variable '{W}' is float32 of shape [6], but the Init header "
         "says float32 of shape [2, 3]"),
        (init([spec], *value, *encode(BN, np.ones(2, np.float32))),
         f"a value was sent for variable '{BN}', which the Init header does not list"),
        (init([spec, spec], *value), f"the header lists variable '{W}' twice"),
        (init([ps_pb2.VariableSpec(name=W, dtype="float33", shape=[2, 3])], *value),
         f"variable '{W}': unknown dtype 'float33'"),
        (init([spec], *value, header=False),
         f"tensor '{W}' came before the Init header"),
        (init([spec, ps_pb2.VariableSpec(name=V, dtype="float32", shape=[4])], *value,
              *encode(V, np.ones(4, np.float32))),
         f"variable '{V}' belongs to parameter server 1, not to this one"),
        (init([spec], *value, optimizer="{not json"), "optimizer_config is not JSON"),
        (init([spec]), f"Init: no values sent for ['{W}']"),
    ]
    for request, message in cases:
        details = refused(grpc.StatusCode.INVALID_ARGUMENT, raw_call, channels[0],
                          PS_SERVICE, "Init", request)
        assert details.startswith("parameter server 0 (of 2), Init: "), details
        assert message in details, details


def test_hostile_init_leaves_a_fresh_server_uninitialized():
    server = ParameterServer()
    channel = rpc.make_channel(server.address)
    try:
        header = ps_pb2.InitRequest(header=ps_pb2.InitHeader(
            optimizer_config=json.dumps(SGD), variables=[ps_pb2.VariableSpec(
                name="w", dtype="float32", shape=[2], trainable=True)]))
        bad = ps_pb2.InitRequest(chunk=chunk(name="w", shape=(2,), content=bytes(12),
                                             total_bytes=12))
        details = refused(grpc.StatusCode.INVALID_ARGUMENT, raw_call, channel,
                          PS_SERVICE, "Init", [header.SerializeToString(),
                                               bad.SerializeToString()])
        assert "tensor 'w': total_bytes is 12, but float32 of shape [2] is 8" in details
        refused(grpc.StatusCode.INVALID_ARGUMENT, raw_call, channel, PS_SERVICE, "Init",
                [header.SerializeToString(), b"\x00"])
        # A variable of 1 PiB (more than any address space): refused, not a crash.
        huge = ps_pb2.InitRequest(header=ps_pb2.InitHeader(
            optimizer_config=json.dumps(SGD), variables=[ps_pb2.VariableSpec(
                name="w", dtype="uint8", shape=[1 << 50], trainable=True)]))
        first = ps_pb2.InitRequest(chunk=chunk(name="w", dtype="uint8", shape=(1 << 50,),
                                               content=bytes(8), total_bytes=1 << 50))
        details = refused(grpc.StatusCode.INVALID_ARGUMENT, raw_call, channel,
                          PS_SERVICE, "Init", [huge.SerializeToString(),
                                               first.SerializeToString()])
        assert f"tensor 'w': cannot allocate its {1 << 50} bytes" in details, details
        assert not server.store.initialized and server.store.version == 0
        # A push before init is still the ordinary FAILED_PRECONDITION.
        details = refused(grpc.StatusCode.FAILED_PRECONDITION, raw_call, channel,
                          PS_SERVICE, "PushSmall",
                          push_bundle(*encode("w", np.ones(2, np.float32))))
        assert "has not been initialized" in details, details
        # A normal init then works.
        client = PSClient([server.address])
        values = client.init({"w": (np.full(2, 3, np.float32), True)}, SGD)
        np.testing.assert_array_equal(values["w"], [3, 3])
        client.close()
    finally:
        channel.close()
        server.stop(0)


def test_normal_push_is_applied_after_hostile_ones(ps_cluster):
    servers, client, channels = ps_cluster
    before = client.pull()
    version = servers[0].store.version
    reply = client.send(Update(grads={W: np.ones((2, 3), np.float32)},
                               ranges=[task_range(4, 8)]))
    assert reply.accepted and reply.statuses == {0: "applied"}
    assert servers[0].store.version == version + 1
    np.testing.assert_allclose(client.pull()[W], before[W] - 0.5 * (1 + 0.9), rtol=1e-6)
    assert servers[0].store.log.applied(TASK) == [(0, 8)]


# -- a task report for a task the worker does not hold ------------------------------
def test_report_of_a_task_the_worker_does_not_hold(master):
    server, channel, stub = master
    worker = stub.RegisterWorker(master_pb2.WorkerRequest(worker_id=-1),
                                 timeout=10).worker_id
    stub.RegisterDataset(master_pb2.RegisterDatasetRequest(
        dataset="train", mode="training", records_per_task=5, num_epochs=1,
        shards=[master_pb2.Shard(name="a", num_records=20)], worker_id=worker),
        timeout=10)
    got = stub.GetTask(master_pb2.GetTaskRequest(worker_id=worker, dataset="train",
                                                 epoch=0), timeout=10)
    assert got.kind == master_pb2.GetTaskResponse.TASK
    held = got.task.task_id
    not_held = next(t for t in range(4) if t != held)
    before = master_state(stub)
    for task_id in (not_held, 99):
        details = refused(grpc.StatusCode.FAILED_PRECONDITION, stub.ReportTask,
                          master_pb2.ReportTaskRequest(worker_id=worker, dataset="train",
                                                       task_ids=[task_id], success=True),
                          10)
        assert f"task {task_id}" in details, details
        after = master_state(stub)
        for state in (before, after):  # a refusal counter is not progress
            state["datasets"]["train"].pop("late_reports", None)
        assert after == before
    # The task it holds is reported normally.
    stub.ReportTask(master_pb2.ReportTaskRequest(worker_id=worker, dataset="train",
                                                 task_ids=[held], success=True),
                    timeout=10)
    assert master_state(stub)["datasets"]["train"]["done_task_ids"] == [held]


def test_tasks_reported_with_the_next_get_task(master):
    """GetTask carries the tasks done since the last call (one call per round
    trip); a report the master refuses hands out nothing and changes nothing."""
    server, channel, stub = master
    client = MasterClient(server.address)
    client.register_worker()
    client.register_dataset(master_pb2.RegisterDatasetRequest(
        dataset="train", mode="training", records_per_task=5, num_epochs=1,
        shards=[master_pb2.Shard(name="a", num_records=40)]))
    first = client.get_tasks("train", 0, 3)
    assert len(first) == 3
    wrong_lease = master_pb2.Task(task_id=first[0].task_id, lease=first[0].lease + 99)
    before = master_state(stub)
    with pytest.raises(TaskNotHeldError, match=f"task {first[0].task_id}"):
        client.get_tasks("train", 0, 3, done=[first[1], wrong_lease])
    after = master_state(stub)
    for state in (before, after):
        state["datasets"]["train"].pop("late_reports", None)
    assert after == before  # neither task recorded, nothing handed out
    second = client.get_tasks("train", 0, 3, done=first)
    assert len(second) == 3
    status = master_state(stub)["datasets"]["train"]
    assert status["done_task_ids"] == sorted(t.task_id for t in first)
    rest = client.get_tasks("train", 0, 8, done=second)
    assert len(rest) == 2
    assert client.get_tasks("train", 0, 1, done=rest) is None  # the epoch is over
    status = master_state(stub)["datasets"]["train"]
    assert status["finished"] and status["tasks_done_total"] == 8
    client.close()

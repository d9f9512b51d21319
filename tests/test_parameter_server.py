"""Parameter servers over real gRPC: init, push/pull, optimizers, partitioning."""

import keras
import numpy as np
import pytest

from keras_elastic.common.tensor_codec import decode_all, encode
from keras_elastic.ps import ParameterServer, PSClient, partition, ps_for
from keras_elastic.ps.store import ParameterStore
from keras_elastic.ps.update import Update

SGD = {"class_name": "SGD", "config": {"learning_rate": 0.5}}


@pytest.fixture
def servers(request):
    count = getattr(request, "param", 1)
    started = [ParameterServer(partition=i, num_partitions=count) for i in range(count)]
    yield started
    for s in started:
        s.stop(0)


def test_init_is_idempotent_and_first_worker_wins(servers):
    a = PSClient([s.address for s in servers], worker_id=0)
    b = PSClient([s.address for s in servers], worker_id=1)
    first = a.init({"w": (np.ones(3, np.float32), True)}, SGD)
    second = b.init({"w": (np.full(3, 7, np.float32), True)}, SGD)
    np.testing.assert_array_equal(first["w"], [1, 1, 1])
    np.testing.assert_array_equal(second["w"], [1, 1, 1])  # not 7: already held


def test_push_applies_sgd_and_returns_only_changed_values(servers):
    c = PSClient([servers[0].address])
    c.init({"w": (np.ones(2, np.float32), True), "b": (np.zeros(1, np.float32), True),
            "bn": (np.zeros(2, np.float32), False)}, SGD)
    new = c.send(Update(grads={"w": np.array([1, 2], np.float32)},
                        assigns={"bn": np.array([3, 4], np.float32)})).values
    np.testing.assert_allclose(new["w"], [0.5, 0.0])
    np.testing.assert_allclose(new["bn"], [3, 4])
    assert "b" not in new  # b got no gradient: unchanged since our version
    assert c.pull(since_version=c.versions[0]) == {}
    assert set(c.pull()) == {"w", "b", "bn"}


def test_non_trainable_updates_of_two_workers_are_merged_not_overwritten(servers):
    # A BatchNormalization moving mean, updated by two workers from the same
    # value: each worker's change is kept (the last writer does not erase the
    # first's), as TensorFlow's parameter-server strategy's assign_sub on the
    # server's variable keeps both.
    a = PSClient([s.address for s in servers], worker_id=0)
    b = PSClient([s.address for s in servers], worker_id=1)
    base = np.array([1.0, 2.0], np.float32)
    a.init({"moving_mean": (base, False)}, SGD)
    b.init({"moving_mean": (base, False)}, SGD)

    def ema(value, x):  # BatchNormalization's update, momentum 0.9
        return (value * 0.9 + np.float32(x) * 0.1).astype(np.float32)

    first = ema(base, 11.0)
    a.send(Update(assigns={"moving_mean": first}))  # no bases: plain assign
    np.testing.assert_array_equal(a.pull()["moving_mean"], first)
    # a's next step starts from the server's value: assigned bit for bit.
    second = ema(first, 5.0)
    a.send(Update(assigns={"moving_mean": second}, bases={"moving_mean": first}))
    np.testing.assert_array_equal(a.pull()["moving_mean"], second)
    # b computed from the older `first`: its change is added to `second`.
    other = ema(first, -7.0)
    b.send(Update(assigns={"moving_mean": other}, bases={"moving_mean": first}))
    np.testing.assert_allclose(b.pull()["moving_mean"], second + (other - first),
                               rtol=1e-6)


@pytest.mark.parametrize("grads_to_wait", [1, 2])
def test_a_push_of_gradients_and_merged_statistics_is_one_exact_update(grads_to_wait):
    # The server applies a push's non-trainable values and its update in one
    # compiled call: a value still at its base is assigned bit for bit, one
    # another worker changed gets this worker's change added, a boolean is
    # assigned as is, and the optimizer's update follows.
    store = ParameterStore(grads_to_wait=grads_to_wait)
    w, mean = np.array([1.0, 2.0], np.float32), np.array([0.5, 0.25], np.float32)
    store.init({"w": w, "mean": mean, "flag": np.array(False), "count": np.int64(3)},
               {"w": True, "mean": False, "flag": False, "count": False}, SGD)
    grad = np.array([0.25, -1.0], np.float32)
    ema = (mean * 0.9 + np.float32(0.3)).astype(np.float32)
    store.push(Update(grads={"w": grad},
                      assigns={"mean": ema, "flag": np.array(True), "count": np.int64(4)},
                      bases={"mean": mean, "flag": np.array(False), "count": np.int64(3)}),
               0)
    values = store.values_since(-1)
    np.testing.assert_array_equal(values["mean"], ema)  # still at its base: as is
    assert values["flag"] and values["count"] == 4
    expected = w if grads_to_wait == 2 else w - 0.5 * grad  # (buffered: not yet)
    np.testing.assert_array_equal(values["w"], expected)
    # Computed from the older `mean` while the server moved on to `ema`.
    other = (mean * 0.9 - np.float32(0.1)).astype(np.float32)
    store.push(Update(grads={"w": grad}, assigns={"mean": other, "count": np.int64(9)},
                      bases={"mean": mean, "count": np.int64(3)}), 1)
    values = store.values_since(-1)
    np.testing.assert_allclose(values["mean"], ema + (other - mean), rtol=1e-6)
    assert values["count"] == 4 + (9 - 3)
    # Two steps of SGD(0.5); with grads_to_wait=2 one step on their mean.
    steps = 2 if grads_to_wait == 1 else 1
    np.testing.assert_array_equal(values["w"], w - steps * 0.5 * grad)
    # Without a base the value is assigned as is.
    store.push(Update(assigns={"mean": other}), 2)
    np.testing.assert_array_equal(store.values_since(-1)["mean"], other)


def test_a_base_value_must_come_with_its_assign_and_match_its_variable(servers):
    c = PSClient([servers[0].address])
    c.init({"bn": (np.zeros(2, np.float32), False)}, SGD)
    with pytest.raises(ValueError, match="does not assign"):
        c.send(Update(bases={"bn": np.zeros(2, np.float32)}))
    with pytest.raises(ValueError, match="bn"):
        c.send(Update(assigns={"bn": np.ones(2, np.float32)},
                      bases={"bn": np.zeros(3, np.float32)}))
    np.testing.assert_array_equal(c.pull()["bn"], [0, 0])  # nothing applied


def test_a_malformed_assignment_changes_nothing_before_it_is_refused():
    """An assignment (values the script set) carrying a gradient is refused by
    the update's checks (ps/update_checks.py), before the hyperparameters it
    carries are set or the push is counted."""
    store = ParameterStore()
    store.init({"w": np.ones(2, np.float32)}, {"w": True}, SGD)
    with pytest.raises(ValueError, match="an assignment push carries values only"):
        store.push(Update(grads={"w": np.ones(2, np.float32)},
                          assigns={"w": np.zeros(2, np.float32)},
                          hyperparameters={"learning_rate": 0.1}, assignment=True))
    assert store.hyperparameters() == {"learning_rate": 0.5}
    assert (store.version, store.pushes) == (0, 0)
    np.testing.assert_array_equal(store.values_since(-1)["w"], 1.0)
    # Values only: applied, the model's version up by one.
    assert store.push(Update(assigns={"w": np.zeros(2, np.float32)},
                             assignment=True)).status == "applied"
    assert store.version == 1
    np.testing.assert_array_equal(store.values_since(0)["w"], 0.0)


def test_keras_optimizer_with_slots_matches_local_apply(servers):
    config = keras.optimizers.serialize(keras.optimizers.Adam(0.01))
    c = PSClient([servers[0].address])
    w0 = np.linspace(-1, 1, 6).astype(np.float32).reshape(2, 3)
    c.init({"w": (w0, True)}, config)
    local = keras.Variable(w0)
    opt = keras.optimizers.Adam(0.01)
    rng = np.random.default_rng(0)
    for _ in range(5):
        g = rng.normal(size=(2, 3)).astype(np.float32)
        remote = c.send(Update(grads={"w": g})).values["w"]
        opt.apply([g], [local])
    np.testing.assert_allclose(remote, local.numpy(), atol=1e-6)
    slots = servers[0].store.optimizer_variables()
    assert any("momentum" in v.path for v in slots)  # Adam's slots exist on the PS


@pytest.mark.parametrize("servers", [2], indirect=True)
def test_variables_are_partitioned_by_stable_hash(servers):
    names = [f"{i:04d}/kernel" for i in range(8)]
    c = PSClient([s.address for s in servers])
    c.init({n: (np.full(2, i, np.float32), True) for i, n in enumerate(names)}, SGD)
    held = [sorted(s.store.variables) for s in servers]
    assert held == [sorted(p) for p in partition(names, 2)]
    assert all(held), held  # both servers own variables
    assert [ps_for(n, 2) for n in names] == [ps_for(n, 2) for n in names]
    new = c.send(Update(grads={n: np.ones(2, np.float32) for n in names})).values
    assert sorted(new) == sorted(names)


def test_large_model_is_streamed_in_chunks(servers):
    # 200 MB of variables: above the unary limit, so it travels in 2 MiB chunks.
    big = np.arange(50_000_000, dtype=np.float32).reshape(5000, 10000)
    c = PSClient([servers[0].address])
    values = c.init({"big": (big, True), "small": (np.ones(4, np.float32), True)}, SGD)
    np.testing.assert_array_equal(values["big"], big)
    grad = np.full_like(big, 2.0)
    new = c.send(Update(grads={"big": grad})).values
    np.testing.assert_array_equal(new["big"][0, :3], big[0, :3] - 1.0)


def test_grads_to_wait_averages_and_drops_stale_gradients():
    store = ParameterStore(grads_to_wait=2, max_staleness=1)
    store.init({"w": np.zeros(1, np.float32)}, {"w": True}, SGD)
    assert store.push(Update(grads={"w": np.array([1.0], np.float32)}), 0)[:2] == (True, 0)
    assert store.push(Update(grads={"w": np.array([3.0], np.float32)}), 0)[:2] == (True, 1)
    np.testing.assert_allclose(store.values_since(-1)["w"], [-1.0])  # 0 - 0.5 * 2
    store.push(Update(grads={"w": np.ones(1, np.float32)}), 1)
    store.push(Update(grads={"w": np.ones(1, np.float32)}), 1)
    store.push(Update(grads={"w": np.ones(1, np.float32)}), 2)
    store.push(Update(grads={"w": np.ones(1, np.float32)}), 2)
    assert store.version == 3
    assert tuple(store.push(Update(grads={"w": np.ones(1, np.float32)}), 0)) == (False, 3,
                                                                                 "stale")
    assert store.dropped == 1


def test_flush_applies_a_partial_buffer_as_sum_over_grads_to_wait():
    # Every buffered gradient is applied exactly once: a partial buffer at the
    # end of an epoch counts as sum / grads_to_wait (missing ones as zero).
    store = ParameterStore(grads_to_wait=4)
    store.init({"w": np.zeros(1, np.float32)}, {"w": True}, SGD)
    store.push(Update(grads={"w": np.array([2.0], np.float32)}), 0)
    assert store.version == 0
    assert store.flush() == 1
    np.testing.assert_allclose(store.values_since(-1)["w"], [-0.25])  # 0.5 * 2 / 4
    assert store.flush() == 1  # nothing buffered: no new version


def test_push_before_init_and_unknown_variables_are_errors(servers):
    c = PSClient([servers[0].address])
    with pytest.raises(ValueError, match="has not been initialized"):
        c.send(Update(grads={"w": np.ones(1, np.float32)}))
    c.init({"w": (np.ones(1, np.float32), True)}, SGD)
    with pytest.raises(ValueError, match=r"does not own \['nope'\]"):
        c.send(Update(grads={"nope": np.ones(1, np.float32)}))


def test_bad_optimizer_config_is_named(servers):
    c = PSClient([servers[0].address])
    with pytest.raises(ValueError, match="cannot build the optimizer from its config"):
        c.init({"w": (np.ones(1, np.float32), True)},
               {"class_name": "NoSuchOptimizer", "config": {}})


def test_values_since_are_read_only_snapshots_that_later_pushes_leave_alone():
    store = ParameterStore()
    store.init({"w": np.ones(1 << 19, np.float32)}, {"w": True}, SGD)  # 2 MB
    before = store.values_since(-1)["w"]
    assert not before.flags.writeable
    # As a server receives it: reassembled from chunks, writable, aligned (the
    # store gives it to TensorFlow without a copy).
    grad, = decode_all(encode("w", np.ones(1 << 19, np.float32), chunk_bytes=1 << 20))
    grad = grad[1]
    assert grad.flags.writeable and grad.ctypes.data % 64 == 0
    store.push(Update(grads={"w": grad}), 0)
    np.testing.assert_array_equal(before, 1)          # the snapshot kept its values
    np.testing.assert_array_equal(store.values_since(0)["w"], 0.5)
    grad[:] = 9  # the gradient was applied, not kept
    np.testing.assert_array_equal(store.values_since(0)["w"], 0.5)


def test_values_read_by_an_update_are_never_served_after_a_later_write():
    # An update returns every variable's value, and the reply to a push is
    # read from them; an assign-only push (a non-trainable value, buffered
    # gradients) or a restore writes after it without a new update.
    store = ParameterStore(grads_to_wait=2)
    store.init({"w": np.zeros(2, np.float32), "m": np.zeros(2, np.float32)},
               {"w": True, "m": False}, SGD)
    store.push(Update(grads={"w": np.ones(2, np.float32)}), 0)
    store.push(Update(grads={"w": np.ones(2, np.float32)}), 0)  # applied: version 1
    assert store.version == 1
    np.testing.assert_array_equal(store.values_since(-1)["w"], -0.5)
    store.push(Update(assigns={"m": np.full(2, 7.0, np.float32)}), 1)  # no new version
    store.push(Update(grads={"w": np.ones(2, np.float32)},
                      assigns={"m": np.full(2, 8.0, np.float32)}), 1)
    assert store.version == 1  # (the gradient waits for a second one)
    np.testing.assert_array_equal(store.values_since(-1)["m"], 8.0)
    np.testing.assert_array_equal(store.values_since(0)["m"], 8.0)
    store.push(Update(grads={"w": np.ones(2, np.float32)}), 1)
    values = store.values_since(1)
    np.testing.assert_array_equal(values["w"], -1.0)
    np.testing.assert_array_equal(values["m"], 8.0)
    store.variables["w"].assign(np.full(2, 3.0, np.float32))  # what a restore does
    store.mark_restored("ckpt")
    np.testing.assert_array_equal(store.values_since(-1)["w"], 3.0)


def test_an_update_writes_in_place_once_the_last_reply_let_go_of_the_values():
    # TensorFlow copies a variable's buffer before an update while anything
    # holds it; the store must not hold the values it read itself (a 4 MB push
    # cost 17-20 ms instead of 12-13 when it did).
    store = ParameterStore()
    store.init({"w": np.ones(1 << 16, np.float32)}, {"w": True}, SGD)
    grad = np.full(1 << 16, 0.5, np.float32)
    store.push(Update(grads={"w": grad}), 0)
    reply = store.values_since(0)
    where = reply["w"].ctypes.data
    del reply  # sent
    store.push(Update(grads={"w": grad}), 1)
    reply = store.values_since(1)
    assert reply["w"].ctypes.data == where  # the same buffer, updated in place
    np.testing.assert_array_equal(reply["w"], 0.5)


def test_a_call_a_stopping_server_cancels_is_retried_one_we_cancel_is_not():
    """A server that shuts down answers a call arriving meanwhile CANCELLED:
    the server going away, retried like UNAVAILABLE (before, the client
    raised it as a server error and a worker stopped); a call this process
    cancelled is not retried."""
    import time
    from concurrent import futures

    import grpc

    from keras_elastic.common import rpc

    def cancelled(request, context):
        context.abort(grpc.StatusCode.CANCELLED, "the server is shutting down")

    def slow(request, context):
        time.sleep(30)
        yield b""

    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", {
        "Cancelled": grpc.unary_unary_rpc_method_handler(cancelled),
        "Slow": grpc.unary_stream_rpc_method_handler(slow)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        attempts = []

        def call():
            attempts.append(1)
            return channel.unary_unary("/t.S/Cancelled")(b"")

        with pytest.raises(grpc.RpcError) as e:
            rpc.retry_unreachable(call, "the test server", timeout=0.6)
        assert e.value.code() == grpc.StatusCode.CANCELLED
        assert rpc.is_unreachable(e.value) and len(attempts) > 1
        # Given up on, it is a server that did not answer, as UNAVAILABLE is,
        # for the parameter-server and the master clients alike.
        from keras_elastic.master.client import MasterClient

        address = f"127.0.0.1:{port}"
        ps = PSClient([address], resolver=None, reconnect_timeout=0.3)
        error = ps._error(0, "Pull", e.value)
        assert isinstance(error, ConnectionError)
        assert str(error) == (f"parameter server 0 at {address} did not answer Pull: "
                              "the server is shutting down")
        ps.close()
        master = MasterClient(address, reconnect_timeout=0.3)
        master._stub = type("Stub", (), {"GetStatus": staticmethod(
            channel.unary_unary("/t.S/Cancelled"))})
        with pytest.raises(ConnectionError, match=f"master at {address} did not "
                           "answer GetStatus: the server is shutting down"):
            master._call("GetStatus", b"")
        master.close()
        stream = channel.unary_stream("/t.S/Slow")(b"")
        stream.cancel()
        with pytest.raises(grpc.RpcError) as e:
            next(stream)
        assert e.value.code() == grpc.StatusCode.CANCELLED
        assert not rpc.is_unreachable(e.value)
    finally:
        channel.close()
        server.stop(None)


def _first_unreachable(client, timeout: float = 30.0):
    """`client.waits(at_least=0.5)` once it names an unreachable server (one
    snapshot: the call may end between two)."""
    import time

    deadline = time.monotonic() + timeout
    waiting, unreachable = client.waits(at_least=0.5)
    while time.monotonic() < deadline and not unreachable:
        time.sleep(0.05)
        waiting, unreachable = client.waits(at_least=0.5)
    return waiting, unreachable


def test_a_client_reports_the_server_it_waits_on_and_cannot_reach():
    """`PSClient.waits`: what a worker's heartbeats tell the launcher's
    liveness policy. A server gone: its pull is retried (UNAVAILABLE) and
    shows as waiting and unreachable until the call gives up."""
    import threading

    server = ParameterServer()
    client = PSClient([server.address], reconnect_timeout=4.0)
    client.init({"w": (np.ones(2, np.float32), True)}, SGD)
    assert client.waits(at_least=0.0) == ({}, {})  # nothing in flight
    server.stop(0)
    failed = []
    puller = threading.Thread(target=lambda: failed.append(
        pytest.raises(ConnectionError, client.pull)))
    puller.start()
    waiting, unreachable = _first_unreachable(client)
    assert set(waiting) == set(unreachable) == {"ps-0"}, (waiting, unreachable)
    assert waiting["ps-0"] >= unreachable["ps-0"] >= 0.5
    puller.join(timeout=60)
    assert failed and client.waits(at_least=0.0) == ({}, {})  # the call ended


@pytest.mark.parametrize("method", ["flush", "status"])
def test_a_worker_stuck_in_any_call_to_a_server_it_cannot_reach_reports_it(method):
    """Every worker flushes every server at its epoch's end: one stuck there
    on a server cut off from all of them is waiting on it (it was reported
    as one that reached it, and the launcher blamed the other worker as cut
    off). A call that may take long on a live server (status, save) is a
    wait once it failed to reach it."""
    import threading

    server = ParameterServer()
    client = PSClient([server.address], reconnect_timeout=3.0)
    client.init({"w": (np.ones(2, np.float32), True)}, SGD)
    server.stop(0)
    failed = []
    caller = threading.Thread(target=lambda: failed.append(
        pytest.raises(ConnectionError, getattr(client, method), *(
            (0,) if method == "status" else ()))))
    caller.start()
    waiting, unreachable = _first_unreachable(client)
    assert set(waiting) == set(unreachable) == {"ps-0"}, (waiting, unreachable)
    caller.join(timeout=60)
    assert failed and client.waits(at_least=0.0) == ({}, {})


@pytest.mark.parametrize("servers", [2], indirect=True)
def test_pull_changed_only_takes_what_others_changed_since_our_last_exchange(servers):
    a = PSClient([s.address for s in servers], worker_id=0)
    b = PSClient([s.address for s in servers], worker_id=1)
    variables = {f"v{i}": (np.ones(3, np.float32), True) for i in range(6)}
    a.init(variables, SGD)
    b.init(variables, SGD)
    assert a.pull(changed_only=True) == {}  # nothing changed since a's init
    b.send(Update(grads={"v0": np.ones(3, np.float32)}))
    changed = a.pull(changed_only=True)
    assert set(changed) == {"v0"}
    np.testing.assert_allclose(changed["v0"], [0.5, 0.5, 0.5])
    assert a.pull(changed_only=True) == {}  # taken: a is up to date


def _refused(code_name, details):
    import grpc

    class Refused(grpc.RpcError):
        def code(self):
            return getattr(grpc.StatusCode, code_name)

        def details(self):
            return details

    return Refused()


def test_a_connection_that_could_not_be_opened_is_unreachable_whatever_its_code():
    """A blackhole route (a partition on the testbed) fails `connect` with
    EINVAL, which gRPC reports as FAILED_PRECONDITION: retried like a server
    that is down, not the worker's death (as the soak found); a server's own
    FAILED_PRECONDITION (a refusal: errors.ClusterError) is not."""
    from keras_elastic.common import rpc

    blackholed = _refused("FAILED_PRECONDITION", (
        "failed to connect to all addresses; last error: FAILED_PRECONDITION: "
        "ipv4:198.19.171.1:42509: connect failed: addr: ipv4:198.19.171.1:42509 "
        "error: Invalid argument"))
    assert rpc.is_unreachable(blackholed)
    refused = _refused("FAILED_PRECONDITION",
                       "worker 3 does not hold task 7 of 'train' (epoch 0)")
    assert not rpc.is_unreachable(refused)


def test_an_idle_worker_asks_the_servers_it_has_not_heard_from():
    """`PSClient.probe_idle`: the evidence an idle worker gives the launcher
    (an answer within the last seconds), and none from a server gone."""
    import time

    servers = [ParameterServer(partition=i, num_partitions=2) for i in range(2)]
    client = PSClient([s.address for s in servers], reconnect_timeout=1.0)
    try:
        client.init({"w": (np.ones(2, np.float32), True)}, SGD)
        before = client.reached()
        assert set(before) == {"ps-0", "ps-1"}, before  # init reached both
        client.probe_idle(older_than=3600.0)  # heard from both just now
        assert client._probing == set()
        servers[1].stop(0)
        time.sleep(1.0)
        client.probe_idle(older_than=0.5)
        deadline = time.monotonic() + 30
        while client._probing and time.monotonic() < deadline:
            time.sleep(0.05)
        after = client.reached()
        assert after["ps-0"] < 1.0  # answered the probe
        assert after["ps-1"] >= 1.0  # no answer: heard from at init only
        assert client.waits(at_least=0.0) == ({}, {})  # a probe is no wait
    finally:
        client.close()
        servers[0].stop(0)

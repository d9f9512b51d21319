"""gRPC servers and channels with the project's settings.

Message size limits: every server (`make_server`) and channel (`make_channel`)
sets both `grpc.max_send_message_length` and `grpc.max_receive_message_length`
to `tensor_codec.MAX_MESSAGE_BYTES` (64 MiB), explicitly rather than relying on
gRPC's defaults (4 MiB receive, unlimited send). Tensors larger than that never
travel in one message: they are cut into chunks of `tensor_codec.CHUNK_BYTES`
(2 MiB) and streamed (`Init`, `Push`, `Pull`); only pushes below
`ps.client.SMALL_PUSH_BYTES` (16 MiB) go in one unary message. A message above
the limit is refused by gRPC itself with RESOURCE_EXHAUSTED, before any of our
code sees it, and the server goes on serving. (Within a request stream, gRPC
Python then ends the servicer's request iterator as if the client had closed
it: a Push header therefore announces its number of tensors, and a shorter
stream is refused.) Services are registered with
`rpc_service.add_service`, which answers a request that does not parse with
INVALID_ARGUMENT naming the method.

Servers that move: in a launched job (`KERAS_ELASTIC_JOB_DIR` set) a channel
to the job's master or a parameter server follows it when a restart puts it
at another address (on another node of a cluster): while the server is
unreachable, the channel looks up the role's address in `JOB_DIR/cluster.json`
(`resolver.py`, at most every 0.5 s) and, when it changed, sends the next calls
there. Stubs made on the channel need not be made again.

Example:

>>> server = make_server()
>>> address = bind(server)
>>> server.start()
>>> channel = make_channel(address)
>>> server.stop(grace=None).wait()
True
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any, TypeVar

import grpc
from absl import logging

from keras_elastic.common import auth, cluster_env, faults, fencing, job_end, tls
from keras_elastic.common import resolver as resolver_mod
from keras_elastic.common.tensor_codec import MAX_MESSAGE_BYTES

# The standard health-checking service's methods (answered without the token).
HEALTH_METHODS = "/grpc.health.v1.Health/"

_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]
# A client reconnects to a restarted server within a second or so (gRPC's
# default backoff grows to two minutes). While calls are in flight it pings
# the server every KEEPALIVE_MS and drops the connection when a ping goes
# unanswered for `keepalive_timeout_ms()`: a server that a network partition
# cut off (packets dropped in silence, no connection reset) then fails the
# calls as UNAVAILABLE, retried like a server that is down, instead of
# leaving them to hang until their deadlines (600 s for a parameter
# server's).
KEEPALIVE_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 10_000
# The metadata key naming the parameter-server partition a call is for
# (`ps/host.py`: a process may hold several).
PARTITION_METADATA = "ke-partition"
# How a process answers a call for a partition it does not hold (it moved, or
# is not there yet): UNAVAILABLE with details that begin so. Nothing of such
# a call was applied: even a call that is not safe to repeat may be sent
# again, where cluster.json says the partition is now (`is_misdirected`).
PARTITION_ELSEWHERE = "not here: "


def is_misdirected(error: grpc.RpcError) -> bool:
    """The call reached a parameter-server process that does not hold its
    partition: nothing of it was applied."""
    return (error.code() == grpc.StatusCode.UNAVAILABLE
            and (error.details() or "").startswith(PARTITION_ELSEWHERE))

_CHANNEL_OPTIONS = _OPTIONS + [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", KEEPALIVE_MS),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
]


def keepalive_timeout_ms() -> int:
    """How long a keepalive ping may go unanswered: KEEPALIVE_TIMEOUT_MS, or
    the job's liveness timeout when longer (`KERAS_ELASTIC_LIVENESS_TIMEOUT`):
    a server that answers nothing (a frozen process) is the launcher's to
    find and replace, after that timeout, as documented; the keepalive only
    drops the connections to servers the launcher finds alive, that this
    process cannot reach (a partition between the two).

    >>> os.environ["KERAS_ELASTIC_LIVENESS_TIMEOUT"] = "60"
    >>> keepalive_timeout_ms()
    60000
    >>> del os.environ["KERAS_ELASTIC_LIVENESS_TIMEOUT"]
    >>> keepalive_timeout_ms()
    10000
    """
    return max(KEEPALIVE_TIMEOUT_MS, int(cluster_env.liveness_timeout() * 1000))
# Servers accept those pings, also during a call that sends no data for long
# (a worker waiting for its next task): gRPC's defaults answer a client that
# pings more often than every 5 minutes without data with GOAWAY.
_SERVER_OPTIONS = _OPTIONS + [
    ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),
]

T = TypeVar("T")

# make_channel(resolver=AUTO): the resolver of the job this process belongs to.
AUTO = "auto"


def is_unreachable(error: grpc.RpcError) -> bool:
    """The server could not be reached (down, restarting, or gone mid-call).

    A server that stops cancels its calls in flight (UNAVAILABLE), and one
    that arrives while it shuts down (CANCELLED, not cancelled by this
    process): both are a server going away, retried like one that is down.
    A connection this machine could not even open is one too, whatever code
    gRPC gives it: a blackhole route makes `connect` fail with EINVAL, which
    gRPC reports as FAILED_PRECONDITION "failed to connect to all addresses"
    (the chaos soak on the testbed found a worker dying of it at once); a
    server's own FAILED_PRECONDITION answers never read so.
    """
    code = error.code()
    return code == grpc.StatusCode.UNAVAILABLE or (
        code == grpc.StatusCode.CANCELLED and error.details() != _LOCALLY_CANCELLED
    ) or (code == grpc.StatusCode.FAILED_PRECONDITION
          and (error.details() or "").startswith(_CONNECT_FAILED))


# What gRPC reports for a call this process cancelled (grpc/_channel.py).
_LOCALLY_CANCELLED = "Locally cancelled by application!"
# How gRPC's details begin when no connection could be opened.
_CONNECT_FAILED = "failed to connect to all addresses"


# The retries' jitter: a generator of its own, never the script's global one
# (a worker retrying at other moments than another must not draw other data).
_JITTER = random.Random()


def retry_unreachable(call: Callable[[], T], what: str, timeout: float,
                      on_unreachable: Callable[[], None] | None = None) -> T:
    """Runs `call()`, retrying with backoff while the server is unreachable, for
    at most `timeout` seconds; then raises the last error. Only for calls that
    are safe to repeat. `on_unreachable()` runs at each failure retried.
    Once the job of this worker ended (`job_end.ended()`: its launcher wrote
    the summary, its servers are gone for good), an unreachable server is
    not retried: the error is raised at once."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    first_failure = None
    while True:
        try:
            return call()
        except grpc.RpcError as e:
            if not is_unreachable(e) or time.monotonic() + delay > deadline:
                raise
            if job_end.ended() is not None:
                logging.warning("%s is unreachable (%s) and the job ended (%s): "
                                "not retrying", what, e.details(), job_end.SUMMARY)
                raise
            if on_unreachable is not None:
                on_unreachable()
            if first_failure is None:
                first_failure = time.monotonic()
                logging.warning("%s is unreachable (%s); retrying for up to %.0f s",
                                what, e.details(), timeout)
            refresh_all()  # it may have moved: the next try goes where it is now
            time.sleep(delay * (0.5 + _JITTER.random()))
            delay = min(delay * 2, 1.0)


def make_server(max_workers: int = 32,
                generation: fencing.Generation | None = None) -> grpc.Server:
    """A server that answers only calls carrying this process's job token
    (`auth.job_token()`); others get UNAUTHENTICATED. It serves the standard
    health-checking service too (`grpc.health.v1.Health`, status SERVING,
    answered without the token, as Kubernetes' and `grpc_health_probe`'s
    probes expect): the launcher's liveness checks call it. With a
    `generation`, it answers only calls of that generation and serves
    `Fencing/Fence` (`fencing.py`)."""
    from grpc_health.v1 import health, health_pb2_grpc

    from keras_elastic.proto import fencing_pb2_grpc

    interceptors = [auth.TokenInterceptor(auth.job_token(), exempt=(HEALTH_METHODS,))]
    if os.environ.get(faults.ENV):
        interceptors.insert(0, _CutInterceptor())
    if generation is not None:
        interceptors.append(fencing.GenerationInterceptor(generation,
                                                          exempt=(HEALTH_METHODS,)))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers),
                         options=_SERVER_OPTIONS, interceptors=interceptors)
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    if generation is not None:
        fencing_pb2_grpc.add_FencingServicer_to_server(
            fencing.FencingServicer(generation), server)
    return server


class _CutInterceptor(grpc.ServerInterceptor):
    """Fault injection's `cut` (`faults.py`): once it happened, every call
    but a health check fails as UNAVAILABLE."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if (handler is None or not faults.is_cut()
                or handler_call_details.method.startswith(HEALTH_METHODS)):
            return handler

        def refuse(request_or_iterator, context):
            context.abort(grpc.StatusCode.UNAVAILABLE,
                          "cut off from the job (fault injection)")

        return auth.refusing_handler(handler, refuse)


def check_bind(host: str, tls_on: bool, insecure: bool) -> None:
    """Refuses (ValueError) to serve beyond loopback in clear text, unless
    `insecure` says the user wants that.

    >>> check_bind("127.0.0.1", tls_on=False, insecure=False)
    >>> check_bind("0.0.0.0", tls_on=False, insecure=False)
    Traceback (most recent call last):
    ...
    ValueError: refusing to serve on 0.0.0.0 without TLS: ...
    >>> check_bind("0.0.0.0", tls_on=False, insecure=True)
    """
    if not tls.is_loopback(host) and not tls_on and not insecure:
        raise ValueError(
            f"refusing to serve on {host or 'every interface'} without TLS: the job's "
            "token and data would cross the network in clear text. Turn TLS on (--tls, "
            "or your own certificate with --tls_cert/--tls_key/--tls_ca), or pass "
            "--insecure if the network is trusted")


def bind(server: grpc.Server, host: str = "127.0.0.1", port: int = 0) -> str:
    """Binds `server` to `host:port` (0: any free port); returns the address.
    The port serves TLS when it is on (`tls.TLSConfig.from_env()`), which it
    must be beyond loopback unless KERAS_ELASTIC_INSECURE=1 (`check_bind`)."""
    config = tls.TLSConfig.from_env()
    check_bind(host, config is not None, os.environ.get(tls.INSECURE_ENV) == "1")
    if config is None:
        bound = server.add_insecure_port(f"{host}:{port}")
    else:
        bound = server.add_secure_port(f"{host}:{port}", config.server_credentials())
    if bound == 0:
        raise OSError(f"could not bind a gRPC server to {host}:{port}")
    return f"{host}:{bound}"


# Seconds a stopped server may take to close its port beyond its grace: a
# stop gRPC cannot finish (its thread pools gone at interpreter exit) must not
# keep the process alive.
STOP_WAIT_SECONDS = 5.0


def await_stop(server: grpc.Server, grace: float | None, what: str) -> bool:
    """Stops `server` (calls in flight get `grace` seconds, None: none) and
    waits for it to finish, at most `grace` plus `STOP_WAIT_SECONDS`; False
    (and a warning) if it did not. (gRPC's own `stop(None)` waits without a
    bound.)"""
    if server.stop(grace or 0.0).wait((grace or 0.0) + STOP_WAIT_SECONDS):
        return True
    logging.warning("%s did not finish stopping within %.0f s; going on", what,
                    (grace or 0.0) + STOP_WAIT_SECONDS)
    return False


def make_channel(address: str, options: Sequence[tuple[str, Any]] = (),
                 resolver: resolver_mod.ClusterResolver | str | None = AUTO,
                 generation: Callable[[], int] | None = None,
                 partition: int | None = None) -> grpc.Channel:
    """A channel to `address` with the project's options, whose calls carry
    this process's job token (`auth.job_token()`), over TLS when it is on
    (`tls.TLSConfig.from_env()`). `options` (gRPC channel arguments) override
    the project's, e.g. a test's client raising its own send limit above the
    server's:

    >>> limit = ("grpc.max_send_message_length", 2 * MAX_MESSAGE_BYTES)
    >>> channel = make_channel("127.0.0.1:5000", [limit])

    When `resolver` (AUTO: `resolver.for_process()`, the job of
    `KERAS_ELASTIC_JOB_DIR`) knows the role listening at `address`, the
    channel follows that role to its new address after a restart
    (`ResolvingChannel`); None: never. `generation`: the generation the
    calls carry when no resolver gives it (a server's own, for the calls it
    forwards to its backup: `ps/replication.py`). `partition`: the
    parameter-server partition every call names (`ps/host.py`); a channel to
    a job's parameter server follows that partition's role ("ps/<p>"), also
    where one process holds several partitions (they share its address).
    """
    overridden = {key for key, _ in options}
    ours = _CHANNEL_OPTIONS + [("grpc.keepalive_timeout_ms", keepalive_timeout_ms())]
    merged = [o for o in ours if o[0] not in overridden] + list(options)
    config = tls.TLSConfig.from_env()
    if config is not None and config.server_name:
        merged.append(("grpc.ssl_target_name_override", config.server_name))

    if resolver == AUTO:
        resolver = resolver_mod.for_process()
    role = resolver.role_of(address) if resolver is not None else None
    if role is not None and role != resolver_mod.MASTER and partition is not None:
        role = resolver_mod.ps_role(partition)
    fenced = role is not None or generation is not None
    named = [] if partition is None else [(PARTITION_METADATA, str(partition))]

    def call_metadata() -> list[tuple[str, str]]:
        if not fenced:
            return named
        value = resolver.generation() if role is not None else generation()
        return [(fencing.METADATA_KEY, str(value))] + named

    def connect(target: str) -> grpc.Channel:
        if config is None:
            channel = grpc.insecure_channel(target, options=merged)
        else:
            channel = grpc.secure_channel(target, config.channel_credentials(),
                                          options=merged)
        # A job's role: its calls carry the job's generation (fencing.py).
        return auth.with_token(channel, auth.job_token(),
                               call_metadata if fenced or named else None)

    if role is None:
        return connect(address)
    return ResolvingChannel(address, role, resolver, connect)


_live_channels: weakref.WeakSet = weakref.WeakSet()


def refresh_all() -> None:
    """Every `ResolvingChannel` of this process checks whether its server
    moved (cheap: the cluster file is read at most every 0.5 s)."""
    for channel in list(_live_channels):
        channel.refresh()


class _ResolvingCallable:
    """A stub's method on a `ResolvingChannel`: calls go to the channel's
    current address."""

    def __init__(self, channel: ResolvingChannel, kind: str, method: str,
                 kwargs: dict) -> None:
        self._channel = channel
        self._kind = kind
        self._method = method
        self._kwargs = kwargs
        self._cached: tuple[int, Any] | None = None

    def _target(self):
        inner, generation = self._channel.current()
        cached = self._cached
        if cached is None or cached[0] != generation:
            cached = self._cached = (generation, getattr(inner, self._kind)(
                self._method, **self._kwargs))
        return cached[1]

    def __call__(self, *args, **kwargs):
        try:
            return self._target()(*args, **kwargs)
        except grpc.RpcError as e:
            if is_unreachable(e):
                self._channel.refresh()
            raise

    def with_call(self, *args, **kwargs):
        return self._target().with_call(*args, **kwargs)

    def future(self, *args, **kwargs):
        return self._target().future(*args, **kwargs)


class ResolvingChannel(grpc.Channel):
    """A channel to one role of a job ("master", "ps/0") that follows it to
    its new address when the job's cluster file says it moved.

    >>> os.makedirs("job")
    >>> with open("job/cluster.json", "w") as f:   # what the launcher writes
    ...     json.dump({"master": "10.0.0.7:40123", "ps": ["10.0.0.9:35011"]}, f)
    >>> channel = make_channel("10.0.0.7:40123",
    ...                        resolver=resolver_mod.ClusterResolver("job"))
    >>> channel.role, channel.address
    ('master', '10.0.0.7:40123')
    >>> channel.close()
    """

    def __init__(self, address: str, role: str,
                 resolver: resolver_mod.ClusterResolver,
                 connect: Callable[[str], grpc.Channel]) -> None:
        self.address = address
        self.role = role
        self._resolver = resolver
        self._connect = connect
        self._lock = threading.Lock()
        self._channel = connect(address)
        self._generation = 0
        # Replaced channels stay open until close(): a call on one of them in
        # another thread fails as unreachable and is retried, not cancelled.
        self._old: list[grpc.Channel] = []
        self._subscribed: dict[Any, grpc.Channel] = {}
        _live_channels.add(self)

    def current(self) -> tuple[grpc.Channel, int]:
        with self._lock:
            return self._channel, self._generation

    def refresh(self) -> bool:
        """Follows the role if the cluster file gives it another address;
        returns whether it moved."""
        new = self._resolver.lookup(self.role)
        if not new or new == self.address:
            return False
        with self._lock:
            if new == self.address:
                return False
            old_address, self.address = self.address, new
            self._old.append(self._channel)
            self._channel = self._connect(new)
            self._generation += 1
        logging.warning("%s moved from %s to %s: following it", self.role,
                        old_address, new)
        return True

    def _callable(self, kind: str, method: str, request_serializer=None,
                  response_deserializer=None, _registered_method=False):
        return _ResolvingCallable(self, kind, method, {
            "request_serializer": request_serializer,
            "response_deserializer": response_deserializer,
            "_registered_method": _registered_method})

    def unary_unary(self, method, request_serializer=None, response_deserializer=None,
                    _registered_method=False):
        return self._callable("unary_unary", method, request_serializer,
                              response_deserializer, _registered_method)

    def unary_stream(self, method, request_serializer=None, response_deserializer=None,
                     _registered_method=False):
        return self._callable("unary_stream", method, request_serializer,
                              response_deserializer, _registered_method)

    def stream_unary(self, method, request_serializer=None, response_deserializer=None,
                     _registered_method=False):
        return self._callable("stream_unary", method, request_serializer,
                              response_deserializer, _registered_method)

    def stream_stream(self, method, request_serializer=None, response_deserializer=None,
                      _registered_method=False):
        return self._callable("stream_stream", method, request_serializer,
                              response_deserializer, _registered_method)

    def subscribe(self, callback, try_to_connect=False):
        channel, _ = self.current()
        self._subscribed[callback] = channel
        channel.subscribe(callback, try_to_connect=try_to_connect)

    def unsubscribe(self, callback):
        channel = self._subscribed.pop(callback, None) or self.current()[0]
        channel.unsubscribe(callback)

    def close(self):
        _live_channels.discard(self)
        with self._lock:
            channels, self._old = [self._channel, *self._old], []
        for channel in channels:
            channel.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.close()
        return False


def wait_ready(channel: grpc.Channel, address: str, what: str,
               timeout: float = 30.0) -> None:
    """Blocks until `channel` connects; raises ConnectionError naming `address`.
    A `ResolvingChannel` follows its server meanwhile if it moves. Once this
    process's job ended (`job_end.ended()`: a worker that joined as its job
    was ending), it stops waiting within a second: the servers are gone."""
    deadline = time.monotonic() + timeout
    refresh = getattr(channel, "refresh", None)
    while True:
        step = min(max(0.0, deadline - time.monotonic()), 1.0)
        future = grpc.channel_ready_future(channel)
        try:
            future.result(timeout=step)
            return
        except grpc.FutureTimeoutError as e:
            future.cancel()
            if job_end.ended() is not None:
                raise ConnectionError(
                    f"cannot reach the {what} at {address}: the job ended "
                    f"({job_end.SUMMARY} was written)") from e
            if time.monotonic() >= deadline:
                raise ConnectionError(
                    f"cannot reach the {what} at {address} within {timeout:.0f} s: is "
                    "it running, and is the address right?") from e
        if refresh is not None:
            refresh()


def write_ready_file(path: str, info: dict) -> None:
    """Writes `info` as JSON to `path` atomically (the launcher polls for it)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, path)


def serve_until_signal(server, ready_file: str | None) -> None:
    """Announces `server.address` in `ready_file`, serves until SIGTERM/SIGINT,
    then stops `server` (a service process's main loop)."""
    if ready_file:
        write_ready_file(ready_file, {"address": server.address, "pid": os.getpid()})
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    # Polled: a signal the kernel delivers to another thread (one the process
    # sends itself from a worker thread, as a fenced master does) only runs
    # its Python handler once the main thread executes bytecode again.
    while not done.wait(0.5):
        pass
    server.stop(grace=1.0)

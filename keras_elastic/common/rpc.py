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

Example:

>>> server = make_server()
>>> address = bind(server)
>>> server.start()          # doctest: +SKIP
>>> channel = make_channel(address)
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any, TypeVar

import grpc
from absl import logging

from keras_elastic.common import auth, tls
from keras_elastic.common.tensor_codec import MAX_MESSAGE_BYTES

_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]
# A client reconnects to a restarted server within a second or so (gRPC's
# default backoff grows to two minutes).
_CHANNEL_OPTIONS = _OPTIONS + [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

T = TypeVar("T")


def is_unreachable(error: grpc.RpcError) -> bool:
    """The server could not be reached (down, restarting, or gone mid-call)."""
    return error.code() == grpc.StatusCode.UNAVAILABLE


def retry_unreachable(call: Callable[[], T], what: str, timeout: float) -> T:
    """Runs `call()`, retrying with backoff while the server is unreachable, for
    at most `timeout` seconds; then raises the last error. Only for calls that
    are safe to repeat."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    first_failure = None
    while True:
        try:
            return call()
        except grpc.RpcError as e:
            if not is_unreachable(e) or time.monotonic() + delay > deadline:
                raise
            if first_failure is None:
                first_failure = time.monotonic()
                logging.warning("%s is unreachable (%s); retrying for up to %.0f s",
                                what, e.details(), timeout)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)


def make_server(max_workers: int = 32) -> grpc.Server:
    """A server that answers only calls carrying this process's job token
    (`auth.job_token()`); others get UNAUTHENTICATED."""
    return grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers),
                       options=_OPTIONS,
                       interceptors=[auth.TokenInterceptor(auth.job_token())])


def check_bind(host: str, tls_on: bool, insecure: bool) -> None:
    """Refuses (ValueError) to serve beyond loopback in clear text, unless
    `insecure` says the user wants that.

    >>> check_bind("0.0.0.0", tls_on=False, insecure=False)  # doctest: +SKIP
    ValueError: refusing to serve on 0.0.0.0 without TLS: ...
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


def make_channel(address: str, options: Sequence[tuple[str, Any]] = ()
                 ) -> grpc.Channel:
    """A channel to `address` with the project's options, whose calls carry
    this process's job token (`auth.job_token()`), over TLS when it is on
    (`tls.TLSConfig.from_env()`). `options` (gRPC channel arguments) override
    the project's, e.g. a test's client raising its own send limit above the
    server's:

    >>> limit = ("grpc.max_send_message_length", 2 * MAX_MESSAGE_BYTES)
    >>> channel = make_channel("127.0.0.1:5000", [limit])
    """
    overridden = {key for key, _ in options}
    merged = [o for o in _CHANNEL_OPTIONS if o[0] not in overridden] + list(options)
    config = tls.TLSConfig.from_env()
    if config is None:
        channel = grpc.insecure_channel(address, options=merged)
    else:
        channel = grpc.secure_channel(address, config.channel_credentials(),
                                      options=merged)
    return auth.with_token(channel, auth.job_token())


def wait_ready(channel: grpc.Channel, address: str, what: str,
               timeout: float = 30.0) -> None:
    """Blocks until `channel` connects; raises ConnectionError naming `address`."""
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
    except grpc.FutureTimeoutError as e:
        raise ConnectionError(
            f"cannot reach the {what} at {address} within {timeout:.0f} s: is it "
            "running, and is the address right?") from e


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
    done.wait()
    server.stop(grace=1.0)

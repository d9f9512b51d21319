"""gRPC servers and channels with the project's settings."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import TypeVar

import grpc
from absl import logging

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
    return grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers),
                       options=_OPTIONS)


def bind(server: grpc.Server, host: str = "127.0.0.1", port: int = 0) -> str:
    """Binds `server` to `host:port` (0: any free port); returns the address."""
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"could not bind a gRPC server to {host}:{port}")
    return f"{host}:{bound}"


def make_channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)


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

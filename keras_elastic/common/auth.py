"""The job token: every call to a job's master or parameter servers carries it.

Each job has a random token. The launcher keeps it in `JOB_DIR/token` (mode
0600) and gives it to its processes in the environment (`KERAS_ELASTIC_TOKEN`);
an embedded cluster makes one for its process. Clients send it as gRPC
metadata (`rpc.make_channel` adds it to every call); servers check it
(`rpc.make_server` installs `TokenInterceptor`) and answer a call without it,
or with another one, UNAUTHENTICATED, logging the method and the caller.

Example:

>>> token = job_token()                 # this process's token (made if none)
>>> os.makedirs("job")
>>> write_token_file("job")
'job/token'
>>> read_token_file("job") == token
True
"""

from __future__ import annotations

import collections
import hmac
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable

import grpc
from absl import logging

TOKEN_ENV = "KERAS_ELASTIC_TOKEN"
TOKEN_FILE = "token"
METADATA_KEY = "x-keras-elastic-token"

_lock = threading.Lock()


def job_token() -> str:
    """This process's job token: `KERAS_ELASTIC_TOKEN`, or a new random one
    stored there (so this process's servers, clients and children share it).

    >>> job_token() == os.environ["KERAS_ELASTIC_TOKEN"]
    True
    """
    with _lock:
        token = os.environ.get(TOKEN_ENV)
        if not token:
            token = os.environ[TOKEN_ENV] = secrets.token_hex(32)
        return token


def write_token_file(job_dir: str, token: str | None = None) -> str:
    """Writes `token` (default: `job_token()`) to `JOB_DIR/token`, readable by
    its owner only; returns the path.

    >>> os.makedirs("job-a")
    >>> write_token_file("job-a", "3f1c9a")
    'job-a/token'
    """
    path = os.path.join(job_dir, TOKEN_FILE)
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # also when the file was there with another mode
        os.write(fd, (token or job_token()).encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def read_token_file(job_dir: str) -> str:
    """The token of the job in `job_dir`; ValueError if the file is missing,
    unreadable, empty, or readable by others than its owner.

    >>> os.makedirs("job-b")
    >>> path = write_token_file("job-b", "3f1c9a")
    >>> read_token_file("job-b")
    '3f1c9a'
    >>> os.chmod(path, 0o644)
    >>> read_token_file("job-b")
    Traceback (most recent call last):
    ...
    ValueError: the job token job-b/token is accessible to other users (mode ...
    """
    path = os.path.join(job_dir, TOKEN_FILE)
    try:
        mode = os.stat(path).st_mode
        with open(path) as f:
            token = f.read().strip()
    except OSError as e:
        raise ValueError(f"cannot read the job token {path}: {e.strerror}; is "
                         f"{job_dir} the directory of a running job, and yours?") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"the job token {path} is accessible to other users (mode "
                         f"{stat.S_IMODE(mode):o}): run `chmod 600 {path}`")
    if not token:
        raise ValueError(f"the job token {path} is empty")
    return token


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses (UNAUTHENTICATED) calls whose metadata lacks `token`.

    >>> from concurrent import futures
    >>> interceptor = TokenInterceptor(job_token())
    >>> server = grpc.server(futures.ThreadPoolExecutor(2),
    ...                      interceptors=[interceptor])
    """

    def __init__(self, token: str, log_every: float = 10.0,
                 exempt: tuple[str, ...] = ()) -> None:
        self._token = token.encode()
        # Method-name prefixes answered without the token (health checks).
        self._exempt = tuple(exempt)
        self._log_every = log_every
        self._last_log = -float("inf")
        self._unlogged = 0
        self._log_lock = threading.Lock()

    def _valid(self, metadata) -> bool:
        for key, value in metadata or ():
            if key == METADATA_KEY:
                given = value.encode() if isinstance(value, str) else value
                return hmac.compare_digest(given, self._token)
        return False

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(self._exempt) or self._valid(
                handler_call_details.invocation_metadata):
            return handler

        def refuse(request_or_iterator, context):
            self._log(method, context.peer())
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          f"missing or wrong job token for {method}: this server belongs "
                          "to another job (a worker of this job gets the token from "
                          f"the launcher, or `keras-elastic join` from JOB_DIR/"
                          f"{TOKEN_FILE})")

        return refusing_handler(handler, refuse)

    def _log(self, method: str, peer: str) -> None:
        with self._log_lock:
            now = time.monotonic()
            if now - self._last_log < self._log_every:
                self._unlogged += 1
                return
            unlogged, self._unlogged, self._last_log = self._unlogged, 0, now
        logging.warning("refused %s from %s: missing or wrong job token%s", method, peer,
                        f" ({unlogged} more refusals not logged)" if unlogged else "")


def refusing_handler(handler: grpc.RpcMethodHandler, refuse) -> grpc.RpcMethodHandler:
    """A handler of the same streaming kinds as `handler` that runs
    `refuse(request_or_iterator, context)` (which aborts the call). It has no
    deserializer: the refused request's bytes are never parsed."""
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)


class _CallDetails(collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials",
                         "wait_for_ready", "compression")), grpc.ClientCallDetails):
    pass


class _TokenClientInterceptor(grpc.UnaryUnaryClientInterceptor,
                              grpc.UnaryStreamClientInterceptor,
                              grpc.StreamUnaryClientInterceptor,
                              grpc.StreamStreamClientInterceptor):
    def __init__(self, token: str, more=None) -> None:
        self._token = token
        self._more = more

    def _details(self, details):
        metadata = list(details.metadata or ()) + [(METADATA_KEY, self._token)]
        if self._more is not None:
            metadata += self._more()
        return _CallDetails(details.method, details.timeout, metadata,
                            details.credentials, details.wait_for_ready,
                            details.compression)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)


def with_token(channel: grpc.Channel, token: str,
               more: Callable[[], list[tuple[str, str]]] | None = None
               ) -> grpc.Channel:
    """`channel` sending `token` with every call (and `more()`'s metadata,
    e.g. the job's generation: `common/fencing.py`).

    >>> channel = with_token(grpc.insecure_channel("127.0.0.1:5000"), job_token())
    """
    return grpc.intercept_channel(channel, _TokenClientInterceptor(token, more))

"""Fencing: a replaced server can never act in the job again.

A job's *generation* counts its service recoveries: 0 at the start, one more
each time the launcher brings back a master or a parameter server. Every
server of the job (`rpc.make_server(..., fencing=Generation(g))`) answers
only calls of its own generation: a client's calls carry the generation it
knows (metadata `x-keras-elastic-generation`, added by the channels
`rpc.make_channel` makes in a launched job, from `cluster.json`), and a call
of another generation is answered UNAVAILABLE, naming both. The client then
does what it does for a server it cannot reach: re-reads `cluster.json`
(where the launcher wrote the new generation and addresses) and retries.

After a recovery the launcher moves every live server into the new
generation (`Fencing/Fence`, which only goes forward). A server that was
replaced but not killed (frozen and woken up later, or cut off by the
network) never gets that call: it stays behind, and the job's clients, now
of the new generation, are refused there, so it can apply no push and hand
out no task. Calls without the metadata (the launcher's own, a test's)
are not checked; the health check and `Fence` itself are exempt.

The master's journal is fenced too (`master/journal.py`): a master that
finds records it did not write stops writing, and a restarted master skips
records of an older generation than one it has seen.

Example:

>>> generation = Generation(3)
>>> generation.fence(5)
5
>>> generation.refusal("4") is not None
True
>>> generation.refusal("5") is None
True
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import grpc

from keras_elastic.common import auth

METADATA_KEY = "x-keras-elastic-generation"
GENERATION_ENV = "KERAS_ELASTIC_GENERATION"  # a worker's generation at its start
SERVICE = "/keras_elastic.Fencing/"


def from_env() -> int:
    """The generation the launcher gave this process (0 if none)."""
    raw = os.environ.get(GENERATION_ENV, "0")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{GENERATION_ENV}={raw!r} is not an integer") from None


class Generation:
    """A server's generation: it answers calls of this generation only."""

    def __init__(self, value: int = 0) -> None:
        self._value = int(value)
        self._lock = threading.Lock()

    @property
    def value(self) -> int:
        return self._value

    def fence(self, generation: int) -> int:
        """Moves to `generation` (never back); returns the generation now."""
        with self._lock:
            self._value = max(self._value, int(generation))
            return self._value

    def refusal(self, given: str | bytes | None) -> str | None:
        """Why a call of generation `given` (the metadata's value; None: not
        given) is refused, or None if it is answered."""
        if given is None:
            return None
        try:
            theirs = int(given)
        except ValueError:
            return f"bad {METADATA_KEY} {given!r}"
        mine = self._value
        if theirs == mine:
            return None
        if theirs < mine:
            return (f"the caller is of generation {theirs}, this server of {mine}: "
                    "the job recovered a service since; re-read the cluster")
        return (f"this server is of generation {mine}, the caller of {theirs}: it "
                "was replaced (or is not fenced into the new generation yet)")


class GenerationInterceptor(grpc.ServerInterceptor):
    """Refuses (UNAVAILABLE) calls of another generation than the server's."""

    def __init__(self, generation: Generation, exempt: tuple[str, ...] = ()) -> None:
        self.generation = generation
        self._exempt = (SERVICE, *exempt)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(self._exempt):
            return handler
        given = next((v for k, v in handler_call_details.invocation_metadata or ()
                      if k == METADATA_KEY), None)
        why = self.generation.refusal(given)
        if why is None:
            return handler

        def refuse(request_or_iterator, context):
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{method} refused: {why}")

        return auth.refusing_handler(handler, refuse)


class FencingServicer:
    """`Fencing/Fence`: the launcher moves a live server into a generation."""

    def __init__(self, generation: Generation,
                 on_fence: Callable[[int], None] | None = None) -> None:
        self.generation = generation
        self.on_fence = on_fence

    def Fence(self, request, context):
        from keras_elastic.proto import fencing_pb2

        value = self.generation.fence(request.generation)
        if self.on_fence is not None:
            self.on_fence(value)
        return fencing_pb2.FenceResponse(generation=value)


def fence(channel: grpc.Channel, generation: int, timeout: float = 30.0) -> int:
    """Moves the server behind `channel` into `generation`; returns its
    generation now.

    >>> from keras_elastic.common.rpc import make_channel
    >>> from keras_elastic.ps.server import ParameterServer
    >>> server = ParameterServer(generation=1)     # a server of generation 1
    >>> fence(make_channel(server.address), 2)
    2
    >>> server.stop()
    """
    from keras_elastic.proto import fencing_pb2, fencing_pb2_grpc

    stub = fencing_pb2_grpc.FencingStub(channel)
    return stub.Fence(fencing_pb2.FenceRequest(generation=generation),
                      timeout=timeout).generation

"""A raw-bytes gRPC echo: the floor the parameter-server benches compare with.

`python -m echo_server --ready_file=F` (with bench/ on PYTHONPATH) serves a
generic gRPC service, bytes in, bytes out, no protobuf, made with
`keras_elastic.common.rpc.make_server` (so the same message limits, channel
options and token check as a parameter server): `Echo` keeps every chunk a
client streams and streams them all back (as the PS reads a push whole before
it answers); `Pull` streams back the number of bytes a small request asks for.
`EchoClient` sends pre-made `bytes` cut into `tensor_codec.CHUNK_BYTES` chunks
(as the PS client streams its tensors, with nothing to encode).
bench_ps_wire.py and bench_ps_scaling.py measure it beside the servers.
"""

from __future__ import annotations

import os
from concurrent import futures

import numpy as np
from absl import app, flags

SERVICE = "kebench.Echo"


class EchoServer:
    def __init__(self) -> None:
        import grpc

        from keras_elastic.common import rpc
        from keras_elastic.common.tensor_codec import CHUNK_BYTES

        pulls: dict[int, list[bytes]] = {}

        def echo(request_iterator, context):
            chunks = list(request_iterator)  # all of it first, as the PS does
            yield from chunks

        def pull(request, context):
            size = int.from_bytes(request, "little")
            if size not in pulls:
                # Distinct bytes of the whole size, as a model's are (one
                # block of zeros sent again and again was served from the
                # CPU's cache: a floor no server holding a model can reach).
                data = np.random.default_rng(size).bytes(size)
                pulls[size] = [data[o:o + CHUNK_BYTES] for o in range(0, size, CHUNK_BYTES)]
            yield from pulls[size]

        handler = grpc.method_handlers_generic_handler(SERVICE, {
            "Echo": grpc.stream_stream_rpc_method_handler(echo),
            "Pull": grpc.unary_stream_rpc_method_handler(pull)})
        self._server = rpc.make_server(max_workers=32)
        self._server.add_generic_rpc_handlers((handler,))
        self.address = rpc.bind(self._server)
        self._server.start()

    def stop(self, grace: float | None = None) -> None:
        self._server.stop(grace)


class EchoClient:
    """Sends `size / n` bytes to each of n echo servers in parallel."""

    def __init__(self, addresses: list[str]) -> None:
        from keras_elastic.common import rpc

        self._channels = [rpc.make_channel(a, resolver=None) for a in addresses]
        for channel, address in zip(self._channels, addresses):
            rpc.wait_ready(channel, address, "echo server")
        self._echo = [c.stream_stream(f"/{SERVICE}/Echo") for c in self._channels]
        self._pull = [c.unary_stream(f"/{SERVICE}/Pull") for c in self._channels]
        self._pool = futures.ThreadPoolExecutor(len(addresses))
        self._payloads: dict[int, list[bytes]] = {}

    def _chunks(self, size: int) -> list[bytes]:
        from keras_elastic.common.tensor_codec import CHUNK_BYTES

        if size not in self._payloads:
            data = np.random.default_rng(size).bytes(size)
            self._payloads[size] = [data[o:o + CHUNK_BYTES]
                                    for o in range(0, size, CHUNK_BYTES)]
        return self._payloads[size]

    def _map(self, fn):
        if len(self._channels) == 1:
            return [fn(0)]
        return list(self._pool.map(fn, range(len(self._channels))))

    def exchange(self, size: int) -> int:
        """`size` bytes out and back; returns the bytes moved (both ways)."""
        part = size // len(self._channels)
        chunks = self._chunks(part)

        def one(i: int) -> int:
            return sum(len(c) for c in self._echo[i](iter(chunks), timeout=600))

        received = sum(self._map(one))
        assert received == part * len(self._channels), received
        return 2 * received

    def pull(self, size: int) -> int:
        """`size` bytes back for a small request; returns them."""
        part = size // len(self._channels)

        def one(i: int) -> int:
            return sum(len(c) for c in self._pull[i](part.to_bytes(8, "little"),
                                                     timeout=600))

        received = sum(self._map(one))
        assert received == part * len(self._channels), received
        return received

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        self._pool.shutdown()


def start_echo_servers(count: int, job_dir: str):
    """`count` echo server processes, started as the launcher starts a role:
    [(handle, ready info with "address" and "pid")]."""
    from keras_elastic.launcher.backends import start_services

    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return start_services([(f"echo-{i}", "echo_server", []) for i in range(count)],
                          job_dir)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from keras_elastic.common import allocator, rpc

    # The most buffers a parameter server keeps (ps/server.py sizes its own
    # limit from its share of the model, up to this): the floor is measured
    # with an allocator at least as kind as the server's.
    allocator.keep_freed_buffers()
    rpc.serve_until_signal(EchoServer(), flags.FLAGS.ready_file)


if __name__ == "__main__":
    flags.DEFINE_string("ready_file", None, "Where the server writes its address.")
    app.run(main)

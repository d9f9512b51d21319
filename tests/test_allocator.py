"""A parameter server keeps the buffers of a push for the next one
(`common/allocator.py`): a real server process, a 4 MB model pushed and
taken back 60 times by 4 workers at once, and the server's page faults
counted from /proc (not a timing). Before, glibc returned every freed message
buffer to the kernel and each push took about 1,300 page faults (5 MB of
fresh pages) back. The size kept follows the server's share of the model
(`buffer_limit`), so a server of large embedding tables keeps no large
one-off buffers.
"""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import subprocess_env
from test_fencing import SGD, start, stop

from keras_elastic.common import allocator
from keras_elastic.ps.update import Update


def minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


@pytest.mark.multiprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_server_takes_no_fresh_pages_for_each_push(tmp_path):
    from keras_elastic.ps import PSClient

    proc, address = start(tmp_path, "ps", "keras_elastic.ps")
    clients = []
    try:
        clients = [PSClient([address], worker_id=w, connect_timeout=30, resolver=None)
                   for w in range(4)]
        rng = np.random.default_rng(0)
        shapes = {f"v{i}": (65536,) for i in range(16)}  # 4 MB in 16 tensors
        clients[0].init({n: (rng.random(s, np.float32), True)
                         for n, s in shapes.items()}, SGD)
        grads = {n: np.full(s, 1e-6, np.float32) for n, s in shapes.items()}

        def push(client, times):
            for _ in range(times):
                client.send(Update(grads=grads))

        # Four workers at once, as a server is loaded: the messages of
        # concurrent pushes are allocated and freed by several threads.
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(push, clients, [5] * 4))
            before = minor_faults(proc.pid)
            list(pool.map(push, clients, [15] * 4))
        per_push = (minor_faults(proc.pid) - before) / 60
        # 4 MB received and 4 MB sent a push are 2,048 pages. Measured: 80-130
        # page faults a push; without keep_freed_buffers 1,240-1,450.
        assert per_push < 400, f"{per_push:.0f} page faults per push"
    finally:
        for client in clients:
            client.close()
        stop(proc)


@pytest.mark.multiprocess
@pytest.mark.skipif(not hasattr(os, "confstr"), reason="no confstr")
def test_keep_freed_buffers_is_applied_where_the_c_library_is_glibc():
    glibc = "glibc" in (os.confstr("CS_GNU_LIBC_VERSION") or "")
    out = subprocess.run(
        [sys.executable, "-c", "from keras_elastic.common import allocator; "
         "print(allocator.keep_freed_buffers())"],
        env=subprocess_env(), capture_output=True, text=True, check=True).stdout
    assert out.split()[-1] == str(glibc)


@pytest.mark.parametrize("model_bytes, limit", [
    (0, 1 << 20),               # a server of embedding tables with no dense part
    (173_056, 1 << 20),         # bench_embedding's MLP on one of 2 servers
    (4_194_304, 8 << 20),       # a 4 MB share: its push and its reply
    (10_000_000, 32 << 20),
    (1_000_000_000, 32 << 20),  # glibc's largest mmap threshold
])
def test_the_kept_buffers_fit_a_push_of_the_server_s_share(model_bytes, limit):
    assert allocator.buffer_limit(model_bytes) == limit

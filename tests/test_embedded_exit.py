"""An embedded process always exits (issue 40).

A script's embedded cluster (a master and a parameter server in the process)
is closed as the main thread ends, before Python stops its thread pools: one
closed later, from `atexit`, could wait for good on a gRPC server whose
serving thread had died of "cannot schedule new futures after interpreter
shutdown" (a heartbeat arriving in between). Closing early is the fix; a
stop that still cannot finish is given up after `rpc.STOP_WAIT_SECONDS`.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
from conftest import subprocess_env

from keras_elastic.common import rpc

ORDER_SCRIPT = textwrap.dedent("""
    import threading
    import concurrent.futures.thread as pools
    import numpy as np, keras
    import keras_elastic as ke
    from keras_elastic.worker import cluster as cluster_mod

    def check():  # registered before the cluster's close: runs after it
        print("pools stopped:", pools._shutdown, "cluster closed:",
              cluster_mod._cluster._closed, flush=True)

    threading._register_atexit(check)
    x = np.random.rand(64, 4).astype("float32")
    model = ke.wrap(keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]))
    model.compile("sgd", "mse")
    model.fit(x, x.sum(axis=1), batch_size=16, epochs=1, verbose=0)
    print("END", flush=True)
""")


@pytest.mark.multiprocess
def test_the_embedded_cluster_closes_before_python_stops_its_thread_pools(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(ORDER_SCRIPT)
    result = subprocess.run([sys.executable, str(script)], env=subprocess_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pools stopped: False cluster closed: True" in result.stdout, (
        result.stdout + result.stderr[-3000:])


def test_a_server_stop_that_cannot_finish_is_given_up(monkeypatch):
    """The original hang, made on purpose: the thread pools stopped as at
    interpreter exit, then a call reaches the master (its serving thread dies
    on the refused pool), then the master stops."""
    import concurrent.futures.thread as pools

    from keras_elastic.master.client import MasterClient
    from keras_elastic.master.server import MasterServer

    master = MasterServer()
    client = MasterClient(master.address, 0, connect_timeout=5)
    client.register_worker(reason="test")
    monkeypatch.setattr(pools, "_shutdown", True)
    stub_call = client._stub.RegisterWorker
    try:
        stub_call(__import__("keras_elastic.proto.master_pb2",
                             fromlist=["x"]).WorkerRequest(worker_id=0), timeout=1)
    except Exception:  # noqa: BLE001 (the call is refused or times out: either way)
        pass
    start = time.monotonic()
    master.stop()
    assert time.monotonic() - start < rpc.STOP_WAIT_SECONDS + 5
    client.close()

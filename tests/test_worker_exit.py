"""How a launched worker's process leaves the job (worker/cluster.py): a
script that finished tells the master it exited, and a chief that finished
stays the chief (it wrote the job's outputs); a script that died of an
exception does not, so the chief passes on to a worker that will finish.

Real processes against a real master in this process: each worker is a
Python process that registers (`Cluster`), closes at exit as a launched
worker does, and either returns or raises.
"""

import subprocess
import sys

import pytest
from conftest import subprocess_env

from keras_elastic.master.client import MasterClient
from keras_elastic.master.server import MasterServer
from keras_elastic.ps import ParameterServer

WORKER = """
import atexit, sys
from absl import app
from keras_elastic.worker.cluster import Cluster

def main(argv):
    cluster = Cluster(sys.argv[1], [sys.argv[3]], worker_id=0)  # (the launcher's id)
    atexit.register(cluster.close)
    if sys.argv[2] == "raise":
        raise RuntimeError("the script died")

app.run(main, argv=sys.argv[:1])
"""


def run_worker(address: str, how: str) -> subprocess.CompletedProcess:
    ps = ParameterServer()
    try:
        return subprocess.run([sys.executable, "-c", WORKER, address, how, ps.address],
                              env=subprocess_env(), capture_output=True, text=True,
                              timeout=120)
    finally:
        ps.stop(0)


@pytest.mark.multiprocess
def test_a_chief_whose_script_raised_is_not_exited_and_the_chief_passes_on():
    master = MasterServer(heartbeat_timeout=600)
    client = MasterClient(master.address, -1, connect_timeout=30)
    try:
        failed = run_worker(master.address, "raise")  # worker 0: the chief
        assert failed.returncode == 1, failed.stderr[-2000:]
        assert "the script died" in failed.stderr
        status = client.job_status().workers
        assert status.chief == 0 and status.exited == [], status
        # Its launcher reports it dead (exit code 1): the chief passes on.
        survivor = client.register_worker(reason="relaunched")
        client.report_worker_dead(0, "exited with code 1")
        assert client.job_status().workers.chief == survivor
    finally:
        client.close()
        master.stop()


@pytest.mark.multiprocess
def test_a_chief_whose_script_finished_stays_the_chief():
    master = MasterServer(heartbeat_timeout=600)
    client = MasterClient(master.address, -1, connect_timeout=30)
    try:
        done = run_worker(master.address, "return")  # worker 0: the chief
        assert done.returncode == 0, done.stderr[-2000:]
        later = client.register_worker(reason="a later worker")
        status = client.job_status().workers
        assert status.exited == [0] and status.chief == 0 != later, status
    finally:
        client.close()
        master.stop()

"""What `keras-elastic scale --num_ps / --drain_ps` asks that the launcher
cannot do is logged once, naming why (launcher/server_scaler.py): a job's
services stood in for by plain objects, no processes (the moves themselves:
tests/test_ps_scaling_job.py)."""

import logging
from types import SimpleNamespace

import pytest

from keras_elastic.launcher.server_scaler import (
    DESIRED_SERVERS_FILE,
    DRAIN_SERVER_FILE,
    ServerScaler,
)


class Services:
    """One server process `ps-0` holding both partitions of 2."""

    def __init__(self, job_dir, replicas=1):
        self.job_dir = str(job_dir)
        self.proc = SimpleNamespace(name="ps-0")
        self.partition_addresses = ["127.0.0.1:1", "127.0.0.1:1"]
        self.config = SimpleNamespace(ps_replicas=replicas, num_ps=1,
                                      liveness_timeout=60.0)
        self.prober = SimpleNamespace(silent_for=lambda role: 0.0)
        self.prober_interval = 2.0

    def hosts(self):
        return [(self.proc, [0, 1])]


@pytest.mark.parametrize("replicas, asked, says", [
    (1, "3", "--num_ps=3: the job has 2 partitions (--ps_partitions): between 1 "
             "and 2 servers"),
    (2, "2", "servers with backups (--ps_replicas=2) are not scaled"),
])
def test_a_server_count_the_job_cannot_have_is_refused_once(tmp_path, caplog,
                                                            replicas, asked, says):
    scaler = ServerScaler(Services(tmp_path, replicas))
    (tmp_path / DESIRED_SERVERS_FILE).write_text(asked)
    with caplog.at_level(logging.WARNING, logger="absl"):
        for _ in range(3):
            scaler.tick()
    assert caplog.text.count(says) == 1, caplog.text
    assert scaler.records == [] and scaler._starting is None


def test_draining_a_process_the_job_does_not_have_is_refused(tmp_path, caplog):
    scaler = ServerScaler(Services(tmp_path))
    (tmp_path / DRAIN_SERVER_FILE).write_text("ps-9")
    with caplog.at_level(logging.WARNING, logger="absl"):
        scaler.tick()
    assert ("--drain_ps=ps-9: no such server process now (they are ps-0)"
            in caplog.text), caplog.text
    assert not (tmp_path / DRAIN_SERVER_FILE).exists() and scaler.records == []


def test_requests_of_an_earlier_run_are_dropped_at_the_start(tmp_path):
    for name in (DESIRED_SERVERS_FILE, DRAIN_SERVER_FILE):
        (tmp_path / name).write_text("2")
    ServerScaler(Services(tmp_path))
    assert not (tmp_path / DESIRED_SERVERS_FILE).exists()
    assert not (tmp_path / DRAIN_SERVER_FILE).exists()

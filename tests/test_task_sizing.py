"""Task sizing (issue 23, item 5): the master chooses records_per_task.

With `ElasticDataset(minibatches_per_task=None)` (the default) the master cuts
an epoch into at least 4 tasks per worker, counting up to the job's maximum
number of workers, with 1 to 32 minibatches per task; the first registration
decides. An explicit size that leaves workers idle is a warning.
"""

import logging
import types

import numpy as np
import pytest

from keras_elastic.master.client import MasterClient
from keras_elastic.master.server import MasterServer
from keras_elastic.master.task_queue import (
    MAX_MINIBATCHES_PER_TASK,
    DatasetSpec,
    auto_records_per_task,
    count_tasks,
    sizing_warning,
)
from keras_elastic.proto import master_pb2

MNIST = (("arrays", 60000),)


# -- the rule ----------------------------------------------------------------------


@pytest.mark.parametrize("workers, expected", [
    (1, 32 * 128),   # 15 tasks >= 4: the cap of 32 minibatches
    (2, 32 * 128),   # 15 tasks >= 8
    (8, 15 * 128),   # 32 tasks = 4 per worker
])
def test_auto_size_gives_every_worker_four_tasks(workers, expected):
    size = auto_records_per_task(MNIST, 128, workers)
    assert size == expected and size % 128 == 0
    assert count_tasks(MNIST, size) >= 4 * workers
    # The largest such size: one more minibatch would leave too few tasks
    # (or pass the cap).
    bigger = size + 128
    assert (bigger > MAX_MINIBATCHES_PER_TASK * 128
            or count_tasks(MNIST, bigger) < 4 * workers)


def test_auto_size_of_a_tiny_dataset_is_one_minibatch():
    assert auto_records_per_task((("a", 10),), 32, 1) == 32
    assert auto_records_per_task((("a", 100),), 8, 8) == 8  # 13 tasks for 8 workers


def test_auto_size_counts_tasks_per_shard_and_per_window():
    # 8 shards of 100: tasks never cross a shard, so small tasks come sooner.
    shards = tuple((f"s{i}", 100) for i in range(8))
    assert auto_records_per_task(shards, 10, 2) == 100  # 8 tasks of 10 minibatches
    # A window of 640 records per epoch: 4 tasks per worker of the window.
    assert auto_records_per_task((("a", 10_000),), 10, 4, records_per_epoch=640) == 40


def test_warning_names_dataset_tasks_workers_and_what_to_set():
    spec = DatasetSpec("train", "training", MNIST, 32 * 128, 3, batch_size=128)
    text = sizing_warning(spec, 16)
    assert text == (
        "dataset 'train': minibatches_per_task=32 (4096 records per task) cuts an "
        "epoch of 60000 records into 15 task(s), fewer than the job's 16 workers: "
        "some workers will idle. Set ElasticDataset(minibatches_per_task=None) (the "
        "default) to let the master choose (7 here), or minibatches_per_task=31 at "
        "most.")
    assert sizing_warning(spec, 15) == ""
    tiny = DatasetSpec("val", "evaluation", (("a", 64),), 32, 0, batch_size=32,
                       auto=True)
    assert sizing_warning(tiny, 4) == (
        "dataset 'val': an epoch of 64 records is only 2 task(s) of one minibatch "
        "(batch_size=32) for up to 4 workers: some workers will idle. Use a smaller "
        "batch_size or fewer workers (--max_workers).")


# -- through the master ---------------------------------------------------------------


def _request(records=60000, batch_size=128, per_task=0, name="train", **kw):
    return master_pb2.RegisterDatasetRequest(
        dataset=name, mode="training", num_epochs=2, batch_size=batch_size,
        records_per_task=per_task,
        shards=[master_pb2.Shard(name="arrays", num_records=records)], **kw)


@pytest.fixture
def master():
    servers = []

    def start(**kwargs):
        server = MasterServer(host="127.0.0.1", **kwargs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.mark.parametrize("max_workers, expected", [(1, 4096), (2, 4096), (8, 1920)])
def test_the_master_sizes_for_its_max_workers(master, max_workers, expected):
    server = master(max_workers=max_workers)
    client = MasterClient(server.address, worker_id=0)
    response = client.register_dataset(_request())
    assert response.records_per_task == expected
    assert response.num_tasks_per_epoch == -(-60000 // expected)
    assert response.warning == ""
    status = client.status()["datasets"]["train"]
    assert status["records_per_task"] == expected
    client.close()


def test_without_a_maximum_the_workers_alive_count(master):
    server = master()  # max_workers=0, as in an embedded cluster
    clients = [MasterClient(server.address, worker_id=i) for i in range(3)]
    clients[0].register_worker()
    # One worker (an embedded cluster): sized as for one.
    assert clients[0].register_dataset(_request(name="one")).records_per_task == 4096
    for client in clients[1:]:
        client.register_worker()
    # 3 workers, 12 tasks at least: 60000 records still allow the cap (15 tasks).
    assert clients[1].register_dataset(_request(name="three")).records_per_task == 4096
    # 6000 records: 4 minibatches (12 tasks); 5 would make 10.
    small = clients[2].register_dataset(_request(records=6000, name="small"))
    assert small.records_per_task == 4 * 128 and small.num_tasks_per_epoch == 12
    for client in clients:
        client.close()


def test_the_first_registration_decides(master):
    server = master(max_workers=8)
    first = MasterClient(server.address, worker_id=0)
    second = MasterClient(server.address, worker_id=1)
    assert first.register_dataset(_request()).records_per_task == 1920
    # Later workers: automatic gets the job's value; the same explicit value
    # is fine; another explicit value is refused, naming both.
    assert second.register_dataset(_request()).records_per_task == 1920
    assert second.register_dataset(_request(per_task=1920)).records_per_task == 1920
    with pytest.raises(ValueError, match="records_per_task is 4096 on this worker but "
                       "1920 in the job \\(the master chose the job's: leave "
                       "minibatches_per_task=None on every worker\\)"):
        second.register_dataset(_request(per_task=4096))
    with pytest.raises(ValueError, match="batch_size is 64 on this worker but 128 in "
                       "the job"):
        second.register_dataset(_request(batch_size=64))
    # Without a batch size the master cannot choose.
    with pytest.raises(ValueError, match="records_per_task is 0 .* but no batch_size"):
        second.register_dataset(_request(name="other", batch_size=0))
    first.close()
    second.close()


def test_an_explicit_size_that_idles_workers_is_a_warning(master, caplog):
    server = master(max_workers=16)
    client = MasterClient(server.address, worker_id=0)
    with caplog.at_level(logging.WARNING):
        response = client.register_dataset(_request(per_task=32 * 128))
    assert response.records_per_task == 4096
    assert response.warning.startswith(
        "dataset 'train': minibatches_per_task=32 (4096 records per task) cuts an "
        "epoch of 60000 records into 15 task(s), fewer than the job's 16 workers")
    assert "minibatches_per_task=31 at most" in response.warning
    # Logged by the master and by the worker's client.
    logged = [r.getMessage() for r in caplog.records]
    assert sum(response.warning in m for m in logged) == 2, logged
    # Every later registration gets the warning too.
    assert client.register_dataset(_request()).warning == response.warning
    client.close()


def test_elastic_dataset_defaults_to_the_masters_choice(master):
    import keras_elastic as ke

    x = np.zeros((60000, 4), np.float32)
    y = np.zeros(60000, np.int64)
    dataset = ke.ElasticDataset((x, y), batch_size=128)
    assert dataset.minibatches_per_task is None
    assert dataset.records_per_task == 4096  # the local estimate (one worker)
    request = dataset.registration(2)
    assert request.records_per_task == 0 and request.batch_size == 128
    server = master(max_workers=8)
    client = MasterClient(server.address, worker_id=0)
    dataset.registered(client.register_dataset(request))
    assert dataset.records_per_task == 1920  # the job's
    assert "1920 records per task" in dataset.describe()
    explicit = ke.ElasticDataset((x, y), batch_size=128, minibatches_per_task=4)
    assert explicit.registration(2).records_per_task == 512
    assert explicit.records_per_task == 512
    with pytest.raises(ValueError, match="minibatches_per_task must be a positive "
                       "integer \\(or None"):
        ke.ElasticDataset((x, y), minibatches_per_task=0)
    client.close()


def test_the_launcher_gives_the_master_its_effective_maximum():
    from keras_elastic.launcher import LaunchConfig
    from keras_elastic.launcher.services import JobServices

    def master_args(**config):
        fake = types.SimpleNamespace(
            config=LaunchConfig(**config), journal_path="/tmp/j", generation=0,
            job_dir="/tmp/job",
            backend=types.SimpleNamespace(service_host=lambda: "127.0.0.1"))
        return JobServices._master_args(fake)

    assert "--max_workers=3" in master_args(num_workers=3)  # --max_workers=0
    assert "--max_workers=5" in master_args(num_workers=2, max_workers=5)


def test_a_resume_with_done_tasks_keeps_their_size(master):
    server = master(max_workers=8)
    client = MasterClient(server.address, worker_id=0)
    resumed = dict(resume=True, resume_epoch=1, resume_done=[0, 2])
    # The done ids name tasks of the checkpoint's size: automatic sizing takes it.
    response = client.register_dataset(_request(name="a", resume_records_per_task=768,
                                                **resumed))
    assert response.records_per_task == 768 and response.epoch == 1
    # A checkpoint from before automatic sizing: the old default, 32 minibatches.
    assert client.register_dataset(_request(name="b", **resumed)).records_per_task == (
        4096)
    # Another explicit size would make the done ids name other records.
    with pytest.raises(ValueError, match="dataset 'c' resumes a checkpoint whose done "
                       "tasks were cut with 768 records per task, but this run asks "
                       "for 1024"):
        client.register_dataset(_request(name="c", per_task=1024,
                                         resume_records_per_task=768, **resumed))
    # Nothing done yet: any size.
    fresh = client.register_dataset(_request(name="d", resume=True, resume_epoch=2,
                                             resume_records_per_task=768))
    assert fresh.records_per_task == 1920
    client.close()

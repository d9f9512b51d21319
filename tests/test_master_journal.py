"""The master journal's replay (`master/journal.py` `JournalReplay`): what a
restarted master rebuilds from the records, without gRPC or a process. (The
file itself, torn tails and corruption: test_master_recovery.py.)"""

from __future__ import annotations

import dataclasses
import struct
import zlib

import numpy as np
import pytest

from keras_elastic.common import fencing
from keras_elastic.master.journal import (
    Journal,
    JournalReplay,
    decode_states,
    encode_record,
    encode_states,
)
from keras_elastic.master.task_queue import DatasetSpec

TRAIN = DatasetSpec("train", "training", (("a", 30), ("b", 10)), 10, num_epochs=3)
VAL = DatasetSpec("val", "evaluation", (("v", 20),), 10, num_epochs=0, after="train")


def dataset(spec: DatasetSpec, **fields) -> dict:
    return {"t": "dataset", "spec": dataclasses.asdict(spec), "resume": False,
            "resume_epoch": 0, "resume_done": [], "warning": "", **fields}


def done(ds: str, epoch: int, task_id: int, lease: int, worker: int = 0,
         states=None) -> dict:
    # A ledger row: epoch, task_id, worker, attempt, lease, shard, start, end, time.
    return {"t": "done", "ds": ds, "rows": [[epoch, task_id, worker, 0, lease, "a",
                                             10 * task_id, 10 * task_id + 10, 1.5]],
            "states": encode_states(states)}


def worker(worker_id: int, state: str, **fields) -> dict:
    return {"t": "worker", "id": worker_id, "state": state, **fields}


def test_a_replay_rebuilds_workers_datasets_rounds_and_leases():
    records = [
        {"t": "start", "time": 1.0},
        worker(1, "alive", time=2.0), worker(0, "alive", time=3.0),
        dataset(TRAIN), dataset(VAL),
        *(done("train", 0, t, lease=100 + t) for t in range(4)),  # epoch 0 ends
        done("train", 1, 2, lease=200, worker=1),
        done("val", 0, 0, lease=150, states={"total": np.array([1.5], np.float32)}),
        done("val", 0, 1, lease=151, states={"total": np.array([2.0], np.float32)}),
        {"t": "failed", "ds": "train", "epoch": 1, "task_id": 3, "worker": 0,
         "error": "boom"},
        worker(1, "lost", reason="gone"),
        {"t": "start", "time": 9.0},
    ]
    replay = JournalReplay().run(records, "j")
    assert replay.starts == 2 and replay.skipped == 0
    members = replay.membership
    assert members.alive() == [0] and members.lost == 1 and members.chief == 0
    assert members.workers[0].joined == 3.0
    train, val = replay.datasets["train"], replay.datasets["val"]
    assert (train.epoch, train.done) == (1, {2})
    assert [e["lease"] for e in train.ledger] == [100, 101, 102, 103, 200]
    assert sorted(t.task_id for t, _ in train.todo) == [0, 1, 3]  # 2 is done
    assert train.failures == {(1, 3): 1} and train.error is None
    num_tasks, sums = val.results[0]
    assert num_tasks == 2 and sums["total"].tolist() == [3.5]
    assert replay.leases.last == 200
    assert replay.leases.next() > 200  # above every lease the journal names


def test_a_rollback_record_sends_training_back_and_raises_the_lease_floor():
    records = [dataset(TRAIN), dataset(VAL),
               *(done("train", 0, t, lease=10 + t) for t in range(4)),
               done("train", 1, 0, lease=20),
               {"t": "rollback", "progress": {"train": {"epoch": 0,
                                                        "done_task_ids": [0, 1]}},
                "reason": "ps 0 recovered", "lease": 5000}]
    replay = JournalReplay().run(records, "j")
    train = replay.datasets["train"]
    assert (train.epoch, train.done, train.rollbacks) == (0, {0, 1}, 1)
    assert [e["task_id"] for e in train.ledger if e.get("rolled_back")] == [2, 3, 0]
    assert replay.datasets["val"].rollbacks == 0  # evaluation is not rolled back
    assert replay.leases.last == 5000


def test_a_resumed_registration_and_too_many_failures_replay_as_they_happened():
    records = [dataset(TRAIN, resume=True, resume_epoch=2, resume_done=[0, 3],
                       warning="few tasks"),
               *({"t": "failed", "ds": "train", "epoch": 2, "task_id": 1, "worker": w,
                  "error": f"boom {w}"} for w in range(3))]
    train = JournalReplay(max_task_retries=3).run(records, "j").datasets["train"]
    assert (train.epoch, train.done, train.warning) == (2, {0, 3}, "few tasks")
    assert train.initial_progress == (2, frozenset({0, 3}))
    assert "failed 3 times; last error, on worker 2: boom 2" in train.error


def test_records_of_a_replaced_master_are_skipped_and_the_generation_fenced():
    records = [{**worker(0, "alive"), "g": 1},
               {**worker(1, "alive"), "g": 2},   # a newer master took over
               {**worker(0, "lost"), "g": 1},    # the old one wrote on: skipped
               {**worker(2, "alive"), "g": 2}]
    generation = fencing.Generation(0)
    replay = JournalReplay().run(records, "j", generation)
    assert replay.skipped == 1 and replay.fence == 2 and generation.value == 2
    assert replay.membership.alive() == [0, 1, 2] and replay.membership.lost == 0


def test_a_record_that_cannot_be_replayed_is_named():
    with pytest.raises(ValueError, match=r"master journal j: record 1 \(done\) cannot "
                                         r"be replayed: KeyError: 'train'"):
        JournalReplay().run([worker(0, "alive"), done("train", 0, 0, lease=1)], "j")
    with pytest.raises(ValueError, match=r"record 0 \(bogus\).*unknown record kind"):
        JournalReplay().run([{"t": "bogus"}], "j")


def test_metric_states_round_trip_with_their_dtype_and_shape():
    states = {"total": np.array([[1.5, 2.0]], np.float32),
              "count": np.array(7, np.int64)}
    encoded = encode_states(states)
    assert encoded["count"][:2] == ["int64", []]
    back = decode_states(encoded)
    for name, value in states.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape
        np.testing.assert_array_equal(back[name], value)
    assert encode_states(None) is None and decode_states(None) is None


def test_a_journal_file_in_the_format_of_earlier_releases_replays(tmp_path):
    """The format is fixed (resumed jobs read old journals): length and
    CRC-32 of the payload, little-endian, then compact JSON."""
    payloads = [b'{"t":"start","time":1.0,"g":0}',
                b'{"t":"worker","id":0,"state":"alive","time":1.0,"g":0}',
                b'{"t":"worker","id":0,"state":"exited","g":0}']
    path = tmp_path / "master.journal"
    path.write_bytes(b"".join(struct.pack("<II", len(p), zlib.crc32(p)) + p
                              for p in payloads))
    records = Journal.read(str(path))
    assert encode_record(records[1]) == struct.pack(
        "<II", len(payloads[1]), zlib.crc32(payloads[1])) + payloads[1]
    replay = JournalReplay().run(records, str(path))
    assert replay.starts == 1 and replay.membership.status()["exited"] == [0]
    assert replay.membership.chief == 0

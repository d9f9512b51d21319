"""The master's workers (`master/membership.py`): registration ids, the chief,
heartbeats, liveness and the start rendezvous, as plain objects (no gRPC, no
threads, the clock passed in)."""

from __future__ import annotations

from keras_elastic.master.membership import (
    ALIVE,
    EXITED,
    LOST,
    Membership,
    StartRendezvous,
    WorkerRecord,
)


def joined(*ids: int, **kwargs) -> Membership:
    members = Membership(**kwargs)
    for worker_id in ids:
        members.join(members.assign_id(worker_id), now=0.0)
    return members


def test_ids_asked_with_minus_one_come_from_1000_above_every_id_seen():
    """Joined workers ask with -1; the launcher gives the workers it starts
    0, 1, 2, ...: the two never meet, also when the launcher relaunches a
    worker after one joined (the soak on the testbed found a relaunched
    worker 1 killed as the lost joined worker 1)."""
    members = joined(0)
    assert members.assign_id(-1) == 1000
    members.join(1000, now=0.0)
    assert members.lose(1000)
    assert members.assign_id(1) == 1  # an id given is kept: the launcher's
    members.join(1, now=0.0)
    assert members.alive() == [0, 1] and members.workers[1000].state == LOST
    assert members.assign_id(-1) == 1001  # 1000 was handed out already
    members.restore(1009, LOST, now=0.0)  # a replayed record names 1009
    assert members.assign_id(-1) == 1010


def test_the_chief_is_the_first_to_join_while_alive_or_exited():
    members = joined(1, 0, 2)
    assert members.chief == 1  # not the smallest id: the first to register
    assert members.exit(1) and members.chief == 1  # an exited chief stays
    members.lose(1)  # not alive: nothing changes
    assert members.chief == 1 and members.lost == 0
    members = joined(1, 0, 2)
    assert members.lose(1) and members.chief == 0  # lost: the smallest alive
    assert members.lose(0) and members.lose(2) and members.chief is None
    members.join(5, now=1.0)
    assert members.chief == 5 and members.lost == 3


def test_restore_replays_worker_records_with_the_same_chief_and_counts():
    members = Membership()
    for worker_id, state in [(1, ALIVE), (0, ALIVE), (1, LOST), (1, LOST),
                             (0, EXITED), (7, EXITED), (2, ALIVE)]:
        members.restore(worker_id, state, now=5.0, joined=12.5)
    assert members.lost == 1  # the second "lost" of 1 is not a new loss
    assert members.chief == 0 and members.alive() == [2]
    assert 7 not in members.workers and members.next_id == 8
    assert members.workers[2] == WorkerRecord(ALIVE, last_seen=5.0, joined=12.5)


def test_the_maximum_refuses_only_new_workers():
    members = joined(0, 1, max_workers=2)
    assert members.refusal(2) == "the job already has its maximum of 2 workers"
    assert members.refusal(1) == ""  # an alive worker registering again
    members.exit(1)
    assert members.refusal(2) == ""
    assert members.sizing_workers() == 2  # tasks are cut for the maximum
    assert joined(0, 1, 2).sizing_workers() == 3 and Membership().sizing_workers() == 1


def test_heartbeats_keep_marks_going_up_and_replace_timings_and_waits():
    members = joined(0)
    assert members.heartbeat(0, now=3.0, timings={"step": 1.0}, marks={"a": 5},
                             waits=({"ps-0": 2.0}, {"ps-1": 1.0}, {"ps-1": 0.5}))
    assert members.heartbeat(0, now=4.0, marks={"a": 2, "b": 1})  # not periodic
    record = members.workers[0]
    assert record.last_seen == 4.0 and record.timings == {"step": 1.0}
    assert record.marks == {"a": 5, "b": 1}
    assert (record.waiting, record.unreachable) == ({"ps-0": 2.0}, {"ps-1": 1.0})
    assert record.reached == {"ps-1": 0.5}
    assert members.status()["reached"] == {0: {"ps-1": 0.5}}
    members.heartbeat(0, now=5.0, timings={"step": 2.0}, waits=({}, {}))
    assert record.timings == {"step": 2.0} and record.waiting == {} == record.unreachable
    assert record.reached == {}
    assert not members.heartbeat(9, now=5.0)  # not part of the job
    members.lose(0)
    assert not members.heartbeat(0, now=6.0) and record.last_seen == 5.0


def test_silence_past_the_timeout_is_found_and_a_stall_is_excused():
    members = joined(0, 1, heartbeat_timeout=30.0)
    members.heartbeat(1, now=20.0)
    assert members.stall(now=1.0, interval=1.0) == 0.0  # the first tick
    assert members.silent(now=30.0) == []
    assert members.silent(now=31.0) == [(0, 31.0)]
    # The watcher's next tick comes 100 s late: the master was frozen, and no
    # worker could be heard then.
    stalled = members.stall(now=101.0, interval=1.0)
    assert stalled == 99.0
    members.excuse(stalled)
    assert members.silent(now=101.0) == [] and members.workers[0].last_seen == 99.0
    assert members.stall(now=102.0, interval=1.0) == 0.0  # on time again
    assert members.stall(now=107.5, interval=1.0) == 0.0  # 4.5 s late: not a stall
    assert [w for w, _ in members.silent(now=130.0)] == [0]
    members.exit(0)
    assert members.silent(now=1000.0) == [(1, 881.0)]  # only alive workers


def test_status_names_the_alive_lost_exited_overdue_and_chief():
    members = joined(0, 1, 2, 3)
    members.heartbeat(1, now=1.0, timings={"step": 2.0}, marks={"saved": 1},
                      waits=({"ps-0": 3.0}, {}))
    members.heartbeat(2, now=1.0, timings={"step": 0.5, "pull": 1.0})
    members.lose(0)
    members.exit(3)
    members.overdue = {2: 40.0, 0: 50.0}  # 0 is no longer alive
    assert members.status() == {
        "alive": [1, 2], "lost": 1, "lost_ids": [0], "overdue": {2: 40.0},
        "marks": {1: {"saved": 1}}, "waiting": {1: {"ps-0": 3.0}}, "unreachable": {},
        "reached": {}, "exited": [3], "registered": 4, "chief": 1}
    assert members.timings() == {"step": 2.5, "pull": 1.0}


def test_the_start_rendezvous_waits_for_workers_progress_or_its_timeout():
    never = lambda: False  # noqa: E731
    rendezvous = StartRendezvous(min_workers=3, timeout=60.0, started=100.0)
    assert not rendezvous.ready(2, never, now=159.0)
    assert rendezvous.ready(3, never, now=159.0)
    assert rendezvous.ready(0, never, now=100.0)  # once met, for good
    assert StartRendezvous(3, 60.0, 100.0).ready(1, lambda: True, now=100.0)
    assert StartRendezvous(3, 60.0, 100.0).ready(1, never, now=160.0)
    assert StartRendezvous(1, 60.0, 100.0).met  # one worker: nothing to wait for


def test_a_heartbeat_brings_what_the_worker_waits_on_and_reached_to_the_status():
    """Over gRPC, as the launcher's liveness policy reads them: the servers a
    worker waits on, cannot reach, and those that answered it."""
    import time

    from keras_elastic.master.client import MasterClient
    from keras_elastic.master.server import MasterServer

    master = MasterServer(host="127.0.0.1")
    client = MasterClient(master.address, 0)
    try:
        assert client.register_worker() == 0
        client.start_heartbeats(0.05, waits=lambda: ({"ps-1": 3.0}, {"ps-1": 2.0}),
                                reached=lambda: {"ps-0": 0.25})
        deadline = time.monotonic() + 30
        workers = client.job_status().workers
        while not workers.reached and time.monotonic() < deadline:
            time.sleep(0.05)
            workers = client.job_status().workers
        assert workers.reached == {0: {"ps-0": 0.25}}, workers
        assert workers.waiting == {0: {"ps-1": 3.0}}
        assert workers.unreachable == {0: {"ps-1": 2.0}}
    finally:
        client.worker_exited()
        master.stop()

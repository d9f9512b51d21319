"""The autoscaler's mechanism without processes (launcher/autoscaler.py): the
windows it measures from the job's observations, and what it applies.

The policy's own table is tests/test_autoscale_policy.py; the real job that
grows by itself is tests/test_autoscale_job.py.
"""

import pytest

from keras_elastic.launcher.autoscale import Limits, Thresholds
from keras_elastic.launcher.autoscaler import (
    Autoscaler,
    Observation,
    WindowTracker,
    observe_status,
)
from keras_elastic.master.status import JobStatus


def obs(t, workers=1, samples=None, rate=10.0, servers=1, cpu=None, phases=None):
    return Observation(now=float(t), workers=workers, servers=servers,
                       samples=rate * t if samples is None else samples,
                       phases=phases or {"compute": 0.9 * t, "push": 0.1 * t},
                       server_cpu=cpu)


def status(alive, tasks_done_total, records_per_task=32, finished=False,
           timings=None, mode="training"):
    dataset = {"mode": mode, "epoch": 0, "num_epochs": 3, "tasks_per_epoch": 100,
               "records_per_epoch": 3200, "records_per_task": records_per_task,
               "todo": 0, "doing": 0, "done": 0, "tasks_done_total": tasks_done_total,
               "requeued": 0, "released": 0, "late_reports": 0, "rollbacks": 0,
               "finished": finished, "done_task_ids": [], "doing_by_worker": {}}
    return JobStatus.from_dict({
        "uptime": 1.0, "master_restarts": 0, "error": None,
        "workers": {"alive": list(alive), "lost": 0, "exited": [], "registered": 1},
        "datasets": {"training": dataset}, "tasks_done": tasks_done_total,
        "requeued": 0, "timings": timings or {"compute": 1.0}})


def test_a_window_leaves_out_its_warmup_and_measures_the_rest():
    tracker = WindowTracker(warmup_s=10)
    # The first 10 s (a worker tracing its step) ran at 2 samples/s, then 10.
    for t in range(0, 11):
        tracker.observe(obs(t, samples=2.0 * t))
    for t in range(11, 41):
        tracker.observe(obs(t, samples=20 + 10.0 * (t - 10)))
    [window] = tracker.history()
    assert window.seconds == 30 and window.samples_per_s == pytest.approx(10.0)
    assert window.phases == pytest.approx({"compute": 27.0, "push": 3.0})


def test_each_size_has_its_window_and_a_decision_closes_the_one_it_was_made_on():
    tracker = WindowTracker(warmup_s=0)
    for t in range(0, 31):
        tracker.observe(obs(t, rate=10))
    tracker.decided()
    # While the new worker starts (its import slows the machine), the job is
    # still at 1 worker: none of it is measured.
    for t in range(31, 45):
        tracker.observe(obs(t, samples=300 + 1.0 * (t - 30)))
    for t in range(45, 76):
        tracker.observe(obs(t, workers=2, samples=314 + 20.0 * (t - 45)))
    first, second = tracker.history()
    assert (first.workers, first.seconds, first.samples_per_s) == (1, 30, 10.0)
    assert (second.workers, second.seconds, second.samples_per_s) == (2, 30, 20.0)


def test_a_decision_that_never_takes_effect_opens_a_new_window_after_reopen_s():
    tracker = WindowTracker(warmup_s=0, reopen_s=20)
    for t in range(0, 11):
        tracker.observe(obs(t))
    tracker.decided()
    for t in range(11, 31):
        tracker.observe(obs(t))
    assert len(tracker.history()) == 1  # waiting for the new size
    for t in range(31, 41):
        tracker.observe(obs(t))
    # Opened at t=30, 20 s after the decision: measured to t=40.
    assert [w.seconds for w in tracker.history()] == [10, 10]


def test_a_rollback_or_a_restarted_server_starts_the_figures_again():
    tracker = WindowTracker(warmup_s=0)
    for t in range(0, 11):
        tracker.observe(obs(t, cpu=[0.5 * t]))
    # A recovery rolled the master back: fewer samples done than before.
    tracker.observe(obs(11, samples=50.0, cpu=[5.5]))
    for t in range(12, 21):
        tracker.observe(obs(t, samples=50.0 + 10 * (t - 11), cpu=[0.5 * t]))
    [window] = tracker.history()
    assert (window.seconds, window.samples_per_s) == (9, 10.0)
    # The server restarted: its CPU seconds count from 0 again.
    tracker.observe(obs(21, samples=150.0, cpu=[0.1]))
    tracker.observe(obs(25, samples=190.0, cpu=[2.1]))
    [window] = tracker.history()
    assert (window.seconds, window.server_busy) == (4, [0.5])


def test_no_observation_without_training_in_progress():
    assert observe_status(status([0], 10, mode="evaluation"), 1, None, 0.0) is None
    assert observe_status(status([0], 10, finished=True), 1, None, 0.0) is None
    o = observe_status(status([0, 1], 10, records_per_task=32), 2, [1.5], 3.0)
    assert (o.workers, o.servers, o.samples, o.server_cpu) == (2, 2, 320.0, [1.5])


class Job:
    """A job whose throughput is `per_worker` x workers, up to `wall`
    samples/s (something shared saturates there), observed every second."""

    def __init__(self, per_worker, wall=float("inf"), server_busy=0.3):
        self.t = 0.0
        self.workers = 1
        self.tasks = 0.0
        self.per_worker, self.wall, self.server_busy = per_worker, wall, server_busy
        self.said = []
        self.scaler = Autoscaler(Limits(1, 3, 1, 1), Thresholds(settle_s=30),
                                 server_cpu=lambda: [self.server_busy * self.t],
                                 apply_workers=self.apply, say=self.said.append,
                                 clock=lambda: self.t)
        self.pending = None

    def apply(self, n):
        self.pending = (n, self.t + 5)  # the new worker registers 5 s later

    def run(self, seconds):
        for _ in range(int(seconds)):
            self.t += 1
            if self.pending and self.t >= self.pending[1]:
                self.workers, self.pending = self.pending[0], None
            rate = min(self.per_worker * self.workers, self.wall)
            self.tasks += rate / 32
            alive = list(range(self.workers))
            self.scaler.tick(status(alive, int(self.tasks), timings={
                "compute": 0.9 * self.t * self.workers,
                "push": 0.1 * self.t * self.workers}), servers=1)


def test_workers_are_added_while_they_pay_up_to_max_workers():
    job = Job(per_worker=100)
    job.run(300)
    moves = [tuple(d["workers"]) for d in job.scaler.decisions]
    assert moves == [(1, 2), (2, 3)], job.scaler.decisions
    assert job.workers == 3
    assert "add a worker" in job.said[0] and "3 of at most 3" in job.said[1], job.said
    record = job.scaler.record()
    assert [w["workers"] for w in record["windows"]] == [1, 2, 3]
    rates = [round(w["samples_per_s"]) for w in record["windows"]]
    assert rates[0] in range(95, 106) and rates[2] in range(290, 311), rates


def test_a_worker_that_did_not_pay_is_given_back_and_not_tried_again():
    job = Job(per_worker=100, wall=150)  # two workers already hit the wall
    job.run(400)
    moves = [tuple(d["workers"]) for d in job.scaler.decisions]
    assert moves == [(1, 2), (2, 3), (3, 2)], job.scaler.decisions
    assert job.workers == 2
    assert job.scaler.decisions[-1]["reason"].startswith("give back a worker")


def test_busy_servers_stop_the_workers_from_growing():
    # Steps mostly push and pull, the server 95% busy: more workers would only
    # wait on it, so none is added (and no server: their bounds are --num_ps).
    clock, applied = [0.0], []
    scaler = Autoscaler(Limits(1, 3, 1, 1), Thresholds(settle_s=30),
                        server_cpu=lambda: [0.95 * clock[0]],
                        apply_workers=applied.append, say=lambda text: None,
                        clock=lambda: clock[0])
    for t in range(1, 120):
        clock[0] = float(t)
        scaler.tick(status([0], t * 3, timings={"compute": 0.3 * t, "push": 0.7 * t}),
                    servers=1)
    assert scaler.decisions == [] and applied == []
    [window] = scaler.record()["windows"]
    assert window["server_busy"] == [0.95] and window["workers"] == 1


def test_a_window_that_is_not_positive_is_refused():
    from keras_elastic.launcher.config import LaunchConfig

    with pytest.raises(ValueError, match="--autoscale_window must be > 0, got 0"):
        LaunchConfig(num_workers=1, max_workers=2, autoscale=True,
                     autoscale_window=0).validate()


def test_busy_servers_get_one_more_server_within_max_ps_and_keep_it_when_it_pays():
    # One worker whose steps are mostly push and pull, its server 95% busy:
    # a server is added (through the scaler: `apply_servers`), a second
    # process halves each server's share, the job's samples/s doubles, and
    # --max_ps=2 keeps it there.
    clock, applied, said = [0.0], [], []
    servers, tasks = [1], [0.0]

    def apply_servers(n):
        applied.append(n)
        servers[0] = n  # (the moves take a moment: here, the next second)

    scaler = Autoscaler(Limits(1, 1, 1, 2), Thresholds(settle_s=30),
                        server_cpu=lambda: [(0.95 if servers[0] == 1 else 0.6)
                                            * clock[0]] * servers[0],
                        apply_workers=lambda n: None, say=said.append,
                        clock=lambda: clock[0], apply_servers=apply_servers)
    for t in range(1, 200):
        clock[0] = float(t)
        tasks[0] += 3 * servers[0]
        scaler.tick(status([0], int(tasks[0]), timings={
            "compute": 0.3 * t, "push": 0.7 * t}), servers=servers[0])
    assert [tuple(d["servers"]) for d in scaler.decisions] == [(1, 2)], scaler.decisions
    assert applied == [2] and servers[0] == 2
    assert "add a server: the steps are 70% push and pull, and the busiest server " \
           "is 95% busy; 2 of at most 2" in said[0], said
    assert [w["servers"] for w in scaler.record()["windows"]] == [1, 2]


def test_server_bounds_are_checked_with_what_to_do():
    from keras_elastic.launcher.config import LaunchConfig

    with pytest.raises(ValueError, match="--num_ps=3 is outside --min_ps=1 .. --max_ps=2"):
        LaunchConfig(num_ps=3, min_ps=1, max_ps=2).validate()
    with pytest.raises(ValueError, match="--max_ps=4 is more than --ps_partitions=3"):
        LaunchConfig(num_ps=1, max_ps=4, ps_partitions=3).validate()
    # --max_ps above --num_ps makes room in the partitions by itself.
    config = LaunchConfig(num_ps=1, max_ps=3, autoscale=True)
    config.validate()
    assert config.partitions == 3 and config.ps_bounds == (1, 3)


def test_a_server_busy_share_that_is_not_positive_is_refused():
    from keras_elastic.launcher.config import LaunchConfig

    with pytest.raises(ValueError, match=r"--autoscale_server_busy must be > 0 \(a "
                       r"share of one core\), got 0"):
        LaunchConfig(num_workers=1, max_workers=2, autoscale=True,
                     autoscale_server_busy=0).validate()

"""The launcher's decisions, as pure functions of what it observed (issue 24):
no process is started here. The launcher's tests (test_elastic_job.py,
test_master_recovery.py, test_exactly_once_ps.py, test_ray_backend.py) run
the same rules with real processes."""

from __future__ import annotations

import pytest

from keras_elastic.launcher.exit_cause import ExitCause, exit_cause
from keras_elastic.launcher.policy import (
    FAIL_BUDGET,
    FAIL_SAME_FAILURE,
    FAIL_UNFIXABLE,
    IGNORE,
    RELAUNCH,
    WAIT_FOR_ROOM,
    Decision,
    FailurePolicy,
    JobView,
    ScaleSteps,
    ServiceLiveness,
    WorkerDeath,
    blame_overdue,
    desired_workers,
    scale_steps,
)


def deaths(*causes_and_done: tuple[str, int]) -> list[WorkerDeath]:
    return [WorkerDeath(i, cause, done) for i, (cause, done) in enumerate(causes_and_done)]


def test_a_dead_worker_is_relaunched_while_the_budget_lasts():
    policy = FailurePolicy(max_worker_restarts=2, num_workers=2)
    view = JobView(deaths=deaths(("Killed", 3)))
    assert policy.on_worker_death(view).action == RELAUNCH
    assert policy.on_worker_death(JobView(deaths=view.deaths, restarts_used=1)
                                  ).action == RELAUNCH
    # The budget is a hard bound, lost workers waiting for room included.
    assert policy.on_worker_death(JobView(deaths=view.deaths, restarts_used=2)
                                  ).action == FAIL_BUDGET
    assert policy.on_worker_death(JobView(deaths=view.deaths, restarts_used=1,
                                          pending_slots=1)).action == FAIL_BUDGET


def test_a_worker_lost_after_the_job_is_over_is_not_replaced():
    policy = FailurePolicy(max_worker_restarts=0, num_workers=1)
    view = JobView(deaths=deaths(("Killed", 9)), job_over=True)
    assert policy.on_worker_death(view).action == IGNORE


def test_no_room_on_the_backend_waits_for_room():
    policy = FailurePolicy(max_worker_restarts=5, num_workers=2)
    view = JobView(deaths=deaths(("node lost", 1)), room_for_worker=False)
    assert policy.on_worker_death(view).action == WAIT_FOR_ROOM


@pytest.mark.parametrize("history, streak", [
    # num_workers + 1 = 3 deaths, same cause, no task done in between: fail.
    ((("ValueError: bad", 4), ("ValueError: bad", 4), ("ValueError: bad", 4)), 3),
    # Progress in between: a flaky cause, not a deterministic crash.
    ((("ValueError: bad", 4), ("ValueError: bad", 5), ("ValueError: bad", 6)), 0),
    # Different causes.
    ((("ValueError: bad", 4), ("Killed", 4), ("ValueError: bad", 4)), 0),
    # Too few deaths to tell.
    ((("ValueError: bad", 4), ("ValueError: bad", 4)), 0),
    # A death without a cause (an empty log) proves nothing.
    ((("", 4), ("", 4), ("", 4)), 0),
])
def test_workers_failing_the_same_way_with_no_progress_fail_the_job(history, streak):
    policy = FailurePolicy(max_worker_restarts=10, num_workers=2)
    decision = policy.on_worker_death(JobView(deaths=deaths(*history), restarts_used=2))
    assert (decision.action, decision.streak) == (
        (FAIL_SAME_FAILURE, streak) if streak else (RELAUNCH, 0))


def test_services_are_restarted_within_their_own_budgets():
    policy = FailurePolicy(max_worker_restarts=0, num_workers=1, max_ps_restarts=2,
                           max_master_restarts=1)
    assert [policy.restart_service("ps", n) for n in range(3)] == [True, True, False]
    assert [policy.restart_service("master", n) for n in range(2)] == [True, False]
    with pytest.raises(KeyError):
        policy.restart_service("worker", 0)


def test_the_desired_number_of_workers():
    bounds = (1, 4)
    assert desired_workers(2, bounds) == 2                        # --num_workers
    assert desired_workers(2, bounds, requested=3, requested_at=1.0) == 3  # scale
    assert desired_workers(2, bounds, requested=0, requested_at=1.0) == 1  # clamped
    assert desired_workers(2, bounds, requested=9, requested_at=1.0) == 4
    # Nodes joined after the request: grow to --max_workers.
    assert desired_workers(2, bounds, requested=3, requested_at=1.0, grown_to=4,
                           grown_at=2.0) == 4
    # A request after the nodes joined wins again.
    assert desired_workers(2, bounds, requested=3, requested_at=3.0, grown_to=4,
                           grown_at=2.0) == 3


@pytest.mark.parametrize("running, pending, desired, room, steps", [
    (2, 0, 2, None, ScaleSteps()),
    (1, 0, 3, None, ScaleSteps(start=2)),
    (1, 0, 3, 1, ScaleSteps(start=1)),              # only as many as fit
    (1, 1, 2, 1, ScaleSteps(fill_pending=1)),       # a lost worker first
    (1, 2, 2, 1, ScaleSteps(fill_pending=1, drop_pending=1)),
    (3, 0, 1, None, ScaleSteps(stop=2)),
    (3, 1, 2, 0, ScaleSteps(drop_pending=1, stop=1)),
    (0, 0, 2, 0, ScaleSteps()),                     # no room at all
])
def test_scale_steps(running, pending, desired, room, steps):
    got = scale_steps(running, pending, desired, room)
    assert got == steps
    # Afterwards the job has what it wants, or as much as fits.
    after = running + got.fill_pending + got.start - got.stop
    left = pending - got.fill_pending - got.drop_pending
    assert after + left == desired or (room is not None and after + left < desired)


# -- liveness of the services (issue 25) ------------------------------------
def test_a_service_is_lost_after_timeout_seconds_without_an_answer():
    live = ServiceLiveness(timeout=60, interval=2)
    live.started("master", 0.0)
    live.started("ps-0", 0.0)
    for t in range(2, 60, 2):
        live.observed({"master": True, "ps-0": False}, float(t))
        assert live.lost(float(t)) == []
    live.observed({"master": True, "ps-0": False}, 60.0)
    assert live.lost(60.0) == ["ps-0"]
    assert live.silent_for("ps-0", 60.0) == 60.0 and live.silent_for("master", 60.0) == 0


def test_one_missed_answer_or_a_slow_stretch_is_not_a_loss():
    """A long GC pause: answers missing for 50 s of a 60 s timeout, then back."""
    live = ServiceLiveness(timeout=60, interval=2)
    live.started("ps-0", 0.0)
    for t in range(2, 52, 2):
        live.observed({"ps-0": False}, float(t))
    live.observed({"ps-0": True}, 52.0)
    for t in range(54, 110, 2):
        live.observed({"ps-0": t % 20 != 0}, float(t))  # now and then a miss
        assert live.lost(float(t)) == []


def test_a_restarted_service_counts_from_its_start():
    live = ServiceLiveness(timeout=10, interval=1)
    live.started("ps-1", 0.0)
    for t in range(1, 11):
        live.observed({"ps-1": False}, float(t))
    assert live.lost(10.0) == ["ps-1"]
    live.started("ps-1", 10.0)  # killed and replaced
    assert live.lost(10.0) == [] and live.lost(19.0) == []
    live.forget("ps-1")
    assert live.lost(100.0) == []


def test_the_observers_own_stall_is_not_the_services_silence():
    """The launcher's process stopped for 300 s (a swapped-out VM): the
    services' clocks move with it; real silence afterwards still counts."""
    live = ServiceLiveness(timeout=60, interval=2)
    live.started("master", 0.0)
    live.observed({"master": True}, 2.0)
    live.observed({"master": False}, 302.0)
    assert live.lost(302.0) == []
    # Silence counts from one interval after the last answer before the stall.
    for t in range(304, 360, 2):
        live.observed({"master": False}, float(t))
    assert live.lost(358.0) == []
    live.observed({"master": False}, 360.0)
    assert live.lost(360.0) == ["master"]


def test_rounds_that_wait_out_a_frozen_services_deadline_are_not_stalls():
    """A service frozen for good: every round of health checks waits its
    deadline (5 s) for it, so rounds come every interval + deadline = 7 s.
    That is the round's own length, not a stall of the observer: the service
    is lost once 60 s passed without an answer (it took 210 s when the 5 s
    were counted as the observer's stall and added back each round)."""
    live = ServiceLiveness(timeout=60, interval=2, deadline=5)
    live.started("master", 0.0)
    live.observed({"master": True}, 2.0)
    t = 2.0
    while not live.lost(t):
        t += 7.0
        live.observed({"master": False}, t)
    assert t == 65.0, t
    assert live.why("master", t) == (
        "answered no health check for 63 s (--liveness_timeout=60)")


def test_a_silent_server_the_workers_wait_on_is_not_said_to_answer():
    """Frozen: the workers' calls hang from before the freeze (their wait
    reaches the timeout first), and health checks get no answer: the
    reason says what was observed, not that it answers health checks."""
    live = ServiceLiveness(timeout=60, interval=2, deadline=5)
    live.started("ps-0", 0.0)
    live.observed({"ps-0": True}, 10.0)
    for t in range(17, 70, 7):
        live.observed({"ps-0": False}, float(t))
        live.reported({0: {"ps-0": t - 5.0}, 1: {"ps-0": t - 6.0}}, {},
                      alive=[0, 1], now=float(t))
    assert live.lost(66.0) == ["ps-0"]
    assert live.why("ps-0", 66.0) == (
        "answered no health check for 56 s, and every worker (0, 1) has waited "
        "60 s for it (--liveness_timeout=60)")


def test_workers_that_cannot_reach_a_silent_server_make_it_lost_sooner():
    """Health checks unanswered and workers' calls failing as UNAVAILABLE:
    two observers agree, so `confirm` (a quarter of the timeout) suffices."""
    live = ServiceLiveness(timeout=60, interval=2)
    assert live.confirm == 15
    live.started("ps-0", 0.0)
    live.started("ps-1", 0.0)
    for t in range(2, 16, 2):
        live.observed({"ps-0": False, "ps-1": True}, float(t))
        live.reported({0: {"ps-0": t - 0.5}, 1: {"ps-0": t - 1.0}},
                      {0: {"ps-0": t - 0.5}}, alive=[0, 1], now=float(t))
        assert live.lost(float(t)) == (["ps-0"] if t >= 16 else [])
    live.observed({"ps-0": False, "ps-1": True}, 16.0)
    live.reported({0: {"ps-0": 15.5}}, {0: {"ps-0": 15.5}}, alive=[0, 1], now=16.0)
    assert live.lost(16.0) == ["ps-0"]
    assert live.why("ps-0", 16.0) == (
        "answered no health check for 16 s, and worker(s) 0 could not reach it for "
        "16 s (--liveness_timeout=60)")


def test_a_slow_or_stopped_server_is_given_the_whole_timeout():
    """A long GC pause (or SIGSTOP): health checks and the workers' calls hang,
    none fails as unreachable: only `timeout` seconds of it make a loss."""
    live = ServiceLiveness(timeout=60, interval=2)
    live.started("ps-0", 0.0)
    for t in range(2, 60, 2):
        live.observed({"ps-0": False}, float(t))
        live.reported({0: {"ps-0": float(t)}}, {}, alive=[0, 1], now=float(t))
        assert live.lost(float(t)) == []
    # Workers that could not reach it for a moment only (a reconnect): no loss.
    live = ServiceLiveness(timeout=60, interval=2)
    live.started("ps-0", 0.0)
    for t in range(2, 40, 2):
        live.observed({"ps-0": t > 20}, float(t))
        live.reported({}, {0: {"ps-0": 1.0}} if t < 20 else {}, alive=[0], now=float(t))
        assert live.lost(float(t)) == []


def test_a_server_every_worker_waits_on_is_lost_though_it_answers_health_checks():
    """A partition between the workers and a server (or a wedged servicer
    behind a live health service): lost after the timeout; not while only
    some workers wait on it (those are the workers' trouble)."""
    live = ServiceLiveness(timeout=10, interval=1)
    live.started("ps-0", 0.0)
    for t in range(1, 30):
        live.observed({"ps-0": True}, float(t))
        live.reported({0: {"ps-0": float(t)}}, {0: {"ps-0": float(t)}},
                      alive=[0, 1], now=float(t), reached={1: {"ps-0": 0.5}})
        assert live.lost(float(t)) == []  # worker 1 does fine with it
    live = ServiceLiveness(timeout=10, interval=1)
    live.started("ps-0", 0.0)
    for t in range(1, 11):
        live.observed({"ps-0": True}, float(t))
        live.reported({0: {"ps-0": t - 0.5}, 1: {"ps-0": float(t)}}, {},
                      alive=[0, 1], now=float(t))
    assert live.lost(10.0) == [] and live.lost(10.5) == ["ps-0"]
    assert "every worker (0, 1) has waited 10 s for it: the workers are cut off" in (
        live.why("ps-0", 10.5))


def test_waits_during_a_recovery_or_before_a_restart_do_not_count():
    live = ServiceLiveness(timeout=10, interval=1)
    live.started("ps-0", 0.0)
    live.started("ps-1", 0.0)
    # ps-1 was recovered at t=20; the servers were paused meanwhile.
    live.started("ps-1", 20.0)
    live.recovered(20.0)
    for t in range(21, 30):
        live.observed({"ps-0": True, "ps-1": True}, float(t))
        live.reported({0: {"ps-0": t - 5.0, "ps-1": t - 5.0}}, {}, alive=[0],
                      now=float(t))
        assert live.lost(float(t)) == []
    live.reported({0: {"ps-0": 25.0}}, {}, alive=[0], now=30.0)
    assert live.lost(30.0) == ["ps-0"]  # waited from the recovery's end


def test_a_worker_waiting_for_a_server_in_trouble_is_not_to_blame():
    """Overdue workers are blamed only when every server answered for longer
    than the limit their hold passed."""
    overdue = {0: 24.0, 3: 24.0, 5: 100.0}
    assert blame_overdue(overdue, services_fine_for=10.0) == []   # a server hung
    assert blame_overdue(overdue, services_fine_for=30.0) == [0, 3]
    assert blame_overdue(overdue, services_fine_for=1e9) == [0, 3, 5]
    assert blame_overdue({}, services_fine_for=1e9) == []
    # A worker that reports waiting on a server is not to blame either.
    assert blame_overdue(overdue, services_fine_for=1e9, waiting={3: {"ps-0": 40.0}}
                         ) == [0, 5]


# -- errors a relaunch cannot fix (issue 40) --------------------------------------
def test_a_worker_whose_script_differs_from_the_jobs_fails_the_job_at_once():
    policy = FailurePolicy(max_worker_restarts=3, num_workers=2)
    death = WorkerDeath(1, "JobMismatchError: dataset 'fit_arrays' differs", 5,
                        exception="JobMismatchError", where="/x/client.py:70")
    assert policy.on_worker_death(JobView(deaths=[death])) == Decision(FAIL_UNFIXABLE, 1)


def script_death(worker_id: int, done: int, exception: str = "ValueError",
                 where: str = "/job/train.py:12", cause: str = "ValueError: bad"):
    return WorkerDeath(worker_id, cause, done, exception=exception, where=where)


@pytest.mark.parametrize("history, action", [
    # The same exception at the same place, twice: whatever was trained between.
    ([script_death(0, 4), script_death(1, 9)], FAIL_SAME_FAILURE),
    # Another place, or another message: maybe not the script's bug.
    ([script_death(0, 4), script_death(1, 9, where="/job/train.py:30")], RELAUNCH),
    ([script_death(0, 4), script_death(1, 9, cause="ValueError: other")], RELAUNCH),
    # The machine or the cluster, not the script: relaunched.
    ([script_death(0, 4, "ConnectionError"), script_death(1, 4, "ConnectionError")],
     RELAUNCH),
    ([script_death(0, 4, "ResourceExhaustedError"),
      script_death(1, 4, "ResourceExhaustedError")], RELAUNCH),
    # Once is no pattern.
    ([script_death(0, 4)], RELAUNCH),
])
def test_the_same_script_error_twice_fails_the_job(history, action):
    policy = FailurePolicy(max_worker_restarts=10, num_workers=4)
    assert policy.on_worker_death(JobView(deaths=history, restarts_used=1)).action == (
        action)


def test_the_cause_of_a_death_is_read_from_its_log():
    tail = "\n".join([
        "[worker-3] Epoch 1/2",
        "[worker-3] Traceback (most recent call last):",
        '[worker-3]   File "/job/train.py", line 4, in <module>',
        "[worker-3]     load()",
        "[worker-3] KeyError: 'x'",
        "[worker-3] ",
        "[worker-3] During handling of the above exception, another exception occurred:",
        "[worker-3] Traceback (most recent call last):",
        '[worker-3]   File "/job/train.py", line 6, in <module>',
        "[worker-3]     model.fit(x, y)",
        '[worker-3]   File "/lib/keras/trainer.py", line 99, in fit',
        "[worker-3]     raise e",
        "[worker-3] tensorflow.python.framework.errors_impl.InvalidArgumentError: "
        "Incompatible shapes: [3] vs. [5]"])
    cause = exit_cause(tail)
    assert cause.exception == ("tensorflow.python.framework.errors_impl."
                               "InvalidArgumentError")
    assert cause.exception_name == "InvalidArgumentError"
    assert cause.where == "/lib/keras/trainer.py:99"
    assert cause.text.endswith("Incompatible shapes: [3] vs. [5]")
    # A message of several lines: its last line (the hint), not a log line after it.
    several = exit_cause("\n".join([
        "[worker-0] Traceback (most recent call last):",
        '[worker-0]   File "/job/runner.py", line 262, in main',
        "[worker-0] keras_elastic.checkpoint.errors.ModelMismatchError: Checkpoint c "
        "does not match model 'm' (1 variable(s) differ):",
        "[worker-0]   0000/kernel: shape [4, 8] in the checkpoint, [4, 2] in the model",
        "[worker-0] --checkpoint_dir=/ckpt holds a checkpoint of another model",
        "[worker-0] I1128 21:06:21.733422 1399 cluster.py:12] closed"]))
    assert several == ExitCause("--checkpoint_dir=/ckpt holds a checkpoint of another "
                                "model", "keras_elastic.checkpoint.errors."
                                "ModelMismatchError", "/job/runner.py:262")
    assert exit_cause("[worker-1] Killed") == ExitCause("Killed")
    assert exit_cause("") == ExitCause("(no output)")


def test_a_worker_cut_off_from_a_server_the_others_reach_is_the_one_lost():
    """A partition between one worker's machine and a server (issue 42): the
    server answers health checks and the other worker reaches it, so after
    the timeout the cut-off worker is lost, never the server; not when every
    worker is cut off (the server's trouble), nor when the server is silent,
    nor in a job of one worker."""
    def run(unreachable_for, answers=True, alive=(0, 1), until=70):
        live = ServiceLiveness(timeout=60, interval=2, deadline=5)
        live.started("ps-0", 0.0)
        for t in range(2, until, 2):
            live.observed({"ps-0": answers}, float(t))
            live.reported({w: {"ps-0": t - 4.0} for w in unreachable_for},
                          {w: {"ps-0": t - 4.0} for w in unreachable_for},
                          alive=list(alive), now=float(t),
                          reached={w: {"ps-0": 0.5} for w in alive
                                   if w not in unreachable_for})
        return live

    live = run([1])
    assert live.cut_off_workers(63.0) == {}
    assert list(live.cut_off_workers(64.0)) == [1]
    assert live.lost(64.0) == []  # the server is not to blame
    assert run([0, 1]).cut_off_workers(64.0) == {}
    assert run([1], answers=False).cut_off_workers(64.0) == {}
    assert run([1], alive=(1,)).cut_off_workers(64.0) == {}
    # A recovery clears what the workers reported.
    live = run([1])
    live.recovered(64.0)
    assert live.cut_off_workers(64.0) == {}


def test_a_lone_waiter_is_blamed_only_on_evidence_that_others_reach_the_server():
    """A server cut off from every worker at an epoch's end: worker 0 waits
    on it with the epoch's last task, worker 1 waits for that task at the
    master and calls no server. Worker 1's silence is no evidence that it
    reaches the server (a CI run lost worker 0 for it): the server is lost.
    Replaced, and worker 0 alone still cannot reach the new one while
    worker 1 stays idle: then worker 0 is the one cut off (its machine),
    never a server replaced again and again."""
    live = ServiceLiveness(timeout=10, interval=1)
    live.started("ps-0", 0.0)
    for t in range(1, 12):
        live.observed({"ps-0": True}, float(t))
        live.reported({0: {"ps-0": float(t)}}, {0: {"ps-0": float(t)}}, alive=[0, 1],
                      now=float(t), reached={1: {"ps-0": t + 5.0}})  # before the cut
        assert live.cut_off_workers(float(t)) == {}
    assert live.lost(11.0) == ["ps-0"]
    assert ("worker(s) 0 waited 11 s for it and worker(s) 1 did not reach it since: "
            "the workers are cut off from it") in live.why("ps-0", 11.0)
    # Worker 1 reached it after worker 0's wait began: worker 0 is cut off.
    live.reported({0: {"ps-0": 11.0}}, {0: {"ps-0": 11.0}}, alive=[0, 1], now=11.0,
                  reached={1: {"ps-0": 2.0}})
    assert live.lost(11.0) == [] and list(live.cut_off_workers(11.0)) == [0]
    # The server replaced at 12 s: worker 0 alone waits on the new one.
    live.started("ps-0", 12.0)
    live.recovered(12.0)
    for t in range(13, 24):
        live.observed({"ps-0": True}, float(t))
        live.reported({0: {"ps-0": t - 12.0}}, {0: {"ps-0": t - 12.0}}, alive=[0, 1],
                      now=float(t), reached={})
        assert live.lost(float(t)) == []
    assert "replaced once already for this worker's waits" in (
        live.cut_off_workers(23.0)[0])
    # Both wait on the new one: the server's trouble again.
    live.reported({0: {"ps-0": 11.0}, 1: {"ps-0": 11.0}}, {}, alive=[0, 1], now=23.0)
    assert live.cut_off_workers(23.0) == {} and live.lost(23.0) == ["ps-0"]

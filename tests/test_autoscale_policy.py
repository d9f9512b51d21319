"""The autoscale policy (keras_elastic/launcher/autoscale.py; issue 43, item
4) as a pure function: tables of what a job measured, in order, and the
decision each calls for. No processes."""

import pytest

from keras_elastic.launcher.autoscale import Limits, Window, ceiling, decide

LIMITS = Limits(min_workers=1, max_workers=4, min_ps=1, max_ps=3)


def window(workers, servers, samples_per_s, compute=50.0, push=5.0, pull=3.0,
           input_wait=2.0, busy=0.3, seconds=60.0):
    return Window(workers, servers, seconds, samples_per_s,
                  {"compute": compute, "push": push, "pull": pull,
                   "input_wait": input_wait}, [busy] * servers)


def sizes(decision):
    return None if decision is None else (decision.workers, decision.servers)


# (history, the sizes decided: None keeps them). Each row a job's story.
TABLE = [
    # compute-bound, servers idle-ish: grow the workers
    ([window(1, 1, 100)], (2, 1)),
    ([window(1, 1, 100), window(2, 1, 190)], (3, 1)),
    # the third worker added little (<5%): given back ...
    ([window(1, 1, 100), window(2, 1, 190), window(3, 1, 195)], (2, 1)),
    # ... and not tried again
    ([window(1, 1, 100), window(2, 1, 190), window(3, 1, 195), window(2, 1, 191)],
     None),
    # at --max_workers: nothing more
    ([window(4, 1, 400)], None),
    # the servers are the wall: push and pull most of the steps, a server busy
    ([window(2, 1, 150, compute=20, push=40, pull=20, busy=0.95)], (2, 2)),
    # the added server paid: and again while the servers stay the wall
    ([window(2, 1, 150, compute=20, push=40, pull=20, busy=0.95),
      window(2, 2, 220, compute=30, push=30, pull=15, busy=0.9)], (2, 3)),
    # the added server did not pay: given back
    ([window(2, 1, 150, compute=20, push=40, pull=20, busy=0.95),
      window(2, 2, 152, compute=20, push=40, pull=20, busy=0.9)], (2, 1)),
    # ... and a busy server with workers waiting: no more workers either
    ([window(2, 1, 150, compute=20, push=40, pull=20, busy=0.95),
      window(2, 2, 152, compute=20, push=40, pull=20, busy=0.9),
      window(2, 1, 150, compute=20, push=40, pull=20, busy=0.95)], None),
    # at --max_ps with the servers the wall: no change (more workers would wait)
    ([window(2, 3, 300, compute=20, push=40, pull=20, busy=0.95)], None),
    # push-heavy but the servers are not busy (the link, not the server):
    # a server would not help; a worker may
    ([window(2, 1, 150, compute=20, push=40, pull=20, busy=0.3)], (3, 1)),
    # at --max_workers, servers idle and pushes cheap: give back a server
    ([window(4, 3, 400, compute=90, push=2, pull=1, busy=0.05)], (4, 2)),
    # ... but never below --min_ps
    ([window(4, 1, 400, compute=90, push=2, pull=1, busy=0.05)], None),
    # a window too short to judge (the last change not settled)
    ([window(1, 1, 100, seconds=10)], None),
    ([], None),
]


@pytest.mark.parametrize("history, expected", TABLE)
def test_decisions(history, expected):
    assert sizes(decide(history, LIMITS)) == expected


def test_every_decision_says_why():
    reasons = [decide(h, LIMITS).reason for h, e in TABLE if e is not None]
    assert reasons and all(r.startswith(("add a", "give back a")) for r in reasons)
    given_back = decide(TABLE[2][0], LIMITS).reason
    assert given_back == ("give back a worker: 3 trained 195 samples/s, 2 190 (less "
                          "than 5% more)")
    server = decide(TABLE[5][0], LIMITS).reason
    assert server == ("add a server: the steps are 73% push and pull, and the "
                      "busiest server is 95% busy; 2 of at most 3")


def test_the_ceiling_is_the_smallest_size_that_did_not_pay():
    history = [window(1, 1, 100), window(2, 1, 190), window(3, 1, 195),
               window(2, 1, 191), window(3, 1, 260)]  # later it paid: still 3
    assert ceiling(history) == (3, None)
    assert ceiling([window(2, 1, 150), window(2, 2, 151)]) == (None, 2)

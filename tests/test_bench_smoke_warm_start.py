"""bench/bench_warm_start.py --smoke: the digits job embedded, with every role
started afresh and from a warm process, and its report. No timing is checked:
only that each run happened and its figures are consistent."""

import pytest
from support.bench_smoke import NUM, figures, run_smoke, skip_without_bench

pytestmark = [skip_without_bench, pytest.mark.multiprocess]


def test_the_digits_job_fresh_and_warm_against_embedded(tmp_path):
    out = run_smoke("bench_warm_start", str(tmp_path))
    (embedded, ratio), = figures(rf"^embedded\s+{NUM}\s+{NUM}\s*$", out)
    assert embedded > 0 and ratio == 1.0, out
    (fresh_wall, _, fresh_first, fresh_trained), = figures(
        rf"^fresh\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}\s+-\s*$", out)
    (warm_wall, _, warm_first, warm_trained, ready), = figures(
        rf"^warm\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}\s*$", out)
    (shared_wall, _, shared_first, shared_trained, shared_ready), = figures(
        rf"^shared\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}\s*$", out)
    # Training starts after the launch and before the job's end; the warm
    # process was ready before the first task (its forks train it).
    for wall, first, trained in ((fresh_wall, fresh_first, fresh_trained),
                                 (warm_wall, warm_first, warm_trained),
                                 (shared_wall, shared_first, shared_trained)):
        assert 0 < first <= trained <= wall, out
    assert 0 < ready < warm_first, out
    # (The bench fails when the shared row's launcher did not use the shared
    # warm process, or the warm row's did.)
    assert 0 <= shared_ready < shared_first, out

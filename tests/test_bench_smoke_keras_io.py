"""bench/bench_keras_io.py --smoke: one keras-io port, plain and as a 2-worker
job, and its row of the report (wall seconds, ratio, the job's phases). No
timing is checked."""

import pytest
from support.bench_smoke import NUM, figures, run_smoke, skip_without_bench

pytestmark = [skip_without_bench, pytest.mark.multiprocess]


def test_keras_io_ports_as_jobs(tmp_path):
    out = run_smoke("bench_keras_io", str(tmp_path))
    rows = figures(rf"^making_new_layers_and_models_via_subclassing\s+{NUM}\s+{NUM}"
                   rf"\s+{NUM}" + rf"\s+{NUM}" * 6 + r"\s*$", out)
    assert len(rows) == 1, out
    plain, job, ratio, _get_batch, _input_wait, compute, *_ = rows[0]
    assert plain > 0 and job > 0 and compute > 0, out
    # The seconds are printed to 0.1 s, the ratio (of the unrounded seconds)
    # to 0.01: it lies between the ratios the rounded seconds allow.
    low, high = (job - 0.05) / (plain + 0.05), (job + 0.05) / (plain - 0.05)
    assert low - 0.005 <= ratio <= high + 0.005, out
    assert figures(rf"^median job/plain over 1 port\(s\): {NUM}$", out), out

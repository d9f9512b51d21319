"""The data-path benches run with --smoke (tiny sizes) and print their ratio
lines: bench/bench_batching.py, bench/bench_checkpoint.py. No timing is
checked. (In-process benches: no master, PS or worker process.)"""

import pytest
from support.bench_smoke import NUM, figures, one_positive, run_smoke, skip_without_bench

pytestmark = skip_without_bench

CASES = ["control", "dense", "padded", "padded_fixed", "padded_sparse",
         "padded_sparse_fixed", "mixed"]


@pytest.mark.multiprocess
def test_batching(tmp_path):
    out = run_smoke("bench_batching", str(tmp_path))
    # case, data and reducer, native el/s, ke el/s, ke/native
    rows = {}
    for case in CASES:
        found = figures(rf"^{case}\s+.*\s{NUM}\s+{NUM}\s+{NUM}\s*$", out)
        assert len(found) == 1, (case, out)
        rows[case] = found[0]
    assert all(value > 0 for row in rows.values() for value in row), out
    assert figures(rf"^mixed: native = the fastest of ragged_batch {NUM}, map\+batch "
                   rf"{NUM} el/s$", out), out


@pytest.mark.multiprocess
def test_checkpoint(tmp_path):
    out = run_smoke("bench_checkpoint", str(tmp_path))
    for kind in ("save", "restore"):
        found = figures(rf"^{kind}\s+plain {NUM} s \({NUM}\)\s+ours {NUM} s \({NUM}\)"
                        rf"\s+ratio plain/ours {NUM} \({NUM}\)$", out)
        assert len(found) == 1, (kind, out)
        *_, ratio, min_ratio = found[0]
        assert ratio > 0 and min_ratio > 0, out
    # (The asynchronous save's ratio has one decimal: it may read 0.0.)
    found = figures(rf"^async\s+blocks the caller {NUM} s \(plain save {NUM} s: "
                    rf"ratio plain/blocked {NUM}\); complete after {NUM} s$", out)
    assert len(found) == 1, out
    one_positive(rf"^ours: {NUM} shards", out)

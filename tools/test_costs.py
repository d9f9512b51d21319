"""Writes tests/test_costs.json from a pytest run's `--durations=0` report.

tests/conftest.py orders the test files by these costs, heaviest first, so
that pytest-xdist (`-n 2 --dist loadfile`, README's test command) hands the
long job and kill files out first and the many short files fill the end: the
two workers then finish close together (longest-processing-time-first
scheduling). The figures only order the files; a file not listed counts by
its tests (see `tests/conftest.py`). Refresh them after adding slow tests:

    python -m pytest -q -n 2 --dist loadfile tests --durations=0 > run.log
    python tools/test_costs.py run.log
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict

from absl import app

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                   "tests", "test_costs.json")
_LINE = re.compile(r"^\s*([\d.]+)s (?:call|setup|teardown)\s+(tests/[^:\s]+\.py)")


def file_costs(report: str) -> dict[str, int]:
    """Seconds per test file (calls, setups and teardowns summed, rounded),
    from a `--durations=0` report.

    >>> file_costs("12.50s call tests/test_a.py::test_x\\n"
    ...            "3.20s setup tests/test_a.py::test_y\\n"
    ...            "0.70s call tests/test_b.py::test_z[1]\\n")
    {'tests/test_a.py': 16, 'tests/test_b.py': 1}
    """
    costs: dict[str, float] = defaultdict(float)
    for line in report.splitlines():
        if m := _LINE.match(line):
            costs[m.group(2)] += float(m.group(1))
    return {name: max(1, round(seconds)) for name, seconds in sorted(costs.items())}


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise app.UsageError("usage: python tools/test_costs.py RUN_LOG (a pytest "
                             "report with --durations=0)")
    with open(argv[1]) as f:
        costs = file_costs(f.read())
    if not costs:
        raise app.UsageError(f"{argv[1]} has no --durations lines")
    with open(OUT, "w") as f:
        json.dump(costs, f, indent=0, sort_keys=True)
        f.write("\n")
    print(f"{len(costs)} files, {sum(costs.values())} s in all: {OUT}")


if __name__ == "__main__":
    app.run(main)

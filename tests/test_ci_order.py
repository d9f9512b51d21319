"""CI time: the order the test files go to pytest-xdist's workers (heaviest
first, by tests/test_costs.json, whole files, the order within a file kept),
and child processes that skip Keras' scikit-learn wrappers (tests/_site)."""

import json
import os
import subprocess
import sys

import pytest
from conftest import COSTS_FILE, REPO, TEST_BUDGET_SECONDS, file_order, subprocess_env


class _Item:
    def __init__(self, nodeid: str, multiprocess: bool = False) -> None:
        self.nodeid = nodeid
        self._multiprocess = multiprocess

    def get_closest_marker(self, name: str):
        return object() if name == "multiprocess" and self._multiprocess else None


def test_files_go_heaviest_first_and_keep_their_own_order():
    items = [_Item("tests/test_a.py::test_1"), _Item("tests/test_a.py::test_2"),
             _Item("tests/test_b.py::test_1", multiprocess=True),
             _Item("tests/test_c.py::test_2"), _Item("tests/test_c.py::test_1"),
             _Item("tests/test_d.py::test_1")]
    # a: 30 s known; b: unknown, 1 multiprocess test (40 s); c: 100 s known;
    # d: unknown, 1 quick test (1 s).
    ordered = file_order(items, {"tests/test_a.py": 30, "tests/test_c.py": 100})
    assert [i.nodeid for i in ordered] == [
        "tests/test_c.py::test_2", "tests/test_c.py::test_1",
        "tests/test_b.py::test_1",
        "tests/test_a.py::test_1", "tests/test_a.py::test_2",
        "tests/test_d.py::test_1"]


def test_the_costs_name_test_files_that_exist():
    with open(COSTS_FILE) as f:
        costs = json.load(f)
    assert costs and all(isinstance(v, int) and v > 0 for v in costs.values())
    missing = [p for p in costs if not os.path.exists(os.path.join(REPO, p))]
    assert not missing, (f"tests/test_costs.json names files that are gone: {missing}; "
                         "rerun tools/test_costs.py")


def test_the_recorded_costs_fit_the_budget():
    """The suite's growth is a decision: the files' recorded seconds, over
    README's two xdist workers, fit TEST_BUDGET_SECONDS (tests/README.md)."""
    with open(COSTS_FILE) as f:
        costs = json.load(f)
    per_worker = sum(costs.values()) / 2
    heaviest = sorted(costs.items(), key=lambda kv: -kv[1])[:5]
    assert per_worker <= TEST_BUDGET_SECONDS, (
        f"the recorded costs are {per_worker:.0f} s per xdist worker, over the "
        f"budget of {TEST_BUDGET_SECONDS} s (conftest.TEST_BUDGET_SECONDS); the "
        f"heaviest files: {heaviest}. Make room, or raise the budget saying why "
        "(tests/README.md)")


@pytest.mark.multiprocess
def test_the_cost_tool_reads_a_durations_report_and_refuses_one_without(tmp_path):
    sys.path.insert(0, os.path.join(REPO, "tools"))
    try:
        from test_costs import file_costs
    finally:
        sys.path.pop(0)
    report = ("===== slowest durations =====\n"
              "273.67s call     tests/test_model_zoo_compat.py::test_modules[x]\n"
              "0.40s setup    tests/test_model_zoo_compat.py::test_modules[x]\n"
              "(12 durations < 0.005s hidden.)\n"
              "0.01s teardown tests/test_x.py::test_y\n")
    assert file_costs(report) == {"tests/test_model_zoo_compat.py": 274,
                                  "tests/test_x.py": 1}
    empty = tmp_path / "empty.log"
    empty.write_text("1 passed in 0.1s\n")
    result = subprocess.run([sys.executable, os.path.join(REPO, "tools", "test_costs.py"),
                             str(empty)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "has no --durations lines" in result.stderr


def test_xdist_keeps_the_order_given(pytestconfig):
    # xdist would sort the files by their number of tests (its default
    # --loadscope-reorder); conftest turns that off.
    assert getattr(pytestconfig.option, "loadscopereorder", False) is False


@pytest.mark.multiprocess
def test_child_processes_skip_keras_sklearn_wrappers_but_can_import_sklearn():
    # `import tensorflow` imports Keras, whose wrappers would import
    # scikit-learn (1.4 s a process); a script's own import still works.
    code = ("import sys, tensorflow\n"
            "import keras.src.wrappers.fixes as fixes\n"
            "print('after tensorflow:', 'sklearn' in sys.modules, fixes.sklearn)\n"
            "from sklearn.datasets import load_digits\n"
            "print('digits:', load_digits().data.shape)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=subprocess_env(), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "after tensorflow: False None" in result.stdout, result.stdout
    assert "digits: (1797, 64)" in result.stdout, result.stdout

"""tools/repeat_tests.py: repeats test files under the README's settings,
counts the failed runs, and reads and writes docs/stability.md's record."""

import os
import subprocess
import sys

import pytest
from conftest import REPO, subprocess_env

TOOL = os.path.join(REPO, "tools", "repeat_tests.py")


@pytest.fixture
def repeat_tests():
    """tools/repeat_tests.py, imported as a module."""
    sys.path.insert(0, os.path.join(REPO, "tools"))
    try:
        import repeat_tests as module
    finally:
        sys.path.pop(0)
    return module


def _repeat(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, TOOL, "--norecord", "--marker=", *args],
                          capture_output=True, text=True, timeout=300,
                          env=subprocess_env())


def test_runs_in_a_row_are_counted_and_a_failed_run_named(tmp_path):
    ok = tmp_path / "test_ok.py"
    ok.write_text("def test_ok():\n    assert True\n")
    result = _repeat("--runs=2", str(ok))
    assert result.returncode == 0, result.stderr
    assert "2 runs of 1 file(s)" in result.stdout and "2 passed, 0 failed" in result.stdout
    # A test that fails every other run (a file counts its runs).
    flaky = tmp_path / "test_flaky.py"
    flaky.write_text(
        "import pathlib\n"
        f"COUNT = pathlib.Path({str(tmp_path / 'count')!r})\n"
        "def test_every_other_run():\n"
        "    n = int(COUNT.read_text()) + 1 if COUNT.exists() else 1\n"
        "    COUNT.write_text(str(n))\n"
        "    assert n % 2\n")
    result = _repeat("--runs=2", str(flaky))
    assert result.returncode == 1
    assert "1 passed, 1 failed" in result.stdout
    failed_log = result.stdout.split("failed: ")[-1].strip()
    assert "run-02.txt" in failed_log and "1 failed" in open(failed_log).read()


def test_only_the_marked_tests_are_repeated(tmp_path):
    marked = tmp_path / "test_marked.py"
    marked.write_text("import pytest\n"
                      "@pytest.mark.multiprocess\n"
                      "def test_marked():\n    assert True\n"
                      "def test_unmarked():\n    assert False\n")
    result = subprocess.run([sys.executable, TOOL, "--norecord", "--runs=1", str(marked)],
                            capture_output=True, text=True, timeout=300,
                            env=subprocess_env())
    assert result.returncode == 0 and "1 passed, 0 failed" in result.stdout, result


def test_a_missing_file_is_refused_naming_it():
    result = _repeat("tests/no_such_test.py")
    assert result.returncode != 0
    assert "no such test file: tests/no_such_test.py" in result.stderr


def test_the_record_counts_only_clean_runs_of_enough_repetitions(tmp_path, monkeypatch,
                                                                 repeat_tests):
    record = tmp_path / "stability.md"
    record.write_text(
        "| date | commit | files | runs | failed runs | tests a run | wall "
        "| failed tests |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- |\n"
        "| 2026-11-27 | abc | `tests/a.py` `tests/b.py` | 20 | 0 | 9 | 5 min | none |\n"
        "| 2026-11-27 | abc | `tests/c.py` `tests/f.py` | 20 | 1 | 3 | 2 min "
        "| `tests/c.py::test_x` (run 7) |\n"
        "| 2026-11-27 | abc | `tests/d.py` | 5 | 0 | 3 | 1 min | none |\n")
    monkeypatch.setattr(repeat_tests, "RECORD", str(record))
    # c.py failed a run; f.py, in the same row, passed every one of its runs.
    assert repeat_tests.recorded_files(20) == {"tests/a.py", "tests/b.py", "tests/f.py"}
    assert repeat_tests.recorded_files(5) == {"tests/a.py", "tests/b.py", "tests/d.py",
                                              "tests/f.py"}
    repeat_tests.append_record(["tests/e.py"], 20, [], 4, 120.0, {})
    repeat_tests.append_record(["tests/g.py", "tests/h.py"], 20, ["run-03.txt"], 4,
                               120.0, {"tests/g.py::test_y": [3]})
    assert record.read_text().splitlines()[-1].endswith(
        "| `tests/g.py::test_y` (run 3) |")
    assert repeat_tests.recorded_files(20) == {"tests/a.py", "tests/b.py", "tests/f.py",
                                               "tests/e.py", "tests/h.py"}
    # A later failure takes a file's record back, until a later clean row.
    repeat_tests.append_record(["tests/a.py"], 20, ["run-01.txt"], 4, 60.0,
                               {"tests/a.py::test_z": [1]})
    assert "tests/a.py" not in repeat_tests.recorded_files(20)
    repeat_tests.append_record(["tests/a.py"], 20, [], 4, 60.0, {})
    assert "tests/a.py" in repeat_tests.recorded_files(20)


def test_a_failed_run_names_its_failed_tests(tmp_path, monkeypatch, repeat_tests):
    ok = tmp_path / "test_ok.py"
    ok.write_text("def test_ok():\n    assert True\n")
    bad = tmp_path / "test_bad.py"
    bad.write_text("def test_bad():\n    assert False\n")
    if not repeat_tests.FLAGS.is_parsed():
        repeat_tests.FLAGS.mark_as_parsed()  # the defaults, as the tool has them
    monkeypatch.setattr(repeat_tests.FLAGS, "marker", "")
    passed, count, failed = repeat_tests.run_once([str(ok), str(bad)],
                                                  str(tmp_path / "run.txt"))
    assert not passed and count == 1
    assert [t.split("/")[-1] for t in failed] == ["test_bad.py::test_bad"], failed

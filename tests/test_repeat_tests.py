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


@pytest.mark.multiprocess
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


@pytest.mark.multiprocess
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


@pytest.mark.multiprocess
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
    repeat_tests.append_record(["tests/e.py"], 20, [], 4, 120.0, {}, "abc", ["e0"])
    repeat_tests.append_record(["tests/g.py", "tests/h.py"], 20, ["run-03.txt"], 4,
                               120.0, {"tests/g.py::test_y": [3]}, "abc", ["g0", "h0"])
    assert record.read_text().splitlines()[-1].endswith(
        "| `tests/g.py::test_y` (run 3) | `g0` `h0` |")
    assert repeat_tests.recorded_files(20) == {"tests/a.py", "tests/b.py", "tests/f.py",
                                               "tests/e.py", "tests/h.py"}
    # A later failure takes a file's record back, until a later clean row.
    repeat_tests.append_record(["tests/a.py"], 20, ["run-01.txt"], 4, 60.0,
                               {"tests/a.py::test_z": [1]}, "abc", ["a0"])
    assert "tests/a.py" not in repeat_tests.recorded_files(20)
    repeat_tests.append_record(["tests/a.py"], 20, [], 4, 60.0, {}, "abc", ["a1"])
    assert "tests/a.py" in repeat_tests.recorded_files(20)
    assert repeat_tests.recorded_rows(20)["tests/a.py"].blob == "a1"
    assert repeat_tests.recorded_rows(20)["tests/b.py"].blob is None  # an old row


def test_a_failed_run_names_its_failed_tests(tmp_path, repeat_tests, tool_flags):
    ok = tmp_path / "test_ok.py"
    ok.write_text("def test_ok():\n    assert True\n")
    bad = tmp_path / "test_bad.py"
    bad.write_text("def test_bad():\n    assert False\n")
    tool_flags.marker = ""
    passed, count, failed = repeat_tests.run_once([str(ok), str(bad)],
                                                  str(tmp_path / "run.txt"))
    assert not passed and count == 1
    assert [t.split("/")[-1] for t in failed] == ["test_bad.py::test_bad"], failed


@pytest.fixture
def tool_flags(repeat_tests):
    """The tool's flags, parsed (the defaults, as the tool has them); what a
    test sets is put back after it. (Not monkeypatch: it would delete the
    flag afterwards, as it finds no value in the instance's __dict__.)"""
    flags = repeat_tests.FLAGS
    if not flags.is_parsed():
        flags.mark_as_parsed()
    saved = {name: flags[name].value for name in ("runs", "record", "marker")}
    yield flags
    for name, value in saved.items():
        flags[name].value = value


def test_a_row_holds_the_commit_and_the_content_the_runs_began_with(
        tmp_path, monkeypatch, repeat_tests, tool_flags):
    """The commit is the one checked out when the runs began (a commit made
    during them is not what ran), with each file's blob id."""
    record = tmp_path / "stability.md"
    monkeypatch.setattr(repeat_tests, "RECORD", str(record))
    test = tmp_path / "test_x.py"
    test.write_text("def test_x():\n    pass\n")
    commits = iter(["c0ffee1", "beef002"])  # HEAD before the runs, then after
    monkeypatch.setattr(repeat_tests, "head_commit", lambda: next(commits))
    runs = []

    def run_once(files, log):
        runs.append(repeat_tests.head_commit())  # a commit lands meanwhile
        return True, 1, []

    monkeypatch.setattr(repeat_tests, "run_once", run_once)
    tool_flags.runs, tool_flags.record = 1, True
    with pytest.raises(SystemExit) as exit_:
        repeat_tests.main(["repeat_tests.py", str(test)])
    assert exit_.value.code == 0 and runs == ["beef002"]
    row = record.read_text().splitlines()[-1]
    blob = repeat_tests.blob_id(str(test))
    assert row.split(" | ")[1] == "c0ffee1", row
    assert row.endswith(f"| none | `{blob}` |"), row
    assert repeat_tests.recorded_rows(1)[str(test)].blob == blob


def test_a_file_changed_during_the_runs_is_not_recorded(tmp_path, monkeypatch,
                                                       repeat_tests, tool_flags,
                                                       capsys):
    record = tmp_path / "stability.md"
    monkeypatch.setattr(repeat_tests, "RECORD", str(record))
    test = tmp_path / "test_x.py"
    test.write_text("def test_x():\n    pass\n")

    def run_once(files, log):
        test.write_text("def test_x():\n    assert True\n")  # edited meanwhile
        return True, 1, []

    monkeypatch.setattr(repeat_tests, "run_once", run_once)
    tool_flags.runs, tool_flags.record = 1, True
    with pytest.raises(SystemExit):
        repeat_tests.main(["repeat_tests.py", str(test)])
    assert f"not recorded: changed during the runs: {test}" in capsys.readouterr().out
    assert not record.exists()


@pytest.mark.multiprocess  # (git)
def test_remaining_lists_files_without_a_row_and_files_changed_since_theirs(
        tmp_path, monkeypatch, repeat_tests):
    """A file whose blob id is its row's is done; one whose content changed
    since is listed, naming the row; one in an older row (no blob ids) is
    compared with the row's commit (an unknown commit: changed)."""
    root = tmp_path / "repo"
    (root / "tests").mkdir(parents=True)
    for name in ("same", "edited", "new", "old_same", "old_unknown"):
        (root / "tests" / f"test_{name}.py").write_text(f"# {name}\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-qm", "x"], check=True)
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.setattr(repeat_tests, "ROOT", str(root))
    monkeypatch.setattr(repeat_tests, "RECORD", str(root / "stability.md"))
    monkeypatch.setattr(repeat_tests, "multiprocess_files", lambda: sorted(
        f"tests/{n}" for n in os.listdir(root / "tests")))
    blob = {n: repeat_tests.blob_id(str(root / "tests" / f"test_{n}.py"))
            for n in ("same", "edited")}
    (root / "stability.md").write_text(
        f"| 2026-11-27 | {head} | `tests/test_old_same.py` | 20 | 0 | 1 | 1 min "
        "| none |\n"
        "| 2026-11-27 | 0000000 | `tests/test_old_unknown.py` | 20 | 0 | 1 | 1 min "
        "| none |\n"
        f"| 2026-11-29 | {head} | `tests/test_same.py` `tests/test_edited.py` | 20 | 0 "
        f"| 2 | 1 min | none | `{blob['same']}` `{blob['edited']}` |\n")
    (root / "tests" / "test_edited.py").write_text("# edited since\n")
    assert repeat_tests.remaining(20) == [
        f"tests/test_edited.py (changed since its row of 2026-11-29, commit {head})",
        "tests/test_new.py",
        "tests/test_old_unknown.py (changed since its row of 2026-11-27, "
        "commit 0000000)"]

"""Every test that starts processes carries the `multiprocess` marker.

tools/repeat_tests.py repeats the tests marked `multiprocess` (the ones whose
faults and processes can race) and `--remaining` finds the files to repeat by
that marker, so a test that starts a process without it is never repeated.
This reads the test files (no test runs): a test starts processes when its
body, a function of its module it calls, or a fixture of its module it takes
calls `subprocess` (run, Popen, ...), `os.fork`, `os.system`, a
`multiprocessing` process, or a helper of tests/conftest.py or tests/support
that does (`launch`, `counting_job`, `write_data`, ...), at any depth.
"""

from __future__ import annotations

import ast
import os

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
# Calls that start a process, by their dotted name as written.
STARTING = {"subprocess.run", "subprocess.Popen", "subprocess.call",
            "subprocess.check_call", "subprocess.check_output", "Popen",
            "os.fork", "os.system", "os.posix_spawn", "multiprocessing.Process",
            "multiprocessing.Pool", "mp.Process", "mp.Pool",
            # the library's own starters of a role's process
            "start_service", "start_services"}
MARKER = "multiprocess"


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _calls(node: ast.AST) -> set[str]:
    """The dotted names a function calls or refers to (a helper passed as a
    callback counts)."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            names.add(_dotted(sub.func))
        elif isinstance(sub, ast.Name):
            names.add(sub.id)
    return names


def _is_fixture(fn: ast.FunctionDef) -> bool:
    return any("fixture" in _dotted(d.func if isinstance(d, ast.Call) else d)
               for d in fn.decorator_list)


def _marked(decorators: list[ast.expr]) -> bool:
    return any(_dotted(d.func if isinstance(d, ast.Call) else d).endswith(
        f"mark.{MARKER}") for d in decorators)


def _module_marked(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) \
                else [node.value]
            if _marked(values):
                return True
    return False


def starters(tree: ast.Module, imported: set[str], methods: bool = True) -> set[str]:
    """The module-level functions of `tree` that start processes (`imported`:
    names from other modules that do); with `methods`, its classes' methods
    too (by their bare names: a test module's own helper classes)."""
    functions = {n.name: n for n in tree.body
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and methods):
        for fn in cls.body:
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.setdefault(fn.name, fn)
    calls = {name: _calls(fn) for name, fn in functions.items()}
    found = {name for name, called in calls.items()
             if called & (STARTING | imported)}
    while True:  # helpers calling helpers
        more = {name for name, called in calls.items() if called & found} - found
        if not more:
            return found
        found |= more


def _tree(path: str) -> ast.Module:
    with open(path) as f:
        return ast.parse(f.read(), path)


def shared_starters() -> set[str]:
    """The names of tests/conftest.py and tests/support/*.py that start
    processes."""
    paths = [os.path.join(TESTS, "conftest.py")] + [
        os.path.join(TESTS, "support", n) for n in sorted(os.listdir(
            os.path.join(TESTS, "support"))) if n.endswith(".py")]
    found: set[str] = set()
    while True:  # support modules use each other's helpers
        # (Module-level names only: a support class's methods are called on
        # its objects, `bed.run(...)`, and their bare names, `run`, `shape`,
        # would match unrelated names of every test.)
        more = set().union(*(starters(_tree(p), found, methods=False)
                             for p in paths)) - found
        if not more:
            return found
        found |= more


def unmarked(path: str, shared: set[str]) -> list[str]:
    """The tests of the file at `path` that start processes without the
    marker (`shared`: the helpers of conftest and support that do)."""
    tree = _tree(path)
    if _module_marked(tree):
        return []
    found = starters(tree, shared)
    fixtures = {n.name for n in ast.walk(tree)
                if isinstance(n, ast.FunctionDef) and _is_fixture(n)} & found
    missing = []
    scopes = [(tree.body, [])] + [(c.body, c.decorator_list) for c in tree.body
                                  if isinstance(c, ast.ClassDef)]
    for body, class_decorators in scopes:
        for fn in body:
            if not isinstance(fn, ast.FunctionDef) or not fn.name.startswith("test"):
                continue
            args = {a.arg for a in fn.args.args}
            if (fn.name in found or args & fixtures) and not _marked(
                    fn.decorator_list + class_decorators):
                missing.append(f"{os.path.basename(path)}::{fn.name}")
    return missing


def test_every_test_that_starts_processes_is_marked():
    shared = shared_starters()
    assert {"launch", "counting_job", "write_data"} <= shared, shared
    missing = [test for name in sorted(os.listdir(TESTS))
               if name.startswith("test_") and name.endswith(".py")
               for test in unmarked(os.path.join(TESTS, name), shared)]
    assert not missing, ("these tests start processes but lack "
                         f"@pytest.mark.{MARKER}: {missing}")


@pytest.mark.parametrize("source, expected", [
    # A test that runs a process itself, through a helper, or a fixture.
    ("import subprocess\ndef test_a():\n    subprocess.run(['true'])\n", ["test_a"]),
    ("import subprocess\ndef helper():\n    return subprocess.Popen(['true'])\n"
     "def test_b():\n    helper()\n", ["test_b"]),
    ("import pytest\nfrom conftest import launch\n@pytest.fixture\ndef job():\n"
     "    return launch('d', 's')\ndef test_c(job):\n    pass\n", ["test_c"]),
    # Marked, on the test or the module; or in-process only.
    ("import pytest, subprocess\n@pytest.mark.multiprocess\ndef test_d():\n"
     "    subprocess.run(['true'])\n", []),
    ("import pytest, subprocess\npytestmark = [pytest.mark.multiprocess]\n"
     "def test_e():\n    subprocess.run(['true'])\n", []),
    ("def test_f():\n    assert 1 + 1 == 2\n", []),
])
def test_the_check_finds_an_unmarked_test_that_starts_processes(tmp_path, source,
                                                                 expected):
    path = tmp_path / "test_sample.py"
    path.write_text(source)
    assert unmarked(str(path), {"launch"}) == [f"test_sample.py::{t}" for t in expected]

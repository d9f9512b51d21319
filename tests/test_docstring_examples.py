"""Every `>>>` example in keras_elastic's docstrings runs as written (Keras'
docstrings are runnable; ours must not drift from the code).

Every module under keras_elastic/ whose source holds `>>>` is a case. Each
of its docstrings (the module's, its classes' and functions') runs in an
empty temporary working directory of its own (examples write relative paths:
`job/`, `ckpts/`) and in the environment the test started with. No example
may be skipped (`# doctest: +SKIP`) but in the modules of SKIPS, each with
its reason; examples that need servers start them in the process (a master
or a parameter server on 127.0.0.1, the embedded cluster, closed after).
"""

from __future__ import annotations

import doctest
import importlib
import os
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "keras_elastic"

# Modules whose examples may still be skipped, and why.
SKIPS: dict[str, str] = {}


def modules_with_examples() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>>" in path.read_text(encoding="utf-8"):
            parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = modules_with_examples()


def test_the_examples_are_found():
    assert len(MODULES) > 70, MODULES
    assert "keras_elastic.common.errors" in MODULES
    assert "keras_elastic.launcher.backends" in MODULES  # a package's __init__


@pytest.fixture
def clean_process(tmp_path, monkeypatch):
    """A temporary working directory; no embedded cluster left behind."""
    from keras_elastic.worker import cluster

    monkeypatch.chdir(tmp_path)
    cluster.reset_cluster()
    yield
    cluster.reset_cluster()


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, clean_process, tmp_path):
    module = importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder().find(module) if t.examples]
    assert tests, f"{name}: '>>>' in its source, but no example doctest finds"
    skipped = [f"{t.name}: {e.source.strip()}" for t in tests for e in t.examples
               if e.options.get(doctest.SKIP)]
    if name in SKIPS:
        assert skipped, f"{name}: no example skipped any more: remove it from SKIPS"
    else:
        assert not skipped, f"{name}: skipped examples (make them run): {skipped}"
    runner = doctest.DocTestRunner(
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    environ = dict(os.environ)
    for i, test in enumerate(tests):
        # Each docstring in an empty working directory of its own and the
        # environment the test started with.
        (tmp_path / f"doc{i}").mkdir()
        os.chdir(tmp_path / f"doc{i}")
        runner.run(test)
        os.environ.clear()
        os.environ.update(environ)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0, f"{name} has no example that runs"
    assert result.failed == 0, f"{name}: {result.failed} example(s) failed (above)"

"""Runs one pytest file: the main of every py_test made by //tests:defs.bzl.

Usage: pytest_runner.py TEST_FILE [PYTEST_ARGS...]

Under `bazel test` it hands pytest the JUnit XML path Bazel reads
(`XML_OUTPUT_FILE`) and keeps pytest's temporary files inside the test's own
temporary directory (`TEST_TMPDIR`); pytest's cache is off. Python puts the
folder of this file, symlinks resolved, first on `sys.path`: under Bazel that
is the source tree's tests/, so the runner takes it off, and test files import
what is in their runfiles only (pytest adds the test file's own folder).
"""

from __future__ import annotations

import os
import sys


def pytest_args(argv: list[str], env: dict[str, str]) -> list[str]:
    """The pytest command line for `argv` (TEST_FILE, then pytest arguments)."""
    if not argv:
        raise SystemExit("pytest_runner: no test file given; "
                         "usage: pytest_runner.py TEST_FILE [PYTEST_ARGS...]")
    test_file, extra = argv[0], argv[1:]
    if not os.path.isfile(test_file):
        raise SystemExit(f"pytest_runner: test file {test_file!r} not found "
                         f"(working directory {os.getcwd()!r})")
    args = [test_file, "-p", "no:cacheprovider"]
    if env.get("XML_OUTPUT_FILE"):
        args.append(f"--junitxml={env['XML_OUTPUT_FILE']}")
    if env.get("TEST_TMPDIR"):
        args.append(f"--basetemp={os.path.join(env['TEST_TMPDIR'], 'pytest')}")
    return args + extra


def main() -> int:
    here = os.path.dirname(os.path.realpath(__file__))
    if sys.path and os.path.realpath(sys.path[0] or os.getcwd()) == here:
        del sys.path[0]
    import pytest

    return int(pytest.main(pytest_args(sys.argv[1:], dict(os.environ))))


if __name__ == "__main__":
    sys.exit(main())

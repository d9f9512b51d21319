"""docs/keras_tests.md lists exactly the manifest's entries (expected.py),
and every entry names tests of the suite.

The page is generated (`python -m tests.keras_suite.report RECORD.json`, see
report.py); these checks fail when the manifest changed and the page was not
regenerated, or an entry matches no test (a renamed or removed test).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from . import expected, report


@pytest.fixture(scope="module")
def page() -> str:
    with open(report.DOC) as f:
        return f.read()


@pytest.fixture(scope="module")
def suite_ids() -> list[str]:
    return report.collect_test_ids()


def test_the_page_lists_exactly_the_manifest(page):
    listed = report.listed_entries(page)
    assert listed["NOT_APPLICABLE"] == expected.NOT_APPLICABLE, (
        "docs/keras_tests.md's 'Not applicable' differs from expected.NOT_APPLICABLE: "
        "regenerate it (python -m tests.keras_suite.report, see report.py)")
    assert listed["DEFECTS"] == expected.DEFECTS, (
        "docs/keras_tests.md's 'Known defects' differs from expected.DEFECTS: "
        "regenerate it (python -m tests.keras_suite.report, see report.py)")


def test_the_page_counts_every_test_of_the_suite(page, suite_ids):
    total = next((line for line in page.splitlines() if line.startswith("| **all** |")),
                 None)
    assert total is not None, "docs/keras_tests.md has no counts table"
    assert int(total.split("|")[2]) == len(suite_ids), (
        "docs/keras_tests.md counts another set of tests than the suite's: regenerate it")


def test_every_entry_names_tests_of_the_suite(suite_ids):
    for name, entries in (("NOT_APPLICABLE", expected.NOT_APPLICABLE),
                          ("DEFECTS", expected.DEFECTS)):
        for pattern, reason in entries.items():
            assert reason.strip(), f"{name}[{pattern!r}] has no reason"
            assert "\n" not in reason, f"{name}[{pattern!r}]: one line, please"
            matched = [t for t in suite_ids if expected.find(entries, t) == pattern]
            assert matched, f"{name}[{pattern!r}] matches no test of the suite"


def test_no_test_is_both_not_applicable_and_a_defect(suite_ids):
    both = [t for t in suite_ids if expected.find(expected.NOT_APPLICABLE, t)
            and expected.find(expected.DEFECTS, t)]
    assert not both, f"in both lists: {both}"


def test_the_suite_is_every_test_pytest_collects(suite_ids):
    """report.collect_test_ids (which the page and these checks use) finds
    exactly what pytest collects."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         report.HERE], capture_output=True, text=True, timeout=600,
        cwd=os.path.dirname(os.path.dirname(report.HERE)),
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    collected = sorted(
        line.split("keras_suite/", 1)[1] for line in result.stdout.splitlines()
        if "keras_suite/" in line and "::" in line
        and not line.split("keras_suite/", 1)[1].startswith(tuple(report.META_FILES)))
    assert collected == suite_ids

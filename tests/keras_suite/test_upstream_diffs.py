"""The copies of Keras test modules in upstream/ differ from the installed
originals by exactly their committed diffs.

A copy (`upstream/NAME.py`) exists only where Keras' module cannot run
unchanged; `upstream/NAME.py.diff` is its unified diff against the installed
original, recomputed here: a copy edited without its diff, a diff edited
without its copy, or a Keras release whose module changed all fail. Each
changed hunk of a copy carries a `# keras-elastic:` comment saying why.

Regenerate a diff (after a deliberate change of its copy):
`python -m tests.keras_suite.test_upstream_diffs`.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
UPSTREAM = os.path.join(HERE, "upstream")
# Each copy and the Keras module it copies.
COPIES = {"trainer_test.py": "keras.src.trainers.trainer_test"}
MARK = "# keras-elastic:"


def original_path(module: str) -> str:
    """The installed file of Keras module `module` (found without importing it:
    the original may not import here)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{module} is not installed"
    return spec.origin


def unified_diff(copy: str) -> str:
    """The diff of `upstream/<copy>` against its installed original, with
    paths that do not depend on where Keras is installed."""
    module = COPIES[copy]
    with open(original_path(module)) as f:
        original = f.readlines()
    with open(os.path.join(UPSTREAM, copy)) as f:
        changed = f.readlines()
    source = "keras/src/" + "/".join(module.split(".")[2:]) + ".py"
    return "".join(difflib.unified_diff(original, changed, fromfile=source,
                                        tofile=f"tests/keras_suite/upstream/{copy}"))


def test_every_copy_is_listed_with_its_diff():
    copies = sorted(name for name in os.listdir(UPSTREAM)
                    if name.endswith(".py") and name != "__init__.py")
    diffs = sorted(name[:-len(".diff")] for name in os.listdir(UPSTREAM)
                   if name.endswith(".py.diff"))
    assert copies == sorted(COPIES), "a copy in upstream/ without an entry in COPIES"
    assert diffs == copies, "each copy needs its .diff, and each .diff its copy"


def test_each_copy_differs_by_its_committed_diff():
    for copy in COPIES:
        with open(os.path.join(UPSTREAM, copy + ".diff")) as f:
            committed = f.read()
        assert committed, f"{copy}.diff is empty: use the original unchanged"
        assert unified_diff(copy) == committed, (
            f"upstream/{copy} no longer differs from {original_path(COPIES[copy])} "
            f"by upstream/{copy}.diff (regenerate it with "
            "`python -m tests.keras_suite.test_upstream_diffs` if the change is meant)")


def test_each_changed_hunk_says_why():
    for copy in COPIES:
        with open(os.path.join(UPSTREAM, copy + ".diff")) as f:
            hunks = re.split(r"^@@ .* @@.*\n", f.read(), flags=re.M)[1:]
        for hunk in hunks:
            added = [line for line in hunk.splitlines() if line.startswith("+")]
            assert any(MARK in line for line in added), (
                f"a hunk of upstream/{copy} adds no '{MARK}' comment:\n{hunk}")


def main() -> None:
    """Writes each copy's diff (`python -m tests.keras_suite.test_upstream_diffs`)."""
    for copy in COPIES:
        with open(os.path.join(UPSTREAM, copy + ".diff"), "w") as f:
            f.write(unified_diff(copy))
        print(f"wrote upstream/{copy}.diff", file=sys.stderr)


if __name__ == "__main__":
    main()

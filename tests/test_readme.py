"""README.md opens with the two commands, and CI runs the second verbatim."""

import glob
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, subprocess_env


def readme_commands():
    text = open(os.path.join(REPO, "README.md")).read()
    block = re.search(r"```bash\n(.*?)\n```", text, re.S).group(1)
    return block.splitlines()


def test_readme_opens_with_the_example_and_the_test_commands():
    example, tests = readme_commands()
    assert example.startswith('pip install -e ".[examples]" && keras-elastic run ')
    script = re.search(r"python (\S+\.py)", example).group(1)
    assert os.path.isfile(os.path.join(REPO, script))
    assert tests == ('pip install -e ".[test]" && '
                     'python -m pytest -q -n 2 --dist loadfile tests')


def test_ci_runs_the_readme_test_command():
    ci = open(os.path.join(REPO, ".ci", "run")).read().splitlines()
    assert readme_commands()[1] in ci


# -- `ke.<module>.<name>` as README.md and docs/ write it -----------------------
def documented_references() -> list[str]:
    """Every `ke.x.y` the README and the docs use (code and prose)."""
    found = set()
    for path in [os.path.join(REPO, "README.md"), *sorted(glob.glob(
            os.path.join(REPO, "docs", "*.md")))]:
        text = open(path).read()
        found.update(re.findall(r"\bke\.[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", text))
    return sorted(found)


def fresh_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=subprocess_env(),
                          capture_output=True, text=True, timeout=300, cwd=REPO)


@pytest.mark.multiprocess
def test_every_documented_ke_reference_resolves_after_a_bare_import():
    """`import keras_elastic as ke` and nothing else, in a fresh process: each
    `ke.x.y` of README.md and docs/ (e.g. `ke.prediction.read_predictions`)
    must resolve, as a reader would type it."""
    references = documented_references()
    assert "ke.prediction.read_predictions" in references
    assert "ke.data.ArrayRecordSource" in references
    code = ("import json, keras_elastic as ke\n"
            "missing = []\n"
            f"for ref in {references!r}:\n"
            "    obj = ke\n"
            "    try:\n"
            "        for part in ref.split('.')[1:]:\n"
            "            obj = getattr(obj, part)\n"
            "    except AttributeError as e:\n"
            "        missing.append(f'{ref}: {e}')\n"
            "print(json.dumps(missing))\n")
    result = fresh_python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


@pytest.mark.multiprocess
def test_readme_read_predictions_usage_in_a_fresh_process(tmp_path):
    """The README's `ke.prediction.read_predictions(dir)`, run as written in a
    process that imported nothing else (it raised AttributeError)."""
    from keras_elastic.prediction import NumpyWriter, TaskRange

    writer = NumpyWriter(str(tmp_path))
    writer.write(TaskRange(1, "b", 0, 2), np.array([[3.0], [4.0]]))
    writer.write(TaskRange(0, "a", 0, 2), np.array([[1.0], [2.0]]))
    result = fresh_python(
        "import keras_elastic as ke\n"
        f"print(ke.prediction.read_predictions({str(tmp_path)!r}).tolist())\n")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[[1.0], [2.0], [3.0], [4.0]]"


def test_every_subpackage_is_a_lazy_attribute():
    import keras_elastic

    packages = {name for name in os.listdir(os.path.join(REPO, "keras_elastic"))
                if os.path.isfile(os.path.join(REPO, "keras_elastic", name,
                                               "__init__.py"))}
    assert packages | {"callbacks"} == set(keras_elastic._LAZY_MODULES)


# -- docs/: the index and the links ---------------------------------------------
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_docs_index_lists_every_page():
    pages = {os.path.basename(p) for p in glob.glob(os.path.join(REPO, "docs", "*.md"))}
    index = open(os.path.join(REPO, "docs", "index.md")).read()
    listed = {link for link in _LINK.findall(index) if not link.startswith("..")}
    assert pages - {"index.md"} == listed, (
        "docs/index.md must list each docs page once, and nothing else: "
        f"missing {sorted(pages - {'index.md'} - listed)}, "
        f"not a page {sorted(listed - pages)}")


def test_relative_links_of_readme_and_docs_resolve():
    """Every `[text](path)` of README.md and docs/ that is not a URL names a
    file of the repository; a `#anchor` names one of its headings."""
    def anchors(path: str) -> set[str]:
        headings = re.findall(r"^#+ (.+)$", open(path).read(), re.M)
        return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                for h in headings}

    broken = []
    for path in [os.path.join(REPO, "README.md"),
                 *glob.glob(os.path.join(REPO, "docs", "*.md"))]:
        for link in _LINK.findall(open(path).read()):
            if re.match(r"[a-z]+:", link):
                continue
            target, _, anchor = link.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), target)) \
                if target else path
            if not os.path.exists(resolved):
                broken.append(f"{os.path.relpath(path, REPO)}: {link}")
            elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                broken.append(f"{os.path.relpath(path, REPO)}: {link} (no such heading)")
    assert broken == [], broken

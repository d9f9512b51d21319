"""The version is written once, as keras_elastic.__version__; setup.py reads it."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, subprocess_env

import keras_elastic


@pytest.mark.multiprocess
def test_setup_py_takes_the_version_from_keras_elastic():
    setup = open(os.path.join(REPO, "setup.py")).read()
    assert not re.search(r"""version\s*=\s*["']""", setup)  # no second copy
    imported = {a.name for node in ast.walk(ast.parse(setup)) if isinstance(
        node, ast.Import) for a in node.names} | {node.module for node in ast.walk(
            ast.parse(setup)) if isinstance(node, ast.ImportFrom)}
    assert not {m for m in imported if m.startswith("keras_elastic")}  # read as text
    result = subprocess.run([sys.executable, "setup.py", "--version"], cwd=REPO,
                            env=subprocess_env(), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-1] == keras_elastic.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", keras_elastic.__version__)

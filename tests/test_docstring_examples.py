"""The `>>>` examples in the docstrings of the pure modules run as written
(Keras' docstrings are runnable; ours must not drift from the code)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "keras_elastic.common.errors",
    "keras_elastic.common.keras_compat",
    "keras_elastic.common.step_context",
    "keras_elastic.launcher.config",
    "keras_elastic.launcher.policy",
    "keras_elastic.launcher.report",
    "keras_elastic.master.journal",
    "keras_elastic.master.membership",
    "keras_elastic.master.status",
    "keras_elastic.worker.session",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no example"
    assert result.failed == 0

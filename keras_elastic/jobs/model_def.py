"""Finding `module:function` and the module's `dataset_fn`, with clear errors.

`check_model_def` inspects the module's source without importing it (no
TensorFlow in the launcher); `load_model_def` imports it in a worker.

Example:

>>> check_model_def("examples.digits.model_def:custom_model")  # doctest: +SKIP
'/path/to/examples/digits/model_def.py'
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any


class ModelDefError(ValueError):
    """--model_def does not name an importable module and function."""


def _split(model_def: str) -> tuple[str, str]:
    if not model_def or model_def.count(":") != 1:
        raise ModelDefError(f"--model_def={model_def!r} must look like "
                            "'package.module:function' or 'path/to/file.py:function'")
    module, function = model_def.split(":")
    if not module or not function.isidentifier():
        raise ModelDefError(f"--model_def={model_def!r} must look like "
                            "'package.module:function'")
    return module, function


def _source_path(module: str) -> str:
    if module.endswith(".py"):
        if not os.path.isfile(module):
            raise ModelDefError(f"--model_def: file {module} does not exist")
        return os.path.abspath(module)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as e:
        raise ModelDefError(f"--model_def: cannot find module '{module}': {e}") from None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise ModelDefError(f"--model_def: cannot find module '{module}' (looked in "
                            f"the current directory {os.getcwd()} and sys.path)")
    return spec.origin


def _top_level_names(path: str) -> set[str]:
    with open(path) as f:
        try:
            tree = ast.parse(f.read(), filename=path)
        except SyntaxError as e:
            raise ModelDefError(f"--model_def: {path} has a syntax error: {e}") from None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(
                node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def check_model_def(model_def: str) -> str:
    """Checks that the module exists and defines the function and `dataset_fn`;
    returns the module's file. Imports nothing."""
    module, function = _split(model_def)
    path = _source_path(module)
    names = _top_level_names(path)
    for required in (function, "dataset_fn"):
        if required not in names:
            what = "the model function" if required == function else (
                "dataset_fn(records, mode)")
            raise ModelDefError(f"--model_def: module '{module}' ({path}) does not "
                                f"define '{required}' ({what})")
    return path


def load_model_def(model_def: str) -> tuple[ModuleType, Any]:
    """Imports the module; returns it and the model function."""
    module_name, function = _split(model_def)
    path = _source_path(module_name)
    if module_name.endswith(".py"):
        spec = importlib.util.spec_from_file_location("model_def", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ModelDefError(f"--model_def: '{module_name}.{function}' is not a function")
    if not callable(getattr(module, "dataset_fn", None)):
        raise ModelDefError(f"--model_def: module '{module_name}' does not define "
                            "dataset_fn(records, mode)")
    return module, fn

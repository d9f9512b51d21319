"""Finding `module:function` and the module's `dataset_fn`, with clear errors.

Two ways to name the model:

- `--model_def=package.module:function` (or `path/to/file.py:function`): the
  module is imported from the current directory or `sys.path`;
- ElasticDL's: `--model_zoo=DIR --model_def=package.module.function` (dotted):
  the module is the file `DIR/package/module.py` (`--model_zoo` may also be
  that file itself); without `--model_zoo`, DIR is the current directory.

`check_model_def` inspects the module's source without importing it (no
TensorFlow in the launcher); `load_model_def` imports it in a worker, with
ElasticDL's import paths (`from elasticdl.python.common.constants import
Mode`, ...) served while it loads (see `elasticdl_compat.py`).

Example:

>>> source = "def custom_model(): ...\\ndef dataset_fn(records, mode): ...\\n"
>>> with open("digits_model.py", "w") as f:
...     _ = f.write(source)
>>> check_model_def("digits_model:custom_model")
'.../digits_model.py'
>>> os.makedirs("model_zoo/mnist")
>>> with open("model_zoo/mnist/mnist_functional_api.py", "w") as f:
...     _ = f.write(source)
>>> check_model_def("mnist.mnist_functional_api.custom_model",
...                 model_zoo="model_zoo")
'.../model_zoo/mnist/mnist_functional_api.py'
>>> check_model_def("digits_model:other_model")
Traceback (most recent call last):
...
keras_elastic.jobs.model_def.ModelDefError: --model_def: module 'digits_model' \
(...) does not define 'other_model' (the model function)
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

from keras_elastic.common import errors


class ModelDefError(errors.JobError, ValueError):
    """--model_def does not name an importable module and function."""


_FORMS = ("'package.module:function' or 'path/to/file.py:function' (or ElasticDL's "
          "--model_zoo=DIR --model_def=package.module.function)")


def _split(model_def: str, model_zoo: str | None = None) -> tuple[str, str]:
    if model_def and ":" not in model_def and (model_zoo or "." in model_def):
        # ElasticDL's dotted form: the last part is the function or class.
        parts = model_def.split(".")
        if model_zoo and os.path.isfile(model_zoo):  # --model_zoo=file.py
            if not parts[-1].isidentifier():
                raise ModelDefError(f"--model_def={model_def!r} must end with the "
                                    "name of the model function or class")
            return "", parts[-1]
        if len(parts) < 2 or not all(p.isidentifier() for p in parts):
            raise ModelDefError(f"--model_def={model_def!r} must look like {_FORMS}")
        return ".".join(parts[:-1]), parts[-1]
    if not model_def or model_def.count(":") != 1:
        raise ModelDefError(f"--model_def={model_def!r} must look like {_FORMS}")
    module, function = model_def.split(":")
    if not module or not function.isidentifier():
        raise ModelDefError(f"--model_def={model_def!r} must look like "
                            "'package.module:function'")
    return module, function


def zoo_dir(model_def: str, model_zoo: str | None) -> str | None:
    """The model zoo of an ElasticDL-style `--model_def` (None for the
    `module:function` form): `--model_zoo`, or the current directory."""
    if ":" in (model_def or "") and not model_zoo:
        return None
    if model_zoo:
        return os.path.abspath(model_zoo)
    return os.getcwd() if "." in (model_def or "") else None


def _zoo_source_path(module: str, zoo: str) -> str:
    if os.path.isfile(zoo):
        return zoo
    if not os.path.isdir(zoo):
        raise ModelDefError(f"--model_zoo={zoo} is not a directory or a .py file")
    if module.endswith(".py"):
        path = os.path.join(zoo, module)
    else:
        path = os.path.join(zoo, *module.split(".")) + ".py"
    if not os.path.isfile(path):
        raise ModelDefError(f"--model_def: module '{module}' is not in the model zoo "
                            f"{zoo} (no file {path})")
    return path


def _source_path(module: str, zoo: str | None = None) -> str:
    if zoo is not None:
        return _zoo_source_path(module, zoo)
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


def dataset_fn_names(feed: str | None = None) -> tuple[str, ...]:
    """Names the dataset function may have: `--feed` (ElasticDL's flag), else
    `dataset_fn` or ElasticDL's `feed`."""
    return (feed,) if feed else ("dataset_fn", "feed")


def check_model_def(model_def: str, model_zoo: str | None = None,
                    feed: str | None = None) -> str:
    """Checks that the module exists and defines the function and `dataset_fn`
    (or `feed`); returns the module's file. Imports nothing."""
    module, function = _split(model_def, model_zoo)
    path = _source_path(module, zoo_dir(model_def, model_zoo))
    names = _top_level_names(path)
    shown = module or path
    if function not in names:
        raise ModelDefError(f"--model_def: module '{shown}' ({path}) does not "
                            f"define '{function}' (the model function)")
    candidates = dataset_fn_names(feed)
    if not any(n in names for n in candidates):
        what = (f"'{feed}' (--feed)" if feed else "'dataset_fn' (dataset_fn(records, "
                "mode)) or 'feed' (ElasticDL's feed(dataset, mode, metadata))")
        raise ModelDefError(f"--model_def: module '{shown}' ({path}) does not define "
                            f"{what}")
    return path


def load_model_def(model_def: str, model_zoo: str | None = None,
                   feed: str | None = None) -> tuple[ModuleType, Any, Any]:
    """Imports the module (ElasticDL's `elasticdl.*` imports served meanwhile);
    returns it, the model function (or class) and the dataset function."""
    from keras_elastic.jobs import tf_op_layers
    from keras_elastic.jobs.elasticdl_compat import elasticdl_imports

    # Modules written for Keras 2 call TensorFlow functions on symbolic
    # tensors (ElasticDL's deepfm: tf.reshape, K.sum): made layers, as Keras 2 did.
    tf_op_layers.enable()
    module_name, function = _split(model_def, model_zoo)
    zoo = zoo_dir(model_def, model_zoo)
    path = _source_path(module_name, zoo)
    with elasticdl_imports():
        if zoo is not None:
            module = _import_from_zoo(module_name, path, zoo)
        elif module_name.endswith(".py"):
            spec = importlib.util.spec_from_file_location("model_def", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    shown = module_name or path
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ModelDefError(f"--model_def: '{shown}.{function}' is not a function "
                            "or class")
    dataset_fn = next((getattr(module, n) for n in dataset_fn_names(feed)
                       if callable(getattr(module, n, None))), None)
    if dataset_fn is None:
        raise ModelDefError(f"--model_def: module '{shown}' does not define "
                            + (f"'{feed}' (--feed)" if feed else
                               "dataset_fn(records, mode) or feed(dataset, mode, "
                               "metadata)"))
    return module, fn, dataset_fn


def _import_from_zoo(module_name: str, path: str, zoo: str) -> ModuleType:
    """Imports `module_name` from the zoo directory `zoo` (first on sys.path;
    its parent last, for modules that import `model_zoo.x.y`)."""
    if os.path.isfile(zoo) or module_name.endswith(".py"):
        name = "model_def"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    if zoo in sys.path:
        sys.path.remove(zoo)
    sys.path.insert(0, zoo)
    parent = os.path.dirname(zoo)
    if parent not in sys.path:
        sys.path.append(parent)
    module = importlib.import_module(module_name)
    found = getattr(module, "__file__", None)
    if not found or not os.path.samefile(found, path):
        raise ModelDefError(f"--model_def: importing '{module_name}' from the model "
                            f"zoo {zoo} found {found} instead of {path} (another "
                            "module of that name comes first)")
    return module


def parse_model_params(text: str | None) -> dict[str, Any]:
    """ElasticDL's `--model_params="a=1; b='x'"`: keyword arguments of
    `custom_model` (Python literals, else strings)."""
    params: dict[str, Any] = {}
    for item in (text or "").split(";"):
        if not item.strip():
            continue
        key, sep, value = item.strip().partition("=")
        if not sep or not key.strip().isidentifier():
            raise ValueError(f"--model_params: {item.strip()!r} is not name=value")
        try:
            params[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            params[key.strip()] = value.strip()
    return params

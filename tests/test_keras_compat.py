"""Keras' private API is reached through one file, checked against the Keras
releases setup.py accepts (issue 24: one seam for Keras internals)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import keras
import pytest
from conftest import subprocess_env

from keras_elastic.common import keras_compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEAM = os.path.join("keras_elastic", "common", "keras_compat.py")


def library_files():
    for top in ("keras_elastic", "callbacks"):
        for folder, _, names in os.walk(os.path.join(ROOT, top)):
            for name in names:
                if name.endswith(".py") and "_pb2" not in name:
                    yield os.path.relpath(os.path.join(folder, name), ROOT)


def keras_src_uses(path: str) -> list[int]:
    """Lines of `path` that import keras.src or reach it as an attribute."""
    tree = ast.parse(open(os.path.join(ROOT, path)).read(), path)
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "keras.src"):
            lines.append(node.lineno)
        elif isinstance(node, ast.Import) and any(
                a.name.startswith("keras.src") for a in node.names):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Attribute) and node.attr == "src"
              and isinstance(node.value, ast.Name) and node.value.id == "keras"):
            lines.append(node.lineno)
    return lines


def test_keras_src_is_used_in_the_seam_only():
    files = list(library_files())
    assert SEAM in files and len(files) > 50
    assert keras_src_uses(SEAM)  # the seam itself does use it
    outside = {path: lines for path in files if path != SEAM
               for lines in [keras_src_uses(path)] if lines}
    assert outside == {}, f"keras.src used outside {SEAM}: {outside}"


PRIVATE = re.compile(r"\._(flatten_layers|symbolic_build|compute_loss|compile_loss|"
                     r"compile_metrics|loss_tracker|call_has_training_arg|tracker|"
                     r"get_iterator)\b")


def test_keras_private_model_methods_are_called_in_the_seam_only():
    outside = {}
    for path in library_files():
        if path == SEAM:
            continue
        text = open(os.path.join(ROOT, path)).read()
        found = sorted({m.group(0) for m in PRIVATE.finditer(text)})
        if found:
            outside[path] = found
    assert outside == {}


def test_the_installed_keras_is_a_checked_release_and_setup_py_accepts_only_those():
    keras_compat.check_keras_version()
    setup = open(os.path.join(ROOT, "setup.py")).read()
    low, high = re.search(r'"keras>=([\d.]+),<([\d.]+)"', setup).groups()
    assert (low, high) == (keras_compat.KERAS_CHECKED[0],
                           keras_compat._next_minor(keras_compat.KERAS_CHECKED[-1]))
    assert ".".join(keras.__version__.split(".")[:2]) in keras_compat.KERAS_CHECKED
    low, high = re.search(r'"tensorflow>=([\d.]+),<([\d.]+)"', setup).groups()
    assert (low, high) == (keras_compat.TENSORFLOW_CHECKED[0], keras_compat._next_minor(
        keras_compat.TENSORFLOW_CHECKED[-1]))


@pytest.mark.parametrize("version", ["3.3.3", "3.99.0", "2.15.0"])
def test_an_unchecked_keras_release_is_a_clear_error(version, monkeypatch):
    monkeypatch.delenv(keras_compat.UNCHECKED_ENV, raising=False)
    with pytest.raises(keras_compat.UnsupportedKerasError) as e:
        keras_compat.check_keras_version(version)
    message = str(e.value)
    assert f"found keras {version}" in message
    assert "pip install 'keras>=3.15,<3.16'" in message
    assert keras_compat.UNCHECKED_ENV in message
    monkeypatch.setenv(keras_compat.UNCHECKED_ENV, "1")
    keras_compat.check_keras_version(version)  # at the user's own risk


def test_an_unchecked_tensorflow_release_is_a_clear_error(monkeypatch):
    monkeypatch.delenv(keras_compat.UNCHECKED_ENV, raising=False)
    with pytest.raises(keras_compat.UnsupportedKerasError,
                       match=r"found tensorflow 2\.17\.0: install a checked release "
                             r"\(pip install 'tensorflow>=2\.21,<2\.22'\)"):
        keras_compat.check_keras_version(keras.__version__, "2.17.0")


@pytest.mark.multiprocess
def test_importing_the_library_with_an_unchecked_keras_names_it():
    """In a fresh process whose Keras says it is 3.99.0, the first use of the
    library (a wrapped model) stops with the seam's error, not a traceback
    from deep in Keras."""
    script = ("import keras; keras.__version__ = '3.99.0'\n"
              "import keras_elastic as ke\n"
              "try:\n"
              "    ke.wrap(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))\n"
              "except ImportError as e:\n"
              "    print('REFUSED', type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=subprocess_env(), cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "REFUSED UnsupportedKerasError" in out.stdout
    assert "found keras 3.99.0" in out.stdout


def test_flat_call_gives_the_public_call_s_result_also_without_the_private_one():
    import tensorflow as tf

    v = tf.Variable([1.0, 2.0])

    @tf.function(autograph=False)
    def f(xs, ys):
        v.assign_add(xs[0])
        return [v.read_value() * ys[0], xs[1]]

    concrete = f.get_concrete_function([tf.TensorSpec((2,)), tf.TensorSpec(())],
                                       [tf.TensorSpec(())])
    args = [tf.constant([1.0, 1.0]), tf.constant(5.0), tf.constant(3.0)]
    fast = [t.numpy().tolist() for t in keras_compat.flat_call(concrete)(args)]

    class Public:  # a concrete function as seen through its public API only
        structured_input_signature = concrete.structured_input_signature

        def __call__(self, *a):
            return concrete(*a)

    public = [t.numpy().tolist() for t in keras_compat.flat_call(Public())(args)]
    assert fast == [[6.0, 9.0], 5.0]
    assert public == [[9.0, 12.0], 5.0]  # (the variable moved on once more)

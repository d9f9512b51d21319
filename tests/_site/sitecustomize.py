"""Start-up of the test suite's child processes (on their PYTHONPATH through
`conftest.subprocess_env`): Keras' optional scikit-learn wrappers go without
scikit-learn.

`import tensorflow` imports all of Keras, and Keras' `keras.wrappers`
(`SKLearnClassifier` and the like) import scikit-learn and SciPy when they are
installed: 1.4 s of CPU in each of the suite's hundreds of TensorFlow
processes (a quarter of a worker's start), for wrappers no test process uses.
Only those imports are refused, as if scikit-learn were absent for them (Keras
handles that); a script that imports scikit-learn itself (the digits example
loads its data with it) gets it as usual. The parameter server's own entry
point does the same for all of scikit-learn (keras_elastic/ps/__main__.py).
"""

import sys

_REFUSED_FOR = "keras.src.wrappers"
_IMPORT_MACHINERY = ("importlib._bootstrap", "importlib._bootstrap_external",
                     "_frozen_importlib", "_frozen_importlib_external")


class _NoScikitLearnForKerasWrappers:
    """A `sys.meta_path` finder refusing `sklearn` to Keras' wrappers only."""

    def find_spec(self, name, path=None, target=None):
        if name != "sklearn" and not name.startswith("sklearn."):
            return None
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__") in _IMPORT_MACHINERY:
            frame = frame.f_back
        importer = frame.f_globals.get("__name__", "") if frame is not None else ""
        if importer.startswith(_REFUSED_FOR):
            raise ModuleNotFoundError(
                f"scikit-learn is not imported for {importer} in the test suite's "
                "child processes (tests/_site/sitecustomize.py)", name=name)
        return None


sys.meta_path.insert(0, _NoScikitLearnForKerasWrappers())

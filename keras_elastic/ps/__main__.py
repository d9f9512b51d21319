"""`python -m keras_elastic.ps`: a parameter server as a process."""

import sys

# Keras imports scikit-learn (and SciPy) for its sklearn wrappers when it is
# installed: 1.5 s of a server's start, for nothing a server uses. A server
# runs no user code but optimizer configs, so it goes without them.
sys.modules.setdefault("sklearn", None)

from absl import app  # noqa: E402

from keras_elastic.ps.server import define_flags, main  # noqa: E402

if __name__ == "__main__":
    define_flags()
    app.run(main)

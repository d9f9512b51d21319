"""keras-elastic: elastic, fault-tolerant parameter-server training for Keras 3.

`pip install -e .` (or `pip install .`) installs the library and its console
script `keras-elastic`. (The top-level `callbacks/` folder is a source-tree
re-export of `keras_elastic.callbacks`, not installed.) A GPU user installs
`.[gpu]`, which asks for TensorFlow with its CUDA libraries; the plain
`tensorflow` wheel runs on CPU.
`.[ray]` adds Ray, for `keras-elastic run --backend ray` (docs/ray.md); the
test extra includes it, so the test suite runs the Ray tests too.
"""

import os
import re
import subprocess
import sys

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def version() -> str:
    """keras_elastic.__version__, the one place the version is written: read
    from keras_elastic/__init__.py's text (importing the package would need
    its dependencies installed first)."""
    with open(os.path.join(HERE, "keras_elastic", "__init__.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"$', f.read(), re.M).group(1)


class BuildWithProtos(build_py):
    """Generates the gRPC modules before collecting the Python files."""

    def run(self):
        subprocess.check_call(
            [sys.executable, os.path.join("keras_elastic", "proto", "_generate.py")],
            cwd=HERE,
        )
        super().run()


packages = find_packages(include=["keras_elastic", "keras_elastic.*"])

setup(
    name="keras-elastic",
    version=version(),
    description="Elastic, fault-tolerant parameter-server training for Keras 3",
    long_description=open(os.path.join(HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=packages,
    package_data={"keras_elastic.proto": ["*.proto"]},
    # The ranges CI installs and tests, no wider: keras-elastic uses Keras'
    # private API (keras_elastic/common/keras_compat.py, checked against these
    # Keras releases; importing it with another says so), and the gRPC modules
    # are generated at build time by grpcio-tools for the protobuf runtime it
    # requires.
    install_requires=[
        "tensorflow>=2.21,<2.22",
        "keras>=3.15,<3.16",
        "grpcio>=1.85",
        "grpcio-tools>=1.85",
        # grpc.health.v1: the launcher's liveness checks of the master and the
        # parameter servers (and any standard gRPC health probe).
        "grpcio-health-checking>=1.85",
        "protobuf>=7.35,<8",
        "absl-py>=2.0",
        # ElasticDataset.from_tfds and ArrayRecord files: the project's named
        # packages, installed with it.
        "tensorflow-datasets>=4.9.10",
        "array-record>=0.8",
        "cloudpickle>=2.0",
        "numpy>=1.24",
        "cryptography>=41",  # a job's self-signed TLS certificate
        # keras.callbacks.TensorBoard needs it; TensorFlow 2.21 no longer
        # installs it.
        "tensorboard>=2.16",
    ],
    extras_require={
        "gpu": ["tensorflow[and-cuda]>=2.21,<2.22"],
        # Kept for scripts that install .[datasets]: both are requirements now.
        "datasets": [],
        "examples": ["scikit-learn>=1.2"],
        "ray": ["ray>=2.9"],  # --backend ray
        # bench/bench_training.py's tf_pss: TensorFlow's own parameter servers.
        "bench": ["tf-keras>=2.21,<2.22"],
        # pytest-xdist: the README's test command runs two test files at once.
        # pandas: fit on DataFrames, as Keras takes them (tests/test_keras_semantics.py).
        "test": ["pytest>=7", "pytest-xdist>=3", "hypothesis>=6", "scikit-learn>=1.2",
                 "ruff>=0.4", "ray>=2.9", "tf-keras>=2.21,<2.22", "pandas>=2"],
    },
    entry_points={"console_scripts": ["keras-elastic=keras_elastic.cli:run_main"]},
    cmdclass={"build_py": BuildWithProtos},
)

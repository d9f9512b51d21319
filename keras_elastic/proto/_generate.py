"""Generates the gRPC modules of `keras_elastic.proto` from its `.proto` files.

Run as a script (it imports nothing of keras_elastic, whose `proto` package
needs the modules it makes): by `setup.py` when the package is installed, or
by hand after a `.proto` file was edited:

    python keras_elastic/proto/_generate.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

_HERE = os.path.dirname(os.path.abspath(__file__))
_PROTOS = ("tensor", "master", "ps", "fencing")


def _stale(name: str) -> bool:
    proto = os.path.join(_HERE, f"{name}.proto")
    outputs = [os.path.join(_HERE, f"{name}_pb2.py"),
               os.path.join(_HERE, f"{name}_pb2_grpc.py")]
    return any(
        not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(proto)
        for out in outputs
    )


def generate(force: bool = False) -> None:
    """Generates the Python modules of every `.proto` file in this package.

    Writes into a temporary directory and renames into place, so that
    processes importing the package at the same time never see a half-written
    module.
    """
    if not force and not any(_stale(name) for name in _PROTOS):
        return
    try:
        import grpc_tools
    except ImportError as e:  # pragma: no cover - grpcio-tools is a dependency
        raise ImportError(
            "keras_elastic needs `grpcio-tools` to generate its gRPC code: "
            "`pip install grpcio-tools`."
        ) from e

    root = os.path.dirname(os.path.dirname(_HERE))  # the folder holding keras_elastic/
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    with tempfile.TemporaryDirectory(dir=_HERE) as tmp:
        # In a subprocess: protoc's C++ runtime crashes next to TensorFlow's.
        args = [
            sys.executable, "-m", "grpc_tools.protoc",
            f"-I{root}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
        ] + [os.path.join(root, "keras_elastic", "proto", f"{n}.proto") for n in _PROTOS]
        result = subprocess.run(args, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"protoc failed to compile {_PROTOS} in {_HERE}:\n"
                               f"{result.stderr}")
        out_dir = os.path.join(tmp, "keras_elastic", "proto")
        for fname in sorted(os.listdir(out_dir)):
            os.replace(os.path.join(out_dir, fname), os.path.join(_HERE, fname))



if __name__ == "__main__":
    generate(force=True)
    print(f"generated the gRPC modules of keras_elastic.proto in {_HERE}")

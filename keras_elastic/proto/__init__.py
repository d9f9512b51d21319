"""Protocol buffers and gRPC stubs of the keras-elastic services.

May import: nothing.

The `*_pb2.py` / `*_pb2_grpc.py` modules are generated from the `.proto` files
beside this file by `grpcio-tools` when the package is installed (`setup.py`)
or built (Bazel's `//:proto_modules`), so that the generated code matches the
protobuf runtime installed with it. Importing never writes files: without the
modules (or, in a source checkout, with a `.proto` newer than them) it stops
with an error that says to run `python keras_elastic/proto/_generate.py`.

Example:

>>> from keras_elastic.proto import master_pb2
>>> master_pb2.GetTaskResponse.WAIT
1
"""

from __future__ import annotations

import importlib
import os

from keras_elastic.proto._generate import _HERE, _PROTOS, _stale, generate


def _check_generated() -> None:
    """Refuses to go on without generated modules, or, in a source checkout,
    with modules older than their `.proto` files (an edited protocol)."""
    root = os.path.dirname(os.path.dirname(_HERE))
    checkout = os.path.exists(os.path.join(root, "setup.py"))
    missing = [n for n in _PROTOS if not os.path.exists(
        os.path.join(_HERE, f"{n}_pb2.py"))]
    stale = [n for n in _PROTOS if checkout and n not in missing and _stale(n)]
    if missing or stale:
        what = (f"missing ({', '.join(missing)})" if missing
                else f"older than their .proto files ({', '.join(stale)})")
        raise ImportError(
            f"the gRPC modules of keras_elastic.proto in {_HERE} are {what}. They "
            "are generated when the package is installed (pip install -e . in a "
            "source checkout) or built (Bazel's //:proto_modules); to generate "
            f"them now: python {os.path.join(_HERE, '_generate.py')}")


_check_generated()

tensor_pb2 = importlib.import_module("keras_elastic.proto.tensor_pb2")
master_pb2 = importlib.import_module("keras_elastic.proto.master_pb2")
master_pb2_grpc = importlib.import_module("keras_elastic.proto.master_pb2_grpc")
ps_pb2 = importlib.import_module("keras_elastic.proto.ps_pb2")
ps_pb2_grpc = importlib.import_module("keras_elastic.proto.ps_pb2_grpc")

__all__ = ["generate", "master_pb2", "master_pb2_grpc", "ps_pb2", "ps_pb2_grpc",
           "tensor_pb2"]

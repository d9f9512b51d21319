"""What a parameter server's store refuses, as errors a worker is told (the
servicer turns them into gRPC statuses: ps/servicer.py).

>>> str(UnknownVariableError(["b", "a"]))
"this parameter server does not own ['a', 'b']"
"""

from __future__ import annotations

from keras_elastic.common import errors

NOT_INITIALIZED = ("the parameter server has not been initialized: a worker must call "
                   "init before pushing")


class UnknownVariableError(errors.NotOwnedError):
    """Names of variables this server does not hold (`names`)."""

    def __init__(self, names: list[str]) -> None:
        self.names = sorted(names)
        super().__init__(f"this parameter server does not own {self.names}")


class UnknownOptimizerError(errors.ServerStateError):
    """A push for an optimizer group this server was not told about."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"this parameter server has no optimizer '{name}': the push "
                         "must carry its spec (config and variables)")

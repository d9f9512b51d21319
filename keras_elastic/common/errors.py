"""The errors keras-elastic raises on purpose, and how a server answers them.

Every such error derives from `KerasElasticError`, through one family:

- `ClusterError`: the job's roles and their contracts (a worker the master
  lost, a task no longer held, a server not initialized, a stale lease, a
  process that did not start);
- `CheckpointError`: a checkpoint that cannot be written, found or restored;
- `DataError`: records, files, tensors or a `dataset_fn` that are not what
  the job needs;
- `JobError`: a job's definition, flags or environment (a model definition,
  a wrong flag, a corrupt master journal, an unchecked Keras release).

Each class keeps the built-in exception it always was as a second base
(`ValueError`, `RuntimeError`, `KeyError`), so `except ValueError` in a
user's script still catches what it caught. A server answers each error with
the gRPC status code of its class (`grpc_code`), chosen here in one place by
`status_code(error)`: a plain `ValueError`/`TypeError` of a server's own
request checks is INVALID_ARGUMENT, and any other exception that is not a
`KerasElasticError` is a bug of the server, answered INTERNAL (never, as
before, FAILED_PRECONDITION for any `RuntimeError`).

Example:

>>> from keras_elastic.common import errors
>>> class Refused(errors.ClusterError, RuntimeError):
...     pass
>>> errors.status_code(Refused("no")).name
'FAILED_PRECONDITION'
>>> errors.status_code(ZeroDivisionError()).name
'INTERNAL'
"""

from __future__ import annotations

import grpc


class KerasElasticError(Exception):
    """Base of every error keras-elastic raises on purpose."""

    # The status a gRPC server answers with when a request raises this.
    grpc_code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION


class ClusterError(KerasElasticError):
    """The job's roles or their contracts: membership, tasks, leases, the
    servers' state, processes that do not start."""


class CheckpointError(KerasElasticError):
    """Base of `keras_elastic.checkpoint.CheckpointError`."""

    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class DataError(KerasElasticError):
    """Records, files, tensors or a `dataset_fn` the job cannot use."""

    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class JobError(KerasElasticError):
    """A job's definition, flags or environment."""


# What the master answers a worker it presumed lost; the worker's client
# raises `master.client.WorkerLostError` for an answer that has it.
PRESUMED_LOST = "is not part of the job (presumed lost)"


def presumed_lost(worker_id: int) -> str:
    """The master's answer to worker `worker_id`, presumed lost.

    >>> presumed_lost(2)
    'worker 2 is not part of the job (presumed lost); restart it to rejoin'
    """
    return f"worker {worker_id} {PRESUMED_LOST}; restart it to rejoin"


class ServerStateError(ClusterError, RuntimeError):
    """A server is not in the state a request needs (for example a push
    before the model initialized it)."""


class NotOwnedError(ClusterError, KeyError):
    """A request names something this server does not hold."""

    grpc_code = grpc.StatusCode.NOT_FOUND

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def status_code(error: BaseException) -> grpc.StatusCode:
    """The gRPC status a server answers `error` with: its class's `grpc_code`
    for a `KerasElasticError`, INVALID_ARGUMENT for a request the server's
    own checks refused with a plain `ValueError`/`TypeError` (a malformed
    message), else INTERNAL (a bug: nothing the caller can fix)."""
    if isinstance(error, KerasElasticError):
        return error.grpc_code
    if isinstance(error, (ValueError, TypeError)):
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.INTERNAL

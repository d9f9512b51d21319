"""Where a job's roles run: this machine (`local`) or a Ray cluster (`ray`).

`make_backend(config)` picks the backend of a `LaunchConfig`. The Ray backend
imports Ray only when chosen (an optional extra: `pip install
"keras-elastic[ray]"`).

Example:

>>> from keras_elastic.launcher.config import LaunchConfig
>>> backend = make_backend(LaunchConfig(backend="local"))
>>> backend.name, backend.describe()
('local', 'local processes, services on 127.0.0.1, warm starts')
"""

from __future__ import annotations

from keras_elastic.launcher.backends.base import (
    Backend,
    BackendError,
    ProcessStartError,
    RoleHandle,
)
from keras_elastic.launcher.backends.local import LocalBackend, ManagedProcess
from keras_elastic.launcher.backends.services import start_service, start_services

BACKENDS = ("local", "ray")

__all__ = ["BACKENDS", "Backend", "BackendError", "LocalBackend", "ManagedProcess",
           "ProcessStartError", "RoleHandle", "make_backend", "start_service",
           "start_services"]


def make_backend(config) -> Backend:
    """The backend of `config` (a LaunchConfig); BackendError when it cannot
    be used (e.g. Ray is not installed)."""
    if config.backend == "local":
        return LocalBackend(config.bind, config.advertise, warm=config.warm_start)
    if config.backend == "ray":
        from keras_elastic.launcher.backends.ray import RayBackend

        return RayBackend(address=config.ray_address,
                          resources={"master": config.master_resources,
                                     "ps": config.ps_resources,
                                     "worker": config.worker_resources})
    raise BackendError(f"--backend={config.backend!r}: choose among {BACKENDS}")

"""Starts the processes of a job and keeps it alive (like torchrun).

Roles run on a backend (`backends/`): processes of this machine, or Ray
actors on the nodes of a Ray cluster (`--backend ray`).

May import: common, proto, master, ps, checkpoint. Of master and ps: their
clients; of checkpoint: the PS checkpoint manifests. Never TensorFlow: the
launcher stays light (tests/test_architecture.py checks both). Ray (an
optional extra) only when the Ray backend is chosen.
"""

from keras_elastic.launcher.config import LaunchConfig
from keras_elastic.launcher.launcher import Launcher

__all__ = ["LaunchConfig", "Launcher"]

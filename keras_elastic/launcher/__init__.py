"""Starts the processes of a job and keeps it alive (like torchrun).

May import: keras_elastic.common, keras_elastic.master (client). Never
TensorFlow: the launcher stays light.
"""

from keras_elastic.launcher.launcher import LaunchConfig, Launcher

__all__ = ["LaunchConfig", "Launcher"]

"""`model.save`, `save_weights` and `keras.saving.save_model` in a job: the
chief writes the file.

Every worker of a launched job runs the script, so a script's
`model.save("my_model.keras")` would have every worker write the same file
at once (a torn zip, an HDF5 lock). As for Keras' file-writing callbacks
(`worker/file_callbacks.py`) and tf_keras' multi-worker convention
(`distributed_file_utils`), the chief (`keras_elastic.worker.is_chief`)
writes the path the script names; every other worker writes a temporary
one of its own under the job directory (`callback-files/worker-<id>/`),
which it deletes, and returns only once the chief's file is written: a
script that loads the file right after saving it (keras.io's serialization
guide) reads the chief's whole file on every worker, as after a plain Keras
save. Every worker saves the same model (the job's weights).

Outside a launched job (a plain process, an embedded cluster) and during
an elastic `fit` (where `ModelCheckpoint` and `BackupAndRestore` are adapted
by `worker/file_callbacks.py`), Keras saves as it always does.

Example (what the script does; nothing to change):

>>> import keras
>>> import keras_elastic as ke
>>> model = ke.wrap(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
>>> model.save("my_model.keras")       # a plain process: Keras' own save
>>> restored = keras.models.load_model("my_model.keras")
>>> [w.shape for w in restored.get_weights()]
[(2, 1), (1,)]
"""

from __future__ import annotations

import os
import shutil

from keras_elastic.common import cluster_env, keras_compat


def _save(save, model, filepath, *args, **kwargs):
    """Keras' `save` (`save_model` or `save_weights`) of `model` to
    `filepath`, by the chief in a job (see the module doc)."""
    from keras_elastic.worker.session import session_of

    session = session_of(model)
    if cluster_env.read() is None or (session is not None and session.training):
        return save(model, filepath, *args, **kwargs)
    from keras_elastic.worker import chief
    from keras_elastic.worker.cluster import get_cluster, is_chief
    from keras_elastic.worker.file_callbacks import scratch_dir

    cluster = get_cluster()
    count = cluster.__dict__.get("_ke_saves", 0) + 1
    cluster.__dict__["_ke_saves"] = count
    if is_chief(cluster):
        out = save(model, filepath, *args, **kwargs)
        chief.reach(cluster, "saved", count)
        return out
    temp_dir = os.path.join(scratch_dir(cluster), f"worker-{cluster.worker_id}",
                            f"save-{count}")
    os.makedirs(temp_dir, exist_ok=True)
    try:
        save(model, os.path.join(temp_dir, os.path.basename(str(filepath))),
             *args, **kwargs)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    chief.wait_for_chief(cluster, "saved", count, what=f"save {filepath}",
                         then="going on without the chief's file")
    return None


def route_saving() -> None:
    """Routes Keras' saving functions through `_save` (once per process)."""
    keras_compat.route_saving(_save)

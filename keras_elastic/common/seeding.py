"""Every worker of a job starts its random generators from the job's seed.

A Keras script often builds its data with unseeded randomness
(`np.random.permutation`, `np.random.randint`, `random.shuffle`: keras.io's
time-series and addition-RNN examples do). Every worker of a job runs the
script, so each would build other data; the master refuses them (a
fingerprint of each array's content: `data/fingerprint.py`), but the user
never asked for seeds. So when `keras_elastic` is imported in a launched
worker, its global generators (Python's `random`, NumPy's global one,
TensorFlow's and Keras' through `keras.utils.set_random_seed`) are seeded
with the job's seed, which the launcher chooses once (`--seed`, else at
random) and keeps in `JOB_DIR/cluster.json` for relaunched, joining and
resumed workers alike. A script that seeds itself later does as it says;
a plain process (no job) is left alone.

Example (what `import keras_elastic` does in a launched worker):

>>> seed_from_job()   # outside a job: nothing
False
"""

from __future__ import annotations

from keras_elastic.common import cluster_env


def seed_from_job() -> bool:
    """Seeds the global random generators with the job's seed; False (and
    nothing done) outside a launched job."""
    seed = cluster_env.seed()
    if seed is None:
        return False
    import keras

    keras.utils.set_random_seed(seed)
    return True

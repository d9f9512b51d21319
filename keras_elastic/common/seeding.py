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

A script may also reseed from the machine's entropy (`np.random.seed()`,
`random.seed()` with no seed: Keras' own `test_utils.get_test_data` does);
each worker would then draw other data again. In a launched worker the k-th
such call takes a seed derived from the job's instead (the same k-th call
on every worker: the same seed), so "a new random state" stays the job's.

Example (what `import keras_elastic` does in a launched worker):

>>> seed_from_job()   # outside a job: nothing
False
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from keras_elastic.common import cluster_env


def seed_from_job() -> bool:
    """Seeds the global random generators with the job's seed, and makes a
    reseed from entropy the job's (see the module doc); False (and nothing
    done) outside a launched job."""
    seed = cluster_env.seed()
    if seed is None:
        return False
    import random

    import keras

    keras.utils.set_random_seed(seed)
    np.random.seed = _job_entropy(np.random.seed, seed, 1)
    random.seed = _job_entropy(random.seed, seed, 2)
    return True


def _job_entropy(reseed: Callable, seed: int, stream: int) -> Callable:
    """`reseed` (`np.random.seed`, `random.seed`) whose k-th call without a
    seed gets one derived from the job's `seed` (in `stream`: one per
    generator) instead of the machine's entropy."""
    if getattr(reseed, "_ke_job_entropy", False):
        return reseed
    calls = itertools.count(1)

    def seeded(*args, **kwargs):
        if not args or args[0] is None:
            derived = np.random.SeedSequence([seed, stream, next(calls)])
            args = (int(derived.generate_state(1)[0]), *args[1:])
        return reseed(*args, **kwargs)

    seeded._ke_job_entropy = True
    seeded.__doc__ = reseed.__doc__
    return seeded

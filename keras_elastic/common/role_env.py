"""A role's environment, in one place, and the one call that enters the job.

The launcher describes the job to every process it starts through
`KERAS_ELASTIC_*` environment variables. `VARIABLES` names each of them and
the module that reads it (tests/test_warm_start.py checks the list is
whole); `enter_job()` is what a process does to become part of its
job: it ties itself to the launcher (`launcher_tie`), seeds its random
generators from the job's (`seeding`) and forgets what an earlier reading of
the environment left in this process (the fault plan; the job's resolvers).

`import keras_elastic` calls `enter_job()` in a process started afresh. A
warm process (`keras_elastic.launcher.warm`) imported keras_elastic before
it knew its role, so it calls `enter_job()` itself once its environment is
the role's: whatever the import would have done is then done, with the
role's environment. Everything else reads the environment when used, never
at import (tests/test_warm_start.py checks that importing what a warm
process imports reads none of these variables' values into a module).

Example:

>>> VARIABLES["KERAS_ELASTIC_SEED"]
"common/seeding.py: the job's seed"
>>> enter_job()      # outside a launched job: nothing to do
False
"""

from __future__ import annotations

# Every variable of the contract, with the module that owns its meaning.
VARIABLES = {
    "KERAS_ELASTIC_MASTER": "common/cluster_env.py: the master's address",
    "KERAS_ELASTIC_PS": "common/cluster_env.py: the servers' addresses",
    "KERAS_ELASTIC_WORKER_ID": "common/cluster_env.py: this worker's id",
    "KERAS_ELASTIC_JOB_DIR": "common/cluster_env.py: the job directory",
    "KERAS_ELASTIC_CONNECT_TIMEOUT": "common/cluster_env.py",
    "KERAS_ELASTIC_LIVENESS_TIMEOUT": "common/cluster_env.py",
    "KERAS_ELASTIC_SEED": "common/seeding.py: the job's seed",
    "KERAS_ELASTIC_REPLACES": "common/cluster_env.py: the worker a relaunch replaces",
    "KERAS_ELASTIC_LAUNCHER_PID": "common/launcher_tie.py",
    "KERAS_ELASTIC_TOKEN": "common/auth.py: the job's token",
    "KERAS_ELASTIC_TLS": "common/tls.py",
    "KERAS_ELASTIC_TLS_CERT": "common/tls.py",
    "KERAS_ELASTIC_TLS_KEY": "common/tls.py",
    "KERAS_ELASTIC_TLS_CA": "common/tls.py",
    "KERAS_ELASTIC_TLS_SERVER_NAME": "common/tls.py",
    "KERAS_ELASTIC_INSECURE": "common/tls.py",
    "KERAS_ELASTIC_GENERATION": "common/fencing.py",
    "KERAS_ELASTIC_PS_PARTITION_BYTES": "ps/partition.py",
    "KERAS_ELASTIC_FAULTS": "common/faults.py: the fault plan",
    "KERAS_ELASTIC_FAULTS_DIR": "common/faults.py",
    "KERAS_ELASTIC_ALLOW_UNCHECKED_KERAS": "common/keras_compat.py",
    "KERAS_ELASTIC_INDEX_DIR": "data/tfrecord_index.py",
    "KERAS_ELASTIC_WARM_START": "launcher/warm/: 0 turns warm processes off",
    "KERAS_ELASTIC_WARM_SOCKET": "launcher/warm/: a shared warm process' socket",
}


def forget_readings() -> None:
    """Drops what this process kept from reading the environment (the fault
    plan, the job's resolvers): they are read again, from the environment
    as it is now, when next used."""
    from keras_elastic.common import faults, launcher_tie, resolver

    faults.set_role(None)
    resolver.forget()
    launcher_tie.forget()


def enter_job() -> bool:
    """Makes this process part of the job its environment names: tied to the
    launcher, its random generators seeded from the job's seed, nothing kept
    from an earlier environment. Returns whether it was launched."""
    from keras_elastic.common import cluster_env
    from keras_elastic.common.launcher_tie import tie_to_launcher

    forget_readings()
    tied = tie_to_launcher()
    if cluster_env.seed() is not None:
        from keras_elastic.common.seeding import seed_from_job

        seed_from_job()
    return tied

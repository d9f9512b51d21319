"""Every worker of a job builds the same data from unseeded randomness (issue
40): the launcher's `--seed` (or a random seed kept in JOB_DIR/cluster.json)
seeds each worker's global generators when keras_elastic is imported,
relaunched workers included, and a reseed from entropy (`np.random.seed()`)
is the job's too (keras_elastic/common/seeding.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, launch, subprocess_env

SCRIPT = os.path.join(REPO, "tests", "scripts", "unseeded_script.py")


def results(job_dir: str) -> dict[str, dict]:
    out = {}
    for name in sorted(os.listdir(job_dir)):
        if name.startswith("worker-") and name.endswith(".log"):
            with open(os.path.join(job_dir, name)) as f:
                lines = [line for line in f if line.startswith("RESULT ")]
            if lines:
                out[name] = json.loads(lines[-1][len("RESULT "):])
    return out


def draws_after_seeding(seed: int) -> dict:
    """The first draws of a plain process that called
    `keras.utils.set_random_seed(seed)` (no job, no keras_elastic)."""
    code = ("import keras, sys; sys.path.insert(0, 'tests/scripts'); "
            f"keras.utils.set_random_seed({seed}); import unseeded_script as s; "
            "import json; print(json.dumps(s.first_draws()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=subprocess_env(),
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.multiprocess
def test_workers_build_the_same_data_from_the_seed_given(tmp_path):
    job = str(tmp_path / "job")
    result = launch(job, SCRIPT, "--num_workers=2", "--num_ps=1", "--seed=1234",
                    "--max_worker_restarts=0", timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    found = results(job)
    assert len(found) == 2, found
    first, second = found.values()
    assert first == second
    want = draws_after_seeding(1234)
    assert {k: first[k] for k in want} == want
    assert json.load(open(os.path.join(job, "cluster.json")))["seed"] == 1234


@pytest.mark.multiprocess
def test_a_relaunched_worker_builds_the_same_data_from_the_jobs_seed(tmp_path):
    """No --seed: the launcher chooses one; worker 1, killed after its third
    push, comes back as worker 2 with the same seed (else the master would
    refuse its data, and the job fail)."""
    job = str(tmp_path / "job")
    faults = str(tmp_path / "faults")
    os.makedirs(faults)
    result = launch(job, SCRIPT, "--num_workers=2", "--num_ps=1",
                    "--max_worker_restarts=1", timeout=300,
                    env={"KERAS_ELASTIC_FAULTS": "after_push@3:w1",
                         "KERAS_ELASTIC_FAULTS_DIR": faults})
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    found = results(job)
    assert set(found) == {"worker-0.log", "worker-2.log"}, found  # 1 was killed
    assert found["worker-0.log"] == found["worker-2.log"]
    seed = json.load(open(os.path.join(job, "cluster.json")))["seed"]
    want = draws_after_seeding(seed)
    assert {k: found["worker-0.log"][k] for k in want} == want

"""`model.save`, `save_weights` and `keras.saving.save_model` in a job (issue
40): the chief writes the file, the other workers a temporary one, and every
worker's save returns once the chief's file is written, so that a script
loading it right after reads the whole file (keras_elastic/worker/saving.py)."""

from __future__ import annotations

import json
import os

import pytest
from conftest import REPO, launch

SCRIPT = os.path.join(REPO, "tests", "scripts", "saving_script.py")


@pytest.mark.multiprocess
def test_the_chief_writes_each_saved_file_once(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    job = str(tmp_path / "job")
    result = launch(job, SCRIPT, "--num_workers=2", "--num_ps=1",
                    script_args=(str(out),), timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    found = []
    for name in sorted(os.listdir(job)):
        if name.startswith("worker-") and name.endswith(".log"):
            lines = [line for line in open(os.path.join(job, name))
                     if line.startswith("RESULT ")]
            found += [json.loads(line[len("RESULT "):]) for line in lines]
    assert len(found) == 2 and sum(r["chief"] for r in found) == 1, found
    # One writer: each file was last written before either worker's save
    # returned, by the same write (two writers: each sees its own).
    assert found[0]["written"] == found[1]["written"], found
    assert all(all(r["same"].values()) for r in found), found
    assert sorted(os.listdir(out)) == ["function.keras", "model.keras",
                                       "model.weights.h5"]
    # The other worker's temporary files are gone.
    scratch = os.path.join(job, "callback-files")
    leftovers = [os.path.join(d, f) for d, _, files in os.walk(scratch) for f in files]
    assert not leftovers, leftovers

"""A damaged checkpoint is skipped, not the end of the job (issue 25, item 3).

The counting job's only parameter server freezes itself at a fault-injection
point (so no checkpoint comes after); the test damages the newest automatic
checkpoint on disk, then kills the server. The recovery skips the damaged
checkpoint, restores the newest intact one, the master rolls back to its
progress, and the model is exact. With every checkpoint damaged the job
stops with one error naming each, and no traceback.
"""

import json
import os
import signal

import pytest
from conftest import wait_for
from support.counting_jobs import check_exact, counting_job, write_data

from keras_elastic.checkpoint import layout

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(str(tmp_path_factory.mktemp("counting")))


def damage(info) -> None:
    """Flips a byte of each data file of every part of a PS checkpoint."""
    for part in info.extra["parts"]:
        part_info = layout.read_manifest(os.path.join(info.path, part))
        for name in part_info.checksums:
            if ".data-" in name:
                with open(os.path.join(part_info.path, name), "r+b") as f:
                    byte = f.read(1)
                    f.seek(0)
                    f.write(bytes([byte[0] ^ 0xFF]))


def frozen_job(tmp_path, data):
    """The job, once its parameter server froze; returns (out, proc, pid,
    the automatic checkpoints)."""
    out, proc = counting_job(
        tmp_path, data, "--num_ps=1", "--ps_checkpoint_secs=0",
        "--ps_checkpoint_versions=1", "--ps_checkpoints_to_keep=2",
        "--liveness_timeout=600", script_args=("--sleep_per_batch=0.05",),
        faults="ps_push@100:ps0=freeze", background=True)
    log = tmp_path / "job" / "ps-0.log"
    wait_for(lambda: log.exists() and "fault injection: freeze" in log.read_text()
             or proc.poll() is not None, timeout=300, what="the server frozen")
    assert proc.poll() is None, proc.stdout.read()[-4000:]
    pid = json.loads((tmp_path / "job" / "cluster.json").read_text())["ps_pids"][0]
    checkpoints = layout.list_checkpoints(str(tmp_path / "job" / "ps_checkpoints"))
    return out, proc, pid, checkpoints


def test_a_damaged_newest_checkpoint_falls_back_to_an_older_intact_one(
        tmp_path, data):
    out, proc, pid, checkpoints = frozen_job(tmp_path, data)
    try:
        names = [c.name for c in checkpoints]
        assert names[0] == "init" and len(names) >= 2, names
        newest, older = checkpoints[-1], checkpoints[-2]
        damage(newest)
        os.kill(pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, output[-4000:]
    assert f"checkpoint {newest.path} is damaged, skipped" in output
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["ps_recoveries"][0]["checkpoint"] == older.path, summary
    check_exact(tmp_path, out, output)


def test_every_checkpoint_damaged_is_one_clear_error(tmp_path, data):
    _, proc, pid, checkpoints = frozen_job(tmp_path, data)
    try:
        for info in checkpoints:
            damage(info)
        os.kill(pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, output[-4000:]
    failed = output[output.index("job FAILED"):]
    assert f"each of the {len(checkpoints)} is damaged" in failed
    for info in checkpoints:
        assert info.path in failed
    assert "Traceback" not in output

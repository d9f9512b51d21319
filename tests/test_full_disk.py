"""A full disk ends in one line, not a traceback (issue 25, item 4; issue 42).

The disk is a small tmpfs the test mounts (skipped only where no tmpfs can be
mounted at all: no permission to mount). Each case has the one outcome it
must have:

- the job directory on a disk full from the start: the job stops with one
  line (status 1) naming the file it could not write and the full disk;
- the automatic checkpoints' disk fills while the job trains (at the
  parameter server's N-th push, a `hold` fault point: the test fills the disk
  there, then lets the push go on): the checkpoints are skipped, the job
  finishes exact, and its summary (summary.json and the text the launcher
  prints) says how many were skipped and how old the newest recovery point
  is (README: "the summary says how old the newest recovery point is");
- the job directory's disk fills while the job trains (the same moment): the
  master cannot journal what it must not forget, and the job stops with one
  line naming the journal and the full disk.

The launcher prints no traceback in any case.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import time
import uuid

import pytest
from conftest import finish, wait_for
from support.counting_jobs import check_exact, counting_job, write_data

from keras_elastic.checkpoint import layout
from keras_elastic.common import faults

pytestmark = pytest.mark.multiprocess

# The server's 20th push (of 64 in an epoch): training under way, the
# initial model saved.
HOLD = "ps_push@20:ps0=hold"
# Mount errors that mean this machine lets nobody here mount a tmpfs.
NOT_PERMITTED = ("permission denied", "operation not permitted", "must be superuser",
                 "only root")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(str(tmp_path_factory.mktemp("counting")))


@pytest.fixture
def small_disk(tmp_path):
    """A 32 MB tmpfs at tmp_path/disk-*. Skipped only where mounting is not
    permitted; any other failure to mount fails the test."""
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    try:
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs",
                                 str(mount)], capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("cannot mount a tmpfs here: no mount command")
    if result.returncode != 0:
        if any(why in result.stderr.lower() for why in NOT_PERMITTED):
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
        pytest.fail(f"mount of a tmpfs failed: {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(directory) -> None:
    """Fills the filesystem of `directory` to the last byte: writes until the
    disk is full (a running job may write there meanwhile: no size is
    computed in advance)."""
    chunk = b"\0" * (1 << 20)
    fd = os.open(os.path.join(directory, f"filler-{uuid.uuid4().hex[:6]}"),
                 os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, chunk)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)


def launcher_lines(output: str) -> list[str]:
    """The launcher's own lines (the workers' are prefixed); none a traceback."""
    lines = [line for line in output.splitlines() if not line.startswith("[worker-")]
    assert not any("Traceback" in line for line in lines), output[-6000:]
    return lines


def test_a_job_directory_on_a_full_disk_stops_with_one_line(small_disk, data,
                                                             tmp_path):
    (small_disk / "job").mkdir()
    (tmp_path / "job").symlink_to(small_disk / "job")
    fill(small_disk)
    _, result = counting_job(tmp_path, data, "--num_ps=1", "--ps_checkpoint_secs=1",
                             epochs=1)
    output = result.stdout + result.stderr
    final = launcher_lines(output)[-1]
    assert result.returncode == 1, output[-6000:]
    assert final.startswith("[launcher] job FAILED: "), output[-6000:]
    assert "No space left on device" in final and str(small_disk) in final, final


def test_checkpoints_on_a_disk_that_fills_are_skipped_and_the_summary_says_how_old(
        small_disk, data, tmp_path):
    """The automatic checkpoints (JOB_DIR/ps_checkpoints, on the small disk)
    fill it while the job trains; the rest of the job directory has room."""
    checkpoints = small_disk / "ps_checkpoints"
    checkpoints.mkdir()
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "ps_checkpoints").symlink_to(checkpoints)
    out, proc = counting_job(tmp_path, data, "--num_ps=1", "--ps_checkpoint_secs=1",
                             script_args=("--sleep_per_batch=0.02",), epochs=1,
                             faults=HOLD, background=True)
    try:
        faults.wait_held(str(tmp_path / "faults"), HOLD, timeout=300)
        # A recovery point exists (the initial model's, or a later one) before
        # the disk fills: its age is what the summary must give.
        wait_for(lambda: layout.latest(str(checkpoints)), timeout=120,
                 what="a recovery point")
        fill(small_disk)
        filled = time.time()
        faults.release(str(tmp_path / "faults"), HOLD)
        output = finish(proc, str(tmp_path / "job"), timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    launcher_lines(output)
    assert proc.returncode == 0, output[-6000:]
    check_exact(tmp_path, out, output, epochs=1)
    summary_path = tmp_path / "job" / "summary.json"
    summary = json.loads(summary_path.read_text())
    assert summary["ps_checkpoint_failures"] >= 1, summary
    newest = layout.latest(str(checkpoints))
    age = summary["recovery_point_age_s"]
    # The newest recovery point is from before the disk filled; the launcher
    # measured its age when it wrote the summary.
    assert newest.created <= filled, (newest, filled)
    assert filled - newest.created <= age <= (
        summary_path.stat().st_mtime - newest.created + 1.0), (age, newest, filled)
    assert (f"[launcher] automatic checkpoints skipped: "
            f"{summary['ps_checkpoint_failures']}; the newest recovery point is "
            f"{age:.0f} s old") in output, output[-6000:]


def test_a_job_directory_whose_disk_fills_while_training_stops_with_one_line(
        small_disk, data, tmp_path):
    (small_disk / "job").mkdir()
    (tmp_path / "job").symlink_to(small_disk / "job")
    _, proc = counting_job(tmp_path, data, "--num_ps=1", "--ps_checkpoint_secs=1",
                           script_args=("--sleep_per_batch=0.02",), epochs=1,
                           faults=HOLD, background=True)
    try:
        faults.wait_held(str(tmp_path / "faults"), HOLD, timeout=300)
        fill(small_disk)
        faults.release(str(tmp_path / "faults"), HOLD)
        output = finish(proc, str(tmp_path / "job"), timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    final = launcher_lines(output)[-1]
    assert proc.returncode == 1, output[-6000:]
    assert final.startswith("[launcher] job FAILED: "), output[-6000:]
    journal = tmp_path / "job" / "master.journal"
    assert final.startswith(f"[launcher] job FAILED: the master failed the job: "
                            f"cannot write {journal}: No space left on device ("), final
    assert final.endswith(f" free on {small_disk})"), final


def test_the_master_says_its_journal_is_on_a_full_disk_whoever_notices_first(
        small_disk, monkeypatch):
    """The order the CI run met: an RPC waiting for its record notices the
    journal's failure before the journal's own thread reports it. The job's
    error still names the journal, the full disk and the space left there."""
    import threading

    from keras_elastic.master.servicer import MasterServicer
    from keras_elastic.proto import master_pb2

    # Holds the journal thread's report back until the RPC below has noticed.
    release = threading.Event()
    reported = threading.Event()
    report = MasterServicer._journal_failed

    def held_report(self, error):
        release.wait(60)
        report(self, error)
        reported.set()

    monkeypatch.setattr(MasterServicer, "_journal_failed", held_report)
    fill(small_disk)
    path = small_disk / "master.journal"
    servicer = MasterServicer(journal_path=str(path))
    try:
        servicer.RegisterWorker(master_pb2.WorkerRequest(worker_id=0), None)
        noticed = servicer._error
        release.set()
        assert reported.wait(60)
        assert servicer._error == noticed
        assert noticed.startswith(f"cannot write {path}: No space left on device ("), (
            noticed)
        assert f"free on {small_disk})" in noticed, noticed
    finally:
        release.set()
        servicer.stop()

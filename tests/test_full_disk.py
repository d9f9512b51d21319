"""A full disk ends in one line, not a traceback (issue 25, item 4).

The job directory is on a small tmpfs (mounted by the test where it may,
skipped elsewhere), filled until little is left. The job either finishes
exact or stops with one line saying which file could not be written and
that the disk is full; the launcher prints no traceback.
"""

import json
import os
import subprocess
import uuid

import pytest
from support.counting_jobs import RECORDS, check_exact, counting_job, write_data

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(str(tmp_path_factory.mktemp("counting")))


@pytest.fixture
def small_disk(tmp_path):
    """A 32 MB tmpfs at tmp_path/disk; skipped where mounting is not allowed."""
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs",
                             str(mount)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(directory, leave: int) -> None:
    """Fills the filesystem of `directory` until `leave` bytes are free."""
    stats = os.statvfs(directory)
    free = stats.f_bavail * stats.f_frsize
    with open(os.path.join(directory, "filler"), "wb") as f:
        f.write(b"\0" * max(0, free - leave))


@pytest.mark.parametrize("leave", [0, 64 * 1024, 4 << 20])
def test_a_job_on_a_full_disk_finishes_exact_or_stops_with_one_line(
        small_disk, data, leave, tmp_path):
    # The job directory on the small disk; the script's own output beside it.
    (small_disk / "job").mkdir()
    (tmp_path / "job").symlink_to(small_disk / "job")
    fill(small_disk, leave)
    out, result = counting_job(tmp_path, data, "--num_ps=1",
                               "--ps_checkpoint_secs=1", epochs=1)
    output = result.stdout + result.stderr
    launcher_lines = [line for line in output.splitlines()
                      if not line.startswith("[worker-")]
    assert not any("Traceback" in line for line in launcher_lines), output[-6000:]
    if result.returncode == 0:
        check_exact(tmp_path, out, output, epochs=1)
        return
    final = launcher_lines[-1]
    assert "No space left on device" in final and str(small_disk) in final, (
        output[-6000:])
    if result.returncode == 3:
        # It trained; the ledger and summary are what could not be written.
        assert final.startswith("[launcher] the job trained, but could not write ")
        counts = json.loads(out.read_text())["counts"]
        assert counts == [RECORDS] * len(counts)
    else:
        assert result.returncode == 1 and final.startswith("[launcher] job FAILED: ")



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
    fill(small_disk, 0)
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

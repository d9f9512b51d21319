"""A running job, as its user watches it (issue 24: README options with no
test before): `keras-elastic status` while it runs, the per-phase time table
of its summary, TensorBoard's layouts (`logs/worker-<id>/validation`, and
`keras_elastic_per_worker = False`), and `EarlyStopping` deciding the same on
every worker.

The job stops itself at its first epoch's end (tests/scripts/running_job_script.py
waits for a file the test writes), so the test sees it running without
guessing at timing.
"""

import glob
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, launch, subprocess_env, wait_for
from test_tensorboard import event_files, scalars

from keras_elastic.common.timing import PHASE_HELP, PHASES

SCRIPT = os.path.join(REPO, "tests", "scripts", "running_job_script.py")
TASKS_PER_EPOCH = 512 // (16 * 4)


def status_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "keras_elastic", "status", *args],
                          env=subprocess_env(), capture_output=True, text=True,
                          timeout=60)


def phase_table(stdout: str) -> dict[str, float]:
    """{phase: seconds} of the summary's table (header row, rule, values)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if "seconds per phase, summed over workers:" in line)
    head, rule, row = (line.removeprefix("[launcher]").strip()
                       for line in lines[start + 1:start + 4])
    names = [h.strip() for h in head.split("|")]
    assert set(rule.replace("|", "").replace(" ", "")) == {"-"}, rule
    return dict(zip(names, (float(v) for v in row.split("|")), strict=True))


@pytest.mark.multiprocess
def test_status_phase_table_tensorboard_layouts_and_early_stopping(tmp_path):
    wait_dir, tb_dir, job = tmp_path / "wait", tmp_path / "tb", tmp_path / "job"
    wait_dir.mkdir()
    proc = launch(str(job), SCRIPT, "--num_workers=2", "--num_ps=1",
                  script_args=(f"--wait_dir={wait_dir}", f"--tb_dir={tb_dir}"),
                  background=True)
    try:
        wait_for(lambda: all((wait_dir / f"ready-{i}").exists() for i in (0, 1))
                 or proc.poll() is not None, timeout=300,
                 what="both workers at the end of epoch 0")
        assert proc.poll() is None, proc.stdout.read()[-4000:]

        # -- keras-elastic status, on the running job ---------------------
        result = status_cli(f"--job_dir={job}")
        assert result.returncode == 0, result.stderr
        status = json.loads(result.stdout)
        assert status["error"] is None and status["master_restarts"] == 0
        assert status["workers"]["alive"] == [0, 1] and status["workers"]["lost"] == 0
        training = status["datasets"]["training"]
        # Epoch 0 is done (the workers are at its end), nothing of epoch 1 is:
        # a task is reported once trained, and both workers wait before it.
        assert training["mode"] == "training" and not training["finished"]
        assert training["tasks_per_epoch"] == TASKS_PER_EPOCH
        assert training["tasks_done_total"] == TASKS_PER_EPOCH, training
        assert training["records_per_epoch"] == 512
        assert status["tasks_done"] == TASKS_PER_EPOCH
        assert status["uptime"] > 0
        # The same through the master's address and the job's token.
        address = json.loads((job / "cluster.json").read_text())["master"]
        assert json.loads(status_cli(f"--master={address}", f"--job_dir={job}")
                          .stdout)["datasets"]["training"]["tasks_done_total"] == (
            TASKS_PER_EPOCH)
        (wait_dir / "go").write_text("")
        stdout, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stdout[-4000:]

    # -- EarlyStopping stopped every worker after epoch 2 ---------------------
    logs = [json.loads((wait_dir / f"logs-{i}.json").read_text()) for i in (0, 1)]
    assert logs[0]["stopped_epoch"] == logs[1]["stopped_epoch"] == 2, logs
    # ... on the same numbers: the epoch's loss and metrics are the job's.
    assert len(logs[0]["epochs"]) == 3
    for mine, theirs in zip(logs[0]["epochs"], logs[1]["epochs"], strict=True):
        assert {k: v for k, v in mine.items() if not k.startswith("val_")} == {
            k: v for k, v in theirs.items() if not k.startswith("val_")}
    summary = json.loads((job / "summary.json").read_text())
    assert summary["datasets"]["training"]["tasks_done_total"] == 3 * TASKS_PER_EPOCH

    # -- the per-phase table: every phase the workers timed, in seed order ----
    table = phase_table(stdout)
    timings = summary["timings"]
    assert list(table) == [p for p in PHASES if p in timings] + sorted(
        p for p in timings if p not in PHASES)
    assert {"compute", "push", "pull", "get_batch"} <= set(table), table
    for phase, seconds in table.items():
        assert seconds == pytest.approx(timings[phase], abs=0.051), phase
        assert f"[launcher]   {phase}: {PHASE_HELP[phase]}" in stdout
    assert table["compute"] > 0 and table["push"] > 0

    # -- TensorBoard: a run per worker, its own validation beside it ----------
    per_worker = tb_dir / "per_worker"
    assert sorted(os.listdir(per_worker)) == ["worker-0", "worker-1"]
    for worker in ("worker-0", "worker-1"):
        assert sorted(os.listdir(per_worker / worker)) == ["train", "validation"]
        validation = scalars(str(per_worker / worker / "validation"))
        assert [s for s, _ in validation["epoch_loss"]] == [0, 1, 2], validation
        train = scalars(str(per_worker / worker / "train"))
        assert [s for s, _ in train["epoch_loss"]] == [0, 1, 2], train
    # keras_elastic_per_worker = False: Keras' layout, both workers in it.
    keras_layout = tb_dir / "keras_layout"
    assert sorted(os.listdir(keras_layout)) == ["train", "validation"]
    assert len(event_files(str(keras_layout / "train"))) == 2
    assert len(event_files(str(keras_layout / "validation"))) == 2
    assert not glob.glob(str(keras_layout / "worker-*"))
    assert json.loads((job / "tensorboard.json").read_text()) == {
        "log_dirs": [str(per_worker)]}

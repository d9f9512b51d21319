"""A `fit` that raises on one worker of a job (a callback's error;
Keras' TerminateOnNaN(raise_error=True) on the batches that worker trained)
leaves the workers in step: the sync points of a fit's end are counted
alike on every worker, so a script that catches the error goes on with the
others (`ElasticSession._abandon_sync_point`). A Keras-suite job found it:
the chief's `fit` raised, the other worker's returned and waited for the
chief's mark at the fit's end, which came only with the next fit, and every
later sync point waited out its timeout."""

import os
import re

import pytest
from conftest import REPO, launch

SCRIPT = os.path.join(REPO, "tests", "scripts", "fit_raises_on_the_chief_script.py")


@pytest.mark.multiprocess
def test_a_fit_that_raised_on_the_chief_leaves_the_workers_in_step(tmp_path):
    job = tmp_path / "job"
    result = launch(str(job), SCRIPT, "--num_workers=2", "--num_ps=1",
                    "--liveness_timeout=20", timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    logs = "".join((job / n).read_text() for n in sorted(os.listdir(job))
                   if n.startswith("worker-") and n.endswith(".log"))
    assert logs.count("first fit raised: the chief's callback failed") == 1, logs[-4000:]
    assert logs.count("first fit returned") == 1, logs[-4000:]
    counts = re.findall(r"second fit done; sync points passed: (\d+)", logs)
    assert len(counts) == 2 and counts[0] == counts[1], (counts, logs[-4000:])
    # Nobody waited out a sync point for a mark that was not coming.
    assert "the chief did not" not in logs, logs[-4000:]


@pytest.mark.multiprocess
def test_a_fit_stopped_mid_epoch_gives_its_held_tasks_to_the_other_worker(tmp_path):
    """Worker 1 sets model.stop_training after one batch (as TerminateOnNaN
    does), holding the task it trains (and any it claimed ahead): it gives
    them back, and worker 0 trains them, skipping the elements already
    applied. Every record is counted once per epoch. Before, worker 0 waited
    for those tasks at the epoch's end while worker 1 waited for the chief
    (a Keras-suite job hung: TerminateOnNaN on the non-chief)."""
    from support.counting_jobs import check_exact, counting_job, write_data

    data = write_data(str(tmp_path / "data"))
    out, result = counting_job(tmp_path, data, "--num_ps=1",
                               script_args=("--stop_worker=1", "--stop_after_batches=1",
                                            "--sleep_per_batch=0.02"))
    output = result.stdout + result.stderr
    assert "worker 1: stop_training after 1 batch(es)" in output, output[-3000:]
    assert re.search(r"worker 1: giving back \d+ task\(s\) \(the fit stopped", output), (
        output[-3000:])
    check_exact(tmp_path, out, output)

"""Keras' own callback tests, and its trainer tests that fit arrays, run by
every worker of a 2-worker job (issue 40).

Each worker runs the same tests in the same order (tests/keras_suite/
run_in_job.py: pytest with the suite's plugin in job mode), so every model,
fit and evaluate of a test is one phase of the job that both workers take
part in: the data in tasks, the weights on the parameter server, the
metrics the job's. A test passes only if it passes on both workers. The
tests that cannot apply in a job are listed in
`tests/keras_suite/expected.py` (`JOB_NOT_APPLICABLE`, `JOB_DEFECTS`), each
with its reason, and shown in docs/keras_tests.md.

Each Keras module runs as a job of its own: a test that fails on one worker
after a fit the other did not reach leaves the workers' calls out of step
(every later call of that job would be refused as differing), and a failure
should cost its own module only.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from conftest import REPO, launch

SUITE = os.path.join(REPO, "tests", "keras_suite")
RUNNER = os.path.join(SUITE, "run_in_job.py")
CALLBACK_FILES = ["test_early_stopping.py", "test_reduce_lr_on_plateau.py",
                  "test_learning_rate_scheduler.py", "test_lambda_callback.py",
                  "test_terminate_on_nan.py", "test_monitor_callback.py",
                  "test_swap_ema_weights.py", "test_callback_list.py",
                  "test_csv_logger.py", "test_backup_and_restore.py"]
# The trainer tests that fit arrays (NumPy, the data a job hands out in
# tasks); those of other data are in a job an error by design (README).
TRAINER_ARRAYS = ("test_fit_flow or test_steps_per_epoch or "
                  "test_steps_per_execution_steps_count or test_fit_with_val_split "
                  "or test_evaluate_flow or test_predict_flow or test_metric_tracking "
                  "or test_fit_with_custom_train_step or test_on_batch_methods "
                  "or test_evaluate_with_custom_test_step or test_recompile "
                  "or test_loss_weights or test_partial_loss_partial_label")
MODULES = {name: (name,) for name in CALLBACK_FILES}
MODULES["test_trainer.py"] = ("test_trainer.py", "-k",
                              f"TestTrainer and ({TRAINER_ARRAYS})")


def records(job_dir: str, base: str) -> dict[str, dict]:
    """{worker: the worker's record of each test}."""
    out = {}
    for name in sorted(os.listdir(job_dir)):
        if name.startswith(os.path.basename(base) + ".worker-"):
            with open(os.path.join(job_dir, name)) as f:
                out[name.rsplit(".", 1)[1]] = json.load(f)["tests"]
    return out


@pytest.mark.multiprocess
@pytest.mark.parametrize("module", sorted(MODULES))
def test_keras_tests_pass_on_every_worker_of_a_job(module, tmp_path):
    job = str(tmp_path / "job")
    record = os.path.join(job, "suite.json")
    first, *rest = MODULES[module]
    result = launch(
        job, RUNNER, "--num_workers=2", "--num_ps=1", "--max_worker_restarts=0",
        "--seed=7", script_args=(os.path.join(SUITE, first), *rest),
        env={"KE_KERAS_SUITE_RECORD": record}, timeout=900)
    output = result.stdout + result.stderr
    keep = os.environ.get("KE_KERAS_SUITE_KEEP")
    if keep:  # the records, for docs/keras_tests.md (report.py --job), and logs
        os.makedirs(os.path.join(keep, module), exist_ok=True)
        for name in os.listdir(job):
            if name.startswith("suite.json.worker-") or name.endswith(".log"):
                shutil.copy(os.path.join(job, name), os.path.join(keep, module))
    assert result.returncode == 0, output[-6000:]
    found = records(job, record)
    assert len(found) == 2, (sorted(os.listdir(job)), output[-4000:])
    outcomes: dict[str, dict[str, str]] = {}
    for worker, tests_run in found.items():
        for test, rec in tests_run.items():
            outcomes.setdefault(test, {})[worker] = (
                rec.get("outcome", "?") + (": " + rec["message"] if rec.get(
                    "message") and rec.get("outcome") != "skipped" else ""))
    failed = {t: o for t, o in outcomes.items()
              if len(o) != 2 or any(v.split(":")[0] not in ("passed", "skipped",
                                                            "xfailed")
                                    for v in o.values())}
    assert not failed, json.dumps(failed, indent=1)[:8000]
    ran = [t for t, o in outcomes.items() if all(v == "passed" for v in o.values())]
    # ... on the job's cluster: models made elastic, fits handed out in tasks.
    for worker, tests_run in found.items():
        elastic = sum(sum(n for path, n in rec.get("calls", {}).items()
                          if path.endswith("elastic"))
                      for rec in tests_run.values())
        assert elastic >= len(ran), (worker, elastic, len(ran))

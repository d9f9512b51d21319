"""keras-io's "Convolutional Autoencoder For Image Denoising" (x fitted to x,
then noisy x to x), plain and elastic (issue 23).

tests/keras_io/autoencoder.py (plain Keras) and autoencoder_elastic.py (the README's
change: `import keras_elastic as ke` and `autoencoder =
ke.wrap(build_autoencoder())`) run as a plain process, as an embedded elastic run
and as a 2-worker job; the elastic metrics must stay within the tolerances below of
plain Keras' (see tests/keras_io/harness.py).
"""

import pytest
from keras_io.harness import (
    EXACT,
    Tol,
    assert_close,
    check_readme_diff,
    run_embedded,
    run_job,
    run_plain,
    script_paths,
)

NAME = "autoencoder"

# Binary cross-entropy of images falls fast in the first epochs (0.63, 0.41,
# 0.26). Plain Keras from the same initial weights with three other batch
# orders: every loss and MSE within 2% of this run. 10% leaves room for the
# master's task-shaped batches.
EMBEDDED = {
    "loss": Tol(rel=0.1),
    "val_loss": Tol(rel=0.1),
    "denoise_loss": Tol(rel=0.1),
    "denoise_val_loss": Tol(rel=0.1),
    "reconstruction_mse": Tol(rel=0.2),
    "denoised_mse": Tol(rel=0.2),
    "noisy_mse": Tol(rel=1e-6),  # the data only
    "epochs_run": EXACT,
}
# A 2-worker job: asynchronous updates, each gradient computed on a model
# about one update old. With only 12 steps an epoch, Adam's first denoising
# steps are where that shows: a plain-Keras loop that applies every gradient
# one update late (the stale model, no keras_elastic) gives denoising
# val_loss 0.495, 0.417, 0.326 against 0.245, 0.238, 0.229 with fresh
# gradients. A 1-worker job gives plain Keras' figures (denoising val_loss
# 0.230 against 0.228, the same in every run); with 2 workers the denoising
# fit's last epoch spreads with a long tail. 22 jobs (2026-11-28, with
# another test file's jobs running beside them, as in the suite), each figure
# over plain Keras':
#   loss 1.04-1.22, val_loss 1.02-1.17, reconstruction_mse 0.93-1.38,
#   denoise_loss 0.99-1.37, the best denoising epoch's val_loss 0.99-1.39
#   (16 jobs with their epoch lines; run 20 of the repeat below: 1.03),
#   and the last denoising epoch's val_loss 0.99-2.56 and denoised_mse
#   0.97-4.8: a last epoch can undo the denoising (run 20 of the 63972f4
#   repeat in docs/stability.md: val_loss 0.236 -> 0.583, denoised MSE 0.113
#   against the noisy input's 0.082) while its best epoch does not.
# How much asynchrony a job gets varies, and the denoising figures follow it:
# the staleness of every applied update measured on the server (the server's
# version minus the gradient's; a probe in ParameterStore.push), 9 jobs
# (2026-11-29, 2 cores, 3 jobs at once): in the 36 updates of the denoising
# fit, 0 to 22 were stale (staleness summed: 0-32), and the denoised MSE over
# plain Keras' rose with it: sum 0: 1.01; 2: 1.11; 9-11: 1.07-1.34; 19-21:
# 1.28-2.02; 32: 2.51 (denoising loss 1.00 -> 1.45, best val_loss 1.01 ->
# 1.42). The first fit's figures stayed within 1.15 (loss) and 1.12
# (reconstruction MSE) with up to 19 of its 36 updates stale.
# So a job is held by what asynchronous SGD keeps: the first fit's figures,
# the denoising fit's training loss and its best epoch (what
# `EarlyStopping(restore_best_weights=True)` keeps; an untrained model: 0.69,
# 3.0x); not by the denoising fit's last epoch. Earlier, on a machine loaded
# further, reconstruction MSE 1.9x (the 2.0 it was given with the denoised
# MSE's bound, 2026-11-27, was that one's: 1.5 holds every job measured). A
# job that did not train is outside every bound.
JOB = {
    "loss": Tol(rel=0.25),
    "val_loss": Tol(rel=0.5),
    "reconstruction_mse": Tol(rel=1.5),
    "denoise_loss": Tol(rel=0.8),
    "denoise_best_val_loss": Tol(rel=0.6),
    "noisy_mse": Tol(rel=1e-6),
    "epochs_run": EXACT,
}


def check_result(result):
    # The second fit learned to denoise: its output is closer to the clean
    # images than its noisy input is (plain Keras: about 0.3 of the noise's
    # MSE); how close, compared with plain Keras, is the tolerances' job.
    assert result["denoised_mse"] < result["noisy_mse"], result
    assert result["denoise_best_val_loss"] <= result["denoise_val_loss"], result


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return run_plain(NAME, tmp_path_factory.mktemp("plain"))


def test_elastic_script_is_the_readme_change():
    check_readme_diff(*script_paths(NAME))


def test_plain_keras(plain):
    check_result(plain)


def test_embedded(plain, tmp_path):
    result = run_embedded(NAME, tmp_path)
    check_result(result)
    assert_close(result, plain, EMBEDDED, "embedded")


@pytest.mark.multiprocess
def test_job_of_one_worker(plain, tmp_path):
    """One worker: no asynchrony, so the job's figures are as close to plain
    Keras' as the embedded run's (the same in every run)."""
    (result,) = run_job(NAME, tmp_path, num_workers=1).values()
    check_result(result)
    assert_close(result, plain, EMBEDDED, "job of one worker")


@pytest.mark.multiprocess
def test_job_of_two_workers(plain, tmp_path):
    for worker, result in run_job(NAME, tmp_path, num_workers=2).items():
        # Not check_result: a job's last epoch may undo its denoising (see
        # JOB); its best epoch may not.
        assert result["denoise_best_val_loss"] <= result["denoise_val_loss"], result
        assert_close(result, plain, JOB, f"job {worker}")

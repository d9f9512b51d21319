"""Across processes: resume in a new process; SIGKILL in the middle of a save."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from conftest import subprocess_env, wait_for

import keras_elastic as ke

MODEL_SRC = '''
import keras
import numpy as np


def data():
    rng = np.random.default_rng(3)
    x = rng.random((96, 8), dtype=np.float32)
    return x, x @ rng.random((8, 2), dtype=np.float32)


def make_model(seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((8,)),
                              keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss="mse")
    return model


def fit(model, epochs, callbacks):
    x, y = data()
    return model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False,
                     verbose=0, callbacks=callbacks)
'''

RESUME_SCRIPT = MODEL_SRC + '''
import sys

import keras_elastic as ke

directory, out = sys.argv[1], sys.argv[2]
model = make_model(seed=123)  # another init: the checkpoint must win
cb = ke.callbacks.ShardedModelCheckpoint(directory + "/", restore_on_start=True)
history = fit(model, 4, [cb])
np.savez(out, *[w.numpy() for w in model.weights],
         epochs_run=len(history.history["loss"]), initial_epoch=cb.initial_epoch)
'''

KILL_SCRIPT = MODEL_SRC + '''
import sys
import time

import tensorflow as tf

import keras_elastic as ke

directory, marker, weights = sys.argv[1:4]


class StallSecondSave(tf.train.experimental.ShardingCallback):
    description = "Stalls in the second save."

    def __init__(self):
        self.calls = 0

    def __call__(self, shardable_tensors):
        self.calls += 1
        if self.calls == 2:
            open(marker, "w").close()
            time.sleep(600)
        return tf.train.experimental.ShardByTaskPolicy()(shardable_tensors)


class SaveWeights(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        np.savez(f"{weights}-{epoch + 1}.npz",
                 *[w.numpy() for w in self.model.weights])


fit(make_model(0), 3, [SaveWeights(), ke.callbacks.ShardedModelCheckpoint(
    directory + "/", sharding_callback=StallSecondSave())])
'''


def _namespace() -> dict:
    namespace: dict = {}
    exec(MODEL_SRC, namespace)  # noqa: S102 - the same code the children run
    return namespace


def _arrays(npz) -> list[np.ndarray]:
    return [npz[f"arr_{i}"] for i in range(len([k for k in npz if k.startswith("arr_")]))]


@pytest.mark.multiprocess
def test_resume_in_a_new_process_equals_uninterrupted_training(tmp_path):
    ns = _namespace()
    directory = str(tmp_path / "ckpts")
    ns["fit"](ns["make_model"](0), 2,
              [ke.callbacks.ShardedModelCheckpoint(directory + "/")])
    assert ke.checkpoint.latest(directory).epoch == 2

    script = tmp_path / "resume.py"
    script.write_text(RESUME_SCRIPT)
    out = str(tmp_path / "resumed.npz")
    run = subprocess.run([sys.executable, str(script), directory, out],
                         env=subprocess_env(), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    resumed = np.load(out)
    assert int(resumed["epochs_run"]) == 2 and int(resumed["initial_epoch"]) == 2

    straight = ns["make_model"](0)
    ns["fit"](straight, 4, [])
    expected = [w.numpy() for w in straight.weights]
    got = _arrays(resumed)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    assert [c.epoch for c in ke.checkpoint.list_checkpoints(directory)] == [1, 2, 3, 4]


@pytest.mark.multiprocess
def test_sigkill_during_a_save_leaves_the_previous_checkpoint_latest(tmp_path):
    directory = str(tmp_path / "ckpts")
    marker = str(tmp_path / "second-save-started")
    weights = str(tmp_path / "weights")
    script = tmp_path / "killed.py"
    script.write_text(KILL_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), directory, marker,
                             weights], env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        wait_for(lambda: os.path.exists(marker) or proc.poll() is not None,
                 timeout=240, what="the second save to start")
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        in_progress = [e for e in os.listdir(directory) if e.startswith(".tmp-")]
        assert len(in_progress) == 1 and ".tmp-ckpt-0002-" in in_progress[0]
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()

    latest = ke.checkpoint.latest(directory)
    assert latest.name == "ckpt-0001" and latest.epoch == 1
    assert [c.name for c in ke.checkpoint.list_checkpoints(directory)] == ["ckpt-0001"]
    ns = _namespace()
    model = ns["make_model"](42)
    ke.checkpoint.restore_model(model, directory)
    saved = _arrays(np.load(weights + "-1.npz"))
    for w, s in zip(model.weights, saved, strict=True):
        np.testing.assert_array_equal(w.numpy(), s)
    # The next saver in this directory clears what the dead one left.
    removed = ke.checkpoint.remove_stale(directory)
    assert [os.path.basename(p) for p in removed] == in_progress
    assert os.listdir(directory) == ["ckpt-0001"]

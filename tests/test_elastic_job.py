"""Real multi-process jobs: launcher, master, parameter servers, workers.

Everything runs as separate processes talking gRPC on 127.0.0.1.
"""

import json
import os
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import (
    assert_exactly_once,
    dump_stacks,
    job_status,
    launch,
    read_ledger,
    subprocess_env,
    wait_for,
)
from support.tfrecord_data import make_arrays, parse, write_shards

pytestmark = pytest.mark.multiprocess

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts",
                      "job_script.py")


def plain_keras_weights(files, epochs=1, batch_size=32):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, activation="relu")(inputs)
    h = keras.layers.BatchNormalization()(h)
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(h))
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss="sparse_categorical_crossentropy")
    model.fit(tf.data.TFRecordDataset(files).map(parse).batch(batch_size),
              epochs=epochs, verbose=0)
    return model.get_weights()


@pytest.mark.parametrize("num_ps", [1, 2])
def test_one_worker_equals_plain_keras_and_uses_every_ps(tmp_path, num_ps):
    x, y = make_arrays(1024)
    files = write_shards(str(tmp_path / "data"), x, y, num_shards=2)
    out = str(tmp_path / "weights.npz")
    result = launch(str(tmp_path / "job"), SCRIPT, "--num_workers=1",
                    f"--num_ps={num_ps}",
                    script_args=(f"--data={tmp_path}/data/train-*.tfrecord",
                                 f"--output={out}"))
    assert result.returncode == 0, result.stdout + result.stderr
    weights = np.load(out)
    for i, expected in enumerate(plain_keras_weights(files)):
        np.testing.assert_allclose(weights[f"arr_{i}"], expected, atol=1e-5)
    with open(out + ".ps.json") as f:
        ps_status = json.load(f)
    assert [s["ps_index"] for s in ps_status] == list(range(num_ps))
    assert all(s["variables"] for s in ps_status), ps_status  # every PS holds some
    owned = sorted(v for s in ps_status for v in s["variables"])
    assert len(owned) == 8 and len(set(owned)) == 8  # each variable on exactly one PS
    assert "seconds per phase" in result.stdout and "push" in result.stdout


def test_worker_killed_mid_epoch_is_relaunched_and_every_task_runs_once(tmp_path):
    x, y = make_arrays(2048)
    write_shards(str(tmp_path / "data"), x, y, num_shards=2)
    job_dir = str(tmp_path / "job")
    # Both workers start training together (a barrier in the script), and
    # worker 1 dies at its 3rd task claim, holding that task (a fault point):
    # no moment is guessed from the job's status.
    result = launch(job_dir, SCRIPT, "--num_workers=2", "--num_ps=1",
                    "--max_worker_restarts=2",
                    script_args=(f"--data={tmp_path}/data/train-*.tfrecord",
                                 "--epochs=2", "--batch_size=16",
                                 "--minibatches_per_task=4", "--sleep_per_batch=0.05",
                                 "--barrier=-1:2"),
                    env={"KERAS_ELASTIC_FAULTS": "after_claim@3:w1"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "fault injection: SIGKILL at 'after_claim'" in output
    summary = json.load(open(os.path.join(job_dir, "summary.json")))
    assert summary["workers_lost"] == 1 and summary["worker_restarts"] == 1
    assert summary["requeued"] >= 1  # the killed worker held tasks
    ledger = read_ledger(job_dir)["training"]
    assert_exactly_once(ledger, num_epochs=2, tasks_per_epoch=32)
    # The requeued tasks were trained again (by worker 0 or the relaunched 2).
    assert any(e["attempt"] > 0 for e in ledger)
    assert {e["worker"] for e in ledger} <= {0, 1, 2}
    assert "relaunched worker 1 as worker 2" in output


def test_worker_joining_a_running_job_gets_tasks(tmp_path):
    x, y = make_arrays(2048)
    write_shards(str(tmp_path / "data"), x, y, num_shards=2)
    job_dir = str(tmp_path / "job")
    # Worker 0 waits at the end of its first epoch until the joining worker
    # is alive (a barrier in the script): the job cannot end before it joins.
    args = (f"--data={tmp_path}/data/train-*.tfrecord", "--epochs=3",
            "--batch_size=16", "--minibatches_per_task=4", "--sleep_per_batch=0.02",
            "--barrier=0:2")
    proc = launch(job_dir, SCRIPT, "--num_workers=1", "--max_workers=2",
                  script_args=args, background=True)
    try:
        wait_for(lambda: (job_status(job_dir) or {}).get("tasks_done", 0) >= 2,
                 timeout=180, what="the job to start")
        # Every role prints its threads' stacks on SIGUSR1 (for a job that
        # hangs), and goes on.
        assert len(dump_stacks(job_dir)) == 3  # the master, the server, worker 0
        joined = subprocess.run(
            [sys.executable, "-m", "keras_elastic", "join", f"--job_dir={job_dir}", "--",
             sys.executable, SCRIPT, *args], env=subprocess_env(), capture_output=True,
            text=True, timeout=300)
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert joined.returncode == 0, joined.stdout + joined.stderr
    assert proc.returncode == 0, output
    for role in ("master", "ps-0", "worker-0"):
        log = open(os.path.join(job_dir, f"{role}.log")).read()
        assert "most recent call first" in log, (role, log[-3000:])
    # The launcher's log is in the job directory too, its summary included.
    launcher_log = open(os.path.join(job_dir, "launcher.log")).read()
    assert "started worker 0" in launcher_log and "===== job summary =====" in (
        launcher_log), launcher_log[-3000:]
    ledger = read_ledger(job_dir)["training"]
    assert_exactly_once(ledger, num_epochs=3, tasks_per_epoch=32)
    by_worker = {w: sum(e["worker"] == w for e in ledger) for w in (0, 1000)}
    assert by_worker[1000] > 0, by_worker  # the joined worker (id 1000) trained
    assert by_worker[0] > 0


def test_worker_that_keeps_crashing_fails_the_job_with_the_cause(tmp_path):
    x, y = make_arrays(64)
    write_shards(str(tmp_path / "data"), x, y, num_shards=1)
    result = launch(str(tmp_path / "job"), SCRIPT, "--num_workers=1",
                    "--max_worker_restarts=1",
                    script_args=(f"--data={tmp_path}/data/*.tfrecord", "--exit_code=3"))
    assert result.returncode == 1
    assert "job FAILED: worker 1 exited with code 3 and the job has used all 1 worker " \
           "restarts" in result.stderr
    assert "crashing on purpose" in result.stderr


@pytest.mark.parametrize("flags, message", [
    (["--num_workers=0"], "--num_workers must be at least 1, got 0"),
    (["--num_workers=3", "--max_workers=2"], "--num_workers=3 is more than "
     "--max_workers=2"),
    (["--num_workers=1", "--min_workers=2"], "--min_workers=2 is more than "
     "--num_workers=1"),
    (["--num_ps=0"], "--num_ps must be at least 1, got 0"),
    (["--no_such_flag=1"], "Unknown command line flag 'no_such_flag'"),
])
def test_launcher_flag_errors(tmp_path, flags, message):
    result = subprocess.run(
        [sys.executable, "-m", "keras_elastic", "run", *flags, "--", "true"],
        env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr


def test_launcher_without_a_command(tmp_path):
    result = subprocess.run([sys.executable, "-m", "keras_elastic", "run"],
                            env=subprocess_env(), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert "no worker command: put it after `--`" in result.stderr


def test_kill_during_a_parameter_server_save_leaves_the_previous_checkpoint(tmp_path):
    """The parameter server is SIGKILLed in the middle of the second save (it
    stalls in the sharding callback, which runs on the server, after writing
    a marker): the first checkpoint stays the latest, whole, and restores the
    values it was saved with; the interrupted save is hidden leftovers."""
    x, y = make_arrays(512)
    write_shards(str(tmp_path / "data"), x, y, num_shards=1)
    job_dir = str(tmp_path / "job")
    ckpt = str(tmp_path / "ckpt") + "/"
    proc = launch(job_dir, SCRIPT, "--num_workers=1", "--max_worker_restarts=0",
                  "--ps_checkpoint_secs=0",
                  script_args=(f"--data={tmp_path}/data/*.tfrecord", "--epochs=2",
                               f"--checkpoint_dir={ckpt}", "--slow_second_save"),
                  background=True)
    try:
        wait_for(lambda: os.path.exists(os.path.join(job_dir, "saving"))
                 or proc.poll() is not None, timeout=180,
                 what="the second save to be under way on the server")
        assert proc.poll() is None, proc.stdout.read()[-4000:]
        server = json.load(open(os.path.join(job_dir, "cluster.json")))["ps_pids"][0]
        os.kill(server, signal.SIGKILL)
        # The launcher restarts the server; the test needs no more of the job.
        wait_for(lambda: json.load(open(os.path.join(job_dir, "cluster.json")))[
            "ps_pids"][0] != server or proc.poll() is not None, timeout=120,
            what="the server restarted")
        proc.terminate()
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "parameter server 0 exited with code -9" in output, output[-4000:]
    import keras_elastic as ke

    latest = ke.checkpoint.latest(ckpt)
    assert latest.name == "ckpt-0001" and latest.epoch == 1
    assert [c.name for c in ke.checkpoint.list_checkpoints(ckpt)] == ["ckpt-0001"]
    assert ke.checkpoint.verify(latest) == []
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, "relu"),
                              keras.layers.BatchNormalization(),
                              keras.layers.Dense(2, "softmax")])
    ke.checkpoint.restore_model(model, ckpt)  # the previous checkpoint loads
    saved = np.load(os.path.join(job_dir, "epoch-1.npz"))
    for i, value in enumerate(model.get_weights()):
        np.testing.assert_allclose(value, saved[f"arr_{i}"], rtol=1e-6)
    ke.checkpoint.remove_stale(ckpt)  # the interrupted save's leftovers, if any
    assert not [n for n in os.listdir(ckpt) if n.startswith(".")]


def test_a_worker_late_for_fit_ends_the_epochs_it_missed_with_the_job_metrics(tmp_path):
    """Worker 1 calls fit only once worker 0 trained epochs 1 and 2 (it was
    busy elsewhere: a long predict between two fits, in keras-io's
    autoencoder, where this was found). Its History still has all 3 epochs,
    the same as worker 0's: it ends the two epochs already over at once,
    with the job's metrics (before, it started at the job's epoch 3 and its
    History had 1 epoch, so the two workers' callbacks saw different
    epochs)."""
    x, y = make_arrays(1024)
    write_shards(str(tmp_path / "data"), x, y, num_shards=2)
    job_dir = str(tmp_path / "job")
    out = launch(job_dir, SCRIPT, "--num_workers=2",
                 script_args=(f"--data={tmp_path}/data/train-*.tfrecord", "--epochs=3",
                              "--batch_size=16", "--minibatches_per_task=4",
                              "--late_worker=1:2", "--write_history"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    histories = []
    for worker in (0, 1):
        with open(os.path.join(job_dir, f"history-{worker}.json")) as f:
            histories.append(json.load(f))
    assert histories[0]["epoch"] == histories[1]["epoch"] == [0, 1, 2]
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(histories[1]["history"][key],
                                   histories[0]["history"][key], rtol=1e-6)
    # Worker 1 trained nothing of epochs 1 and 2 (they were over when it came).
    ledger = read_ledger(job_dir)["training"]
    assert {e["worker"] for e in ledger if e["epoch"] < 2} == {0}
    worker_1 = open(os.path.join(job_dir, "worker-1.log")).read()
    assert "dataset 'training' is at epoch 3; this worker ends epochs 1-2 at once" in (
        worker_1), worker_1[-3000:]


def test_scaling_a_running_job_up_and_down(tmp_path):
    x, y = make_arrays(2048)
    write_shards(str(tmp_path / "data"), x, y, num_shards=2)
    job_dir = str(tmp_path / "job")
    proc = launch(job_dir, SCRIPT, "--num_workers=1", "--min_workers=1",
                  "--max_workers=2",
                  script_args=(f"--data={tmp_path}/data/train-*.tfrecord", "--epochs=3",
                               "--batch_size=16", "--minibatches_per_task=4",
                               # Worker 0 waits at the end of epoch 1 until
                               # the added worker joined: the job cannot end
                               # before it trains. (Joined, not alive: the
                               # test may scale it down before worker 0
                               # reaches the barrier, which then waited for
                               # good: a CI hang.)
                               "--sleep_per_batch=0.05", "--barrier=0:2"),
                  background=True)

    def scale(n):
        subprocess.run([sys.executable, "-m", "keras_elastic", "scale",
                        f"--job_dir={job_dir}", f"--num_workers={n}"],
                       env=subprocess_env(), check=True, capture_output=True, timeout=60)

    try:
        wait_for(lambda: (job_status(job_dir) or {}).get("tasks_done", 0) >= 2,
                 timeout=180, what="the job to start")
        scale(2)

        def added_worker_trained():
            assert proc.poll() is None, "the job ended before the added worker trained"
            return (job_status(job_dir) or {}).get("tasks_done", 0) >= 2 and any(
                e["worker"] == 1 for e in job_status_ledger(job_dir))

        wait_for(added_worker_trained, timeout=180,
                 what="the added worker to train a task")
        scale(1)
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    assert "scaling down: stopping worker 1" in output
    ledger = read_ledger(job_dir)["training"]
    assert_exactly_once(ledger, num_epochs=3, tasks_per_epoch=32)


def job_status_ledger(job_dir):
    from keras_elastic.master.client import MasterClient

    with open(os.path.join(job_dir, "cluster.json")) as f:
        client = MasterClient(json.load(f)["master"], connect_timeout=5)
    try:
        return client.status(include_ledger=True)["datasets"].get(
            "training", {}).get("ledger", [])
    finally:
        client.close()

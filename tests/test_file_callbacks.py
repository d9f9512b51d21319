"""Keras' file-writing callbacks in elastic `fit` (issue 23, item 4).

`ModelCheckpoint`, `CSVLogger` and `BackupAndRestore` follow Keras'
multi-worker convention in a job: the chief writes the real paths, the other
workers temporary ones they delete (keras_elastic/worker/file_callbacks.py).
An embedded process writes exactly what plain Keras writes, and a script
that crashed resumes from its `BackupAndRestore` backup as with plain Keras.
"""

import csv
import glob
import json
import os
import re
import time
from types import SimpleNamespace

import keras
import numpy as np
import pytest
from conftest import REPO, launch
from scripts.file_callbacks_script import file_callbacks, make_model
from support.tfrecord_data import make_arrays

import keras_elastic as ke
from keras_elastic.common import cluster_env
from keras_elastic.worker import cluster as cluster_mod
from keras_elastic.worker.file_callbacks import SCRATCH, JobCallbacks, merge_csv

SCRIPT = os.path.join(REPO, "tests", "scripts", "file_callbacks_script.py")


def listing(directory: str) -> list[str]:
    """Every file under `directory`, relative to it."""
    return sorted(os.path.relpath(p, directory) for p in glob.glob(
        os.path.join(directory, "**"), recursive=True) if os.path.isfile(p))


def csv_rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def assert_rows_close(rows: list[dict], expected: list[dict]) -> None:
    assert [list(r) for r in rows] == [list(r) for r in expected]
    for row, want in zip(rows, expected):
        for key, value in want.items():
            if value == "NA" or key == "epoch":
                assert row[key] == value, (key, row, want)
            else:
                np.testing.assert_allclose(float(row[key]), float(value), atol=1e-5,
                                           err_msg=key)


def h5_weights(model: keras.Model, path: str) -> list[np.ndarray]:
    clone = make_model()
    clone.build(model.input_shape if model.built else None)
    clone.load_weights(path)
    return clone.get_weights()


class Interrupt(keras.callbacks.Callback):
    """Fails `fit` at the end of epoch `at` (Keras' own BackupAndRestore test
    interrupts training the same way)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.at:
            raise RuntimeError("Interrupting!")


class EpochRecorder(keras.callbacks.Callback):
    """The epochs `fit` runs, and the model's weights as the first one begins."""

    def __init__(self) -> None:
        super().__init__()
        self.epochs: list[int] = []
        self.first_weights: list[np.ndarray] | None = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.first_weights is None:
            self.first_weights = self.model.get_weights()
        self.epochs.append(epoch)


def fit(model, callbacks, epochs: int = 3):
    x, y = make_arrays(256)
    return model.fit(x, y, batch_size=32, epochs=epochs, shuffle=False, verbose=0,
                     callbacks=callbacks)


# -- embedded: exactly plain Keras ------------------------------------------------
def test_embedded_fit_writes_what_plain_keras_writes(tmp_path, embedded_cluster):
    plain_dir, elastic_dir = str(tmp_path / "plain"), str(tmp_path / "elastic")
    for directory, model in ((plain_dir, make_model()),
                             (elastic_dir, ke.wrap(make_model()))):
        os.makedirs(directory)
        fit(model, file_callbacks(directory, delete_checkpoint=False))
    assert listing(elastic_dir) == listing(plain_dir) == [
        "backup/latest.weights.h5", "backup/training_metadata.json",
        "best.weights.h5", "ckpt/model-01.keras", "ckpt/model-02.keras",
        "ckpt/model-03.keras", "log.csv"]
    assert_rows_close(csv_rows(os.path.join(elastic_dir, "log.csv")),
                      csv_rows(os.path.join(plain_dir, "log.csv")))
    for name in ("backup/training_metadata.json",):
        assert json.load(open(os.path.join(elastic_dir, name))) == json.load(
            open(os.path.join(plain_dir, name))) == {"epoch": 3, "batch": 0}
    for name in ("backup/latest.weights.h5", "best.weights.h5"):
        model = make_model()
        for a, b in zip(h5_weights(model, os.path.join(elastic_dir, name)),
                        h5_weights(model, os.path.join(plain_dir, name))):
            np.testing.assert_allclose(a, b, atol=1e-5, err_msg=name)
    saved = keras.models.load_model(os.path.join(elastic_dir, "ckpt/model-03.keras"))
    assert type(saved) is keras.Sequential


def crash_then_rerun(tmp_path, elastic: bool, same_process: bool,
                     interrupt_first: bool = False) -> tuple[list[int], list, list]:
    """Fits 5 epochs with a BackupAndRestore, failing at the end of epoch 2,
    then fits again (a new model and cluster, as a rerun of the script; or
    the same, as Keras' docstring retries). Returns the epochs the second fit
    ran, its weights as it began and the backup's weights it should hold."""
    backup = str(tmp_path / ("elastic" if elastic else "plain") / "backup")
    model = ke.wrap(make_model()) if elastic else make_model()
    first = [keras.callbacks.BackupAndRestore(backup), Interrupt(at=2)]
    if interrupt_first:  # the backup is then of epoch 1's end
        first.reverse()
    with pytest.raises(RuntimeError, match="Interrupting"):
        fit(model, first, epochs=5)
    expected = h5_weights(make_model(), os.path.join(backup, "latest.weights.h5"))
    if not same_process:
        if elastic:  # a new process: a new embedded master and server
            cluster_mod.reset_cluster()
            cluster_mod.get_cluster()
        model = ke.wrap(make_model()) if elastic else make_model()
    recorder = EpochRecorder()
    history = fit(model, [keras.callbacks.BackupAndRestore(backup), recorder], epochs=5)
    assert len(history.history["loss"]) == len(recorder.epochs)
    assert not os.path.exists(backup)  # delete_checkpoint: deleted at the end
    return recorder.epochs, recorder.first_weights, expected


@pytest.mark.parametrize("same_process, interrupt_first", [
    (False, False),  # the script run again after it crashed
    (True, True),    # fit retried in the process (BackupAndRestore's docstring)
])
def test_embedded_rerun_resumes_at_the_backed_up_epoch_like_keras(
        tmp_path, embedded_cluster, same_process, interrupt_first):
    plain, _, _ = crash_then_rerun(tmp_path, False, same_process, interrupt_first)
    epochs, weights, backup = crash_then_rerun(tmp_path, True, same_process,
                                               interrupt_first)
    assert epochs == plain == ([2, 3, 4] if interrupt_first else [3, 4])
    # It resumed from the backup's weights (not the servers' newer values).
    for a, b in zip(weights, backup):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_merge_csv_appends_the_rows_the_real_file_lacks(tmp_path):
    real, temp = str(tmp_path / "log.csv"), str(tmp_path / "temp.csv")
    header = "epoch,loss\r\n"
    rows = [f"{e},0.{e}\r\n" for e in range(4)]
    with open(temp, "w", newline="") as f:
        f.write(header + "".join(rows[:3]))
    # No real file: the temporary one as it is.
    assert merge_csv(temp, real) == 2
    assert open(real, newline="").read() == header + "".join(rows[:3])
    # A real file cut in the middle of a line (its writer was killed).
    with open(real, "w", newline="") as f:
        f.write(header + rows[0] + "1,0.")
    with open(temp, "w", newline="") as f:
        f.write(header + "".join(rows))
    assert merge_csv(temp, real) == 3
    assert open(real, newline="").read() == header + "".join(rows)
    # Nothing to add: the file is left as it is.
    mtime = os.stat(real).st_mtime_ns
    assert merge_csv(temp, real) == 3 and os.stat(real).st_mtime_ns == mtime
    # A temporary file without a header (reopened in append mode).
    with open(real, "w", newline="") as f:
        f.write(header + rows[0])
    with open(temp, "w", newline="") as f:
        f.write("".join(rows[1:3]))
    assert merge_csv(temp, real, ",") == 2
    assert open(real, newline="").read() == header + "".join(rows[:3])


# -- a worker that becomes the chief, without processes -------------------------------
class FakeCluster:
    """What JobCallbacks asks of the cluster: its id, the master's alive workers."""

    embedded = False

    def __init__(self, worker_id: int, alive: list[int]) -> None:
        self.worker_id = worker_id
        self.alive = alive
        self.master = self

        self.marks: dict[int, dict[str, int]] = {}

    def job_status(self):
        """As `MasterClient.job_status()` (typed) answers it, workers only."""
        from keras_elastic.master.status import WorkersStatus

        # The master's chief: worker 0 registered first; when it is lost, the
        # smallest alive id.
        return SimpleNamespace(workers=WorkersStatus(
            alive=list(self.alive), lost=0, exited=[], registered=2,
            marks={w: dict(m) for w, m in self.marks.items()},
            chief=min(self.alive, default=None)))

    def set_mark(self, name: str, value: int = 1) -> None:
        self.marks.setdefault(self.worker_id, {})[name] = value


class Kill(keras.callbacks.Callback):
    """The master loses worker 0 at the end of epoch `at`."""

    def __init__(self, cluster: FakeCluster, at: int) -> None:
        super().__init__()
        self.cluster, self.at = cluster, at

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.at:
            self.cluster.alive = [1]


def test_worker_that_becomes_chief_promotes_what_it_wrote(tmp_path, monkeypatch):
    out, job = str(tmp_path / "out"), str(tmp_path / "job")
    monkeypatch.setenv(cluster_env.JOB_DIR, job)
    os.makedirs(out)
    os.makedirs(os.path.join(job, SCRATCH, "worker-7"))  # left by a killed worker 7
    x, y = make_arrays(256)
    # Worker 0, the chief, writes epoch 0 (as plain Keras: the real paths)...
    make_model().fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0,
                     callbacks=file_callbacks(out, delete_checkpoint=False))
    # ... while worker 1 writes its temporary paths. Worker 0 dies in epoch 1 (it
    # writes no more) and the master sees it after epoch 2: worker 1 is the
    # chief from epoch 3's begin on, with epochs 1 and 2 written only by it.
    cluster = FakeCluster(1, [0, 1])
    model = make_model()
    jc = JobCallbacks(model, file_callbacks(out), cluster)
    assert jc.resume_epoch == 1  # worker 0's backup (used by ke.Model.fit only)
    try:
        model.fit(x, y, batch_size=32, epochs=4, shuffle=False, verbose=0,
                  callbacks=jc.callbacks + [Kill(cluster, at=2)])
    finally:
        jc.close()
    check_outputs(out, epochs=4, job_dir=job)
    rows = csv_rows(os.path.join(out, "log.csv"))
    assert [float(r["loss"]) for r in rows][1:] == sorted(
        [float(r["loss"]) for r in rows][1:], reverse=True)  # worker 1's, in order
    # The user's callbacks have their own paths back.
    assert all(out in getattr(cb, "filepath", getattr(cb, "filename", out))
               and SCRATCH not in getattr(cb, "filepath", "")
               for cb in jc.callbacks[1:])


class ChiefAtTrainEnd(FakeCluster):
    """Worker 1 of [0, 1]; from the train end of worker 1's fit on, the
    `at`-th status call finds `then()` done (the chief finishing, or dying)."""

    def __init__(self, at: int, then) -> None:
        super().__init__(1, [0, 1])
        self.at, self.then, self.calls = at, then, None

    def job_status(self):
        if self.calls is not None:
            self.calls += 1
            if self.calls == self.at:
                self.then(self)
        return super().job_status()


class ArmAtTrainEnd(keras.callbacks.Callback):
    def __init__(self, cluster: ChiefAtTrainEnd) -> None:
        super().__init__()
        self.cluster = cluster

    def on_train_end(self, logs=None):
        self.cluster.calls = 0


def fit_as_worker_1(out: str, cluster: ChiefAtTrainEnd,
                    callbacks: list | None = None) -> JobCallbacks:
    x, y = make_arrays(128)
    model = make_model()
    if callbacks is None:
        callbacks = [keras.callbacks.ModelCheckpoint(
            os.path.join(out, "ckpt-{epoch}.keras"))]
    jc = JobCallbacks(model, callbacks, cluster, fit_name="training@2")
    # The helper that waits is last: the test's callback runs just before it.
    callbacks = jc.callbacks[:-1] + [ArmAtTrainEnd(cluster)] + jc.callbacks[-1:]
    try:
        model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0,
                  callbacks=callbacks)
    finally:
        jc.close()
    return jc


def test_fit_of_a_non_chief_returns_once_the_chiefs_files_are_written(
        tmp_path, monkeypatch):
    out = str(tmp_path / "ckpt")
    monkeypatch.setenv(cluster_env.JOB_DIR, str(tmp_path / "job"))
    chief_model = make_model()

    def chief_finishes(cluster):
        os.makedirs(out, exist_ok=True)
        for epoch in (1, 2):
            chief_model.save(os.path.join(out, f"ckpt-{epoch}.keras"))
        cluster.marks[0] = {"callbacks/training@2": 1}

    cluster = ChiefAtTrainEnd(at=3, then=chief_finishes)
    fit_as_worker_1(out, cluster)
    # Worker 1 asked until the chief's mark was there, and not longer.
    assert cluster.calls == 4, cluster.calls  # 1 decide, 2 waits, 1 decide
    assert listing(out) == ["ckpt-1.keras", "ckpt-2.keras"], listing(out)
    assert cluster.marks == {0: {"callbacks/training@2": 1}}  # worker 1 marks nothing


def test_a_non_chief_waiting_for_a_chief_that_dies_promotes_its_own_files(
        tmp_path, monkeypatch):
    out = str(tmp_path / "ckpt")
    monkeypatch.setenv(cluster_env.JOB_DIR, str(tmp_path / "job"))

    def chief_dies(cluster):
        cluster.alive = [1]

    cluster = ChiefAtTrainEnd(at=3, then=chief_dies)
    fit_as_worker_1(out, cluster)
    assert listing(out) == ["ckpt-1.keras", "ckpt-2.keras"], listing(out)
    assert cluster.marks == {1: {"callbacks/training@2": 1}}  # now the chief


@pytest.mark.parametrize("chief_wrote", ["nothing", "epoch 0"])
def test_a_worker_that_becomes_the_chief_at_the_fits_end_promotes_every_file(
        tmp_path, monkeypatch, chief_wrote):
    # A CI run: worker 0, the chief, was killed in its first epoch (its
    # CSVLogger had opened log.csv, no row written); the master saw it lost
    # only once worker 1 had trained every epoch. Worker 1 became the chief in
    # its last callback: its CSV rows were deleted at train end before that
    # promotion, and log.csv stayed empty.
    out = str(tmp_path / "out")
    monkeypatch.setenv(cluster_env.JOB_DIR, str(tmp_path / "job"))
    os.makedirs(out)
    if chief_wrote == "nothing":
        open(os.path.join(out, "log.csv"), "w").close()
    else:  # epoch 0's files, its backup too, as plain Keras writes them
        x, y = make_arrays(128)
        make_model().fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0,
                         callbacks=file_callbacks(out, delete_checkpoint=False))
        assert os.path.exists(os.path.join(out, "backup"))

    def chief_dies(cluster):
        cluster.alive = [1]

    cluster = ChiefAtTrainEnd(at=3, then=chief_dies)
    fit_as_worker_1(out, cluster, callbacks=file_callbacks(out))
    # As after a plain Keras fit: every epoch's files, no backup left.
    assert listing(out) == ["best.weights.h5", "ckpt/model-01.keras",
                            "ckpt/model-02.keras", "log.csv"], listing(out)
    rows = csv_rows(os.path.join(out, "log.csv"))
    assert [r["epoch"] for r in rows] == ["0", "1"], rows
    assert not os.path.exists(os.path.join(str(tmp_path / "job"), SCRATCH))
    assert cluster.marks == {1: {"callbacks/training@2": 1}}


def test_a_non_chief_stops_waiting_for_a_silent_chief_with_a_warning(
        tmp_path, monkeypatch, caplog):
    import logging

    monkeypatch.setenv(cluster_env.JOB_DIR, str(tmp_path / "job"))
    jc = JobCallbacks(make_model(), [keras.callbacks.CSVLogger(str(tmp_path / "a.csv"))],
                      FakeCluster(1, [0, 1]), fit_name="training@3")
    with caplog.at_level(logging.WARNING, logger="absl"):
        jc.tracker.wait_for_chief("callbacks/training@3", limit=0.3)
    assert ("worker 1: the chief did not finish the callbacks of training@3 within "
            "0 s; going on without its files") in caplog.text, caplog.text


def test_marks_travel_through_the_master_and_survive_its_restart(tmp_path):
    """`MasterClient.set_mark`, read by another worker; a restarted master
    learns the marks back from the next heartbeats."""
    from keras_elastic.master.client import MasterClient
    from keras_elastic.master.server import MasterServer

    journal = str(tmp_path / "journal")
    master = MasterServer(host="127.0.0.1", journal=journal)
    port = int(master.address.rsplit(":", 1)[1])
    chief, other = (MasterClient(master.address, i) for i in range(2))  # launched
    try:
        assert [chief.register_worker(), other.register_worker()] == [0, 1]
        chief.set_mark("callbacks/training", 1)
        chief.set_mark("callbacks/training", 0)  # marks only go up
        workers = other.job_status().workers
        assert workers.mark(0, "callbacks/training") == 1, workers
        assert workers.mark(1, "callbacks/training") is None
        master.stop()
        master = MasterServer(host="127.0.0.1", port=port, journal=journal)
        assert other.job_status().workers.marks == {}
        chief.start_heartbeats(interval=0.05)
        for _ in range(400):  # the first heartbeat brings it back
            if other.job_status().workers.marks:
                break
            time.sleep(0.05)
        assert other.job_status().workers.marks == {0: {"callbacks/training": 1}}
    finally:
        chief.worker_exited()
        master.stop()


# -- a job: the chief writes the real paths ----------------------------------------
def check_outputs(out_dir: str, epochs: int, job_dir: str | None = None) -> None:
    """One file set, one CSV row per epoch, no backup; no temporary file of
    any worker left in the job directory."""
    assert listing(out_dir) == sorted(
        ["best.weights.h5", "log.csv"]
        + [f"ckpt/model-{e + 1:02d}.keras" for e in range(epochs)]), listing(out_dir)
    if job_dir is not None:
        assert not os.path.exists(os.path.join(job_dir, SCRATCH)), listing(job_dir)
    text = open(os.path.join(out_dir, "log.csv")).read()
    assert text.count("epoch,") == 1, text
    rows = csv_rows(os.path.join(out_dir, "log.csv"))
    assert [r["epoch"] for r in rows] == [str(e) for e in range(epochs)], text
    assert all(float(r["loss"]) > 0 for r in rows), text
    last = keras.models.load_model(os.path.join(out_dir, f"ckpt/model-{epochs:02d}.keras"))
    assert len(last.get_weights()) == 4


def worker_logs(job_dir: str) -> str:
    return "".join(open(p).read() for p in sorted(glob.glob(
        os.path.join(job_dir, "worker-*.log"))))


@pytest.mark.multiprocess
def test_two_worker_job_writes_each_file_once(tmp_path):
    out_dir, job = str(tmp_path / "out"), str(tmp_path / "job")
    result = launch(job, SCRIPT, "--num_workers=2", "--num_ps=1",
                    script_args=(f"--out_dir={out_dir}", "--epochs=3"), timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    check_outputs(out_dir, epochs=3, job_dir=job)
    logs = worker_logs(job)
    assert "Errno" not in logs and "unable to lock" not in logs, logs[-4000:]
    # One chief (whichever worker registered first); the other ran the
    # callbacks too, on its temporary paths.
    chiefs = re.findall(r"worker (\d) is the chief", logs)
    others = re.findall(r"worker (\d) is not the chief", logs)
    assert len(chiefs) == 1 and others == [str(1 - int(chiefs[0]))], logs[-4000:]


@pytest.mark.multiprocess
def test_chief_killed_mid_training_the_next_worker_continues_the_files(tmp_path):
    out_dir, job = str(tmp_path / "out"), str(tmp_path / "job")
    # Worker 0, the chief, dies at its second epoch end (tasks trained, not
    # reported, its callbacks not run); worker 1 becomes the chief, a new
    # worker 2 joins.
    result = launch(job, SCRIPT, "--num_workers=2", "--num_ps=1",
                    "--max_worker_restarts=1",
                    script_args=(f"--out_dir={out_dir}", "--epochs=4",
                                 "--worker_0_first"),
                    env={"KERAS_ELASTIC_FAULTS": "epoch_end@2:w0"}, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    logs = worker_logs(job)
    assert "SIGKILL at 'epoch_end'" in logs, output[-4000:]
    assert "worker 1 is the chief" in logs, logs[-4000:]
    check_outputs(out_dir, epochs=4, job_dir=job)


# -- the chief, held by the master ------------------------------------------------
def test_the_chief_is_the_first_worker_to_register_also_after_a_master_restart(
        tmp_path):
    # A CI run's 2-worker job: worker 1 reached fit before worker 0 had
    # registered, so under a smallest-alive-id rule both wrote the CSV and the
    # .h5 checkpoint in epoch 1 (an h5py lock error, a CSV of 1 row of 20).
    from keras_elastic.master.client import MasterClient
    from keras_elastic.master.server import MasterServer
    from keras_elastic.worker.cluster import is_chief

    journal = str(tmp_path / "master.journal")
    server = MasterServer(journal=journal)
    clients = []

    def worker(worker_id):
        client = MasterClient(server.address, worker_id)
        clients.append(client)
        assert client.register_worker() == worker_id
        return SimpleNamespace(embedded=False, master=client, worker_id=worker_id)

    try:
        one = worker(1)
        assert is_chief(one)  # alone so far
        zero = worker(0)
        assert is_chief(one) and not is_chief(zero)  # 0 came later: 1 stays chief
        two = worker(2)
        one.master.worker_exited()  # it finished the script: still the chief
        assert not is_chief(zero) and not is_chief(two)
    finally:
        for client in clients:
            client.close()
        server.stop()
    server = MasterServer(journal=journal)  # a restarted master
    try:
        # Worker 0's process goes on (workers register once; their heartbeats
        # reach the new master).
        client = MasterClient(server.address, 0)
        clients.append(client)
        zero = SimpleNamespace(embedded=False, master=client, worker_id=0)
        workers = client.job_status().workers
        assert workers.chief == 1 and workers.exited == [1] and not is_chief(zero)
        assert workers.alive == [0, 2]
    finally:
        for client in clients:
            client.close()
        server.stop()


def test_a_lost_chief_passes_to_the_smallest_alive_id_also_on_replay(tmp_path):
    from keras_elastic.master.servicer import MasterServicer
    from keras_elastic.proto import master_pb2

    journal = str(tmp_path / "master.journal")
    servicer = MasterServicer(journal_path=journal)
    for worker_id in (3, 4, 2):
        servicer.RegisterWorker(master_pb2.WorkerRequest(worker_id=worker_id), None)
    assert servicer.status()["workers"]["chief"] == 3
    servicer.ReportWorkerDead(master_pb2.WorkerRequest(worker_id=3, reason="test"), None)
    assert servicer.status()["workers"]["chief"] == 2
    servicer.ReportWorkerDead(master_pb2.WorkerRequest(worker_id=4, reason="test"), None)
    assert servicer.status()["workers"]["chief"] == 2  # not the chief: no change
    servicer.stop()
    again = MasterServicer(journal_path=journal)
    assert again.status()["workers"]["chief"] == 2
    again.ReportWorkerDead(master_pb2.WorkerRequest(worker_id=2, reason="test"), None)
    assert again.status()["workers"]["chief"] is None  # none alive
    again.RegisterWorker(master_pb2.WorkerRequest(worker_id=7), None)
    assert again.status()["workers"]["chief"] == 7
    again.stop()

"""Keras' file-writing callbacks in an elastic job: the chief writes the files.

Every worker of a job runs the user's callbacks; `JobCallbacks` (what
`ke.Model.fit` gives Keras) follows Keras' multi-worker convention: the
chief writes the user's real paths, every other worker temporary paths of
its own under the job directory (`<job_dir>/callback-files/worker-<id>/`),
deleted when `fit` ends. A worker that becomes the chief first promotes what
it wrote meanwhile (`ModelCheckpoint` saves, `CSVLogger` rows,
`BackupAndRestore` files), so the real paths hold what a chief that never
died would have written; `fit` returns on every worker once the chief's
callbacks are through. `BackupAndRestore` resumes through the master
(`resume_epoch`, `restore_weights`). An embedded cluster behaves exactly as
plain Keras. The whole design, its file layout and its limits:
docs/file_callbacks.md.

Example:

>>> from keras_elastic.worker.cluster import get_cluster
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> jc = JobCallbacks(model, [keras.callbacks.CSVLogger("log.csv")],
...                   get_cluster())      # an embedded cluster: a plain process
>>> jc.resume_epoch is None               # no BackupAndRestore to resume from
True
>>> [type(c).__name__ for c in jc.callbacks]   # a plain process: as given
['CSVLogger']
>>> jc.close()
"""

from __future__ import annotations

import errno
import glob
import json
import os
import re
import shutil
import tempfile

import keras
from absl import logging

from keras_elastic.common.keras_compat import file_utils

SCRATCH = "callback-files"  # under the job directory


def scratch_dir(cluster) -> str:
    """Where the workers of a job keep their temporary callback files: the
    job directory's `callback-files` (`KERAS_ELASTIC_JOB_DIR`, which the
    launcher sets), else one under the system's temporary directory, named
    after the master's address.

    >>> from keras_elastic.worker.cluster import get_cluster
    >>> os.environ["KERAS_ELASTIC_JOB_DIR"] = "/jobs/mnist"   # the launcher's
    >>> scratch_dir(get_cluster())
    '/jobs/mnist/callback-files'
    """
    from keras_elastic.common import cluster_env

    job_dir = os.environ.get(cluster_env.JOB_DIR)
    if job_dir:
        return os.path.join(job_dir, SCRATCH)
    address = str(getattr(cluster.master, "address", "") or "local")
    return os.path.join(tempfile.gettempdir(), "keras-elastic-" + SCRATCH,
                        re.sub(r"[^\w.-]", "_", address))
_HOOKS = ("on_batch_begin", "on_batch_end", "on_epoch_begin", "on_epoch_end",
          "on_train_batch_begin", "on_train_batch_end", "on_test_batch_begin",
          "on_test_batch_end", "on_predict_batch_begin", "on_predict_batch_end",
          "on_train_begin", "on_train_end", "on_test_begin", "on_test_end",
          "on_predict_begin", "on_predict_end")


class JobCallbacks:
    """The user's callbacks as one worker of a job runs them.

    `callbacks`: what to give Keras' `fit`: a helper first (in a job with
    file-writing callbacks), then the user's callbacks, with
    `ModelCheckpoint`, `CSVLogger` and `BackupAndRestore` adapted (see the
    module docstring). `resume_epoch`: the epoch the first
    `BackupAndRestore`'s backup says training resumes at (None without
    one). `restore_weights(model)` loads the backup's weights into the built
    model. `close()` deletes this worker's temporary files (also after a
    failed `fit`).

    Example:

    ```python
    jc = JobCallbacks(model, callbacks, cluster)
    if jc.resume_epoch and not request.resume:  # as Keras: 0 changes nothing
        request.resume, request.resume_epoch = True, jc.resume_epoch
    ...                           # build the model
    jc.restore_weights(model)     # before the servers are initialized
    try:
        keras_fit(..., callbacks=jc.callbacks)
    finally:
        jc.close()
    ```
    """

    def __init__(self, model: keras.Model, callbacks: list | None, cluster,
                 fit_name: str = "fit") -> None:
        self.model = model
        self.cluster = cluster
        self.fit_name = fit_name
        self.embedded = bool(cluster.embedded)
        self.worker_id = int(cluster.worker_id)
        self.scratch = scratch_dir(cluster)
        self.adapters: list[_Adapter] = []
        self._backup: _BackupAdapter | None = None
        adapted = [self._adapt(i, cb) for i, cb in enumerate(list(callbacks or []))]
        self.tracker = _ChiefTracker(self)
        self.callbacks: list = ([self.tracker] + adapted + [_FitEnd(self)]
                                if self.adapters else adapted)
        self.resume_epoch: int | None = None
        self._weights: str | None = None   # a private copy of the backup's weights
        self._copy_dir: str | None = None
        if self._backup is not None:
            self._read_backup(self._backup.callback)

    # -- construction -------------------------------------------------------
    def _adapt(self, index: int, callback):
        from keras_elastic.worker.checkpoint_resume import RestoringCheckpoint

        if getattr(callback, "keras_elastic_per_worker", True) is False:
            return callback
        path = str(getattr(callback, "filepath", None) or getattr(
            callback, "filename", None) or getattr(callback, "backup_dir", ""))
        managed = not self.embedded and not file_utils.is_remote_path(path)
        if not self.embedded and not managed:
            logging.warning("keras_elastic: %s writes %s, not a local path: every "
                            "worker writes it", type(callback).__name__, path)
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            adapter = _BackupAdapter(self, index, callback, managed)
            if self._backup is None:
                self._backup = adapter
            else:
                logging.warning("keras_elastic: several BackupAndRestore callbacks: "
                                "fit resumes from the first one's backup (%s)",
                                self._backup.real)
            if managed:
                self.adapters.append(adapter)
            return adapter
        if not managed:
            return callback
        if (isinstance(callback, keras.callbacks.ModelCheckpoint)
                and not isinstance(callback, RestoringCheckpoint)):
            self.adapters.append(_CheckpointAdapter(self, index, callback))
            return callback  # only its filepath changes
        if isinstance(callback, keras.callbacks.CSVLogger):
            adapter = _CSVAdapter(self, index, callback)
            self.adapters.append(adapter)
            return adapter
        return callback

    def _read_backup(self, backup: keras.callbacks.BackupAndRestore) -> None:
        """Finds the backup's resume epoch and copies its weights aside, as
        Keras' `on_train_begin` would load them (the previous backup of a
        `double_checkpoint` if the latest one cannot be read)."""
        pairs = [(backup._weights_path, backup._training_metadata_path)]
        if file_utils.exists(backup._prev_weights_path):
            pairs.append((backup._prev_weights_path,
                          backup._prev_training_metadata_path))
        error: Exception | None = None
        for weights, metadata in pairs:
            try:
                epoch = None
                if file_utils.exists(metadata):
                    with file_utils.File(metadata, "r") as f:
                        epoch = int(json.loads(f.read())["epoch"])
                copy = self._copy_weights(weights) if file_utils.exists(weights) else None
            except (OSError, ValueError, KeyError, TypeError) as e:
                error = error or e
                continue
            self.resume_epoch, self._weights = epoch, copy
            if epoch is not None or copy is not None:
                logging.info("keras_elastic: BackupAndRestore backup %s: resume at "
                             "epoch %s%s", os.path.dirname(weights), epoch,
                             " with its weights" if copy else "")
            return
        if error is not None:
            if self.embedded:
                raise error
            logging.warning("keras_elastic: cannot read the BackupAndRestore backup "
                            "in %s (%s: %s); this worker does not restore it",
                            backup.backup_dir, type(error).__name__, error)

    def _copy_weights(self, path: str) -> str:
        """A private copy of an HDF5 weights file, checked readable: the chief
        may rewrite the original meanwhile (h5py locks files it writes)."""
        import h5py

        if self._copy_dir is None:
            self._copy_dir = tempfile.mkdtemp(prefix="ke-backup-")
        # Keras' load_weights wants a ".weights.h5" name (not ".bkp").
        copy = os.path.join(self._copy_dir, "backup.weights.h5")
        file_utils.copy(path, copy)

        def read(_name, item) -> None:
            if isinstance(item, h5py.Dataset):
                item[()]

        with h5py.File(copy, "r") as f:
            f.visititems(read)
        return copy

    # -- the interface ----------------------------------------------------------
    def restore_weights(self, model: keras.Model) -> None:
        """Loads the backup's weights (and optimizer variables, as Keras'
        `BackupAndRestore`) into the built `model`; a no-op without a backup.

        In an embedded process whose model is already connected to the
        servers (a second `fit` after one that crashed), the values are also
        sent to the servers, as Keras would train from them."""
        if self._weights is None:
            return
        try:
            optimizer = getattr(model, "optimizer", None)
            if optimizer is not None and not optimizer.built:
                optimizer.build(model.trainable_variables)
            model.load_weights(self._weights)
        except (OSError, ValueError) as e:
            if self.embedded:
                raise
            logging.warning("keras_elastic: cannot load the BackupAndRestore weights "
                            "(%s: %s); the servers' values are used", type(e).__name__,
                            e)
            return
        finally:
            self._drop_copy()
        from keras_elastic.worker.session import session_of

        session = session_of(model)
        if self.embedded and session is not None:
            session.push_local_values()

    def close(self) -> None:
        """Best effort, idempotent: deletes this worker's temporary files (a
        `fit` that failed leaves them) and gives the user's callbacks back
        their own paths."""
        for adapter in self.adapters:
            try:
                adapter.close()
            except OSError as e:
                logging.warning("keras_elastic: cannot clean up %s: %s",
                                adapter.temp_root, e)
        for adapter in self.adapters:
            _remove_if_empty(adapter.worker_dir)
        _remove_if_empty(self.scratch)
        self._drop_copy()

    def _drop_copy(self) -> None:
        if self._copy_dir is not None:
            shutil.rmtree(self._copy_dir, ignore_errors=True)
            self._copy_dir = None
        self._weights = None


class _ChiefTracker(keras.callbacks.Callback):
    """First in the list: decides the chief (one master call per epoch) and
    points the adapted callbacks at their paths."""

    def __init__(self, job: JobCallbacks) -> None:
        super().__init__()
        self.job = job
        self.chief: bool | None = None

    def decide(self) -> bool:
        from keras_elastic.worker.cluster import is_chief

        try:
            chief = is_chief(self.job.cluster)
        except ConnectionError as e:  # the master is restarting: keep the last
            chief = bool(self.chief)
            logging.warning("keras_elastic: cannot tell the chief (%s); worker %d "
                            "goes on as %s", e, self.job.worker_id,
                            "the chief" if chief else "a non-chief")
        if chief != self.chief:
            logging.info("keras_elastic: worker %d is %s: ModelCheckpoint, CSVLogger "
                         "and BackupAndRestore write %s", self.job.worker_id,
                         "the chief" if chief else "not the chief",
                         "the real paths" if chief else "temporary paths")
        self.chief = chief
        for adapter in self.job.adapters:
            adapter.point(chief)
        return chief

    def on_train_begin(self, logs=None):
        for adapter in self.job.adapters:  # left by a killed worker of this id
            shutil.rmtree(adapter.temp_root, ignore_errors=True)
        self.decide()

    def on_epoch_begin(self, epoch, logs=None):
        for adapter in self.job.adapters:
            adapter.prune()
        self.decide()

    def wait_for_chief(self, mark: str, limit: float | None = None) -> None:
        """Returns once the chief reported `mark` (its callbacks of this fit
        are through: its files are written), or this worker became the chief
        (the chief died), or after `limit` seconds (default: the liveness
        timeout; a warning)."""
        from keras_elastic.worker import chief

        chief.wait_for_chief(
            self.job.cluster, mark, limit=limit,
            what=f"finish the callbacks of {self.job.fit_name}",
            then="going on without its files")

    def train_end(self) -> None:
        """After every callback's `on_train_end` (`_FitEnd`): a non-chief
        waits for the chief's, so that when `fit` returns on any worker the
        files of the whole fit are there (as after a plain Keras `fit`: a
        script that reads its newest checkpoint next reads the same file on
        every worker); the chief then reports its own."""
        mark = f"callbacks/{self.job.fit_name}"
        if not self.decide():
            self.wait_for_chief(mark)
        for adapter in self.job.adapters:
            adapter.prune()
        chief = self.decide()
        # Only after that last decision: a worker that became the chief in it
        # promoted its temporary files (every epoch's CSV rows among them),
        # and does the chief's train-end work on the real paths.
        for adapter in self.job.adapters:
            adapter.train_end(chief)
        if chief:
            self._remove_dead_workers_files()
            try:
                self.job.cluster.master.set_mark(mark)
            except ConnectionError as e:
                logging.warning("keras_elastic: cannot report the end of %s's "
                                "callbacks (%s): the other workers wait for it up "
                                "to the liveness timeout", self.job.fit_name, e)

    def _remove_dead_workers_files(self) -> None:
        """Temporary directories of workers no longer alive (killed workers
        leave theirs)."""
        try:
            alive = set(self.job.cluster.master.job_status().workers.alive)
        except ConnectionError:
            return
        alive.add(self.job.worker_id)
        for path in glob.glob(os.path.join(glob.escape(self.job.scratch), "worker-*")):
            suffix = os.path.basename(path)[len("worker-"):]
            if suffix.isdigit() and int(suffix) not in alive:
                logging.info("keras_elastic: removing %s (worker %s is gone)",
                             path, suffix)
                shutil.rmtree(path, ignore_errors=True)


class _FitEnd(keras.callbacks.Callback):
    """Last in the list: at train end, after the user's callbacks, the chief's
    files of the fit are complete (`_ChiefTracker.train_end`)."""

    def __init__(self, job: JobCallbacks) -> None:
        super().__init__()
        self.job = job

    def on_train_end(self, logs=None):
        self.job.tracker.train_end()


# -- the adapted callbacks ------------------------------------------------------
class _Adapter:
    """Where one file-writing callback writes: its real path or this worker's
    temporary one. `point(chief)` switches (promoting on becoming chief)."""

    kind = ""

    def __init__(self, job: JobCallbacks, index: int, real: str) -> None:
        self.job = job
        self.real = real
        self.parent, rest = _split_template(real)
        self.worker_dir = os.path.join(job.scratch, f"worker-{job.worker_id}")
        self.temp_root = os.path.join(self.worker_dir, f"{self.kind}-{index}")
        self.temp = os.path.join(self.temp_root, rest)
        self.chief: bool | None = None

    def point(self, chief: bool) -> None:
        if chief == self.chief:
            return
        if chief and self.chief is False:
            self.promote()
        self.chief = chief
        self.use(self.real if chief else self.temp)

    def use(self, path: str) -> None:
        """Makes the callback write to `path`."""

    def promote(self) -> None:
        """This worker became the chief: its temporary files to the real paths."""

    def prune(self) -> None:
        """Drops temporary files that can no longer be promoted."""

    def train_end(self, chief: bool) -> None:
        """The fit's end, after the job's last word on the chief (`chief`):
        the callback's own train-end work if it has some on the real paths,
        then this worker's temporary files go (kept until then: a worker
        that becomes the chief at the very end promotes them)."""
        self.close()

    def close(self) -> None:
        """Deletes the temporary files; the callback gets its real path back."""
        shutil.rmtree(self.temp_root, ignore_errors=True)
        _remove_if_empty(self.worker_dir)
        self.restore()

    def restore(self) -> None:
        """Gives the user's callback its own path back."""
        self.use(self.real)


class _CheckpointAdapter(_Adapter):
    """`keras.callbacks.ModelCheckpoint`: its `filepath` (a template) moves."""

    kind = "checkpoint"

    def __init__(self, job: JobCallbacks, index: int,
                 callback: keras.callbacks.ModelCheckpoint) -> None:
        self.callback = callback
        super().__init__(job, index, callback.filepath)
        # The real files of the series: the placeholders as wildcards.
        self.series = re.sub(r"\{[^{}]*\}", "*", glob.escape(self.real))

    def use(self, path: str) -> None:
        self.callback.filepath = path

    def prune(self) -> None:
        """Deletes the temporary saves the chief wrote too: a file whose real
        counterpart exists once a real file of the series is at least as new
        (the chief saved after this worker, or saved again since)."""
        files = _files(self.temp_root)
        if not files:
            return
        newest = max((_mtime(p) for p in glob.glob(self.series)), default=None)
        if newest is None:
            return
        for path in files:
            real = os.path.join(self.parent, os.path.relpath(path, self.temp_root))
            if os.path.exists(real) and newest >= _mtime(path):
                os.remove(path)

    def promote(self) -> None:
        self.prune()
        _move_tree(self.temp_root, self.parent)


class _Forwarding(keras.callbacks.Callback):
    """Runs a callback through Keras' hooks, except those in `_OWN`."""

    _OWN: tuple[str, ...] = ()

    def __init__(self, callback: keras.callbacks.Callback) -> None:
        super().__init__()
        self.callback = callback
        # Forward every hook (Keras' defaults stay defaults, so Keras may still
        # dispatch batch hooks asynchronously).
        for name in _HOOKS:
            if name not in self._OWN:
                setattr(self, name, getattr(callback, name))
        self.async_safe = getattr(callback, "async_safe", False)

    def set_params(self, params):
        super().set_params(params)
        self.callback.set_params(params)

    def set_model(self, model):
        super().set_model(model)
        self.callback.set_model(model)


class _CSVAdapter(_Adapter, _Forwarding):
    """`keras.callbacks.CSVLogger` in a job: opened at the first epoch begin,
    continued by a worker that becomes the chief (see the module doc)."""

    kind = "csv"
    _OWN = ("on_train_begin", "on_epoch_begin", "on_epoch_end", "on_train_end")

    def __init__(self, job: JobCallbacks, index: int,
                 callback: keras.callbacks.CSVLogger) -> None:
        _Forwarding.__init__(self, callback)
        _Adapter.__init__(self, job, index, callback.filename)
        self._opened = False
        self._written_up_to = -1  # epochs the real file holds (after a promotion)

    def on_train_begin(self, logs=None):
        self._opened, self._written_up_to = False, -1

    def on_epoch_begin(self, epoch, logs=None):
        if not self._opened:
            self._opened = True
            if self.chief:
                self._open(self.real, append=self.callback.append or epoch > 0)
            else:
                self._open(self.temp, append=False)
        self.callback.on_epoch_begin(epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        if self.chief and epoch <= self._written_up_to:
            logging.info("keras_elastic: CSVLogger: %s already has epoch %d",
                         self.real, epoch)
            return
        self.callback.on_epoch_end(epoch, logs)

    def on_train_end(self, logs=None):
        self.callback.on_train_end(logs)  # closes the file; `train_end` cleans up

    def _open(self, path: str, append: bool) -> None:
        """The callback's `on_train_begin` on `path` (its file closed first)."""
        callback = self.callback
        if callback.csv_file is not None and not callback.csv_file.closed:
            callback.csv_file.close()
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        callback.filename = path
        own_append = callback.append
        callback.append, callback.append_header = append, True
        try:
            callback.on_train_begin()
        finally:
            callback.append = own_append

    def point(self, chief: bool) -> None:
        if not self._opened:  # opened at the first epoch begin
            self.chief = chief
            return
        super().point(chief)

    def use(self, path: str) -> None:
        if not self._opened:
            self.callback.filename = path
        elif self.callback.filename != path:
            self._open(path, append=True)

    def promote(self) -> None:
        callback = self.callback
        if callback.csv_file is not None and not callback.csv_file.closed:
            callback.csv_file.close()
        try:
            self._written_up_to = merge_csv(self.temp, self.real, callback.sep)
        except OSError as e:
            logging.warning("keras_elastic: CSVLogger: cannot continue %s from %s "
                            "(%s)", self.real, self.temp, e)
            return
        if os.path.exists(self.temp):
            os.remove(self.temp)

    def close(self) -> None:
        callback = self.callback
        if callback.csv_file is not None and not callback.csv_file.closed:
            callback.csv_file.close()  # (a promotion at train end reopens it)
        super().close()

    def restore(self) -> None:
        self.callback.filename = self.real


class _BackupAdapter(_Adapter, _Forwarding):
    """`keras.callbacks.BackupAndRestore`: no restore inside Keras' fit (see
    `JobCallbacks`); backups to the chief's real `backup_dir`."""

    kind = "backup"
    _OWN = ("on_train_begin", "on_train_end")

    def __init__(self, job: JobCallbacks, index: int,
                 callback: keras.callbacks.BackupAndRestore, managed: bool) -> None:
        _Forwarding.__init__(self, callback)
        _Adapter.__init__(self, job, index, os.path.normpath(callback.backup_dir))
        self.real = callback.backup_dir  # as the user gave it
        self.managed = managed  # False: the real path in any case (embedded)
        if not managed:
            self.chief = True

    def on_train_begin(self, logs=None):
        pass  # restored by JobCallbacks.restore_weights, before the servers init

    def on_train_end(self, logs=None):
        if not self.managed:  # the real path in any case
            self.callback.on_train_end(logs)
        # else `train_end`, once the chief of the fit's end is known

    def train_end(self, chief: bool) -> None:
        if chief:
            self.callback.on_train_end()  # delete_checkpoint: the real backup
        self.close()

    def use(self, path: str) -> None:
        callback = self.callback
        callback.backup_dir = path
        callback._weights_path = file_utils.join(path, "latest.weights.h5")
        callback._training_metadata_path = file_utils.join(
            path, "training_metadata.json")
        callback._prev_weights_path = f"{callback._weights_path}.bkp"
        callback._prev_training_metadata_path = (
            f"{callback._training_metadata_path}.bkp")

    def promote(self) -> None:
        _move_tree(self.temp, self.real)

    def close(self) -> None:
        if self.managed:
            super().close()


# -- files ------------------------------------------------------------------
def _split_template(path: str) -> tuple[str, str]:
    """(the longest leading directory of `path` without a `{placeholder}`,
    the rest).

    >>> _split_template("ckpt/{epoch:02d}/model.keras")
    ('ckpt', '{epoch:02d}/model.keras')
    """
    parent = os.path.dirname(path)
    while "{" in parent:
        parent = os.path.dirname(parent)
    rest = os.path.relpath(path, parent) if parent else path
    return parent, rest


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


def _files(root: str) -> list[str]:
    return [os.path.join(d, name) for d, _, names in os.walk(root) for name in names]


def _move_tree(source: str, target: str) -> None:
    """Moves every file under `source` to the same place under `target`
    (replacing), then removes `source`."""
    for path in _files(source):
        destination = os.path.join(target, os.path.relpath(path, source))
        os.makedirs(os.path.dirname(destination) or ".", exist_ok=True)
        try:
            os.replace(path, destination)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            # Another filesystem: a copy beside the real file, then a rename.
            partial = f"{destination}.ke-partial"
            shutil.copyfile(path, partial)
            os.replace(partial, destination)
            os.remove(path)
        logging.info("keras_elastic: promoted %s to %s", path, destination)
    shutil.rmtree(source, ignore_errors=True)


def _remove_if_empty(directory: str) -> None:
    try:
        os.rmdir(directory)
    except OSError:
        pass


def _complete_lines(path: str) -> list[str]:
    """The lines of a CSV file with their line ends, without a torn last
    line; [] if there is no file."""
    try:
        with open(path, newline="") as f:
            lines = f.read().splitlines(keepends=True)
    except FileNotFoundError:
        return []
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines.pop()
    return lines


def _epoch(line: str, separator: str) -> int | None:
    """The epoch of a CSVLogger row (its first field); None for the header."""
    try:
        return int(line.split(separator, 1)[0].strip())
    except ValueError:
        return None


def merge_csv(temp: str, real: str, separator: str = ",") -> int:
    """Continues the CSVLogger file `real` with the rows of `temp` (another
    worker's copy of the same log) whose epoch is after `real`'s last row;
    all of `temp` if `real` has no row. A torn last line of `real` is
    dropped. Returns the epoch of the last row of `real` now (-1 if none).

    Example:

    >>> os.makedirs("logs/.ke-worker-1/csv-2")
    >>> with open("logs/log.csv", "w") as f:                 # the chief's
    ...     _ = f.write("epoch,loss\\n0,0.9\\n1,0.5\\n")
    >>> with open("logs/.ke-worker-1/csv-2/log.csv", "w") as f:  # another's
    ...     _ = f.write("epoch,loss\\n0,0.9\\n1,0.5\\n2,0.4\\n3,0.3\\n")
    >>> merge_csv("logs/.ke-worker-1/csv-2/log.csv", "logs/log.csv")
    3
    >>> print(open("logs/log.csv").read(), end="")
    epoch,loss
    0,0.9
    1,0.5
    2,0.4
    3,0.3
    """
    os.makedirs(os.path.dirname(real) or ".", exist_ok=True)
    try:
        with open(real, newline="") as f:
            before = f.read()
    except FileNotFoundError:
        before = None
    lines = _complete_lines(real)
    rows = [e for e in (_epoch(line, separator) for line in lines) if e is not None]
    last = rows[-1] if rows else -1
    added = []
    for line in _complete_lines(temp):
        epoch = _epoch(line, separator)
        if epoch is None:  # the header: needed only by an empty file
            if not lines and not added:
                added.append(line)
        elif epoch > last:
            added.append(line)
            last = epoch
    merged = "".join(lines + added)
    if merged != before:
        fd, path = tempfile.mkstemp(dir=os.path.dirname(real) or ".",
                                    prefix=f".{os.path.basename(real)}.")
        with os.fdopen(fd, "w", newline="") as f:
            f.write(merged)
        os.replace(path, real)
        logging.info("keras_elastic: CSVLogger: %d row(s) of %s appended to %s",
                     sum(1 for line in added if _epoch(line, separator) is not None),
                     temp, real)
    return last

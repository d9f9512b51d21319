"""The master's journal: what it must not forget, on disk before it is said.

An append-only file of records, each `length (4 bytes) | CRC-32 (4 bytes) |
JSON`, written and fsync'd in batches by one background thread (group commit:
records appended during one fsync share the next). The servicer appends a
record under its lock, in the order its state changes (no system call under
that lock), and an answer that makes a change irrevocable waits until its
record is durable (`wait`): what a worker acts on survives a crash of the
master.

`read` gives the records back for a restarted master, and `JournalReplay`
rebuilds the master's state from them (its docstring lists the record kinds).
A torn last record (the process died while writing it) is dropped, and cut
off the file so new records follow a clean one; anything else that cannot be
read raises `JournalCorruptError` naming the file and the byte offset.

Example:

>>> journal = Journal("master.journal")
>>> seq = journal.append({"t": "done", "ds": "training", "epoch": 0})
>>> journal.wait(seq)            # durable from here on
>>> journal.close()
>>> Journal.read("master.journal")
[{'t': 'done', 'ds': 'training', 'epoch': 0}]
"""

from __future__ import annotations

import base64
import json
import os
import struct
import threading
import time
import zlib

import numpy as np
from absl import logging

from keras_elastic.common import disk, errors, fencing
from keras_elastic.master.membership import Membership
from keras_elastic.master.task_queue import (
    LEDGER_FIELDS,
    DatasetSpec,
    DatasetTasks,
    LeaseClock,
    rollback_training,
)

_HEADER = struct.Struct("<II")  # payload length, CRC-32 of the payload
# A record longer than this is not a record (a corrupt length field).
MAX_RECORD_BYTES = 256 << 20


class JournalFencedError(errors.ClusterError, OSError):
    """Another master wrote the journal: this one was replaced, and stops."""


class JournalCorruptError(errors.JobError, RuntimeError):
    """A record in the middle of the journal cannot be read."""

    def __init__(self, path: str, offset: int, what: str) -> None:
        super().__init__(f"master journal {path} is corrupt at byte offset {offset}: "
                         f"{what}. The records before it are intact; move the file "
                         "away to start the job's bookkeeping afresh.")
        self.path = path
        self.offset = offset


def encode_record(record: dict) -> bytes:
    payload = json.dumps(record, separators=(",", ":")).encode()
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


class Journal:
    """Appends records to `path`; one thread writes and fsyncs them in batches.

    `append` encodes the record and queues it (under the journal's lock, so
    the file holds records in the order they were appended); it makes no
    system call, so the caller may hold its own lock around it without
    stalling other threads. The flushing thread writes what was queued and
    fsyncs it (group commit: the records that arrive during one fsync share
    the next; with `flush_secs` > 0 it also waits that long for company, up
    to `max_batch` records, unless someone waits). `wait(seq)` returns once
    record `seq` is on disk.
    """

    def __init__(self, path: str, flush_secs: float = 0.0,
                 max_batch: int = 1024, on_error=None) -> None:
        self.path = path
        # Called (from the flushing thread) with the error that stopped the
        # journal: a full disk, or another master writing it (JournalFencedError).
        self.on_error = on_error
        self.flush_secs = flush_secs
        self.max_batch = max_batch
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        # Where this master's last write ended: a file that grew past it was
        # written by another master (fencing: this one was replaced).
        self._end = os.fstat(self._fd).st_size
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # RPC handlers: records on disk
        self._work = threading.Condition(lock)  # the flusher: records to sync
        self._queued: list[bytes] = []  # encoded, not yet written
        self._appended = 0   # sequence number of the last record appended
        self._durable = 0    # of the last record fsync'd
        self._error: BaseException | None = None
        self._closed = False
        self._urgent = False  # someone waits: flush without lingering
        self.batches = 0
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="master-journal")
        self._thread.start()

    @property
    def appended(self) -> int:
        """Sequence number of the last record appended."""
        return self._appended

    @property
    def error(self) -> BaseException | None:
        """The write error that stopped the journal (None while it works)."""
        return self._error

    def describe_failure(self, error: BaseException) -> str:
        """One line for the journal's failure: the path, what went wrong, the
        space left (a full disk). Whichever caller notices first (the
        flushing thread, an append, a wait) says it the same way, from the
        journal's own error rather than the wrapper an append or a wait
        raises (`error`: its words when no write failed, a sync that timed
        out)."""
        cause = self._error
        if cause is None:
            return str(error)
        if disk.is_disk_condition(cause):
            return disk.describe_write_error(self.path, cause)
        return f"the master journal {self.path} cannot be written: {cause}"

    @property
    def durable(self) -> int:
        """Sequence number of the last record on disk."""
        return self._durable

    def append(self, record: dict) -> int:
        """Queues `record` for the disk; returns its sequence number (for `wait`)."""
        data = encode_record(record)
        with self._cond:
            if self._error is not None or self._closed:
                raise OSError(f"the master journal {self.path} cannot be written: "
                              f"{self._error or 'closed'}")
            self._queued.append(data)
            self._appended += 1
            if len(self._queued) == 1 or len(self._queued) >= self.max_batch:
                self._work.notify()
            return self._appended

    def wait(self, seq: int, timeout: float | None = 60.0) -> None:
        """Blocks until record `seq` (and every one before it) is on disk."""
        with self._cond:
            if self._durable < seq:
                self._urgent = True
                self._work.notify()
            if not self._cond.wait_for(
                    lambda: self._durable >= seq or self._error is not None, timeout):
                raise TimeoutError(f"the master journal {self.path} was not synced "
                                   f"within {timeout} s")
            if self._durable < seq:
                raise OSError(f"the master journal {self.path} cannot be written: "
                              f"{self._error}")

    def _run(self) -> None:
        while True:
            with self._cond:
                self._work.wait_for(lambda: self._queued or self._closed)
                if self.flush_secs > 0 and not self._closed:
                    self._work.wait_for(
                        lambda: len(self._queued) >= self.max_batch or self._urgent
                        or self._closed, self.flush_secs)
                batch, self._queued = self._queued, []
                self._urgent = False
                target = self._appended
                closed = self._closed
            if batch:
                try:
                    data = b"".join(batch)
                    size = os.fstat(self._fd).st_size
                    if size != self._end:
                        raise JournalFencedError(
                            f"the master journal {self.path} grew from {self._end} "
                            f"to {size} bytes without this master: another master "
                            "writes it (this one was replaced), so this one stops")
                    written = 0
                    while written < len(data):
                        written += os.write(self._fd, data[written:])
                    os.fsync(self._fd)
                    self._end += written
                except OSError as e:
                    logging.error("the master journal %s cannot be written: %s",
                                  self.path, e)
                    with self._cond:
                        self._error = e
                        self._cond.notify_all()
                    if self.on_error is not None:
                        self.on_error(e)
                    return
                self.batches += 1
                with self._cond:
                    self._durable = target
                    self._cond.notify_all()
            if closed:
                return

    def close(self) -> None:
        """Syncs what was written and closes the file."""
        with self._cond:
            self._closed = True
            self._work.notify_all()
        self._thread.join(timeout=30)
        os.close(self._fd)

    @staticmethod
    def read(path: str, repair: bool = True) -> list[dict]:
        """The records of the journal at `path` ([] if there is none).

        A torn last record is dropped (and, with `repair`, cut off the file);
        a record that cannot be read before the end raises
        `JournalCorruptError`.
        """
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        records = []
        offset = 0
        size = len(data)
        while offset < size:
            torn = None
            if offset + _HEADER.size > size:
                torn = "a record header cut short"
            else:
                length, crc = _HEADER.unpack_from(data, offset)
                end = offset + _HEADER.size + length
                if length == 0 or length > MAX_RECORD_BYTES:
                    if not any(data[offset:]):
                        torn = "zeros after the last record"
                    else:
                        raise JournalCorruptError(path, offset,
                                                  f"impossible record length {length}")
                elif end > size:
                    torn = "the last record cut short"
                else:
                    payload = data[offset + _HEADER.size:end]
                    if zlib.crc32(payload) != crc:
                        if end == size:
                            torn = "the last record's checksum does not match"
                        else:
                            raise JournalCorruptError(
                                path, offset, "the record's checksum does not match "
                                "its bytes")
                    else:
                        try:
                            records.append(json.loads(payload))
                        except ValueError as e:
                            raise JournalCorruptError(path, offset,
                                                      f"not a JSON record ({e})") from None
                        offset = end
                        continue
            # A torn tail: the process died while writing it.
            logging.warning("master journal %s: dropping a torn tail at byte offset %d "
                            "(%s, %d bytes)", path, offset, torn, size - offset)
            if repair:
                with open(path, "r+b") as f:
                    f.truncate(offset)
            break
        return records


def encode_states(states: dict[str, np.ndarray] | None) -> dict | None:
    """Metric states as a "done" record holds them: {name: [dtype, shape,
    base64 of the bytes]} (None for none)."""
    if not states:
        return None
    return {name: [str(v.dtype), list(v.shape), base64.b64encode(
        np.ascontiguousarray(v).tobytes()).decode()] for name, v in states.items()}


def decode_states(encoded: dict | None) -> dict[str, np.ndarray] | None:
    """The metric states of a "done" record (`encode_states`' inverse)."""
    if not encoded:
        return None
    return {name: np.frombuffer(base64.b64decode(data), dtype=np.dtype(dtype)
                                ).reshape(shape).copy()
            for name, (dtype, shape, data) in encoded.items()}


class JournalReplay:
    """Rebuilds the master's state from its journal's records (a restarted
    master): the workers (`membership`), the datasets with their epochs,
    ledgers, evaluation rounds and failures (`datasets`), the lease clock
    (`leases`) and how many masters started on the journal (`starts`).

    The records, each a JSON object with its kind `t` and the generation `g`
    of the master that wrote it:

    - `start` {time}: a master started on the journal.
    - `worker` {id, state: alive | exited | lost, time (alive), reason (lost)}.
    - `dataset` {spec (`DatasetSpec` as a dict), resume, resume_epoch,
      resume_done, warning}: a dataset registered.
    - `done` {ds, rows (ledger entries as lists of `LEDGER_FIELDS`), states
      (`encode_states`)}: tasks completed.
    - `failed` {ds, epoch, task_id, worker, error}: a task failed.
    - `rollback` {progress, reason, lease}: the training datasets went back
      to `progress`; every later lease is above `lease`.

    A record of a generation older than one already seen was written by a
    master replaced meanwhile: it is skipped (`skipped`, `fence`).

    >>> replay = JournalReplay().run([
    ...     {"t": "start", "time": 0.0, "g": 0},
    ...     {"t": "worker", "id": 0, "state": "alive", "time": 0.0, "g": 0}])
    >>> replay.starts, replay.membership.alive()
    (1, [0])
    """

    def __init__(self, max_task_retries: int = 3, membership: Membership | None = None,
                 leases: LeaseClock | None = None,
                 datasets: dict[str, DatasetTasks] | None = None) -> None:
        self.max_task_retries = max_task_retries
        self.membership = membership if membership is not None else Membership()
        self.leases = leases if leases is not None else LeaseClock()
        self.datasets = datasets if datasets is not None else {}
        self.starts = 0
        self.fence = 0  # the newest generation seen
        self.skipped = 0  # records of replaced masters

    def run(self, records: list[dict], path: str = "",
            generation: fencing.Generation | None = None) -> JournalReplay:
        """Replays `records` (of the journal at `path`, for messages); moves
        `generation` to the newest one they carry. Raises ValueError naming
        the record that cannot be replayed."""
        for i, record in enumerate(records):
            kind = record.get("t")
            if record.get("g", 0) < self.fence:
                self.skipped += 1  # written by a master replaced meanwhile
                continue
            self.fence = max(self.fence, record.get("g", 0))
            try:
                self.apply(record)
            except (IndexError, KeyError, TypeError, ValueError) as e:
                raise ValueError(f"master journal {path}: record {i} ({kind}) cannot "
                                 f"be replayed: {type(e).__name__}: {e}") from None
        if self.skipped:
            logging.warning("master journal %s: %d record(s) of a replaced master "
                            "skipped (older generation than %d)", path, self.skipped,
                            self.fence)
        if generation is not None:
            generation.fence(self.fence)
        for ds in self.datasets.values():
            ds.finish_replay()
        if records:
            alive = self.membership.alive()
            self.membership.heard_all(time.monotonic())
            logging.warning(
                "master restarted from its journal %s (%d records, start %d): %s; "
                "workers %s alive; tasks that were in flight are handed out again",
                path, len(records), self.starts + 1, ", ".join(
                    f"'{n}' at epoch {ds.epoch} with {len(ds.done)} task(s) done"
                    for n, ds in self.datasets.items()) or "no dataset", alive)
        return self

    def apply(self, record: dict) -> None:
        """Replays one record (of a generation not fenced off)."""
        kind = record.get("t")
        if kind == "start":
            self.starts += 1
        elif kind == "worker":
            self.membership.restore(record["id"], record["state"], time.monotonic(),
                                    joined=record.get("time", 0))
        elif kind == "dataset":
            spec = DatasetSpec.from_json(record["spec"])
            ds = DatasetTasks(spec, self.max_task_retries, self.leases.next)
            ds.warning = record.get("warning", "")
            if record.get("resume"):
                ds.restore_progress(record["resume_epoch"], set(record["resume_done"]))
            self.datasets[spec.name] = ds
        elif kind == "done":
            entries = [dict(zip(LEDGER_FIELDS, row)) for row in record["rows"]]
            self.datasets[record["ds"]].replay_done(entries,
                                                    decode_states(record.get("states")))
            self.leases.observe(max((e.get("lease", 0) for e in entries), default=0))
        elif kind == "failed":
            self.datasets[record["ds"]].replay_failed(
                record["epoch"], record["task_id"], record["worker"], record["error"])
        elif kind == "rollback":
            rollback_training(self.datasets, record["progress"])
            self.leases.observe(record.get("lease", 0))
        else:
            raise ValueError(f"unknown record kind {kind!r}")

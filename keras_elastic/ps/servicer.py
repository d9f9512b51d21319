"""The parameter server's gRPC service over a `ParameterStore`.

Requests come from other processes and are checked in full before anything
changes (the variables, the version, the task log): a tensor whose header does
not match its bytes, a gradient or value whose dtype or shape is not its
variable's, a malformed element range or Init header, an optimizer
hyperparameter that is unknown, not a finite number >= 0 or not settable (a
learning rate for an optimizer with a LearningRateSchedule) is answered
INVALID_ARGUMENT; a variable this server does not hold NOT_FOUND (naming the
server that owns it, if another one); a push before init FAILED_PRECONDITION.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

import grpc
import numpy as np
from absl import logging

from keras_elastic.common import disk, errors, faults, variable_slices
from keras_elastic.common.tensor_codec import (
    BundleParser,
    FrameParser,
    TensorError,
    bundle_bytes,
    chunk_frames_all,
    decode_all,
    read_stream,
    tensors_bytes,
)
from keras_elastic.proto import ps_pb2, ps_pb2_grpc
from keras_elastic.ps.partition import (
    ASSIGN_PREFIX,
    BASE_PREFIX,
    OPTIMIZER_STATE_PREFIX,
    SPARSE_PREFIX,
    ps_for,
    row_owner,
)
from keras_elastic.ps.replication import (
    DEFAULT_TIMEOUT,
    Backup,
    copy_state,
    marker_path,
)
from keras_elastic.ps.store import ParameterStore, UnknownVariableError
from keras_elastic.ps.task_log import Range, StaleLeaseError
from keras_elastic.ps.update import Update

__all__ = ["ASSIGN_PREFIX", "ParameterServerServicer"]


def ranges_of(header) -> list[Range]:
    return [Range((r.dataset, r.epoch, r.task_id), r.lease, r.start, r.end,
                  r.fingerprint, r.update) for r in header.ranges]


def optimizer_spec_of(header) -> tuple[dict, list[str]] | None:
    """(config, variable keys) of the optimizer group a push header names, or
    None for the model's own optimizer; ValueError if malformed."""
    if not header.optimizer or not header.HasField("optimizer_spec"):
        return None  # the model's own optimizer, or a group made before
    if not header.optimizer_spec.config:
        raise ValueError(f"the spec of optimizer '{header.optimizer}' has no config")
    try:
        config = json.loads(header.optimizer_spec.config)
    except ValueError as e:
        raise ValueError(f"optimizer '{header.optimizer}': its config is not JSON: {e}"
                         ) from None
    if not isinstance(config, dict):
        raise ValueError(f"optimizer '{header.optimizer}': its config is not a JSON "
                         "object")
    return config, list(header.optimizer_spec.variables)


class ParameterServerServicer(ps_pb2_grpc.ParameterServerServicer):
    # Requests read without protobuf's copies: the pushed tensors' chunks are
    # views of the received messages (see `rpc_service.add_service`).
    RAW_REQUESTS = {"Push": FrameParser(ps_pb2.PushHeader),
                    "PushSmall": BundleParser(ps_pb2.PushHeader)}

    def __init__(self, store: ParameterStore, partition: int = 0,
                 num_partitions: int = 1, init_checkpoint_dir: str | None = None,
                 paused: bool = False) -> None:
        self.store = store
        # The partition this servicer serves, of the job's `num_partitions`
        # (a server process may hold several: ps/host.py).
        self.partition = partition
        self.num_partitions = num_partitions
        # Where the server saves its share of the initial model when a worker
        # initializes it (the job's first recovery point).
        self.init_checkpoint_dir = init_checkpoint_dir
        # Paused during a rollback (see Pause): workers must not act on the
        # restored state before the master has rolled back too.
        self.paused = paused
        # Called with the store once a worker's Init created the model (a
        # launched server sizes its allocator's kept buffers: ps/server.py).
        self.after_init: Callable[[ParameterStore], None] | None = None
        # The backup every call that changes the state goes to as well
        # (ps/replication.py; None: none), and the job directory its
        # "unreplicated" marker is written to.
        self.backup: Backup | None = None
        self.job_dir: str | None = None
        # The server's generation (a launched server's: common/fencing.py),
        # which the calls it forwards to its backup carry.
        self.generation: Callable[[], int] | None = None
        self.backup_timeout = DEFAULT_TIMEOUT

    def _forward(self, method: str, request: Callable[[], object]) -> None:
        """A call applied here (under the store's lock), applied by the
        backup too before it is answered (ps/replication.py). `request()`
        builds what is sent, only when there is a backup (a push's or a
        lookup's bytes cost a copy)."""
        if self.backup is None:
            return
        faults.reached("ps_forward")
        if not self.backup.forward(method, request()):
            self.backup = None

    @staticmethod
    def _forwarded_push(header, tensors: dict[str, np.ndarray]) -> bytes:
        """A push as its backup is sent it: the same, marked `forwarded`."""
        forwarded = ps_pb2.PushHeader()
        forwarded.CopyFrom(header)
        forwarded.forwarded = True
        return bundle_bytes(forwarded, tensors.items())

    def AttachBackup(self, request, context):
        """From now on (under the store's lock: between two calls), every call
        that changes the state is applied by the server at `address` too;
        "" detaches the backup (the launcher found it lost)."""
        backup = self.backup
        if backup is not None and not request.address:
            backup.cancel()  # a call retrying it holds the lock: it gives up
        with self.store.lock:
            if self.backup is not None:
                if request.address:
                    self.backup.close()
                else:
                    self.backup.detach("the launcher detached it")
                self.backup = None
            if not request.address:
                return ps_pb2.AttachBackupResponse(backup="")
            if not self.job_dir:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"parameter server {self.partition} has no job directory "
                              "to write its replication marker in (--job_dir)")
            if (self.store.initialized and not request.same_start
                    and not request.copy_dir):
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"parameter server {self.partition} already holds a "
                              "model: a backup attached now needs a copy of it "
                              "(copy_dir), unless both were started from the same "
                              "checkpoint (same_start)")
            backup = Backup(request.address, self.partition,
                            marker_path(self.job_dir, self.partition),
                            self.backup_timeout, self.generation)
            if request.copy_dir and self.store.initialized:
                try:
                    copied = copy_state(self.store, self.partition, self.num_partitions,
                                        request.copy_dir, backup, self.paused)
                except (errors.KerasElasticError, ValueError, OSError) as e:
                    backup.close()
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                  f"parameter server {self.partition} could not copy its "
                                  f"state for its backup: {e}")
                if not copied:
                    context.abort(grpc.StatusCode.UNAVAILABLE,
                                  f"parameter server {self.partition}: the new backup "
                                  f"{request.address} did not take the copy")
            self.backup = backup
            # Every call answered so far is the backup's too.
            try:
                os.remove(marker_path(self.job_dir, self.partition))
            except FileNotFoundError:
                pass
            logging.info("parameter server %d: backup %s attached", self.partition,
                         request.address)
            return ps_pb2.AttachBackupResponse(backup=request.address)

    def _refuse_if_paused(self, context) -> None:
        if self.paused:
            context.abort(grpc.StatusCode.UNAVAILABLE,
                          f"parameter server {self.partition} is paused while the job "
                          "rolls back to a checkpoint; retry")

    def Pause(self, request, context):
        with self.store.lock:  # no push, pull or claim is half done
            self.paused = True
            self._forward("Pause", lambda: request)
        return ps_pb2.PauseResponse(paused=True)

    def Resume(self, request, context):
        """Serves again; after a rollback (`min_lease` L): claims with a lease
        below L, handed out before the rollback, are refused from now."""
        if request.min_lease < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"Resume: min_lease must not be negative, got "
                          f"{request.min_lease}")
        with self.store.lock:
            self.store.log.min_lease = max(self.store.log.min_lease, request.min_lease)
            self._forward("Resume", lambda: request)
        self.paused = False
        return ps_pb2.PauseResponse(paused=False)

    def _abort_bad_request(self, context, method: str, error: Exception) -> None:
        """Answers a request that `error` refuses, with the status of its
        class (`common/errors.py`: NOT_FOUND for variables this server does not
        hold, FAILED_PRECONDITION before init, INVALID_ARGUMENT for a
        malformed request, INTERNAL for a bug); the message names this server,
        the method and why."""
        where = f"parameter server {self.partition} (of {self.num_partitions}), {method}"
        code = errors.status_code(error)
        if isinstance(error, UnknownVariableError):
            owners = {n: ps_for(n, self.num_partitions) for n in error.names
                      if variable_slices.parse(n) is None}
            elsewhere = [f"'{n}' belongs to parameter server {i}"
                         for n, i in owners.items() if i != self.partition]
            context.abort(code, f"{where}: {error}" + (
                f" ({'; '.join(elsewhere)})" if elsewhere
                else ": not a variable of the model it holds"))
        if code == grpc.StatusCode.INTERNAL:
            logging.exception("%s failed", where)
            context.abort(code, f"{where} failed: {type(error).__name__}: {error} (a "
                          "bug of the parameter server; its log has the traceback)")
        context.abort(code, f"{where}: {error}")

    def _check_pushed(self, header, name: str, dtype: np.dtype,
                      shape: tuple[int, ...]) -> None:
        """Refuses a pushed tensor before it is assembled (the store checks
        the whole push again before applying it)."""
        if not self.store.initialized:
            return  # answered in _push (UNAVAILABLE if paused, else not initialized)
        if name.startswith(SPARSE_PREFIX):
            table, kind = _sparse_name(name)
            if kind == "ids":
                if np.dtype(dtype) != np.int64 or len(shape) != 1:
                    raise ValueError(f"the ids of embedding table '{table}' must be a "
                                     f"1-D int64 tensor, got {dtype} of shape "
                                     f"{list(shape)}")
                self.store.check_sparse(table, None)
            else:
                self.store.check_sparse(table, None, shape, dtype)
        elif name.startswith((ASSIGN_PREFIX, BASE_PREFIX)):
            self.store.check_tensor(name[1:], dtype, shape, False)
        else:
            self.store.check_tensor(name, dtype, shape, True)

    def _init_specs(self, header) -> dict[str, tuple[np.dtype, tuple[int, ...], bool]]:
        """The variables an Init header announces, checked: name -> (dtype,
        shape, trainable)."""
        specs = {}
        for v in header.variables:
            if v.name in specs:
                raise ValueError(f"the header lists variable '{v.name}' twice")
            try:
                dtype = np.dtype(v.dtype)
            except (TypeError, ValueError, SyntaxError):
                raise ValueError(f"variable '{v.name}': unknown dtype {v.dtype!r}"
                                 ) from None
            if any(d < 0 for d in v.shape):
                raise ValueError(f"variable '{v.name}': negative dimension in shape "
                                 f"{list(v.shape)}")
            # (A slice's server is the layout's, from the whole model: the
            # workers' Inits must agree on it, `ParameterStore._check_same`.)
            owner = ps_for(v.name, self.num_partitions)
            if owner != self.partition and variable_slices.parse(v.name) is None:
                raise ValueError(f"variable '{v.name}' belongs to parameter server "
                                 f"{owner}, not to this one")
            specs[v.name] = (dtype, tuple(v.shape), v.trainable)
        return specs

    def _read_init(self, request_iterator):
        """Header, checked variable specs and values of an Init stream; raises
        ValueError (TensorError) for anything malformed."""
        specs: dict = {}

        state_specs: dict = {}

        def check(header, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
            if header is None:
                raise TensorError(f"tensor '{name}' came before the Init header")
            if not specs:
                specs.update(self._init_specs(header))
            if name.startswith(OPTIMIZER_STATE_PREFIX):
                if not state_specs:
                    state_specs.update({s.name: (np.dtype(s.dtype), tuple(s.shape))
                                        for s in header.optimizer_state})
                if state_specs.get(name[len(OPTIMIZER_STATE_PREFIX):]) != (
                        np.dtype(dtype), tuple(shape)):
                    raise ValueError(f"optimizer state '{name[1:]}' is {dtype} of shape "
                                     f"{list(shape)}, which the Init header does not "
                                     "announce")
                return
            if name not in specs:
                raise ValueError(f"a value was sent for variable '{name}', which the "
                                 "Init header does not list")
            if (dtype, shape) != specs[name][:2]:
                raise ValueError(
                    f"the value of variable '{name}' is {dtype} of shape "
                    f"{list(shape)}, but the Init header says {specs[name][0]} of "
                    f"shape {list(specs[name][1])}")

        header, values = read_stream(request_iterator, check)
        if header is None:
            raise ValueError("Init stream had no header")
        tables = {}
        for t in header.tables:
            if t.name in tables:
                raise ValueError(f"the header lists embedding table '{t.name}' twice")
            try:
                initializer = json.loads(t.initializer) if t.initializer else "uniform"
            except ValueError as e:
                raise ValueError(f"embedding table '{t.name}': the initializer is not "
                                 f"JSON: {e}") from None
            tables[t.name] = {"dim": t.dim, "dtype": t.dtype or "float32",
                              "input_dim": t.input_dim or None,
                              "initializer": initializer,
                              "admit_after": t.admit_after,
                              "max_rows": t.max_rows or None,
                              "ttl_versions": t.ttl_versions or None}
        specs = specs or self._init_specs(header)
        optimizer_state = {n[len(OPTIMIZER_STATE_PREFIX):]: values.pop(n)
                           for n in list(values) if n.startswith(OPTIMIZER_STATE_PREFIX)}
        missing = sorted(set(specs) - set(values))
        if missing:
            raise ValueError(f"Init: no values sent for {missing}")
        try:
            optimizer_config = json.loads(header.optimizer_config)
        except ValueError as e:
            raise ValueError(f"optimizer_config is not JSON: {e}") from None
        return header, specs, values, optimizer_config, tables, optimizer_state

    def _model_stream(self, header: ps_pb2.ModelHeader, values: dict):
        yield ps_pb2.ModelChunk(header=header)
        # Each chunk serialized here, from the value's bytes with one copy (a
        # protobuf ModelChunk would copy them in, then out again).
        yield from chunk_frames_all(2, values.items())

    def Init(self, request_iterator, context):
        self._refuse_if_paused(context)
        received = []  # what a backup is sent, if the model is made now

        def kept(messages):
            for message in messages:
                received.append(message)
                yield message

        try:
            header, specs, values, optimizer_config, tables, state = self._read_init(
                kept(request_iterator))
        except ValueError as e:
            self._abort_bad_request(context, "Init", e)
        trainable = {name: spec[2] for name, spec in specs.items()}
        try:
            with self.store.lock:  # nobody pushes between creating and restoring
                created = self.store.init(values, trainable, optimizer_config, tables,
                                          optimizer_state=state,
                                          namespace=header.namespace)
                if created and header.restore_from:
                    from keras_elastic.ps.checkpoint_part import restore_shard

                    restore_shard(self.store, self.partition, self.num_partitions,
                                  header.restore_from)
                if created and self.after_init is not None:
                    self.after_init(self.store)
                if created and self.init_checkpoint_dir:
                    from keras_elastic.ps.checkpoint_part import save_shard

                    save_shard(self.store, self.partition, self.num_partitions,
                               self.init_checkpoint_dir, extra={"initial": True})
                if created:
                    self._forward("Init", lambda: [
                        m if isinstance(m, bytes) else m.SerializeToString()
                        for m in received])
        except (errors.KerasElasticError, ValueError, OSError) as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return ps_pb2.InitResponse(initialized_now=created, version=self.store.version)

    def Push(self, request_iterator, context):
        try:
            header, tensors = read_stream(request_iterator, self._check_pushed)
            if header is None:
                raise ValueError("Push stream had no header")
            if len(tensors) != header.num_tensors:
                # (Also what a call that failed midway looks like from here.)
                raise ValueError(f"the header announces {header.num_tensors} "
                                 f"tensors, the stream carried {len(tensors)}")
        except (ValueError, KeyError) as e:
            self._abort_bad_request(context, "Push", e)
        reply, values = self._push(header, tensors, context)
        yield from self._model_stream(reply, values)

    def PushSmall(self, request, context):
        try:
            tensors = dict(decode_all(
                request.tensors, lambda *tensor: self._check_pushed(None, *tensor)))
        except (ValueError, KeyError) as e:
            self._abort_bad_request(context, "PushSmall", e)
        reply, values = self._push(request.header, tensors, context, "PushSmall")
        return bundle_bytes(reply, values.items())

    def _since(self, version: int, incarnation: int) -> int:
        """`version` if it belongs to this server's current state, else -1."""
        return version if incarnation == self.store.incarnation else -1

    def _push(self, header, tensors, context, method: str = "Push"):
        faults.reached("ps_push")
        try:
            update = self._update_of(header, tensors)
            spec = optimizer_spec_of(header)
            with self.store.lock:
                self._refuse_if_paused(context)
                if spec is not None and self.store.initialized:
                    self.store.register_optimizer(update.optimizer, *spec)
                since = self._since(header.base_version, header.incarnation)
                result = self.store.push(update, since)
                # (A backup's reply is read by nobody: no values.)
                values = {} if header.forwarded else self.store.values_since(since)
                incarnation = self.store.incarnation
                self._forward("PushSmall", lambda: self._forwarded_push(header, tensors))
        except (errors.KerasElasticError, KeyError, ValueError, RuntimeError) as e:
            self._abort_bad_request(context, method, e)
        return ps_pb2.ModelHeader(version=result.version, accepted=result.accepted,
                                  status=result.status, incarnation=incarnation), values

    def _update_of(self, header, tensors: dict[str, np.ndarray]) -> Update:
        """The `Update` a push's header and tensors carry (their names say
        what each tensor is: see ps/client.py's prefixes)."""
        spec = header.optimizer_spec if header.HasField("optimizer_spec") else None
        return Update(
            grads={n: v for n, v in tensors.items()
                   if not n.startswith((ASSIGN_PREFIX, BASE_PREFIX, SPARSE_PREFIX))},
            assigns={n[len(ASSIGN_PREFIX):]: v for n, v in tensors.items()
                     if n.startswith(ASSIGN_PREFIX)},
            bases={n[len(BASE_PREFIX):]: v for n, v in tensors.items()
                   if n.startswith(BASE_PREFIX)},
            rows=self._sparse_grads(tensors),
            ranges=ranges_of(header),
            hyperparameters=dict(header.hyperparameters),
            optimizer=header.optimizer,
            optimizer_spec=None if spec is None else (spec.config,
                                                      tuple(spec.variables)),
            assignment=header.assignment, phase=header.phase)

    def _sparse_grads(self, tensors: dict[str, np.ndarray]
                      ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The embedding rows of a push, {table: (ids, gradient rows)}; the ids
        must be this server's."""
        parts: dict[str, dict[str, np.ndarray]] = {}
        for name, value in tensors.items():
            if name.startswith(SPARSE_PREFIX):
                table, kind = _sparse_name(name)
                parts.setdefault(table, {})[kind] = value
        sparse = {}
        for table, part in parts.items():
            if set(part) != {"ids", "grads"}:
                raise ValueError(f"embedding table '{table}': a push must carry both "
                                 f"its ids and its gradient rows, got {sorted(part)}")
            ids, grads = part["ids"], part["grads"]
            self.store.check_sparse(table, ids, grads.shape, grads.dtype)
            self._check_owned(table, ids)
            sparse[table] = (ids, grads)
        return sparse

    def _check_owned(self, table: str, ids: np.ndarray) -> None:
        if self.num_partitions == 1:
            return  # (every row is this server's)
        owners = row_owner(ids, self.num_partitions)
        wrong = np.flatnonzero(owners != self.partition)
        if wrong.size:
            i = wrong[0]
            raise ValueError(f"row {int(ids[i])} of embedding table '{table}' belongs to "
                             f"parameter server {int(owners[i])}, not to this one "
                             f"({self.partition})")

    def Lookup(self, request, context):
        # (The request parsed by protobuf: for a step's few thousand ids its C
        # parser costs less than reading the chunks by hand; the reply, the
        # rows, is built by hand.)
        try:
            ids = dict(decode_all(request.ids))
            for table, table_ids in ids.items():
                if table_ids.dtype != np.int64 or table_ids.ndim != 1:
                    raise ValueError(f"the ids of embedding table '{table}' must be a "
                                     f"1-D int64 tensor, got {table_ids.dtype} of shape "
                                     f"{list(table_ids.shape)}")
                self.store.check_sparse(table, table_ids)
                self._check_owned(table, table_ids)
            with self.store.lock:
                self._refuse_if_paused(context)
                rows = self.store.lookup(ids, create=not request.no_create)
                if not request.no_create:  # rows made, ids counted: the backup too
                    self._forward("Lookup", lambda: tensors_bytes(
                        1, ids.items(), varints={3: 1}))
        except (errors.KerasElasticError, KeyError, ValueError, RuntimeError) as e:
            self._abort_bad_request(context, "Lookup", e)
        if request.forwarded:
            return tensors_bytes(1, [])
        # (a serialized LookupResponse, built with one copy of the rows)
        return tensors_bytes(1, rows.items())

    def Claim(self, request, context):
        if not self.store.initialized:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"parameter server {self.partition} is not initialized")
        try:
            with self.store.lock:
                self._refuse_if_paused(context)
                updates = self.store.claim(
                    (request.dataset, request.epoch, request.task_id), request.lease)
                self._forward("Claim", lambda: request)
        except StaleLeaseError as e:
            return ps_pb2.ClaimResponse(ok=False, error=str(e))
        ranges, fingerprint = updates.pop("", ([], 0))
        return ps_pb2.ClaimResponse(
            ok=True, applied=[x for r in ranges for x in r],
            fingerprint_known=fingerprint is not None, fingerprint=fingerprint or 0,
            other_updates=[ps_pb2.UpdateApplied(
                update=u, applied=[x for r in a.ranges for x in r],
                fingerprint_known=a.fingerprint is not None,
                fingerprint=a.fingerprint or 0) for u, a in sorted(updates.items())])

    def Flush(self, request, context):
        self._refuse_if_paused(context)
        faults.reached("ps_flush")
        if not self.store.initialized:
            return ps_pb2.FlushResponse(version=0)
        with self.store.lock:
            version = self.store.flush()
            self._forward("Flush", lambda: request)
        return ps_pb2.FlushResponse(version=version)

    def Pull(self, request, context):
        if not self.store.initialized:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"parameter server {self.partition} is not initialized")
        with self.store.lock:
            self._refuse_if_paused(context)
            version = self.store.version
            incarnation = self.store.incarnation
            hyperparameters = self.store.hyperparameters()
            phase, phase_start_hyperparameters = self.store.phase_start
            try:
                values = self.store.optimizer_state() if request.optimizer_state else (
                    self.store.values_since(
                        self._since(request.since_version, request.incarnation),
                        list(request.names) or None))
            except UnknownVariableError as e:
                self._abort_bad_request(context, "Pull", e)
        yield from self._model_stream(ps_pb2.ModelHeader(
            version=version, accepted=True, status="applied", incarnation=incarnation,
            hyperparameters=hyperparameters, phase_start=phase,
            phase_start_hyperparameters=phase_start_hyperparameters), values)

    def Status(self, request, context):
        store = self.store
        return ps_pb2.PSStatusResponse(
            ps_index=self.partition, num_ps=self.num_partitions,  # (the proto's names)
            initialized=store.initialized, version=store.version,
            variables=sorted(store.variables), pushes=store.pushes,
            tables={n: len(t) for n, t in store.tables.items()},
            table_stats={n: ps_pb2.TableStats(**t.counters())
                         for n, t in store.tables.items()},
            dropped=store.dropped, duplicates=store.duplicates,
            refused=store.refused, incarnation=store.incarnation,
            restored_from=store.restored_from or "", tasks_logged=len(store.log),
            paused=self.paused, hyperparameters=store.hyperparameters(),
            cpu_seconds=time.process_time(),
            backup=self.backup.address if self.backup is not None else "",
            replicated=self.backup is not None)

    def Save(self, request, context):
        from keras_elastic.ps.checkpoint_part import save_shard

        extra = {f: getattr(request, f) for f in ("epoch", "batch", "step")
                 if request.HasField(f)}
        if request.automatic:
            extra["automatic"] = True
        try:
            info = save_shard(self.store, self.partition, self.num_partitions,
                              request.directory, request.sharding_callback or None, extra,
                              table_base=request.table_base)
            return ps_pb2.SaveResponse(name=info.name, path=info.path,
                                       model_version=info.extra["model_version"])
        except Exception as e:  # noqa: BLE001 - TensorFlow's write errors too
            if disk.is_disk_condition(e):
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"parameter server {self.partition} could not save: "
                              f"{disk.describe_write_error(request.directory, e)}")
            if not isinstance(e, (errors.KerasElasticError, ValueError, OSError)):
                raise
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"parameter server {self.partition} could not save: {e}")

    def Restore(self, request, context):
        """Replaces the state with the checkpoint's; a server that holds no
        model yet (a new backup) creates it from the checkpoint."""
        from keras_elastic.ps.checkpoint_part import init_from_checkpoint, restore_shard

        try:
            with self.store.lock:
                restore = restore_shard if self.store.initialized else (
                    init_from_checkpoint)
                answer = restore(self.store, self.partition, self.num_partitions,
                                 request.path)
                self._forward("Restore", lambda: request)
            return ps_pb2.RestoreResponse(**answer)
        except (errors.KerasElasticError, ValueError, OSError) as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"parameter server {self.partition} could not restore: {e}")


def _sparse_name(name: str) -> tuple[str, str]:
    """("table", "ids" | "grads") of a push chunk named "@table/ids" or
    "@table/grads"."""
    table, _, kind = name[len(SPARSE_PREFIX):].rpartition("/")
    if not table or kind not in ("ids", "grads"):
        raise ValueError(f"tensor '{name}': embedding rows are pushed as "
                         f"'{SPARSE_PREFIX}TABLE/ids' and '{SPARSE_PREFIX}TABLE/grads'")
    return table, kind

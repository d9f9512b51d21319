"""Runs a parameter server, in this process or as its own process.

A server process holds one or more of the job's partitions (`ps/host.py`):
partition `--partition` by default, `--partitions` to hold several (after
a scale-in, one process holds what several did).

Example:

>>> server = ParameterServer()
>>> server.address
'127.0.0.1:...'
>>> server.stop()
"""

from __future__ import annotations

import gc

import numpy as np
from absl import app, flags, logging

from keras_elastic.common import (
    allocator,
    faults,
    fencing,
    job_end,
    rpc,
    rpc_service,
    stacks,
)
from keras_elastic.proto import ps_pb2
from keras_elastic.ps.host import PartitionHost
from keras_elastic.ps.servicer import ParameterServerServicer
from keras_elastic.ps.store import ParameterStore


class ParameterServer:
    """A gRPC server process holding partitions `partitions` (default:
    `partition` alone) of the job's `num_partitions`, each a `ParameterStore`;
    `store` and `servicer` are the first one's."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, partition: int = 0,
                 num_partitions: int = 1, grads_to_wait: int = 1,
                 max_staleness: int = 0, restore_from: str | None = None,
                 init_checkpoint_dir: str | None = None, paused: bool = False,
                 generation: int | None = None,
                 partitions: list[int] | None = None) -> None:
        # (No partition: a process that waits for partitions to move in.)
        partitions = [partition] if partitions is None else list(partitions)
        bad = [p for p in partitions if not 0 <= p < num_partitions]
        if bad or len(set(partitions)) != len(partitions):
            raise ValueError(f"partitions {partitions}: each must be one of "
                             f"0..{num_partitions - 1} (--num_partitions), once")
        self.num_partitions = num_partitions
        self._settings = (grads_to_wait, max_staleness, init_checkpoint_dir)
        # Set on every partition's servicer, those made later too (`configure`).
        self.job_dir: str | None = None
        self.backup_timeout: float | None = None
        self.after_init = None
        # A launched server is fenced (common/fencing.py); one made in a
        # process (embedded, tests) is not, unless given a generation.
        self.generation = None if generation is None else fencing.Generation(generation)
        stores = {}
        for p in partitions:
            stores[p] = ParameterStore(grads_to_wait, max_staleness, num_partitions)
            if restore_from:
                # A server restarted after a crash: its state comes back before
                # it serves anybody.
                from keras_elastic.ps.checkpoint_part import init_from_checkpoint

                info = init_from_checkpoint(stores[p], p, num_partitions, restore_from)
                logging.info("parameter-server partition %d restored %d variables "
                             "from %s", p, info["restored"], info["path"])
        self.host = PartitionHost(
            lambda p: self._servicer(p, stores.pop(p, None), paused), partitions)
        self.servicer = self.host.servicer(partitions[0]) if partitions else None
        self.store = self.servicer.store if partitions else None
        self._server = rpc.make_server(max_workers=32, generation=self.generation)
        rpc_service.add_service(self._server, self.host,
                                ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"])
        self.address = rpc.bind(self._server, host, port)
        self._server.start()

    def _servicer(self, partition: int, store: ParameterStore | None,
                  paused: bool = False) -> ParameterServerServicer:
        """Partition `partition`'s servicer (over `store`; a new empty one for
        a partition that comes here later: a move's target)."""
        grads_to_wait, max_staleness, init_checkpoint_dir = self._settings
        if store is None:
            store = ParameterStore(grads_to_wait, max_staleness, self.num_partitions)
            paused = False
        servicer = ParameterServerServicer(store, partition, self.num_partitions,
                                           init_checkpoint_dir, paused)
        if self.generation is not None:
            servicer.generation = lambda: self.generation.value
        self._configure(servicer)
        return servicer

    def _configure(self, servicer: ParameterServerServicer) -> None:
        if self.job_dir is not None:
            servicer.job_dir = self.job_dir
        if self.backup_timeout is not None:
            servicer.backup_timeout = self.backup_timeout
        if self.after_init is not None:
            servicer.after_init = self.after_init

    def configure(self, job_dir: str | None = None, backup_timeout: float | None = None,
                  after_init=None) -> None:
        """Settings of every partition's servicer, now and to come: the job
        directory (replication markers), the backup timeout, and what runs
        once a worker's Init made a partition's model."""
        if job_dir is not None:
            self.job_dir = job_dir
        if backup_timeout is not None:
            self.backup_timeout = backup_timeout
        if after_init is not None:
            self.after_init = after_init
        for servicer in self.host.servicers():
            self._configure(servicer)

    def stop(self, grace: float | None = None) -> None:
        """Stops serving (calls in flight get `grace` seconds, None: none)
        and returns once the port is closed: a call made after this finds
        the server unreachable, not shutting down."""
        rpc.await_stop(self._server, grace, f"parameter server {self.address}")


FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_string("host", "127.0.0.1", "Address to bind.")
    flags.DEFINE_integer("port", 0, "Port to bind; 0 picks a free one.")
    flags.DEFINE_integer("partition", 0, "The partition this server process is "
                         "started for: the one it holds without --partitions (with "
                         "--backup: the one whose server it backs up); it names the "
                         "process in fault points (ps<P>) and logs.")
    flags.DEFINE_list("partitions", None, "The partitions this server process holds "
                      "(of --num_partitions); default: --partition alone; `none`: it "
                      "waits for partitions to move in (keras-elastic scale --num_ps).")
    flags.DEFINE_integer("num_partitions", 1, "Number of partitions of the job's "
                         "variables (--ps_partitions; not the number of server "
                         "processes, which may each hold several).")
    flags.DEFINE_integer("grads_to_wait", 1,
                         "Gradients averaged per update (1: asynchronous SGD).")
    flags.DEFINE_integer("max_staleness", 0,
                         "With grads_to_wait > 1, drop gradients older than this many "
                         "versions (0: 4 x grads_to_wait).")
    flags.DEFINE_string("ready_file", None, "Write {'address': ...} here once serving.")
    flags.DEFINE_string("job_dir", None, "The job's directory: the server exits once "
                        "the job ended (its summary.json written), as one the "
                        "launcher could not stop must (common/job_end.py).")
    flags.DEFINE_string("restore_from", None, "Start from this parameter-server "
                        "checkpoint (a server restarted after a crash).")
    flags.DEFINE_bool("paused", False, "Start paused (Init, Push, Pull, Claim answer "
                      "UNAVAILABLE until Resume): a restarted server while the job "
                      "rolls back.")
    flags.DEFINE_integer("generation", 0,
                         "The job's generation this server belongs to (fencing).")
    flags.DEFINE_string("init_checkpoint_dir", None, "Save this server's share of "
                        "the initial model here when a worker initializes it.")
    flags.DEFINE_bool("backup", False, "This server is the backup of the server of "
                      "partition --partition (ps/replication.py): its primary forwards "
                      "it every call; fault points name it ps<P>b.")
    flags.DEFINE_float("backup_timeout", 10.0, "Seconds this server, as a primary, "
                       "retries its backup before detaching it and going on alone.")


def keep_buffers_for(store: ParameterStore) -> None:
    """Keeps freed buffers of up to the size of a push of `store`'s dense
    variables for reuse (a launched server process only: a process-wide
    setting)."""
    dense = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                for v in store.variables.values())
    limit = allocator.buffer_limit(dense)
    if allocator.keep_freed_buffers(limit):
        logging.info("freed buffers of up to %d bytes are kept for reuse (this "
                     "server's dense variables: %d bytes)", limit, dense)


def main(argv) -> None:
    del argv
    faults.set_role(f"ps{FLAGS.partition}" + ("b" if FLAGS.backup else ""))
    stacks.enable_stack_dumps()  # kill -USR1: every thread's stack in the log
    try:
        partitions = (None if not FLAGS.partitions
                      else [] if FLAGS.partitions == ["none"]
                      else [int(p) for p in FLAGS.partitions])
    except ValueError:
        raise app.UsageError(f"--partitions={','.join(FLAGS.partitions)}: give "
                             "partition numbers, e.g. --partitions=0,2") from None
    try:
        server = ParameterServer(FLAGS.host, FLAGS.port, FLAGS.partition,
                                 FLAGS.num_partitions, FLAGS.grads_to_wait,
                                 FLAGS.max_staleness, FLAGS.restore_from,
                                 FLAGS.init_checkpoint_dir,
                                 FLAGS.paused, FLAGS.generation, partitions)
    except ValueError as e:
        if partitions is None:
            raise
        raise app.UsageError(f"--partitions: {e}") from None
    # Every push allocates and frees buffers of the model's size: kept for
    # reuse, not taken back from the kernel page by page (common/allocator.py),
    # once the server knows its share of the model.
    server.configure(job_dir=FLAGS.job_dir, backup_timeout=FLAGS.backup_timeout,
                     after_init=keep_buffers_for)
    for servicer in server.host.servicers():
        if servicer.store.initialized:  # restored from a checkpoint
            keep_buffers_for(servicer.store)
    logging.info("parameter server %d/%d%s serving at %s (partitions %s)",
                 FLAGS.partition, FLAGS.num_partitions,
                 " (a backup)" if FLAGS.backup else "",
                 server.address, server.host.held())
    # The objects made so far (TensorFlow's and Keras' modules: several hundred
    # thousand) live as long as the process: kept out of the garbage
    # collector's passes, which every request's allocations trigger (py-spy
    # found the collector in 4.5% of a busy server's samples; a 4 KB push
    # costs about 4% less server CPU, within this machine's noise).
    gc.freeze()
    if FLAGS.job_dir:
        job_end.watch_service(FLAGS.job_dir, f"parameter server {FLAGS.partition}")
    rpc.serve_until_signal(server, FLAGS.ready_file)

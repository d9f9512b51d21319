"""Runs a parameter server, in this process or as its own process.

Example:

>>> server = ParameterServer()
>>> server.address
'127.0.0.1:...'
>>> server.stop()
"""

from __future__ import annotations

import gc

import numpy as np
from absl import flags, logging

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
from keras_elastic.ps.servicer import ParameterServerServicer
from keras_elastic.ps.store import ParameterStore


class ParameterServer:
    """A gRPC server holding one `ParameterStore`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, ps_index: int = 0,
                 num_ps: int = 1, grads_to_wait: int = 1,
                 max_staleness: int = 0, restore_from: str | None = None,
                 init_checkpoint_dir: str | None = None, paused: bool = False,
                 generation: int | None = None) -> None:
        self.store = ParameterStore(grads_to_wait, max_staleness, num_ps)
        # A launched server is fenced (common/fencing.py); one made in a
        # process (embedded, tests) is not, unless given a generation.
        self.generation = None if generation is None else fencing.Generation(generation)
        if restore_from:
            # A server restarted after a crash: its state comes back before it
            # serves anybody.
            from keras_elastic.ps.checkpoint_part import init_from_checkpoint

            info = init_from_checkpoint(self.store, ps_index, num_ps, restore_from)
            logging.info("parameter server %d restored %d variables from %s",
                         ps_index, info["restored"], info["path"])
        self.servicer = ParameterServerServicer(self.store, ps_index, num_ps,
                                                init_checkpoint_dir, paused)
        if self.generation is not None:
            self.servicer.generation = lambda: self.generation.value
        self._server = rpc.make_server(max_workers=32, generation=self.generation)
        rpc_service.add_service(self._server, self.servicer,
                                ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"])
        self.address = rpc.bind(self._server, host, port)
        self._server.start()

    def stop(self, grace: float | None = None) -> None:
        """Stops serving (calls in flight get `grace` seconds, None: none)
        and returns once the port is closed: a call made after this finds
        the server unreachable, not shutting down."""
        rpc.await_stop(self._server, grace, f"parameter server {self.address}")


FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_string("host", "127.0.0.1", "Address to bind.")
    flags.DEFINE_integer("port", 0, "Port to bind; 0 picks a free one.")
    flags.DEFINE_integer("ps_index", 0, "Index of this parameter server.")
    flags.DEFINE_integer("num_ps", 1, "Number of parameter servers in the job.")
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
    flags.DEFINE_bool("backup", False, "This server is the backup of server "
                      "--ps_index (ps/replication.py): its primary forwards it every "
                      "call; fault points name it ps<I>b.")
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
    faults.set_role(f"ps{FLAGS.ps_index}" + ("b" if FLAGS.backup else ""))
    stacks.enable_stack_dumps()  # kill -USR1: every thread's stack in the log
    server = ParameterServer(FLAGS.host, FLAGS.port, FLAGS.ps_index, FLAGS.num_ps,
                             FLAGS.grads_to_wait, FLAGS.max_staleness,
                             FLAGS.restore_from, FLAGS.init_checkpoint_dir,
                             FLAGS.paused, FLAGS.generation)
    # Every push allocates and frees buffers of the model's size: kept for
    # reuse, not taken back from the kernel page by page (common/allocator.py),
    # once the server knows its share of the model.
    server.servicer.after_init = keep_buffers_for
    server.servicer.job_dir = FLAGS.job_dir
    server.servicer.backup_timeout = FLAGS.backup_timeout
    if server.store.initialized:  # restored from a checkpoint
        keep_buffers_for(server.store)
    logging.info("parameter server %d/%d%s serving at %s", FLAGS.ps_index,
                 FLAGS.num_ps, " (a backup)" if FLAGS.backup else "", server.address)
    # The objects made so far (TensorFlow's and Keras' modules: several hundred
    # thousand) live as long as the process: kept out of the garbage
    # collector's passes, which every request's allocations trigger (py-spy
    # found the collector in 4.5% of a busy server's samples; a 4 KB push
    # costs about 4% less server CPU, within this machine's noise).
    gc.freeze()
    if FLAGS.job_dir:
        job_end.watch_service(FLAGS.job_dir, f"parameter server {FLAGS.ps_index}")
    rpc.serve_until_signal(server, FLAGS.ready_file)

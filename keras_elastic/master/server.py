"""Runs the master service, in this process or as its own process.

Example (in-process, as the embedded cluster does):

>>> server = MasterServer()
>>> server.address
'127.0.0.1:...'
>>> server.stop()
"""

from __future__ import annotations

import os
import signal
import sys

from absl import flags, logging

from keras_elastic.common import faults, fencing, job_end, rpc, rpc_service, stacks
from keras_elastic.master.servicer import MasterServicer
from keras_elastic.proto import master_pb2


class MasterServer:
    """A gRPC server holding a `MasterServicer`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 heartbeat_timeout: float = 30.0, max_task_retries: int = 3,
                 max_workers: int = 0, journal: str | None = None,
                 progress_timeout: float = 60.0, generation: int | None = None,
                 on_journal_error=None, min_workers: int = 1,
                 rendezvous_timeout: float = 0.0) -> None:
        # A launched master is fenced (common/fencing.py); one made in a
        # process (embedded, tests) is not, unless given a generation.
        fenced = None if generation is None else fencing.Generation(generation)
        self.servicer = MasterServicer(heartbeat_timeout=heartbeat_timeout,
                                       max_task_retries=max_task_retries,
                                       max_workers=max_workers, journal_path=journal,
                                       progress_timeout=progress_timeout,
                                       generation=fenced,
                                       on_journal_error=on_journal_error,
                                       min_workers=min_workers,
                                       rendezvous_timeout=rendezvous_timeout)
        self._server = rpc.make_server(max_workers=64,
                                       generation=self.servicer.generation
                                       if fenced is not None else None)
        rpc_service.add_service(self._server, self.servicer,
                                master_pb2.DESCRIPTOR.services_by_name["Master"])
        self.address = rpc.bind(self._server, host, port)
        self._server.start()

    def stop(self, grace: float | None = None) -> None:
        """Stops serving (calls in flight get `grace` seconds, None: none)
        and returns once the port is closed: a call made after this finds
        the server unreachable, not shutting down."""
        self.servicer.stop()
        rpc.await_stop(self._server, grace, f"master {self.address}")

    def wait(self) -> None:
        self._server.wait_for_termination()


FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_string("host", "127.0.0.1", "Address to bind.")
    flags.DEFINE_integer("port", 0, "Port to bind; 0 picks a free one.")
    flags.DEFINE_string("ready_file", None,
                        "Write {'address': ...} here once serving.")
    flags.DEFINE_string("job_dir", None, "The job's directory: the master exits once "
                        "the job ended (its summary.json written), as one the "
                        "launcher could not stop must (common/job_end.py).")
    flags.DEFINE_float("heartbeat_timeout", 30.0,
                       "Seconds of silence after which a worker is presumed lost.")
    flags.DEFINE_float("progress_timeout", 60.0,
                       "Least seconds a worker may hold a task before it counts as "
                       "making no progress (more when the dataset's tasks are slow).")
    flags.DEFINE_integer("generation", 0,
                         "The job's generation this master belongs to (fencing).")
    flags.DEFINE_integer("max_task_retries", 3,
                         "Failures of one task that fail the job.")
    flags.DEFINE_integer("max_workers", 0, "Most workers at once (0: no limit).")
    flags.DEFINE_integer("min_workers", 1,
                         "Workers that must have registered before the first task "
                         "is handed out (the job's start rendezvous).")
    flags.DEFINE_float("rendezvous_timeout", 120.0,
                       "Seconds after the master's start after which tasks are "
                       "handed out with fewer than --min_workers registered.")
    flags.DEFINE_string("journal", None,
                        "Append-only journal of the job's progress; a master started "
                        "on an existing one continues from it.")


def _stop_on_fenced_journal(error: OSError) -> None:
    """A master whose journal another master writes was replaced: it stops
    (SIGTERM to itself: serve_until_signal's orderly end)."""
    from keras_elastic.master.journal import JournalFencedError

    if isinstance(error, JournalFencedError):
        logging.error("%s", error)
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv) -> None:
    del argv
    # Many short RPC handlers on many threads: hand the GIL over sooner than
    # the default 5 ms (a waiting handler otherwise stalls; measured by
    # bench/bench_master.py: +10-25% tasks/s).
    sys.setswitchinterval(0.001)
    faults.set_role("master")
    stacks.enable_stack_dumps()  # kill -USR1: every thread's stack in the log
    server = MasterServer(FLAGS.host, FLAGS.port, FLAGS.heartbeat_timeout,
                          FLAGS.max_task_retries, FLAGS.max_workers, FLAGS.journal,
                          FLAGS.progress_timeout, FLAGS.generation,
                          on_journal_error=_stop_on_fenced_journal,
                          min_workers=FLAGS.min_workers,
                          rendezvous_timeout=FLAGS.rendezvous_timeout)
    logging.info("master serving at %s", server.address)
    if FLAGS.job_dir:
        job_end.watch_service(FLAGS.job_dir, "the master")
    rpc.serve_until_signal(server, FLAGS.ready_file)

"""Master throughput: tasks per second with the journal on and off.

A master process (with the job token check, as always) serves one training
dataset of one-record tasks; `--clients` concurrent clients (threads spread
over `--client_processes` processes, each a `MasterClient` of its own) ask for
tasks and report them done, as fast as they can, for `--seconds`: first as a
worker's task stream does (one task per GetTask, then a ReportTask), then as a
client that fetches `--tasks_per_call` tasks ahead and reports them with its
next GetTask (one call per round trip). Every client connects and registers
before the clock starts. The same run
measures the master without a journal and with it (every answer waits for
its record to be fsync'd; records are written in batches), and prints tasks/s
of each and the ratio on / off.

```
PYTHONPATH=. python bench/bench_master.py
PYTHONPATH=. python bench/bench_master.py --smoke  # tiny sizes: both configurations
```

`--smoke`: 4 clients in 2 processes, one round of 1 s per configuration (flags
given on the command line are kept): checks that both configurations run, with
the journal off and on, and print their ratios; the figures mean nothing.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from absl import app, flags, logging
from proc_stats import cpu_seconds

FLAGS = flags.FLAGS
flags.DEFINE_integer("clients", 64, "Concurrent clients.")
flags.DEFINE_integer("client_processes", 4, "Processes the clients are spread over.")
flags.DEFINE_float("seconds", 10.0, "Seconds measured per configuration.")
flags.DEFINE_integer("rounds", 3, "Measurements per configuration (best kept).")
flags.DEFINE_integer("tasks_per_call", 8, "Second configuration: tasks each client "
                     "asks for per call, reporting the previous ones with the same "
                     "call (the first configuration is what a worker's task stream "
                     "does: one task per GetTask, then a ReportTask).")
flags.DEFINE_bool("smoke", False, "Tiny sizes (4 clients in 2 processes, one round "
                  "of 1 s per configuration; a test runs it: "
                  "tests/test_bench_smoke*.py); the figures mean nothing.")

# --smoke: the values of the flags not given on the command line.
SMOKE = {"clients": 4, "client_processes": 2, "seconds": 1.0, "rounds": 1}


def _client_process(address: str, threads: int, first_id: int, seconds: float,
                    per_call: int, start, queue) -> None:
    """`threads` clients, each registered before this process says "ready" on
    `queue`; they run from the time it then reads from `start` for `seconds`,
    and the tasks they completed go to `queue`."""
    from keras_elastic.master.client import MasterClient
    from keras_elastic.proto import master_pb2

    counts = [0] * threads
    clients = []
    for k in range(threads):
        client = MasterClient(address, worker_id=first_id + k)
        client.register_worker("bench")
        client.register_dataset(master_pb2.RegisterDatasetRequest(
            dataset="bench", mode="training",
            shards=[master_pb2.Shard(name="s", num_records=300_000)],
            records_per_task=1, num_epochs=1))
        clients.append(client)
    queue.put("ready")
    start_at = start.get()

    def run(k: int) -> None:
        client = clients[k]
        while time.time() < start_at:
            time.sleep(0.001)
        end = start_at + seconds
        held: list = []
        while time.time() < end:
            if per_call == 1:  # a worker's TaskStream: ask, train, report
                tasks = client.get_tasks("bench", 0, 1, return_on_wait=True)
                if not isinstance(tasks, list):
                    continue
                client.report_tasks("bench", [t.task_id for t in tasks],
                                    leases=[t.lease for t in tasks])
                counts[k] += len(tasks)
            else:  # a client that fetches ahead: report with the next request
                tasks = client.get_tasks("bench", 0, per_call, return_on_wait=True,
                                         done=held)
                counts[k] += len(held)
                held = tasks if isinstance(tasks, list) else []
        if held:
            client.report_tasks("bench", [t.task_id for t in held],
                                leases=[t.lease for t in held])
        client.close()

    pool = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    queue.put(sum(counts))


def measure(journal: str | None, per_call: int) -> float:
    """Tasks done per second by the clients against a fresh master."""
    ready = tempfile.mktemp(suffix=".json")
    args = [sys.executable, "-m", "keras_elastic.master", f"--ready_file={ready}",
            "--heartbeat_timeout=600"]
    if journal:
        args.append(f"--journal={journal}")
    master = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not os.path.exists(ready):
            if master.poll() is not None:
                raise RuntimeError("the master did not start")
            time.sleep(0.05)
        import json

        address = json.load(open(ready))["address"]
        context = multiprocessing.get_context("spawn")
        queue, start = context.Queue(), context.Queue()
        per = FLAGS.clients // FLAGS.client_processes
        procs = [context.Process(target=_client_process, args=(
            address, per, i * per, FLAGS.seconds, per_call, start, queue))
            for i in range(FLAGS.client_processes)]
        for p in procs:
            p.start()
        for _ in procs:  # every client connected and registered
            if queue.get(timeout=300) != "ready":
                raise RuntimeError("a client process did not start")
        start_at = time.time() + 0.5
        for _ in procs:
            start.put(start_at)
        done = sum(queue.get(timeout=FLAGS.seconds + 120) for _ in procs)
        cpu = cpu_seconds([master.pid])
        for p in procs:
            p.join()
        logging.info("master CPU %.1f s for %d tasks (%.0f us per task)", cpu, done,
                     1e6 * cpu / max(done, 1))
        return done / FLAGS.seconds
    finally:
        master.terminate()
        master.wait()


def main(argv) -> None:
    del argv
    if FLAGS.smoke:
        for name, value in SMOKE.items():
            if not FLAGS[name].present:
                FLAGS[name].value = value
    os.environ.setdefault("KERAS_ELASTIC_TOKEN", os.urandom(16).hex())
    print(f"master, {FLAGS.clients} clients in {FLAGS.client_processes} processes, "
          f"best of {FLAGS.rounds} x {FLAGS.seconds:.0f} s per configuration:")
    with tempfile.TemporaryDirectory() as tmp:
        for per_call in sorted({1, FLAGS.tasks_per_call}):
            results: dict[str, list[float]] = {"off": [], "on": []}
            for r in range(FLAGS.rounds):
                # Alternate which goes first: no configuration always measures
                # right after the other's teardown.
                for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
                    journal = (os.path.join(tmp, f"journal-{per_call}-{r}")
                               if mode == "on" else None)
                    results[mode].append(measure(journal, per_call))
                logging.info("%d per call, round %d: off %.0f tasks/s, on %.0f tasks/s",
                             per_call, r, results["off"][-1], results["on"][-1])
            off, on = max(results["off"]), max(results["on"])
            mid_off, mid_on = (statistics.median(results[m]) for m in ("off", "on"))
            print(f"  {per_call} task(s) per call: journal off {off:7.0f} tasks/s, "
                  f"on {on:7.0f} tasks/s, ratio on / off {on / off:.3f} (medians "
                  f"{mid_off:.0f} and {mid_on:.0f}: {mid_on / mid_off:.3f})", flush=True)


if __name__ == "__main__":
    app.run(main)

"""Parameter servers added, removed and drained while the job trains.

`keras-elastic scale --num_ps N` writes `JOB_DIR/desired_servers` (the
number of server processes the job should have, within 1 and
`--ps_partitions`); `keras-elastic scale --drain_ps NAME` writes
`JOB_DIR/drain_server` (a process whose machine is being taken away: its
partitions go to the others, then it stops). On the launcher's loop,
`ServerScaler.tick`:

1. starts the new processes off the loop (their TensorFlow import takes
   seconds; the job trains on meanwhile), each holding no partition yet;
2. once they serve, plans the moves on the job's layout at that moment
   (`launcher/placement.py`: every process ends with an equal share, the
   fewest partitions move) and makes them one by one (`ps/moves.py`: a copy
   under the partition's lock, forwarding until cluster.json names the new
   process, then the old one lets it go), with the automatic checkpoints
   paused; workers follow each partition to its new process, exactly once;
3. stops the processes left holding nothing.

Nothing rolls back and nothing is trained again. Each change is a line of
the launcher's log and an entry of summary.json's `ps_scaling`; each change
and each refusal is also written, as it happens, to `JOB_DIR/ps_scaling.json`
(`OUTCOMES_FILE`), which `keras-elastic scale` waits on to say how its
request ended.

Example:

```python
scaler = ServerScaler(services)
while training:
    scaler.tick()          # on the launcher's loop, each round
```
"""

from __future__ import annotations

import json
import os
import time
from concurrent import futures
from typing import Any

from absl import logging

from keras_elastic.launcher import placement
from keras_elastic.launcher.backends import ProcessStartError, RoleHandle
from keras_elastic.ps.moves import MoveError, move_partition

DESIRED_SERVERS_FILE = "desired_servers"
DRAIN_SERVER_FILE = "drain_server"
# Every change and refusal so far, as it happens: [{"request": {"num_ps": N} or
# {"drain": NAME}, "servers_before", "servers_after", "moves", "failed",
# "stopped", "seconds", "at"} or {"request": ..., "refused": why, "at"}].
OUTCOMES_FILE = "ps_scaling.json"


class ServerScaler:
    """Carries out `keras-elastic scale --num_ps / --drain_ps` on a running
    job's servers (`services`: the launcher's `JobServices`)."""

    def __init__(self, services) -> None:
        self.services = services
        self.job_dir = services.job_dir
        self.records: list[dict[str, Any]] = []
        # What OUTCOMES_FILE holds: the records and the refusals, in order.
        self.outcomes: list[dict[str, Any]] = []
        self._pool = futures.ThreadPoolExecutor(1, "ps-scale")
        # New processes being started off the loop: (the start, the request).
        self._starting: tuple[futures.Future, dict] | None = None
        self._refused: object = None  # the last request refused (logged once)
        # The autoscaler's count and when it asked (`ask`); the newer of it
        # and `keras-elastic scale`'s file wins.
        self._asked: tuple[int, float] | None = None
        # Requests of an earlier run of this job (--resume): this run's flags
        # are newer.
        for name in (DESIRED_SERVERS_FILE, DRAIN_SERVER_FILE, OUTCOMES_FILE):
            try:
                os.remove(os.path.join(self.job_dir, name))
                logging.info("%s of an earlier run removed: --num_ps=%d holds",
                             name, services.config.num_ps)
            except FileNotFoundError:
                pass

    # -- requests -----------------------------------------------------------------
    def ask(self, count: int) -> None:
        """The autoscaler's request for `count` server processes."""
        self._asked = (count, time.time())

    def _desired(self) -> int | None:
        path = os.path.join(self.job_dir, DESIRED_SERVERS_FILE)
        try:
            with open(path) as f:
                written = (int(f.read().strip()), os.path.getmtime(path))
        except (OSError, ValueError):
            written = None
        newest = max((r for r in (written, self._asked) if r is not None),
                     key=lambda r: r[1], default=None)
        return None if newest is None else newest[0]

    def _drain(self) -> str | None:
        path = os.path.join(self.job_dir, DRAIN_SERVER_FILE)
        try:
            with open(path) as f:
                name = f.read().strip()
        except OSError:
            return None
        return name or None

    def _done_draining(self) -> None:
        try:
            os.remove(os.path.join(self.job_dir, DRAIN_SERVER_FILE))
        except FileNotFoundError:
            pass

    def _refuse(self, request: object, message: str,
                asked: dict | None = None) -> None:
        """Logs (once per `request`) why `asked` is not carried out, and
        writes it to OUTCOMES_FILE."""
        if request != self._refused:
            self._refused = request
            logging.warning("scaling the parameter servers: %s", message)
            if asked is not None:
                self._outcome({"request": asked, "refused": message,
                               "at": time.time()})

    def _outcome(self, entry: dict[str, Any]) -> None:
        self.outcomes.append(entry)
        try:
            _write(os.path.join(self.job_dir, OUTCOMES_FILE),
                   json.dumps(self.outcomes, default=str))
        except OSError as e:  # a full disk: the log and the summary have it
            logging.warning("could not write %s: %s", OUTCOMES_FILE, e)

    # -- the loop -----------------------------------------------------------------
    def tick(self) -> None:
        """One round on the launcher's loop: a start that finished gets its
        partitions; else a request not yet met begins."""
        if self._starting is not None:
            start, request = self._starting
            if not start.done():
                return
            self._starting = None
            try:
                started = start.result()
            except (ProcessStartError, OSError) as e:
                self._refuse(("start", time.time()),
                             f"new server processes could not start: {e}", request)
                return
            self._apply(request, started)
            return
        services = self.services
        hosts = services.hosts()
        partitions = len(services.partition_addresses)
        # Not while a server process is silent (frozen, cut off): a move would
        # wait on it; the liveness checks replace it first.
        if any(services.prober.silent_for(f"ps-{held[0]}") > 2 * services.prober_interval
               for _, held in hosts):
            return
        drain = self._drain()
        if drain is not None:
            names = [proc.name for proc, _ in hosts]
            if drain not in names:
                self._refuse(("drain", drain), f"--drain_ps={drain}: no such server "
                             f"process now (they are {', '.join(names)})",
                             {"drain": drain})
                self._done_draining()
                return
            request = {"drain": drain}
            new = 1 if len(hosts) == 1 else 0
        else:
            desired = self._desired()
            if desired is None or desired == len(hosts):
                return
            if not 1 <= desired <= partitions:
                self._refuse(("num_ps", desired),
                             f"--num_ps={desired}: the job has {partitions} "
                             f"partitions (--ps_partitions): between 1 and "
                             f"{partitions} servers", {"num_ps": desired})
                return
            if services.config.ps_replicas > 1:
                self._refuse(("num_ps", desired), "servers with backups "
                             "(--ps_replicas=2) are not scaled", {"num_ps": desired})
                return
            request = {"num_ps": desired}
            new = max(0, desired - len(hosts))
        if new:
            self._starting = (self._pool.submit(self._start, new), request)
            logging.info("scaling the parameter servers (%s): starting %d new "
                         "process(es)", _describe(request), new)
        else:
            self._apply(request, [])

    def _start(self, count: int) -> list[tuple[RoleHandle, str]]:
        """(Off the loop.) `count` server processes holding no partition."""
        services = self.services
        live = {proc.name for proc, _ in services.hosts()}
        started = []
        try:
            for _ in range(count):
                k = 0
                while f"ps-n{k}" in live:
                    k += 1
                name = f"ps-n{k}"
                live.add(name)
                # (Its --partition, past the job's partitions, only names it.)
                named = len(services.partition_addresses) + k
                proc, info = services._start_service(
                    name, "keras_elastic.ps", services._ps_args(named, partitions=[]))
                started.append((proc, services._advertised(info["address"])))
        except BaseException:
            for proc, _ in started:
                proc.kill()
                proc.close()
            raise
        return started

    def _apply(self, request: dict, started: list[tuple[RoleHandle, str]]) -> None:
        """Plans and makes the moves on the layout as it is now, then stops
        the processes left without a partition."""
        services = self.services
        began = time.time()
        hosts = services.hosts()
        before = len(hosts)
        layout = [held for _, held in hosts]
        if "drain" in request:
            keep = [k for k, (proc, _) in enumerate(hosts)
                    if proc.name != request["drain"]]
        else:
            keep = list(range(min(request["num_ps"], len(hosts))))
        try:
            after, moves = placement.plan(layout, keep, len(started))
        except ValueError as e:
            self._refuse(request, str(e), request)
            for proc, _ in started:
                proc.kill()
                proc.close()
            return
        for proc, address in started:
            # Into the job's generation now (a recovery may have moved it).
            services.recovery.fence(address, services.generation, proc.name)
        targets = [(proc, services.partition_addresses[held[0]]) for proc, held in hosts]
        targets += started
        copy_dir = os.path.join(self.job_dir, "moves")
        done, failed = [], []
        # A move waits on its processes up to half the liveness timeout (a
        # frozen one is then left to the liveness checks); after one failed,
        # no other move from or to the same process is tried this round.
        timeout = max(5.0, min(60.0, services.config.liveness_timeout / 2))
        unreachable: set[str] = set()
        checkpointer = services.checkpointer
        if checkpointer is not None:
            checkpointer.pause()
        try:
            for p, _, to in moves:
                proc, address = targets[to]

                def switch(p=p, proc=proc, address=address) -> None:
                    services.partition_procs[p] = proc
                    services.partition_addresses[p] = address
                    services.write_cluster_file()

                source = services.partition_addresses[p]
                if {source, address} & unreachable:
                    failed.append({"partition": p, "error": "not tried: a move from "
                                   "or to the same process failed"})
                    continue
                try:
                    seconds = move_partition(p, source, address, copy_dir, switch,
                                             timeout=timeout)
                except (MoveError, ValueError) as e:
                    logging.warning("partition %d stays at %s: %s", p, source, e)
                    failed.append({"partition": p, "error": str(e)})
                    if isinstance(e, MoveError):
                        unreachable.update((source, address))
                    continue
                services.prober.set_target(f"ps-{p}", address)
                done.append({"partition": p, "from": source, "to": address,
                             "seconds": round(seconds, 2)})
            if checkpointer is not None:
                checkpointer.set_partition_addresses(services.partition_addresses)
        finally:
            if checkpointer is not None:
                checkpointer.resume()
        holding = {id(proc) for proc, _ in services.hosts()}
        stopped = []
        for proc, _ in [*hosts, *started]:
            if id(proc) not in holding:
                proc.terminate()
                stopped.append(proc.name)
        if "drain" in request:
            self._done_draining()
            desired = self._desired()
            if desired is not None and desired > len(services.hosts()):
                # The count asked before the drain would bring a process back.
                _write(os.path.join(self.job_dir, DESIRED_SERVERS_FILE),
                       str(len(services.hosts())))
        services.write_cluster_file()
        record = {"request": request, "servers_before": before,
                  "servers_after": len(services.hosts()), "moves": done,
                  "failed": failed, "stopped": stopped,
                  "seconds": round(time.time() - began, 2), "at": time.time()}
        self.records.append(record)
        self._outcome(record)
        logging.warning("parameter servers %s: %d -> %d processes, %d partition(s) "
                        "moved in %.1f s%s", _describe(request), before,
                        record["servers_after"], len(done), record["seconds"],
                        f" ({len(failed)} could not move)" if failed else "")

    def stop(self) -> None:
        """Stops new processes still starting (at the job's end)."""
        if self._starting is not None:
            start, _ = self._starting
            self._starting = None
            try:
                for proc, _ in start.result(timeout=60):
                    proc.terminate()
            except (futures.TimeoutError, ProcessStartError, OSError):
                pass
        self._pool.shutdown(wait=False)


def _describe(request: dict) -> str:
    if "drain" in request:
        return f"draining {request['drain']}"
    return f"to {request['num_ps']}"


def _write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)

"""CPU time and resident memory of processes, from /proc (shared by the benches).

>>> cpu_seconds([os.getpid()]) >= 0
True
"""

from __future__ import annotations

import os


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by the processes `pids` (all threads)."""
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def pin(pids: list[int], cores: list[int]) -> None:
    """Bind every thread of the processes `pids` to the CPU cores `cores`
    (`sched_setaffinity` of each task in /proc/<pid>/task: a running process's
    threads keep their own masks; threads they start later inherit them).
    Raises RuntimeError when a process's main thread did not take the binding."""
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                os.sched_setaffinity(int(tid), cores)
            except ProcessLookupError:  # a thread that ended meanwhile
                pass
        if os.sched_getaffinity(pid) != set(cores):
            raise RuntimeError(f"process {pid} was not bound to cores {cores}: it "
                               f"runs on {sorted(os.sched_getaffinity(pid))}")


def core_plan(server_cores: int, servers: int) -> tuple[list[list[int]], list[int]]:
    """`server_cores` cores of this process's own for each of `servers` servers,
    and the cores left for everything else (the clients): disjoint, from
    `os.sched_getaffinity(0)`. Raises ValueError when fewer than one core would be
    left for the clients.

    >>> servers, clients = core_plan(1, 1)  # on a machine of 2 cores or more
    >>> len(servers[0]), servers[0][0] in clients
    (1, False)
    """
    cores = sorted(os.sched_getaffinity(0))
    needed = server_cores * servers
    if needed >= len(cores):
        raise ValueError(f"{servers} server(s) x {server_cores} core(s) leave no core "
                         f"for the clients: this process may use {len(cores)} cores "
                         f"({cores})")
    return ([cores[i * server_cores:(i + 1) * server_cores] for i in range(servers)],
            cores[needed:])


def rss_bytes(pid: int | str = "self") -> int:
    """Resident memory of process `pid` (VmRSS of /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def trimmed_rss_bytes() -> int:
    """This process's resident memory once the C allocator gave its free memory
    back to the operating system (glibc's `malloc_trim`): what the live
    arrays hold, not the freed temporaries the allocator keeps for reuse."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: plain VmRSS
        pass
    return rss_bytes()

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

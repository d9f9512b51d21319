"""The C allocator of a server process: freed message buffers kept for reuse.

A parameter server receives and sends a model's bytes at every push: buffers
of megabytes, allocated and freed hundreds of times a second by gRPC, Python
and TensorFlow. glibc's `malloc` gives such blocks back to the operating
system when they are freed (each one its own `mmap`, or the heap trimmed
above 128 KiB free) and the next push takes every page back by a page
fault: measured on a server taking 4 MB pushes, 1,300 page faults a push and
45% of its CPU time in the kernel. `keep_freed_buffers` raises both limits
so that blocks up to `max_bytes` stay in the process and are reused;
`buffer_limit` sizes that limit for a server's share of a model.

Example:

>>> from keras_elastic.common import allocator
>>> allocator.buffer_limit(4_000_000)  # a 4 MB share: its pushes and replies
8388608
>>> allocator.keep_freed_buffers(allocator.buffer_limit(4_000_000))  # glibc
True
"""

from __future__ import annotations

import ctypes
import ctypes.util

from absl import logging

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

# glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2: 32 MiB on 64-bit.
DEFAULT_MAX_BYTES = 32 << 20
MIN_BYTES = 1 << 20
# The free memory an arena keeps above its used blocks, in blocks of the
# limit: with 4 workers pushing a 4 MB model at once, an 8 MiB limit needed
# 4 of them (trimmed at 8 MiB, a push still took 2,800 page faults).
TRIM_FACTOR = 4


def buffer_limit(model_bytes: int) -> int:
    """The `keep_freed_buffers` limit for a server holding `model_bytes` of
    dense variables: the smallest power of two at least twice that (a push's
    message and its reply, with the statistics it assigns), within 1 MiB and
    32 MiB. No larger: a server's big one-off buffers (a lookup of a million
    embedding rows: 32 MB) then still go back to the operating system, so a
    server of large tables holds no more memory than it needs."""
    limit = MIN_BYTES
    while limit < 2 * model_bytes and limit < DEFAULT_MAX_BYTES:
        limit *= 2
    return limit


def keep_freed_buffers(max_bytes: int = DEFAULT_MAX_BYTES) -> bool:
    """Makes this process's `malloc` keep freed blocks of up to `max_bytes`
    for reuse instead of returning them to the operating system: blocks up
    to that size come from the allocator's heaps, not each from its own
    `mmap` (glibc's `M_MMAP_THRESHOLD`), and a heap gives memory back only
    when `TRIM_FACTOR` times that is free at its top (`M_TRIM_THRESHOLD`). A
    process-wide setting: call it in a server process, never in a user's.

    Returns whether it was applied: False (and nothing changed) where the C
    library is not glibc.

    The cost is memory: each of the allocator's heaps (one per thread that
    allocates concurrently, at most 8 per core) may keep up to
    `TRIM_FACTOR * max_bytes` free. Measured on a server taking 4 MB pushes
    from 4 workers at once, with 32 MiB: 40 MB more resident (740 MB against
    700 MB, most of it TensorFlow's), page faults a push 1,240-1,750 -> 40-130.
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, max_bytes) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, TRIM_FACTOR * max_bytes) == 1 and ok
    if not ok:
        logging.warning("the C library refused mallopt(%d bytes): freed buffers go "
                        "back to the operating system", max_bytes)
    return ok

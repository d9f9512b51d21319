"""Which parameter-server process holds which partitions: the job's start,
and the moves that take it to another number of processes (`keras-elastic
scale --num_ps`, a drained server). Pure functions, tested without
processes; `launcher/server_scaler.py` carries the moves out.

A layout is a list of processes (slots), each the sorted list of partitions
it holds. The moves keep every partition that can stay where it is: each
process ends with `P // N` or one more partitions, the fullest keep the
larger shares, and only the surplus (and everything a removed process held)
moves.

Example:

>>> initial(4, 2)
[[0, 2], [1, 3]]
>>> after, moves = plan([[0, 2], [1, 3]], keep=[0, 1], new=2)
>>> after, moves
([[0], [1], [2], [3]], [(2, 0, 2), (3, 1, 3)])
>>> plan(after, keep=[0], new=0)
([[0, 1, 2, 3]], [(1, 1, 0), (2, 2, 0), (3, 3, 0)])
"""

from __future__ import annotations

Move = tuple[int, int, int]  # (partition, from slot, to slot)


def initial(partitions: int, servers: int) -> list[list[int]]:
    """The start: server k holds partitions k, k + servers, ...

    >>> initial(3, 3)
    [[0], [1], [2]]
    """
    if not 1 <= servers <= partitions:
        raise ValueError(f"{servers} servers for {partitions} partitions: each server "
                         "holds at least one")
    return [list(range(k, partitions, servers)) for k in range(servers)]


def plan(layout: list[list[int]], keep: list[int], new: int
         ) -> tuple[list[list[int]], list[Move]]:
    """The layout after keeping the processes of slots `keep` (in that order)
    and adding `new` processes, and the moves that make it. The returned
    layout lists `keep`'s processes, then the new ones. A move names its
    source by its slot in `layout`, its target by its slot in `layout` too
    (a kept process) or `len(layout) + k` (the k-th new process)."""
    partitions = sorted(p for held in layout for p in held)
    if len(set(partitions)) != len(partitions):
        raise ValueError(f"layout {layout}: a partition is held twice")
    servers = len(keep) + new
    if not 1 <= servers <= len(partitions):
        raise ValueError(f"{servers} servers for {len(partitions)} partitions: "
                         f"between 1 and {len(partitions)} (--ps_partitions)")
    if len(set(keep)) != len(keep) or any(not 0 <= k < len(layout) for k in keep):
        raise ValueError(f"keep={keep}: slots of the layout's {len(layout)}, once each")
    base, extra = divmod(len(partitions), servers)
    # The fullest kept processes keep the larger shares (fewest moves).
    by_load = sorted(range(len(keep)), key=lambda j: (-len(layout[keep[j]]), j))
    quota = [base] * servers
    for rank, j in enumerate(by_load):
        if rank < extra:
            quota[j] = base + 1
    for j in range(len(keep), servers):  # the rest of the larger shares
        if sum(1 for q in quota if q == base + 1) < extra:
            quota[j] = base + 1
    after: list[list[int]] = [[] for _ in range(servers)]
    source: dict[int, int] = {}
    loose: list[int] = []
    for j, slot in enumerate(keep):
        held = sorted(layout[slot])
        after[j] = held[:quota[j]]
        loose += held[quota[j]:]
    kept = set(keep)
    for slot, held in enumerate(layout):
        for p in held:
            source[p] = slot
        if slot not in kept:
            loose += held
    moves: list[Move] = []
    for p in sorted(loose):
        j = next(j for j in range(servers) if len(after[j]) < quota[j])
        after[j].append(p)
        moves.append((p, source[p], keep[j] if j < len(keep) else len(layout) + j
                      - len(keep)))
    return [sorted(held) for held in after], moves

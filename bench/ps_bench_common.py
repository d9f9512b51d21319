"""What the parameter-server benches share (bench_ps_wire.py, bench_ps_scaling.py)."""

from __future__ import annotations


def variable_names(count: int, num_ps: int) -> list[str]:
    """`count` variable names, `count / num_ps` owned by each server."""
    from keras_elastic.ps.partition import ps_for

    per = count // num_ps
    taken: list[list[str]] = [[] for _ in range(num_ps)]
    k = 0
    while any(len(t) < per for t in taken):
        name = f"dense_{k}/kernel"
        owner = ps_for(name, num_ps)
        if len(taken[owner]) < per:
            taken[owner].append(name)
        k += 1
    return [n for t in taken for n in t]

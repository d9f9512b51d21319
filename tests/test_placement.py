"""Which parameter-server process holds which partitions, and the moves to
another number of processes (launcher/placement.py): tables, no processes."""

import itertools

import pytest

from keras_elastic.launcher import placement


@pytest.mark.parametrize("partitions, servers, layout", [
    (1, 1, [[0]]),
    (4, 4, [[0], [1], [2], [3]]),
    (4, 2, [[0, 2], [1, 3]]),
    (5, 2, [[0, 2, 4], [1, 3]]),
])
def test_the_start_spreads_the_partitions_round_robin(partitions, servers, layout):
    assert placement.initial(partitions, servers) == layout


def test_more_servers_than_partitions_is_refused_naming_both():
    with pytest.raises(ValueError, match="5 servers for 4 partitions"):
        placement.initial(4, 5)
    with pytest.raises(ValueError, match="between 1 and 4"):
        placement.plan([[0, 1, 2, 3]], keep=[0], new=4)


@pytest.mark.parametrize("layout, keep, new, after, moved", [
    # Growing: the new processes take the surplus of the fullest.
    ([[0, 2], [1, 3]], [0, 1], 2, [[0], [1], [2], [3]], [2, 3]),
    ([[0, 1, 2, 3]], [0], 1, [[0, 1], [2, 3]], [2, 3]),
    ([[0, 2, 4], [1, 3]], [0, 1], 1, [[0, 2], [1, 3], [4]], [4]),
    # Shrinking: the removed processes' partitions go to the kept ones.
    ([[0], [1], [2], [3]], [0], 0, [[0, 1, 2, 3]], [1, 2, 3]),
    ([[0], [1], [2], [3]], [0, 1], 0, [[0, 2], [1, 3]], [2, 3]),
    # Draining the middle one of three.
    ([[0, 3], [1], [2]], [0, 2], 0, [[0, 3], [1, 2]], [1]),
    # Draining the only one: a new process takes everything.
    ([[0, 1]], [], 1, [[0, 1]], [0, 1]),
    # Nothing to do.
    ([[0], [1]], [0, 1], 0, [[0], [1]], []),
])
def test_moves_keep_what_can_stay(layout, keep, new, after, moved):
    got_after, moves = placement.plan(layout, keep, new)
    assert got_after == after
    assert sorted(p for p, _, _ in moves) == moved


@pytest.mark.parametrize("partitions, before, to", [
    (p, b, t) for p, b, t in itertools.product([1, 3, 4, 7], [1, 2, 3, 4], [1, 2, 3, 4])
    if b <= p and t <= p])
def test_every_plan_holds_each_partition_once_balanced_with_fewest_moves(
        partitions, before, to):
    layout = placement.initial(partitions, before)
    keep, new = list(range(min(before, to))), max(0, to - before)
    after, moves = placement.plan(layout, keep, new)
    assert sorted(p for held in after for p in held) == list(range(partitions))
    assert len(after) == to
    sizes = [len(held) for held in after]
    assert max(sizes) - min(sizes) <= 1
    # Each move's source held the partition, its target holds it after.
    targets = {k: j for j, k in enumerate(keep)}
    for p, source, target in moves:
        assert p in layout[source]
        j = targets[target] if target < len(layout) else len(keep) + target - len(layout)
        assert p in after[j]
    # Nothing moves that could stay: only the kept processes' surplus and
    # what the removed ones held.
    surplus = sum(max(0, len(layout[k]) - len(after[j])) for j, k in enumerate(keep))
    removed = sum(len(layout[k]) for k in range(before) if k not in keep)
    assert len(moves) == surplus + removed

"""ps/id_index.IdIndex: the vectorized id -> row hash index of embedding tables,
against a dict on the same operations (issue 27)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_elastic.ps.id_index import IdIndex


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 2**63 - 1), max_size=300),
                          st.lists(st.booleans(), max_size=400)), max_size=8),
       st.lists(st.integers(0, 2**63 - 1), max_size=200))
def test_appends_removals_and_lookups_equal_a_list(batches, queries):
    index, expected = IdIndex(), []  # expected: the ids in row order
    for batch, kept in batches:
        new = np.array(sorted(set(batch) - set(expected)), np.int64)
        assert index.append(new).tolist() == list(range(len(expected),
                                                        len(expected) + len(new)))
        expected += new.tolist()
        # Some rows removed: the others move down, in order.
        keep = np.array((kept + [True] * len(expected))[:len(expected)], bool)
        index.keep(keep)
        expected = [i for i, k in zip(expected, keep) if k]
        assert len(index) == len(expected)
        assert index.ids.tolist() == expected
    asked = np.array(queries + expected[:50], np.int64)
    row = {i: r for r, i in enumerate(expected)}
    assert index.get(asked).tolist() == [row.get(i, -1) for i in asked.tolist()]


def test_colliding_ids_of_one_batch_and_growth_keep_every_id():
    index = IdIndex()
    # Ids that share their low bits (a stride of 2^40) and many batches: probe
    # chains, claims of the same slot within a batch, and several rehashes.
    ids = np.arange(5000, dtype=np.int64) << 40
    for k in range(0, 5000, 700):
        index.append(ids[k:k + 700])
    assert len(index) == 5000
    assert np.array_equal(index.get(ids), np.arange(5000))
    assert index.get(np.array([1, 3 << 40 | 1])).tolist() == [-1, -1]
    # 8 bytes an id, and 5 bytes a slot (its row and tag) at least 3/8 full
    # after growing.
    assert index.nbytes <= 5000 * 8 + 5000 / 0.375 * 5
    assert IdIndex().nbytes == 0  # nothing allocated before the first append


def test_ids_view_is_read_only():
    index = IdIndex()
    index.append(np.array([4, 2]))
    view = index.ids
    try:
        view[0] = 9
    except ValueError:
        pass
    else:
        raise AssertionError("IdIndex.ids let a caller change an id")
    assert index.get(np.array([4])).tolist() == [0]


def test_ids_of_one_group_and_one_tag_overflow_and_are_all_found():
    """The slow paths of a lookup: ids that share their home group past its 8
    slots (found in the next groups) and share their tag within a group
    (the first slot of their tag is another id's)."""
    from keras_elastic.ps.id_index import GROUP, _hash

    # A table of 4 groups (2 bits) holds up to 24 ids; pick ids whose home is
    # group 0, many of them with one tag.
    candidates = np.arange(200_000, dtype=np.int64)
    group, tag = _hash(candidates, 2)
    home = candidates[group == 0]
    common = np.bincount(tag[group == 0]).argmax()
    same_tag = home[tag[group == 0] == common][:4]
    others = home[tag[group == 0] != common][:8]
    ids = np.concatenate([others[:6], same_tag, others[6:]])  # 12 > GROUP
    assert len(ids) == 12 > GROUP and len(same_tag) == 4
    index = IdIndex()
    index.append(ids)
    assert index._bits == 2  # (still 4 groups: the ids share group 0)
    assert index.get(ids).tolist() == list(range(12))
    assert index.get(ids[::-1]).tolist() == list(range(12))[::-1]
    # Absent ids of the same group and tag are not found.
    absent = home[tag[group == 0] == common][4:6]
    assert index.get(absent).tolist() == [-1, -1]
    # And after a removal (a rehash) the rest are still found in their rows.
    keep = np.ones(12, bool)
    keep[[0, 7]] = False
    index.keep(keep)
    assert index.get(ids[keep]).tolist() == list(range(10))
    assert index.get(ids[~keep]).tolist() == [-1, -1]

"""ps/id_index.IdIndex: the vectorized id -> row hash index of embedding tables,
against a dict on the same operations (issue 27)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_elastic.ps.id_index import IdIndex


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**63 - 1), max_size=300), max_size=8),
       st.lists(st.integers(0, 2**63 - 1), max_size=200))
def test_inserts_and_lookups_equal_a_dict(batches, queries):
    index, expected = IdIndex(), {}
    for batch in batches:
        new = np.array(sorted(set(batch) - set(expected)), np.int64)
        rows = np.arange(len(expected), len(expected) + len(new))
        index.insert(new, rows)
        expected.update(zip(new.tolist(), rows.tolist()))
        assert len(index) == len(expected)
    asked = np.array(queries + list(expected)[:50], np.int64)
    assert index.get(asked).tolist() == [expected.get(i, -1) for i in asked.tolist()]
    ids, rows = index.items()
    assert dict(zip(ids.tolist(), rows.tolist())) == expected


def test_colliding_ids_of_one_batch_and_growth_keep_every_id():
    index = IdIndex()
    # Ids that share their low bits (a stride of 2^40) and many batches: probe
    # chains, claims of the same slot within a batch, and several rehashes.
    ids = np.arange(5000, dtype=np.int64) << 40
    for k in range(0, 5000, 700):
        index.insert(ids[k:k + 700], np.arange(k, min(k + 700, 5000)))
    assert len(index) == 5000
    assert np.array_equal(index.get(ids), np.arange(5000))
    assert index.get(np.array([1, 3 << 40 | 1])).tolist() == [-1, -1]
    assert index.nbytes <= 5000 / 0.375 * 12  # at least 3/8 full after growing
    assert IdIndex().nbytes == 0  # nothing allocated before the first insert


def test_rows_beyond_int32_are_kept():
    index = IdIndex()
    index.insert(np.array([7], np.int64), np.array([2**40]))
    index.insert(np.array([8], np.int64), np.array([2**33]))
    assert index.get(np.array([7, 8])).tolist() == [2**40, 2**33]

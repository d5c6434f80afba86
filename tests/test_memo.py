"""The one bounded-memo policy (hlo_spmd.memo) used by the partitioner's pure memos."""
from hypothesis import given, strategies as st

from hlo_spmd.memo import BoundedMemo


def test_put_returns_the_value_and_get_finds_it():
    memo = BoundedMemo(4)
    value = object()
    assert memo.put(("k", 1), value) is value
    assert memo.get(("k", 1)) is value
    assert memo.get(("other",)) is None


def test_none_is_a_value_to_remember():
    memo = BoundedMemo(4)
    memo.put("k", None)
    assert "k" in memo and memo["k"] is None


@given(st.integers(min_value=1, max_value=16), st.lists(st.integers(0, 40), max_size=200))
def test_never_holds_more_than_its_limit_and_keeps_the_newest(limit, keys):
    memo = BoundedMemo(limit)
    for k in keys:
        memo.put(k, -k)
        assert len(memo) <= limit
        assert memo[k] == -k

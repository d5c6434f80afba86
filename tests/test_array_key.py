"""array_token: equal tokens exactly for equal (shape, dtype, elements), small or large,
read-only or not, and never fooled by an array changed after it was named."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hlo_spmd.sharding.array_key import array_token


@st.composite
def arrays(draw):
    n = draw(st.sampled_from([1, 3, 8, 255, 256, 257, 1000, 2048]))
    dtype = draw(st.sampled_from([np.int64, np.int32, np.uint8, np.bool_, np.float32]))
    # Few distinct values, so that equal and nearly equal arrays are drawn often.
    seed = draw(st.integers(0, 3))
    a = np.random.default_rng(seed).integers(0, 2, n).astype(dtype)
    if draw(st.booleans()) and n % 8 == 0:
        a = a.reshape(8, -1)
    if draw(st.booleans()):
        a.flags.writeable = False
    return a


@settings(max_examples=300, deadline=None, derandomize=True)
@given(arrays(), arrays())
def test_tokens_equal_exactly_when_arrays_equal(a, b):
    same = a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)
    assert (array_token(a) == array_token(b)) == same
    assert array_token(a) == array_token(a.copy())


@settings(max_examples=100, deadline=None, derandomize=True)
@given(arrays(), st.integers(0, 10 ** 6))
def test_one_changed_element_changes_the_token(a, where):
    b = a.copy()
    flat = b.reshape(-1)
    i = where % flat.size
    flat[i] = 0 if flat[i] else 1
    assert array_token(a) != array_token(b)


def test_a_writeable_array_changed_after_naming_gets_a_new_token():
    a = np.arange(4096, dtype=np.int64)
    t = array_token(a)
    a[7] = -1
    assert array_token(a) != t
    a[7] = 7
    assert array_token(a) == t


def test_read_only_view_of_a_writeable_array_is_not_trusted_by_identity():
    base = np.arange(4096, dtype=np.int64)
    view = base[:]
    view.flags.writeable = False
    t = array_token(view)
    base[0] = 5
    assert array_token(view) != t


def test_transposed_and_contiguous_copies_agree():
    a = np.arange(4096, dtype=np.int64).reshape(64, 64)
    assert array_token(a.T) == array_token(np.ascontiguousarray(a.T))
    assert array_token(a.T) != array_token(a)


def test_intern_table_is_bounded_and_tokens_never_reused(monkeypatch):
    from hlo_spmd.sharding import array_key

    monkeypatch.setattr(array_key, "_INTERNED_LIMIT", 8)
    monkeypatch.setattr(array_key, "_INTERNED", {})
    monkeypatch.setattr(array_key, "_interned_count", 0)
    values = [np.full(1024, v, np.int64) for v in range(40)]
    tokens = [array_token(v) for v in values]
    assert sum(len(b) for b in array_key._INTERNED.values()) <= 8
    assert len(set(tokens)) == len(tokens)          # distinct values, distinct tokens
    assert array_token(values[-1].copy()) == tokens[-1]   # still interned: same token
    again = array_token(values[0].copy())           # cleared since: a new token, no clash
    assert again not in tokens[1:]

"""TileAssignment: iota canonical form, value equality, reshape/transpose, compaction."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_sharding_model import SETTINGS, reshape_dims_for, tile_assignments

from hlo_spmd.errors import ShardingError
from hlo_spmd.sharding import TileAssignment, canonicalize_iota, iota_form


@pytest.mark.parametrize("dims,perm,want", [
    ([3, 4, 5], [0, 1, 2], ([60], [0])),
    ([3, 4, 5], [2, 1, 0], ([3, 4, 5], [2, 1, 0])),
    ([3, 4, 5], [1, 2, 0], ([3, 20], [1, 0])),
    ([3, 4, 5], [1, 0, 2], ([3, 4, 5], [1, 0, 2])),
    ([3, 4, 5], [2, 0, 1], ([12, 5], [1, 0])),
    ([1, 3, 1, 4, 1, 5], [4, 3, 2, 5, 1, 0], ([3, 20], [1, 0])),
    ([1, 1], [1, 0], ([1], [0])),
    ([1], [0], ([1], [0])),
])
def test_canonicalize_matches_xla_examples(dims, perm, want):
    rd, rp = canonicalize_iota(dims, perm)
    assert (list(rd), list(rp)) == (want[0], want[1])


@SETTINGS
@given(st.data())
def test_iota_form_recovers_canonical_fields(data):
    n = data.draw(st.sampled_from([1, 2, 4, 6, 8, 12, 16, 24, 30, 36, 48, 64]))
    rd = data.draw(reshape_dims_for(n))
    perm = data.draw(st.permutations(range(len(rd))))
    ta = TileAssignment([n], rd, perm)
    arr = np.arange(n).reshape(rd).transpose(perm).reshape(-1)
    assert np.array_equal(ta.array(), arr)
    form = iota_form(arr)
    assert form == (ta.reshape_dims, ta.transpose_perm)
    # Explicit and iota forms of one value are equal and hash alike.
    ex = TileAssignment.from_array(arr)
    assert ex == ta and hash(ex) == hash(ta)
    assert ex.compact().is_iota and ex.compact() == ta


@SETTINGS
@given(st.permutations(range(12)))
def test_iota_form_rejects_non_iota(perm):
    arr = np.asarray(perm)
    form = iota_form(arr)
    if form is not None:
        rd, rp = form
        assert np.array_equal(np.arange(12).reshape(rd).transpose(rp).reshape(-1), arr)
    assert iota_form(np.array([1, 2, 3])) is None
    assert iota_form(np.array([0, 0])) is None


@st.composite
def ta_and_perm(draw):
    rank = draw(st.integers(1, 5))
    dims = [draw(st.sampled_from([1, 2, 3, 4, 6])) for _ in range(rank)]
    while math.prod(dims) > 96:
        dims[dims.index(max(dims))] = 1
    ta = draw(tile_assignments(dims))
    return ta, draw(st.permutations(range(rank)))


@SETTINGS
@given(ta_and_perm())
def test_transpose_is_numpy_transpose(tp):
    ta, perm = tp
    out = ta.transpose(perm)
    assert np.array_equal(out.array(), ta.array().transpose(perm))
    assert out.dims == tuple(ta.dims[p] for p in perm)
    if out.is_iota:  # iota results are canonical
        assert canonicalize_iota(out.reshape_dims, out.transpose_perm) == \
            (out.reshape_dims, out.transpose_perm)


@SETTINGS
@given(ta_and_perm(), st.data())
def test_reshape_keeps_flat_order(tp, data):
    ta, _ = tp
    n = ta.num_devices
    new = data.draw(reshape_dims_for(n)) if n > 1 else [1]
    out = ta.reshape(new)
    assert np.array_equal(out.array().reshape(-1), ta.array().reshape(-1))
    assert out.is_iota == ta.is_iota


def test_equality_and_text():
    a = TileAssignment([2, 4], [4, 2], [1, 0])
    assert str(a) == "devices=[2,4]<=[4,2]T(1,0)"
    assert a.array().tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    b = TileAssignment.from_array([[0, 2, 4, 6], [1, 3, 5, 7]])
    assert str(b) == "devices=[2,4]0,2,4,6,1,3,5,7"
    assert a == b and hash(a) == hash(b)
    assert a != TileAssignment([2, 4])
    assert a != TileAssignment([4, 2], [4, 2], [1, 0])  # same flat order, other dims
    assert TileAssignment([2, 2], [2, 2], [0, 1]).reshape_dims == (4,)
    assert str(TileAssignment([1, 1], [1], [0])) == "devices=[1,1]<=[1]"


def test_invalid_iota_rejected():
    with pytest.raises(ShardingError, match="permutation"):
        TileAssignment([4], [2, 2], [0, 0])
    with pytest.raises(ShardingError, match="hold"):
        TileAssignment([4], [2, 3], [0, 1])
    with pytest.raises(ShardingError, match="need 4 devices"):
        TileAssignment.from_devices([2, 2], [0, 1, 2])


def test_device_positions_inverse():
    ta = TileAssignment.from_array([[3, 0], [2, 1]])
    pos = ta.device_positions()
    assert pos.tolist() == [1, 3, 2, 0]
    assert ta.uses_device(3) and not ta.uses_device(4)


def test_xla_transpose_fallback_stays_correct():
    # [2,3]<=[3,2]T(1,0)-style arrays break XLA's factor grouping: explicit result.
    ta = TileAssignment([6, 2], [2, 6], [1, 0]).reshape([2, 3, 2])
    out = ta.transpose([2, 0, 1])
    assert np.array_equal(out.array(), ta.array().transpose(2, 0, 1))


def test_large_iota_is_cheap():
    ta = TileAssignment([16, 8, 16], [8, 16, 16], [1, 2, 0])
    for perm in ([2, 1, 0], [1, 0, 2], [0, 2, 1]):
        out = ta.transpose(perm)
        assert out.is_iota
    assert str(ta).startswith("devices=[16,8,16]<=")
    ex = TileAssignment.from_array(ta.array())
    assert ex.compact() == ta and ex.compact().is_iota

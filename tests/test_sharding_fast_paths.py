"""The large-mesh fast paths of the sharding algebra against the plain algorithms they
replace: orders, distinctness checks and their error messages must be identical."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hlo_spmd.errors import ShardingError
from hlo_spmd.sharding import HloSharding
from hlo_spmd.sharding.algebra import _order_by_key_then_device
from hlo_spmd.sharding.device_ids import all_distinct


@st.composite
def keyed_devices(draw):
    n = draw(st.sampled_from([1, 2, 255, 256, 300, 1024, 2048]))
    rng = np.random.default_rng(draw(st.integers(0, 1 << 20)))
    devices = rng.permutation(n * draw(st.sampled_from([1, 2]))).astype(np.int64)[:n]
    if draw(st.booleans()):
        devices[rng.integers(0, n, max(1, n // 100))] = devices[0]  # ties
    key = rng.integers(0, draw(st.sampled_from([1, 4, 64, n])), n).astype(np.int64)
    return key, devices


@settings(max_examples=200, deadline=None, derandomize=True)
@given(keyed_devices())
def test_order_is_lexsorts(kd):
    key, devices = kd
    assert np.array_equal(_order_by_key_then_device(key, devices), np.lexsort((devices, key)))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(keyed_devices())
def test_all_distinct_is_the_sorted_check(kd):
    _, devices = kd
    s = np.sort(devices)
    assert all_distinct(devices) == bool(s.size < 2 or np.all(s[1:] != s[:-1]))


@pytest.mark.parametrize("n", [8, 512, 2048])
def test_duplicate_and_negative_devices_are_named(n):
    ids = np.random.default_rng(n).permutation(n)
    ok = HloSharding.tile(ids.reshape(2, -1))
    assert ok.tile_assignment.num_devices == n
    dup = np.arange(n)
    dup[[5, n - 1]] = [3, 1]   # devices 1 and 3 now appear twice: the smaller is named
    dup = dup[ids]
    with pytest.raises(ShardingError, match=r"device 1 appears more than once"):
        HloSharding.tile(dup.reshape(2, -1))
    neg = ids.copy()
    neg[2] = -4
    with pytest.raises(ShardingError, match=r"device id -4 is negative"):
        HloSharding.tile(neg.reshape(2, -1))
    far = ids.copy()
    far[0] = 10 * n   # outside the bincount range: the general path
    HloSharding.tile(far.reshape(2, -1))


def test_grouping_memos_keep_each_callers_metadata():
    from hlo_spmd.sharding import parse_sharding
    from hlo_spmd.sharding.grouping import group_by_dims, ungroup
    from hlo_spmd.sharding.metadata import OpMetadata

    s = parse_sharding("{devices=[4,2,2]<=[16] last_tile_dim_replicate}")
    a = s.with_metadata([OpMetadata(op_name="a")])
    b = s.with_metadata([OpMetadata(op_name="b")])
    ga, gb = group_by_dims(a, [0]), group_by_dims(b, [0])
    assert ga.sharding.metadata == (OpMetadata(op_name="a"),)
    assert gb.sharding.metadata == (OpMetadata(op_name="b"),)
    assert ungroup(ga) == s and ungroup(ga).metadata == (OpMetadata(op_name="a"),)
    assert ungroup(gb).metadata == (OpMetadata(op_name="b"),)
    # An equal grouping built anew (another array object) gives the same answer.
    again = ga.with_sharding(ga.sharding)
    object.__setattr__(again, "device_groups", ga.device_groups.copy())
    assert ungroup(again) == ungroup(ga)
    other = ga.with_sharding(ga.sharding)
    object.__setattr__(other, "device_groups", ga.device_groups[::-1].copy())
    assert ungroup(other) != ungroup(ga)

"""Device grouping (paper section 4.4), ungrouping, iota replica groups."""
from __future__ import annotations


import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_sharding_model import (SETTINGS, holder_mask, reshape_dims_for, sharding_and_shape,
                                 tile_index_of_device, tiled_shardings)

from hlo_spmd.errors import ShardingError
from hlo_spmd.sharding import (HloSharding, TileAssignment, group_by_all_dims_except,
                               group_by_dims, iota_replica_groups, parse_sharding, shard_bounds,
                               ungroup)


@SETTINGS
@given(tiled_shardings(), st.data())
def test_group_by_dims_definition(s, data):
    ta = s.tile_assignment
    dims = data.draw(st.lists(st.integers(0, ta.ndim - 1), unique=True))
    man = s.subgroup_manual_dim
    # Grouping away a manual dim needs subgroup_manual to restore it (XLA's contract).
    g = group_by_dims(s, dims, subgroup_manual=man in dims)
    idx = tile_index_of_device(s)
    groups = g.device_groups
    assert groups.shape == (g.num_groups, g.group_size)
    assert sorted(groups.reshape(-1).tolist()) == sorted(idx)  # a partition of the devices
    inner_idx = tile_index_of_device(g.sharding) if g.sharding.is_tiled else None
    rest = [i for i in range(ta.ndim) if i not in dims]
    for gi in range(g.num_groups):
        coords = np.unravel_index(gi, g.group_dim_sizes) if dims else ()
        for local, dev in enumerate(groups[gi].tolist()):
            # Group gi = devices at these coordinates on the grouped dims, in order.
            assert [idx[dev][d] for d in dims] == [int(c) for c in coords]
            # Within the group, devices are row-major over the remaining dims, and the
            # inner sharding puts group-local device `local` at the same data tile.
            assert local == int(np.ravel_multi_index([idx[dev][d] for d in rest],
                                                     [ta.dims[d] for d in rest])) if rest else True
            if inner_idx is not None:
                r = s.tiled_data_rank
                for d in range(r):
                    if d not in dims:
                        assert inner_idx[local][d] == idx[dev][d]
    if man not in dims or s.subgroup_replication_dim not in dims:
        assert ungroup(g) == s


@SETTINGS
@given(sharding_and_shape(), st.data())
def test_group_then_shard_within_group_matches_model(ss, data):
    """Recursive partitioning view: group on data dims, shard the group's slice."""
    s, dims = ss
    r = len(dims)
    gdims = data.draw(st.lists(st.integers(0, r - 1), unique=True))
    g = group_by_dims(s, gdims)
    full = holder_mask(s, dims, s.tile_assignment.num_devices)
    tiles = s.tile_dims_for_data()
    # The group's slice: ceil(dim/tiles) chunks on grouped dims, whole elsewhere.
    for gi in range(g.num_groups):
        coords = [int(c) for c in np.unravel_index(gi, g.group_dim_sizes)] if gdims else []
        lo = [0] * r
        hi = list(dims)
        for d, c in zip(gdims, coords):
            size = -(-dims[d] // tiles[d])
            lo[d], hi[d] = min(c * size, dims[d]), min((c + 1) * size, dims[d])
        local_dims = [max(hi[i] - lo[i], 0) for i in range(r)]
        if g.sharding.is_replicated:
            continue
        inner = holder_mask(g.sharding, local_dims, g.group_size)
        for local, dev in enumerate(g.device_groups[gi].tolist()):
            window = full[(dev,) + tuple(slice(a, b) for a, b in zip(lo, hi))]
            # Within-group tiles use the group slice's own dims; they agree with the
            # global tiles whenever the slice divides evenly.
            if all(local_dims[i] % (tiles[i] if i not in gdims else 1) == 0 for i in range(r)):
                assert np.array_equal(inner[local], window)


def test_group_examples():
    s = parse_sharding("{devices=[2,2,2]<=[8] last_tile_dim_replicate}")
    g = group_by_dims(s, [0])
    groups, inner = g
    assert groups is g.device_groups and inner is g.sharding
    assert g.device_groups.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert str(g.sharding) == "{devices=[1,2,2]<=[4] last_tile_dim_replicate}"
    assert (g.group_dims, g.group_dim_sizes, g.data_rank) == ((0,), (2,), 2)
    g = group_by_dims(s, [2])  # group on the replication dim: replicas side by side
    assert g.device_groups.tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert str(g.sharding) == "{devices=[2,2]<=[4]}"
    assert ungroup(g) == s
    g = group_by_dims(s, [1], group_dim_shards=[1])
    assert g.device_groups.tolist() == [[0, 1, 4, 5], [2, 3, 6, 7]]
    g = group_by_dims(parse_sharding("{devices=[4,2]<=[8]}"), [0], group_dim_shards=[2])
    assert g.device_groups.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert str(g.sharding) == "{devices=[2,2]<=[4]}" and ungroup(g).tile_assignment.dims == (4, 2)
    m = parse_sharding("{devices=[2,2,2]<=[8] last_tile_dims={manual, replicated}}")
    g = group_by_dims(m, [1], subgroup_manual=True)
    assert g.device_groups.tolist() == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert str(g.sharding) == "{devices=[2,2]<=[4] last_tile_dim_replicate}"
    assert ungroup(g) == m
    g = group_by_all_dims_except(s, [1])
    assert g.group_dims == (0, 2) and str(g.sharding) == "{devices=[1,2]<=[2]}"
    assert ungroup(g) == s
    with pytest.raises(ShardingError, match="tiled"):
        group_by_dims(HloSharding.replicate(), [0])
    with pytest.raises(ShardingError, match="distinct"):
        group_by_dims(s, [0, 0])


def test_ungroup_replicated_inner():
    s = parse_sharding("{devices=[4,1]<=[4]}")
    g = group_by_dims(s, [0])
    assert g.sharding.is_replicated
    assert ungroup(g) == s
    # Replace the inner sharding: each group of 2 tiles dim 1.
    g2 = group_by_dims(parse_sharding("{devices=[2,1,2]<=[4] last_tile_dim_replicate}"), [0])
    assert g2.sharding.is_replicated
    out = ungroup(g2.with_sharding(parse_sharding("{devices=[1,2]<=[2]}")))
    assert str(out) == "{devices=[2,2]<=[4]}"


@SETTINGS
@given(st.data())
def test_iota_replica_groups_round_trip(data):
    n = data.draw(st.sampled_from([2, 4, 6, 8, 12, 16, 32, 64]))
    rd = data.draw(reshape_dims_for(n))
    perm = data.draw(st.permutations(range(len(rd))))
    arr = np.arange(n).reshape(rd).transpose(perm).reshape(-1)
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    g = data.draw(st.sampled_from(divisors))
    groups = arr.reshape(g, n // g)
    res = iota_replica_groups(groups)
    assert res is not None
    ng, gs, rdims, rperm = res
    assert (ng, gs) == (g, n // g)
    assert np.array_equal(np.arange(n).reshape(rdims).transpose(rperm).reshape(g, -1), groups)


def test_iota_replica_groups_examples():
    assert iota_replica_groups([[0, 1, 2, 3]]) == (1, 4, (4,), (0,))
    assert iota_replica_groups([[0, 2], [1, 3]]) == (2, 2, (2, 2), (1, 0))
    assert iota_replica_groups([[0, 1], [3, 2]]) is None
    assert iota_replica_groups([[0, 1], [2]]) is None
    assert iota_replica_groups([[1, 2], [3, 4]]) is None
    s = HloSharding.iota_tile([16, 8, 16], [8, 16, 16], [1, 2, 0])
    g = group_by_dims(s, [1])
    res = iota_replica_groups(g.device_groups)
    assert res is not None and res[:2] == (8, 256)
    assert ungroup(g) == s


def test_grouping_2048_devices_bounds_consistent():
    s = HloSharding.tile(TileAssignment.from_array(
        np.random.default_rng(1).permutation(2048).reshape(8, 16, 16)), True)
    g = group_by_dims(s, [0])
    assert g.device_groups.shape == (8, 256)
    b = shard_bounds(s, (64, 32))
    for gi in (0, 7):
        rows = b[g.device_groups[gi], 0]
        assert (rows == rows[0]).all()  # one group = one slice of dim 0
    assert ungroup(g) == s

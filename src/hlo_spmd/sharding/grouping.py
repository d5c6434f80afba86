"""Device grouping (GSPMD paper section 4.4) and compact replica-group forms.

``group_by_dims(s, dims)``: devices that sit at the same index on the tile dims
``dims`` form one group; groups are numbered row-major over ``dims`` in the
order given, and each group lists its devices row-major over the remaining tile
dims.  The inner sharding describes the tiling *within* a group over group-local
ids ``0..group_size-1`` (same data rank, grouped dims have 1 tile each, or
``group_dim_shards`` tiles when only part of a dim is grouped).  This is XLA's
GroupShardingOnDims; ``ungroup`` is UngroupSharding.  Both are numpy reshape /
transpose of the device array, no per-device Python.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hlo_spmd.errors import ShardingError
from hlo_spmd.memo import BoundedMemo
from hlo_spmd.sharding.common import compact, memoised
from hlo_spmd.sharding.array_key import array_token
from hlo_spmd.sharding.hlo_sharding import HloSharding, ShardingType
from hlo_spmd.sharding.tile_assignment import TileAssignment, iota_form

__all__ = ["GroupedSharding", "group_by_dims", "group_by_all_dims_except", "ungroup",
           "iota_replica_groups"]


@dataclass(frozen=True, eq=False)
class GroupedSharding:
    """Devices split into groups plus the sharding each group applies internally.

    ``device_groups[g, l]`` is the global device id of group-local device ``l``
    in group ``g``.  ``group_dims`` are tile dims of the original sharding (a dim
    >= ``data_rank`` is a subgroup dim: manual when ``subgroup_manual``, else
    replicated), ``group_dim_sizes`` how many groups each contributes.
    """

    device_groups: np.ndarray
    group_dims: tuple[int, ...]
    group_dim_sizes: tuple[int, ...]
    data_rank: int
    sharding: HloSharding
    subgroup_manual: bool = False

    def __iter__(self) -> Iterator[Any]:
        """``groups, inner = group_by_dims(...)`` unpacks the two main results."""
        return iter((self.device_groups, self.sharding))

    @property
    def num_groups(self) -> int:
        return int(self.device_groups.shape[0])

    @property
    def group_size(self) -> int:
        return int(self.device_groups.shape[1])

    def with_sharding(self, sharding: HloSharding, data_rank: int | None = None) -> GroupedSharding:
        """Same groups, new inner sharding (e.g. after a per-group transformation)."""
        return GroupedSharding(self.device_groups, self.group_dims, self.group_dim_sizes,
                               self.data_rank if data_rank is None else data_rank, sharding,
                               self.subgroup_manual)


# Memoised (results are immutable: a frozen record over a read-only array): a model's
# layers group the same shardings the same way, and each grouping is O(devices) numpy
# work; a shared device-group array is also known by identity to the memos keyed on it.
@memoised
def group_by_dims(sharding: HloSharding, dims: Sequence[int],
                  group_dim_shards: Sequence[int] | None = None,
                  subgroup_manual: bool = False) -> GroupedSharding:
    """Group devices by their index on tile dims ``dims`` (see module docstring).

    ``group_dim_shards[i]``: keep that many tiles of ``dims[i]`` inside each
    group (the dim's tiles split as groups-major, shards-minor).
    """
    if not sharding.is_tiled:
        raise ShardingError(f"group_by_dims needs a tiled sharding, got {sharding}")
    ta = sharding.tile_assignment
    r = sharding.tiled_data_rank
    assert ta is not None and r is not None
    gdims = [int(d) for d in dims]
    if len(set(gdims)) != len(gdims) or any(not 0 <= d < ta.ndim for d in gdims):
        raise ShardingError(f"group dims {gdims} must be distinct tile dims of {sharding}")
    shards = [1] * len(gdims) if group_dim_shards is None else [int(x) for x in group_dim_shards]
    if len(shards) != len(gdims):
        raise ShardingError("group_dim_shards must match dims in length")
    sizes = []
    for d, sh in zip(gdims, shards):
        if sh < 1 or ta.dims[d] % sh:
            raise ShardingError(f"tile dim {d} of size {ta.dims[d]} is not divisible by {sh}")
        sizes.append(ta.dims[d] // sh)
    # Split each grouped dim into (groups, shards) and move the group parts first.
    split_dims: list[int] = []
    group_axis: dict[int, int] = {}
    rest_axes: list[int] = []
    for i, d in enumerate(ta.dims):
        if i in gdims:
            k = gdims.index(i)
            group_axis[i] = len(split_dims)
            split_dims.extend([sizes[k], shards[k]])
            rest_axes.append(len(split_dims) - 1)
        else:
            rest_axes.append(len(split_dims))
            split_dims.append(d)
    perm = [group_axis[d] for d in gdims] + rest_axes
    num_groups = math.prod(sizes)
    arr = ta.array().reshape(split_dims).transpose(perm).reshape(num_groups, -1)
    arr = np.ascontiguousarray(arr)
    arr.setflags(write=False)
    inner_dims = list(ta.dims)
    for d, sh in zip(gdims, shards):
        inner_dims[d] = sh
    inner_ta = TileAssignment(inner_dims)
    md = sharding.metadata
    if inner_ta.num_devices == 1:
        inner = HloSharding.replicate(md)
    elif sharding.replicate_on_last_tile_dim:
        inner = HloSharding._partial_tile(inner_ta, md)
    elif sharding.subgroup_types:
        inner = HloSharding._subgroup_impl(inner_ta, sharding.subgroup_types, md)
    else:
        inner = HloSharding._tiled(inner_ta, metadata=md)
    return GroupedSharding(arr, tuple(gdims), tuple(sizes), r, inner, subgroup_manual)


def group_by_all_dims_except(sharding: HloSharding, non_group_dims: Sequence[int],
                             subgroup_manual: bool = False) -> GroupedSharding:
    """Group on every tile dim (subgroup dims included) not in ``non_group_dims``."""
    ta = sharding.tile_assignment
    if ta is None:
        raise ShardingError(f"group_by_all_dims_except needs a tiled sharding, got {sharding}")
    keep = {int(d) for d in non_group_dims}
    return group_by_dims(sharding, [d for d in range(ta.ndim) if d not in keep],
                         subgroup_manual=subgroup_manual)


def ungroup(grouped: GroupedSharding) -> HloSharding:
    """The global sharding a per-group sharding describes (XLA's UngroupSharding).

    Data group dims multiply the inner tile count (group index major); group
    dims past the data rank become subgroup dims (manual if
    ``subgroup_manual`` else replicated).
    """
    # One answer per distinct grouping value (O(devices) numpy work each); the inner
    # sharding's metadata is part of the key, as the result carries it.
    inner = grouped.sharding
    key = (array_token(grouped.device_groups), grouped.group_dims, grouped.group_dim_sizes,
           grouped.data_rank, grouped.subgroup_manual, inner,
           None if inner.is_tuple else inner.metadata)
    hit = _UNGROUPED.get(key)
    if hit is None:
        hit = _UNGROUPED.put(key, _ungroup(grouped))
    return hit


_UNGROUPED = BoundedMemo(4096)


def _ungroup(grouped: GroupedSharding) -> HloSharding:
    inner = grouped.sharding
    gsize = grouped.group_size
    r = grouped.data_rank
    gdims = list(grouped.group_dims)
    if inner.is_tuple or not (inner.is_tiled or inner.is_replicated or inner.is_manual):
        raise ShardingError(f"cannot ungroup inner sharding {inner}")
    types: list[ShardingType]
    if inner.is_tiled:
        ita = inner.tile_assignment
        assert ita is not None
        if inner.tiled_data_rank != r:
            raise ShardingError(f"inner sharding {inner} does not have data rank {r}")
        tiling = list(ita.dims)
        types = [ShardingType.REPLICATED] if inner.replicate_on_last_tile_dim \
            else list(inner.subgroup_types)
        local = ita.array()
    else:
        # Replicated (or manual) inside each group: one trailing subgroup dim.
        tiling = [1] * r + [gsize]
        types = [ShardingType.MANUAL if inner.is_manual else ShardingType.REPLICATED]
        local = np.arange(gsize, dtype=np.int64).reshape(tiling)
    if grouped.subgroup_manual:
        # Every subgroup group dim is a fresh manual dim inserted at its index.
        for d in gdims:
            if d < r:
                continue
            if d > len(tiling):
                raise ShardingError(f"group dim {d} skips past tile dim {len(tiling)}")
            tiling.insert(d, 1)
            types.insert(d - r, ShardingType.MANUAL)
    else:
        # A group dim one past the inner tile dims is a new replication dim;
        # one inside them multiplies that dim (e.g. the replication dim).
        for d in sorted(x for x in gdims if x >= len(tiling)):
            if d != len(tiling):
                raise ShardingError(f"group dim {d} skips past tile dim {len(tiling)}")
            tiling.append(1)
            types.append(ShardingType.REPLICATED)
    local = local.reshape(tiling)
    n_groups = grouped.num_groups
    if math.prod(grouped.group_dim_sizes) != n_groups:
        raise ShardingError("group_dim_sizes do not multiply to the number of groups")
    if local.size != gsize:
        raise ShardingError(
            f"inner sharding {inner} uses {local.size} devices, groups have {gsize}")
    # vals[g..., inner idx...] = device_groups[g, local[inner idx]]
    vals = grouped.device_groups[:, local.reshape(-1)]
    vals = vals.reshape(tuple(grouped.group_dim_sizes) + tuple(tiling))
    ng = len(gdims)
    perm: list[int] = []
    final: list[int] = []
    for j, t in enumerate(tiling):
        if j in gdims:
            i = gdims.index(j)
            perm.extend([i, ng + j])
            final.append(grouped.group_dim_sizes[i] * t)
        else:
            perm.append(ng + j)
            final.append(t)
    arr = vals.transpose(perm).reshape(final)
    ta = TileAssignment.from_array(arr).compact()
    md = inner.metadata
    return compact(HloSharding._subgroup_impl(ta, tuple(types), md))


def iota_replica_groups(groups: np.ndarray | Sequence[Sequence[int]]
                        ) -> tuple[int, int, tuple[int, ...], tuple[int, ...]] | None:
    """``(num_groups, group_size, reshape_dims, perm)`` if the groups are an iota list.

    That is XLA's IotaReplicaGroupList ``[G,S]<=[reshape_dims]T(perm)``: the
    groups, flattened row-major, equal ``arange(N).reshape(reshape_dims)
    .transpose(perm)``.  None when no such form exists.
    """
    try:
        arr = np.asarray(groups, dtype=np.int64)
    except (ValueError, TypeError):
        return None  # ragged groups
    if arr.ndim != 2 or arr.size == 0:
        return None
    form = iota_form(arr)
    if form is None:
        return None
    return int(arr.shape[0]), int(arr.shape[1]), form[0], form[1]

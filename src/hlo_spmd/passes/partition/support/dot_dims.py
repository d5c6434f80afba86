"""Dot geometry for the dot and convolution handlers: the sharding maps between the
iteration space, the three tensors and device groups. The dimension classes and the
iteration space itself are the shared dims model (hlo_spmd.passes.dot_conv_dims).

The *iteration space* has one dim per output dim (in output order) followed by one dim
per contracting dim (and, for a convolution, dims the planner never tiles). A tiled
sharding ``T`` of the iteration space says which block of the computation every device
does: its lhs tile is ``T`` with the rhs non-contracting dims replicated, its rhs tile the
same with the lhs non-contracting dims replicated, and its local dot is a partial sum of
the output tile ``T`` projected on the output dims, summed over the contracting tiles.

Device grouping (GSPMD 4.4): ``groups[g, l]`` (logical ids of the current context) lists
the devices of group ``g``; a tensor is *grouped* on some of its dims when group ``g``
holds exactly the ``g``-th block of those dims (row-major over them) and every group
shards its block the same way over local ids ``l`` (the *inner* sharding). A tensor
without the grouped dims is grouped when it is the same in every group.

All maps are numpy on device arrays; nothing loops over devices in Python.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from hlo_spmd.memo import BoundedMemo
from hlo_spmd.sharding.array_key import array_token
from hlo_spmd.sharding import (GroupedSharding, HloSharding, ShardingType, compact,
                               group_by_dims, sharding_from_tile_indices, tile_coords,
                               ungroup)

from hlo_spmd.passes.dot_conv_dims import (  # noqa: F401  (the shared dims model)
    BATCH, CONTRACTING, KINDS, LHS_NC, RHS_NC, DimNums, DotDims)


# -- plain sharding facts ------------------------------------------------------------------
def is_plain(s: HloSharding) -> bool:
    """Replicated or tiled with at most a replication subgroup (what the planner handles)."""
    if s.is_replicated:
        return True
    if not s.is_tiled:
        return False
    return all(t == ShardingType.REPLICATED for t in s.subgroup_types)


def data_tiles(s: HloSharding, rank: int) -> tuple[int, ...]:
    return s.tile_dims_for_data() if s.is_tiled else (1,) * rank


def _tile_array(s: HloSharding, rank: int) -> np.ndarray:
    """Device array ``[data tiles..., replication]`` of a plain sharding."""
    ta = s.tile_assignment
    assert ta is not None
    arr = ta.array()
    return arr.reshape(tuple(arr.shape[:rank]) + (-1,))


# The planner derives the same few shardings from device arrays over and over (every
# candidate of every sub-problem): one canonicalisation per distinct array, and one
# regrouping per distinct (sharding, groups, dims). Both are pure in immutable values.
_FROM_ARRAY = BoundedMemo(1024)  # keys hold O(devices) bytes
_REGROUP = BoundedMemo(1024)
# lift / project / scattered per (sharding, dims...): the dot problems of a model share
# their operand and candidate shardings (at 7 layers about half the calls repeat one).
# The results depend on the tile array only (never on metadata): keyed by value.
_MAPS = BoundedMemo(4096)


def _from_array(arr: np.ndarray) -> HloSharding:
    """Plain sharding from ``[data tiles..., replication]`` (canonicalised)."""
    if arr.ndim == 1:
        return HloSharding.replicate()
    key = array_token(arr)
    hit = _FROM_ARRAY.get(key)
    if hit is None:
        hit = _FROM_ARRAY.put(key, compact(HloSharding.partial_tile(arr)))
    return hit


def lift(s: HloSharding, tensor_iter: Sequence[int], iter_rank: int,
         n: int) -> HloSharding | None:
    """The iteration-space sharding that tiles like ``s`` on the tensor's dims and not at
    all on the others (None unless plain)."""
    key = ("lift", s, tuple(tensor_iter), iter_rank)
    if key in _MAPS:
        return _MAPS[key]
    return _MAPS.put(key, _lift(s, tensor_iter, iter_rank))


def _lift(s: HloSharding, tensor_iter: Sequence[int], iter_rank: int) -> HloSharding | None:
    if not is_plain(s):
        return None
    if s.is_replicated:
        return HloSharding.replicate()
    r = len(tensor_iter)
    arr = _tile_array(s, r)
    order = sorted(range(r), key=lambda j: tensor_iter[j])
    shape = [1] * iter_rank
    for j in range(r):
        shape[tensor_iter[j]] = arr.shape[j]
    arr = arr.transpose(order + [r]).reshape(shape + [arr.shape[-1]])
    return _from_array(arr)


def project(t: HloSharding, tensor_iter: Sequence[int], iter_rank: int) -> HloSharding:
    """The tensor sharding an iteration-space sharding implies: tiled on the tensor's dims,
    replicated over the tiles of the other iteration dims."""
    if t.is_replicated:
        return t
    key = ("project", t, tuple(tensor_iter), iter_rank)
    hit = _MAPS.get(key)
    if hit is None:
        hit = _MAPS.put(key, _project(t, tensor_iter, iter_rank))
    return hit


def _project(t: HloSharding, tensor_iter: Sequence[int], iter_rank: int) -> HloSharding:
    arr = _tile_array(t, iter_rank)
    keep = list(tensor_iter)
    others = [k for k in range(iter_rank) if k not in keep]
    shape = [arr.shape[k] for k in keep] + [-1]
    return _from_array(arr.transpose(keep + others + [iter_rank]).reshape(shape))


def reduction_groups(t: HloSharding, iter_rank: int, contr: Sequence[int]) -> np.ndarray:
    """``[groups, k]``: devices that differ only in their contracting tiles, each in
    row-major contracting-tile order."""
    arr = _tile_array(t, iter_rank)
    contr = list(contr)
    rest = [k for k in range(iter_rank + 1) if k not in contr]
    k = math.prod(arr.shape[c] for c in contr)
    return arr.transpose(rest + contr).reshape(-1, k)


def scattered(t: HloSharding, iter_rank: int, out_rank: int, contr: Sequence[int],
              dim: int) -> HloSharding:
    """Output sharding after a reduce-scatter on output ``dim`` over the contracting groups
    of ``t``: the contracting tiles become minor tiles of ``dim``."""
    key = ("scattered", t, iter_rank, out_rank, tuple(contr), dim)
    hit = _MAPS.get(key)
    if hit is None:
        hit = _MAPS.put(key, _scattered(t, iter_rank, out_rank, contr, dim))
    return hit


def _scattered(t: HloSharding, iter_rank: int, out_rank: int, contr: Sequence[int],
               dim: int) -> HloSharding:
    arr = _tile_array(t, iter_rank)
    contr = list(contr)
    order = list(range(dim + 1)) + contr + list(range(dim + 1, out_rank)) + [iter_rank]
    others = [k for k in range(out_rank, iter_rank) if k not in contr]
    arr = arr.transpose(order[:-1] + others + [iter_rank])
    shape = [arr.shape[k] for k in range(out_rank + len(contr))]
    merged = shape[:dim] + [math.prod(shape[dim:dim + len(contr) + 1])] + \
        shape[dim + len(contr) + 1:]
    return _from_array(arr.reshape(merged + [-1]))


# -- grouping ------------------------------------------------------------------------------
def index_table(s: HloSharding, rank: int, n: int) -> np.ndarray:
    """``[n, rank]``: every logical device's data tile index (zeros when replicated)."""
    out = np.zeros((n, rank), dtype=np.int64)
    if s.is_tiled:
        devices, coords = tile_coords(s)
        out[devices] = coords[:, :rank]
    return out


def _view_sharding(index: np.ndarray, tiles: Sequence[int]) -> HloSharding | None:
    """Sharding over local ids ``0..S-1`` where local ``l`` holds tile ``index[l]``."""
    s = index.shape[0]
    if math.prod(tiles) == 1:
        return HloSharding.replicate()
    return sharding_from_tile_indices(np.arange(s, dtype=np.int64), index, list(tiles))


def group_index(sizes: Sequence[int], num_groups: int) -> np.ndarray:
    """``[num_groups, len(sizes)]``: each group's block index, row-major over ``sizes``."""
    if not sizes:
        return np.zeros((num_groups, 0), np.int64)
    return np.stack(np.unravel_index(np.arange(num_groups), tuple(sizes)), axis=1)


def regroup(s: HloSharding, rank: int, groups: np.ndarray, x_dims: Sequence[int] | None,
            sizes: Sequence[int]) -> HloSharding | None:
    """The inner sharding of ``s`` for ``groups`` when ``s`` is grouped exactly (see the
    module docstring), else None. ``x_dims``: the tensor's dims the groups split (in group
    order), None when the tensor has none of them."""
    if not is_plain(s):
        return None
    key = (s, rank, array_token(groups),
           None if x_dims is None else tuple(x_dims), tuple(int(z) for z in sizes))
    if key in _REGROUP:
        return _REGROUP[key]
    return _REGROUP.put(key, _regroup(s, rank, groups, x_dims, sizes))


def _regroup(s: HloSharding, rank: int, groups: np.ndarray, x_dims: Sequence[int] | None,
             sizes: Sequence[int]) -> HloSharding | None:
    ng, gsize = groups.shape
    n = groups.size
    tiles = list(data_tiles(s, rank))
    idx = index_table(s, rank, n)[groups]              # [ng, S, rank]
    rest = list(range(rank))
    if x_dims is not None:
        if [tiles[d] for d in x_dims] != [int(z) for z in sizes]:
            return None
        gidx = group_index(sizes, ng)                   # [ng, len]
        if not np.array_equal(idx[:, :, list(x_dims)], np.broadcast_to(
                gidx[:, None, :], (ng, gsize, len(x_dims)))):
            return None
        rest = [d for d in range(rank) if d not in x_dims]
        for d in x_dims:
            tiles[d] = 1
    if not np.array_equal(idx[:, :, rest], np.broadcast_to(idx[:1, :, rest],
                                                           (ng, gsize, len(rest)))):
        return None
    view = idx[0].copy()
    if x_dims is not None:
        view[:, list(x_dims)] = 0
    return _view_sharding(view, tiles)


def group0_view(s: HloSharding, rank: int, groups: np.ndarray,
                x_dims: Sequence[int] | None) -> HloSharding:
    """A reasonable inner sharding when ``s`` is not grouped: how the first group's devices
    tile the non-grouped dims under ``s`` (replicated if that is not a valid sharding)."""
    if not is_plain(s) or s.is_replicated:
        return HloSharding.replicate()
    tiles = list(data_tiles(s, rank))
    view = index_table(s, rank, groups.size)[groups[0]]
    for d in x_dims or ():
        tiles[d] = 1
        view[:, d] = 0
    if math.prod(tiles) > groups.shape[1]:
        return HloSharding.replicate()
    out = _view_sharding(view, tiles)
    return out if out is not None else HloSharding.replicate()


def manual_groups(shardings: Sequence[HloSharding], ranks: Sequence[int]
                  ) -> tuple[np.ndarray, list[HloSharding | None]] | None:
    """The manual device groups of the first partially manual sharding of ``shardings``
    (GSPMD 4.4: an op on partially manual values is partitioned inside those groups) and
    each sharding (of rank ``ranks[i]``) as seen inside them, None where it is not in the
    same groups; None when no sharding is partially manual."""
    ref = next((s for s in shardings if s.is_tiled and s.subgroup_manual_dim is not None),
               None)
    if ref is None:
        return None
    groups = np.asarray(group_by_dims(ref, [ref.subgroup_manual_dim],
                                      subgroup_manual=True).device_groups, np.int64)
    return groups, [regroup_manual(s, r, groups) for s, r in zip(shardings, ranks)]


def regroup_manual(s: HloSharding, rank: int, groups: np.ndarray) -> HloSharding | None:
    """The inner (non-manual) sharding of a partially manual ``s`` when group ``g`` of
    ``groups`` is exactly its manual group ``g`` and every group tiles the data alike."""
    md = s.subgroup_manual_dim if s.is_tiled else None
    if md is None or any(t not in (ShardingType.MANUAL, ShardingType.REPLICATED)
                         for t in s.subgroup_types):
        return None
    ng, gsize = groups.shape
    ta = s.tile_assignment
    assert ta is not None
    if ta.dims[md] != ng or ta.num_devices != groups.size:
        return None
    devices, coords = tile_coords(s)
    manual = np.zeros(groups.size, np.int64)
    manual[devices] = coords[:, md]
    if not np.array_equal(manual[groups], np.broadcast_to(np.arange(ng)[:, None], groups.shape)):
        return None
    idx = np.zeros((groups.size, rank), np.int64)
    idx[devices] = coords[:, :rank]
    view = idx[groups]
    if not np.array_equal(view, np.broadcast_to(view[:1], view.shape)):
        return None
    return _view_sharding(view[0], data_tiles(s, rank))


def ungroup_to(groups: np.ndarray, rank: int, x_dims: Sequence[int] | None,
               sizes: Sequence[int], inner: HloSharding) -> HloSharding:
    """The global sharding of a tensor grouped by ``groups`` with ``inner`` in each group."""
    if x_dims is None:
        g = GroupedSharding(groups, (rank,), (int(groups.shape[0]),), rank, inner)
    else:
        g = GroupedSharding(groups, tuple(int(d) for d in x_dims),
                            tuple(int(z) for z in sizes), rank, inner)
    return ungroup(g)


def per_group_dims(dims: Sequence[int], x_dims: Sequence[int] | None,
                   sizes: Sequence[int]) -> tuple[int, ...]:
    """A tensor's per-group shape: grouped dims shrink to their (padded) shard size."""
    out = [int(d) for d in dims]
    for d, z in zip(x_dims or (), sizes):
        out[d] = -(-out[d] // int(z))
    return tuple(out)

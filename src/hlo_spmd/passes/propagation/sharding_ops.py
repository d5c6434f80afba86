"""XLA-faithful sharding operations used by propagation (hlo_sharding_util.cc semantics).

The sharding package (``hlo_spmd.sharding``) supplies the value type and most of the
algebra; this module adds the few operations propagation needs with XLA's exact
behaviour (the ones the algebra does differently or does not have):

* ``more_specific`` (IsShardingMoreSpecific), ``merge_sharding`` (MergeSharding),
  ``merge_if_compatible`` (MergeShardingIfCompatible, XLA's preconditions around
  the algebra's merge), ``find_common_sharding``;
* ``reshape_sharding`` / ``propagate_through_reshape``: XLA's current gcd-based
  ReshapeSharding and the interval search of PropagateShardingThroughReshape;
* ``transpose_with_collapsed_dims``, ``remove_shape_dims``, ``replicate_all_data_dims``
  (with a target data rank), ``propagate_along_dims`` (PropagateShardingAlongDims-
  AndReplicateOthers), ``is_subtiling_or_equal`` (IsSubTilingOrEqualSharding);
* tuple helpers (sub-shardings by shape index, single-sharding tuples).

Every function is pure and deterministic; the expensive ones are memoised on their
(hashable) arguments because a module reuses a handful of shardings many times.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np

from hlo_spmd.ir.shape import Shape
from hlo_spmd.sharding import HloSharding, ShardingType, TileAssignment
from hlo_spmd.sharding import algebra

REPLICATED = ShardingType.REPLICATED
MANUAL = ShardingType.MANUAL
_CACHE = 65536

# -- predicates ------------------------------------------------------------------------


def is_spatially_partitioned(s: HloSharding | None) -> bool:
    """XLA's IsSpatiallyPartitioned: tiled, manual or replicated (not single-device)."""
    if s is None:
        return False
    if s.is_tuple:
        return any(is_spatially_partitioned(e) for e in s.tuple_elements)
    return not s.is_tile_maximal or s.is_replicated


def is_tiled(s: HloSharding) -> bool:
    """XLA's IsTiled: has a tile assignment (not maximal, manual or unknown)."""
    return (not s.is_tuple) and s.is_tiled


def has_unique_device(s: HloSharding) -> bool:
    return s.unique_device is not None


def num_tiles(s: HloSharding) -> int:
    """Data tiles of a leaf (1 for replicated / maximal / manual)."""
    return s.num_tiles


def tile_dims(s: HloSharding) -> tuple[int, ...]:
    ta = s.tile_assignment
    return ta.dims if ta is not None else ()


def data_rank(s: HloSharding) -> int:
    r = s.tiled_data_rank
    return -1 if r is None else r


def _leaf_more_specific(lhs: HloSharding, rhs: HloSharding) -> bool:
    if lhs.is_manual and rhs.is_tile_maximal:
        return True
    if lhs.is_manual or rhs.is_manual:
        return False
    if not rhs.is_tile_maximal:
        return lhs.num_tiles > rhs.num_tiles
    if rhs.is_replicated:
        return not lhs.is_replicated
    return not lhs.is_tile_maximal


def more_specific(lhs: HloSharding, rhs: HloSharding) -> bool:
    """XLA's IsShardingMoreSpecific (tuples: none worse and one better)."""
    if lhs.is_tuple != rhs.is_tuple:
        raise ValueError(f"cannot compare {lhs} with {rhs}")
    if lhs.is_tuple:
        better = False
        for a, b in zip(lhs.tuple_elements, rhs.tuple_elements):
            if more_specific(b, a):
                return False
            better |= more_specific(a, b)
        return better
    return _leaf_more_specific(lhs, rhs)


def strictly_better(lhs: HloSharding, rhs: HloSharding) -> bool:
    """XLA's IsShardingStrictlyBetter: manual replacing tile-maximal (per leaf)."""
    if lhs.is_tuple != rhs.is_tuple:
        return False
    if lhs.is_tuple:
        mask = 0
        for a, b in zip(lhs.tuple_elements, rhs.tuple_elements):
            if a.is_manual and b.is_tile_maximal:
                mask |= 1
            if b.is_manual and a.is_tile_maximal:
                mask |= 2
        return mask == 1
    return lhs.is_manual and rhs.is_tile_maximal


# -- construction helpers ----------------------------------------------------------------


def rebuild(like: HloSharding, ta: TileAssignment) -> HloSharding:
    """``like``'s kind of tiling over a new tile assignment.

    XLA's ``ReplicateOnLastTileDim() ? PartialTile(ta) : Subgroup(ta, types)``.
    """
    if like.replicate_on_last_tile_dim:
        return HloSharding.partial_tile(ta, like.metadata)
    return HloSharding.subgroup(ta, like.subgroup_types, like.metadata)


def subgroup(ta: TileAssignment, types: Sequence[ShardingType]) -> HloSharding:
    return HloSharding.subgroup(ta, tuple(types))


# -- replication -------------------------------------------------------------------------


@lru_cache(maxsize=_CACHE)
def _partial_replicate(s: HloSharding, dims: tuple[int, ...]) -> HloSharding:
    return algebra.partial_replicate(s, dims)


def partial_replicate(s: HloSharding, dims: Iterable[int]) -> HloSharding:
    """PartiallyReplicateTiledShardingOnDims."""
    if not s.is_tiled:
        return s
    return _partial_replicate(s, tuple(int(d) for d in dims))


def partial_replicate_all_except(s: HloSharding, keep: Iterable[int]) -> HloSharding:
    """PartiallyReplicateTiledShardingOnAllDimsExcept."""
    if not s.is_tiled:
        return s
    keep_t = tuple(int(d) for d in keep)
    return partial_replicate(s, [d for d in range(data_rank(s)) if d not in keep_t])


def replicate_all_data_dims(s: HloSharding, rank: int = -1) -> HloSharding:
    """ReplicateAllDataDims: keep manual subgroups, optionally re-rank to ``rank``."""
    if s.is_manual:
        return s
    if not s.subgroup_types:
        return HloSharding.replicate(s.metadata)
    result = partial_replicate_all_except(s, ())
    if rank >= 0 and result.is_tiled and rank != data_rank(result):
        ta = result.tile_assignment
        assert ta is not None
        new_dims = (1,) * rank + ta.dims[data_rank(result):]
        result = HloSharding.subgroup(ta.reshape(new_dims), result.subgroup_types)
    return result


def remove_shape_dims(s: HloSharding, dims: Iterable[int]) -> HloSharding:
    """RemoveShapeDimensions (each removed tile dim must have 1 tile)."""
    dims_t = tuple(dims)
    if s.is_tile_maximal or not dims_t or not s.is_tiled:
        return s
    ta = s.tile_assignment
    assert ta is not None
    new_dims = [d for i, d in enumerate(ta.dims) if i not in dims_t]
    return rebuild(s, ta.reshape(new_dims))


# -- permutations ------------------------------------------------------------------------


@lru_cache(maxsize=_CACHE)
def _transpose(s: HloSharding, perm: tuple[int, ...]) -> HloSharding:
    return algebra.transpose_sharding(s, perm)


def transpose(s: HloSharding, perm: Sequence[int]) -> HloSharding:
    """TransposeSharding (perm over data dims, or over all tile dims)."""
    if not s.is_tiled:
        return s
    return _transpose(s, tuple(int(p) for p in perm))


def transpose_with_collapsed_dims(s: HloSharding, src_to_tgt: Sequence[int],
                                  tgt_to_src: Sequence[int]) -> HloSharding | None:
    """TransposeShardingWithCollapsedDims: transpose, dropping/adding unsharded dims.

    ``-1`` in ``src_to_tgt`` drops a source dim (must have one tile); ``-1`` in
    ``tgt_to_src`` adds a target dim with one tile.  None if a dropped dim is tiled.
    """
    if not s.is_tiled:
        return s
    return _transpose_collapsed(s, tuple(src_to_tgt), tuple(tgt_to_src))


@lru_cache(maxsize=_CACHE)
def _transpose_collapsed(s: HloSharding, src_to_tgt: tuple[int, ...],
                         tgt_to_src: tuple[int, ...]) -> HloSharding | None:
    ta = s.tile_assignment
    assert ta is not None
    if len(src_to_tgt) < ta.ndim:
        extra = ta.ndim - len(src_to_tgt)
        n_src, n_tgt = len(src_to_tgt), len(tgt_to_src)
        src_to_tgt = src_to_tgt + tuple(n_tgt + i for i in range(extra))
        tgt_to_src = tgt_to_src + tuple(n_src + i for i in range(extra))
    nsub = len(s.subgroup_types) if not s.replicate_on_last_tile_dim else 0
    # XLA counts subgroup_types(), which is empty for last_tile_dim_replicate.
    src_data = len(src_to_tgt) - nsub
    tgt_data = len(tgt_to_src) - nsub
    tgt_skipping = [-1] * len(tgt_to_src)
    skipped_tgt = 0
    for i, src in enumerate(tgt_to_src):
        if src < 0:
            skipped_tgt += 1
        else:
            tgt_skipping[i] = i - skipped_tgt
    skipped_src = sum(1 for x in src_to_tgt if x == -1)
    perm = [0] * len(src_to_tgt)
    for i in range(src_data):
        if src_to_tgt[i] < 0:
            if ta.dims[i] > 1:
                return None
            perm[src_data - skipped_src] = i
            skipped_src -= 1
        else:
            perm[tgt_skipping[src_to_tgt[i]]] = i
    skipped_src = sum(1 for x in src_to_tgt if x == -1)
    for i in range(src_data, len(src_to_tgt)):
        perm[src_to_tgt[i] - skipped_tgt + skipped_src] = i
    tgt = transpose(s, perm)
    tta = tgt.tile_assignment
    if tta is None:
        return tgt
    tgt_tiles = [1] * len(tgt_to_src)
    for i in range(len(tgt_tiles)):
        if tgt_to_src[i] >= 0:
            dim = tgt_skipping[i]
            if i >= tgt_data:
                dim += skipped_src
            tgt_tiles[i] = tta.dims[dim]
    return rebuild(s, tta.reshape(tgt_tiles))


@lru_cache(maxsize=_CACHE)
def _reverse(s: HloSharding, dims: tuple[int, ...]) -> HloSharding:
    return algebra.reverse_sharding(s, dims)


def reverse(s: HloSharding, dims: Sequence[int]) -> HloSharding:
    """ReverseSharding."""
    if not s.is_tiled or not dims:
        return s
    return _reverse(s, tuple(int(d) for d in dims))


def propagate_along(s: HloSharding, source_dims: Sequence[int],
                         target_dims: Sequence[int], target_rank: int) -> HloSharding:
    """PropagateShardingAlongDimsAndReplicateOthers: move tiling of source dims to target dims."""
    if not s.is_tiled:
        return s
    return _propagate_along(s, tuple(source_dims), tuple(target_dims), target_rank)


@lru_cache(maxsize=_CACHE)
def _propagate_along(s: HloSharding, source_dims: tuple[int, ...],
                     target_dims: tuple[int, ...], target_rank: int) -> HloSharding:
    rep = partial_replicate_all_except(s, source_dims)
    if rep.is_tile_maximal:
        return rep
    arg_src = sorted(range(len(source_dims)), key=lambda i: source_dims[i])
    arg_tgt = sorted(range(len(target_dims)), key=lambda i: target_dims[i])
    if arg_src != arg_tgt:
        rta = rep.tile_assignment
        assert rta is not None
        perm = [source_dims[arg_tgt[i]] for i in range(len(source_dims))]
        non_source = 0
        for _ in range(len(source_dims), rta.ndim):
            while non_source in source_dims:
                non_source += 1
            perm.append(non_source)
            non_source += 1
        rep = transpose(rep, perm)
    rta = rep.tile_assignment
    assert rta is not None
    sta = s.tile_assignment
    assert sta is not None
    tgt_tiles = [1] * target_rank
    for sd, td in zip(source_dims, target_dims):
        tgt_tiles[td] = sta.dims[sd]
    tgt_tiles.extend(rta.dims[data_rank(rep):])
    return rebuild(rep, rta.reshape(tgt_tiles))


# -- merging -----------------------------------------------------------------------------


def merge_if_compatible(to_merge: HloSharding, dst: HloSharding,
                        minimum_tiles: int | None = None) -> HloSharding | None:
    """MergeShardingIfCompatible: the merged sharding, or None (``dst`` unchanged).

    ``minimum_tiles`` defaults to ``dst``'s tile count + 1, as in XLA.
    """
    if to_merge.is_tuple or dst.is_tuple or to_merge.is_manual or dst.is_manual:
        return None
    if minimum_tiles is None:
        minimum_tiles = dst.num_tiles + 1
    if to_merge.is_tile_maximal:
        return None
    if dst.is_tile_maximal:
        return to_merge
    if not dst.has_partial_replication:
        return None
    return _merge_cached(to_merge, dst, minimum_tiles)


@lru_cache(maxsize=_CACHE)
def _merge_cached(to_merge: HloSharding, dst: HloSharding,
                  minimum_tiles: int) -> HloSharding | None:
    if data_rank(dst) != data_rank(to_merge):
        return None
    if (to_merge.subgroup_manual_dim is None) != (dst.subgroup_manual_dim is None):
        return None
    a, b = tile_dims(to_merge)[:data_rank(dst)], tile_dims(dst)[:data_rank(dst)]
    merged = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            return None
        merged.append(max(x, y))
    ta = to_merge.tile_assignment
    assert ta is not None
    n = ta.num_devices
    tiles = math.prod(merged)
    if n % tiles or tiles < minimum_tiles:
        return None
    result = algebra.merge_compatible(to_merge, dst, minimum_tiles)
    if result is None or result.is_tuple:
        return None
    return result.without_metadata()


def merge_sharding(to_merge: HloSharding, dst: HloSharding,
                   may_combine_partial: bool) -> tuple[bool, HloSharding]:
    """MergeSharding: (accepted, new dst).

    ``dst`` is the candidate, ``to_merge`` the existing sharding: partial shardings
    are combined when allowed; otherwise the candidate is accepted only if it is
    more specific than the existing one.
    """
    if to_merge.is_tuple:
        changed = False
        out = []
        for m, d in zip(to_merge.tuple_elements, dst.tuple_elements):
            c, nd = merge_sharding(m, d, may_combine_partial)
            changed |= c
            out.append(nd)
        return changed, HloSharding.tuple(out)
    if (may_combine_partial and to_merge.has_partial_replication and dst.has_partial_replication
            and to_merge.num_devices == dst.num_devices):
        merged = merge_if_compatible(to_merge, dst,
                                     max(to_merge.num_tiles, dst.num_tiles) + 1)
        if merged is not None:
            return True, merged
    return _leaf_more_specific(dst, to_merge), dst


def find_common_sharding(shardings: Sequence[HloSharding],
                         default: HloSharding | None = None) -> HloSharding:
    """FindCommonSharding: merge all if compatible, else ``default`` or the first."""
    common = shardings[0]
    for s in shardings[1:]:
        if common == s:
            continue
        merged = merge_if_compatible(s, common, common.num_tiles)
        if merged is None:
            return default if default is not None else shardings[0]
        common = merged
    return common


# -- reshape -----------------------------------------------------------------------------


def reshape_sharding(src: Sequence[int], tgt: Sequence[int], s: HloSharding) -> HloSharding | None:
    """ReshapeSharding (XLA's current gcd-based version), or None."""
    if not s.is_tiled:
        return s
    return _reshape_sharding(tuple(src), tuple(tgt), s)


@lru_cache(maxsize=_CACHE)
def _reshape_sharding(src: tuple[int, ...], tgt: tuple[int, ...],
                      s: HloSharding) -> HloSharding | None:
    ta = s.tile_assignment
    assert ta is not None
    target: list[int] = []
    src_stack = list(reversed(src))
    tgt_stack = list(reversed(tgt))
    tile_stack = list(reversed(ta.dims[:len(src)]))
    state = {"index": -1, "inplace": False}
    dims_to_replicate: list[int] = []

    def push(size: int, parts: int) -> None:
        src_stack.append(size)
        tile_stack.append(parts)
        state["index"] -= 1

    def pop() -> None:
        src_stack.pop()
        tile_stack.pop()
        state["index"] += 1

    def append(size: int) -> None:
        if state["inplace"]:
            target[-1] *= size
        else:
            target.append(size)
        state["inplace"] = False

    while src_stack and tgt_stack and math.prod(tile_stack) != 1:
        src_prod = 1
        while tile_stack and tile_stack[-1] == 1:
            src_prod *= src_stack[-1]
            pop()
        while tgt_stack and tgt_stack[-1] > 1 and src_prod % tgt_stack[-1] == 0:
            src_prod //= tgt_stack[-1]
            tgt_stack.pop()
            append(1)
        if src_prod != 1:
            push(src_prod, 1)
        if not src_stack or not tgt_stack:
            break
        s_size, s_parts = src_stack[-1], tile_stack[-1]
        pop()
        t_size = tgt_stack.pop()
        if s_size == t_size:
            append(s_parts)
        elif t_size == 1:
            append(1)
            push(s_size, s_parts)
        elif s_size == 1:
            tgt_stack.append(t_size)
            if s_parts > 1:
                dims_to_replicate.append(state["index"])
        elif s_parts == 1:
            if src_stack and tile_stack[-1] == 1:
                src_stack[-1] *= s_size
            else:
                break
        elif s_size % s_parts:
            return None
        else:
            g = math.gcd(s_parts, t_size)
            if g == 1:
                break
            push(s_size // g, s_parts // g)
            tgt_stack.append(t_size // g)
            append(g)
            state["inplace"] = True
    if math.prod(target) == 1:
        return None
    while len(target) < len(tgt):
        target.append(1)
    sharding = partial_replicate(s, dims_to_replicate) if dims_to_replicate else s
    sta = sharding.tile_assignment
    if sta is None:
        return None
    rep_dim = sharding.subgroup_replication_dim
    for i in range(data_rank(sharding), sta.ndim):
        target.append(1 if i == rep_dim else sta.dims[i])
    types = list(sharding.subgroup_types)
    total = sta.num_devices
    if total % math.prod(target):
        return None
    pr = total // math.prod(target)
    if pr > 1:
        if sharding.replicate_on_last_tile_dim:
            target[-1] = pr
            types.append(REPLICATED)
        elif REPLICATED in types:
            assert rep_dim is not None
            target[rep_dim - data_rank(sharding) + len(tgt)] = pr
        else:
            target.append(pr)
            types.append(REPLICATED)
    if len(target) - len(tgt) != len(types):
        return None
    return HloSharding.subgroup(sta.reshape(target), types)


def propagate_through_reshape(src: Sequence[int], tgt: Sequence[int],
                              s: HloSharding) -> HloSharding:
    """PropagateShardingThroughReshape: best sharding reachable by intervals of dims."""
    if not s.is_tiled:
        return s
    return _propagate_reshape(tuple(src), tuple(tgt), s)


@lru_cache(maxsize=_CACHE)
def _propagate_reshape(src: tuple[int, ...], tgt: tuple[int, ...], s: HloSharding) -> HloSharding:
    if s.is_manual_subgroup:
        return _propagate_reshape_manual_subgroup(src, tgt, s)
    ta = s.tile_assignment
    assert ta is not None
    result = HloSharding.replicate()
    start = 0
    while start < len(src):
        found = False
        for end in range(len(src), start, -1):
            grouped_dims = [1] * len(src)
            grouped_dims[start:end] = ta.dims[start:end]
            grouped = HloSharding._tiled(TileAssignment(grouped_dims))
            reshaped = reshape_sharding(src, tgt, grouped)
            if reshaped is None or reshaped.tile_assignment is None:
                continue
            perm = list(range(start, end)) + list(range(start)) + list(range(end, ta.ndim))
            rdims = list(reshaped.tile_assignment.dims)
            reps = ta.num_devices // math.prod(rdims)
            if len(rdims) == len(tgt):
                rdims.append(reps)
            else:
                rdims[-1] *= reps
            ungrouped = HloSharding.partial_tile(ta.transpose(perm).reshape(rdims))
            merged = merge_if_compatible(ungrouped, result)
            if merged is not None:
                result = merged
                start = end
                found = True
                break
        if not found:
            start += 1
    return result


def _propagate_reshape_manual_subgroup(src: tuple[int, ...], tgt: tuple[int, ...],
                                       s: HloSharding) -> HloSharding:
    """Reshape the data part of a manual-subgroup sharding per manual group (XLA groups on
    the manual dim, propagates the inner sharding and ungroups)."""
    ta = s.tile_assignment
    md = s.subgroup_manual_dim
    assert ta is not None and md is not None
    arr = np.moveaxis(ta.array(), md, 0)
    groups = arr.reshape(arr.shape[0], -1)
    inner_dims = arr.shape[1:]
    inner_ta = TileAssignment(inner_dims)
    rank = data_rank(s)
    if len(inner_dims) > rank:
        inner = HloSharding.partial_tile(inner_ta)
    else:
        inner = (HloSharding._tiled(inner_ta) if math.prod(inner_dims) > 1
                 else HloSharding.replicate())
    res = propagate_through_reshape(src, tgt, inner) if inner.is_tiled else inner
    gsize = groups.shape[1]
    if res.is_tiled:
        rta = res.tile_assignment
        assert rta is not None
        local = rta.array()
        types = list(res.subgroup_types) or ([REPLICATED] if res.replicate_on_last_tile_dim else [])
    else:
        local = np.arange(gsize).reshape((1,) * len(tgt) + ((gsize,) if gsize > 1 else ()))
        types = [REPLICATED] if gsize > 1 else []
    glob = groups[:, local]
    glob = np.moveaxis(glob, 0, len(tgt))
    return HloSharding.subgroup(TileAssignment.from_array(glob).compact(), [MANUAL] + types)


# -- sub-tiling --------------------------------------------------------------------------


def is_subtiling_or_equal(dims: Sequence[int], p: HloSharding, s: HloSharding) -> bool:
    """IsSubTilingOrEqualSharding: every device's tile under ``p`` lies inside its tile
    under ``s`` (XLA's version, including its treatment of padding tiles)."""
    if p.is_manual or s.is_manual:
        return False
    if s.is_tile_maximal:
        return True
    if p.is_tile_maximal:
        return False
    return _subtiling(tuple(dims), p, s)


@lru_cache(maxsize=_CACHE)
def _subtiling(dims: tuple[int, ...], p: HloSharding, s: HloSharding) -> bool:
    r = data_rank(p)
    if r != data_rank(s) or r != len(dims):
        return False
    pta, sta = p.tile_assignment, s.tile_assignment
    assert pta is not None and sta is not None
    pbase, sbase = [], []
    shortcut = True
    reshape_dims = list(pta.dims)
    diff = 0
    for i in range(r):
        d, pt, st = dims[i], pta.dims[i], sta.dims[i]
        if pt < st:
            return False
        pb, sb = -(-d // pt), -(-d // st)
        pbase.append(pb)
        sbase.append(sb)
        if st != 1 and (pt % st or sb % pb or d <= (pt - 1) * pb or d <= (st - 1) * sb):
            shortcut = False
        if shortcut and pt != st:
            reshape_dims[i + diff] = st
            reshape_dims.insert(i + diff + 1, pt // st)
            diff += 1
    if shortcut:
        if not s.has_partial_replication:
            return p == s
        perm = list(range(len(reshape_dims)))
        for i in range(r):
            if pta.dims[i] != sta.dims[i]:
                e = perm[i + 1]
                del perm[i + 1]
                perm.append(e)
        if pta.num_devices != sta.num_devices:
            return False
        cand = HloSharding.partial_tile(pta.reshape(reshape_dims).transpose(perm).reshape(sta.dims))
        return cand.tile_assignment is not None and cand.tile_assignment == sta
    total = max(int(pta.flat().max()), int(sta.flat().max())) + 1
    s_off = np.full((total, r), -1, dtype=np.int64)
    s_coords = np.stack(np.unravel_index(np.arange(sta.num_devices), sta.dims), axis=1)[:, :r]
    s_off[sta.flat()] = s_coords * np.asarray(sbase, dtype=np.int64)
    p_coords = np.stack(np.unravel_index(np.arange(pta.num_devices), pta.dims), axis=1)[:, :r]
    p_off = p_coords * np.asarray(pbase, dtype=np.int64)
    s_rows = s_off[pta.flat()]
    if np.any(s_rows < 0):
        return False
    if np.any(p_off < s_rows):
        return False
    end = p_off + np.asarray(pbase, dtype=np.int64)
    inside = end <= np.asarray(dims, dtype=np.int64)
    beyond = end > s_rows + np.asarray(sbase, dtype=np.int64)
    return not bool(np.any(inside & beyond))


# -- tuples ------------------------------------------------------------------------------


def leaf_count(shape: Shape) -> int:
    """Leaves of a shape as XLA's tuple shardings count them (arrays and tokens)."""
    if not shape.is_tuple:
        return 1
    return sum(leaf_count(s) for s in shape.tuple_shapes)


def required_leaves(shape: Shape) -> int:
    return max(1, leaf_count(shape))


def leaf_range(shape: Shape, index: int) -> tuple[int, int]:
    """[start, end) of tuple element ``index``'s leaves in the flattened sharding."""
    start = sum(leaf_count(s) for s in shape.tuple_shapes[:index])
    return start, start + leaf_count(shape.tuple_shapes[index])


def normalize_tuple(s: HloSharding, shape: Shape) -> HloSharding:
    """NormalizeTupleSharding: a non-tuple sharding on a tuple shape applies to every leaf."""
    if shape.is_tuple and not s.is_tuple:
        return HloSharding.tuple([s] * required_leaves(shape))
    return s


def single_tuple(shape: Shape, s: HloSharding) -> HloSharding:
    """HloSharding::SingleTuple: ``s`` on every leaf (``s`` itself for an array)."""
    if not shape.is_tuple:
        return s
    return HloSharding.tuple([s] * required_leaves(shape))


def sub_sharding(s: HloSharding, shape: Shape, index: int) -> HloSharding:
    """GetSubSharding(shape, {index}) for a (normalised) tuple sharding."""
    if not s.is_tuple:
        return s
    start, end = leaf_range(shape, index)
    sub_shape = shape.tuple_shapes[index]
    if sub_shape.is_tuple:
        return HloSharding.tuple(s.tuple_elements[start:end])
    return s.tuple_elements[start]


def with_sub_sharding(s: HloSharding, shape: Shape, index: int, sub: HloSharding) -> HloSharding:
    """``s`` with tuple element ``index`` replaced by ``sub``."""
    start, end = leaf_range(shape, index)
    leaves = list(s.tuple_elements)
    new = list(sub.tuple_elements) if sub.is_tuple else [sub] * (end - start)
    leaves[start:end] = new
    return HloSharding.tuple(leaves)


def shapes_compatible(a: Shape, b: Shape) -> bool:
    """ShapeUtil::CompatibleIgnoringElementType."""
    if a.is_tuple or b.is_tuple:
        return (a.is_tuple and b.is_tuple and len(a.tuple_shapes) == len(b.tuple_shapes)
                and all(shapes_compatible(x, y) for x, y in zip(a.tuple_shapes, b.tuple_shapes)))
    if a.is_token or b.is_token:
        return a.is_token and b.is_token
    return a.dims == b.dims


def evenly_partitions(shape: Shape, s: HloSharding) -> bool:
    """True if every tiled dim of ``shape`` divides evenly (XLA's output/param check)."""
    if s.is_tuple:
        leaves = [leaf for _, leaf in shape.leaves()] if shape.is_tuple else [shape]
        return all(evenly_partitions(l, e) for l, e in zip(leaves, s.tuple_elements))
    if not s.is_tiled:
        return True
    return all(d % t == 0 for d, t in zip(shape.dims, s.tile_dims_for_data()))

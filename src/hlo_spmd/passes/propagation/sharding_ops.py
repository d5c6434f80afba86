"""Sharding operations only propagation needs (hlo_sharding_util.cc semantics).

The sharding algebra itself (partial replication, transpose, reverse, reshape and
PropagateShardingThroughReshape, merging, IsShardingMoreSpecific, sub-tiling) lives in
``hlo_spmd.sharding.algebra`` and is used from there; this module adds what is specific
to propagating over HLO:

* ``strictly_better`` (IsShardingStrictlyBetter), ``find_common_sharding``;
* ``transpose_with_collapsed_dims``, ``remove_shape_dims``, ``propagate_along``
  (PropagateShardingAlongDimsAndReplicateOthers);
* tuple helpers on IR shapes (sub-shardings by shape index, single-sharding tuples).

Every function is pure and deterministic; the expensive ones are memoised on their
(hashable) arguments because a module reuses a handful of shardings many times.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Iterable, Sequence

from hlo_spmd.ir.shape import Shape
from hlo_spmd.memo import BoundedMemo
from hlo_spmd.sharding import (HloSharding, merge_if_compatible, partial_replicate_all_except,
                               transpose_sharding, with_tile_assignment)
from hlo_spmd.sharding.common import memoised

_CACHE = 65536

# -- predicates ------------------------------------------------------------------------


def is_tiled(s: HloSharding) -> bool:
    """XLA's IsTiled: has a tile assignment (not maximal, manual or unknown)."""
    return (not s.is_tuple) and s.is_tiled


def tile_dims(s: HloSharding) -> tuple[int, ...]:
    ta = s.tile_assignment
    return ta.dims if ta is not None else ()


def data_rank(s: HloSharding) -> int:
    r = s.tiled_data_rank
    return -1 if r is None else r


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


# -- dims ------------------------------------------------------------------------------


def remove_shape_dims(s: HloSharding, dims: Iterable[int]) -> HloSharding:
    """RemoveShapeDimensions (each removed tile dim must have 1 tile)."""
    dims_t = tuple(dims)
    if s.is_tile_maximal or not dims_t or not s.is_tiled:
        return s
    return _remove_tile_dims(s, dims_t)


@memoised
def _remove_tile_dims(s: HloSharding, dims_t: tuple[int, ...]) -> HloSharding:
    # (memoised: the same candidate object for the same inputs, so the propagator's
    # identity-keyed verdicts and skip memo see the repeated layers as repeats)
    ta = s.tile_assignment
    assert ta is not None
    new_dims = [d for i, d in enumerate(ta.dims) if i not in dims_t]
    return with_tile_assignment(s, ta.reshape(new_dims))


# -- permutations ------------------------------------------------------------------------


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
    tgt = transpose_sharding(s, perm)
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
    return with_tile_assignment(s, tta.reshape(tgt_tiles))


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
        rep = transpose_sharding(rep, perm)
    rta = rep.tile_assignment
    assert rta is not None
    sta = s.tile_assignment
    assert sta is not None
    tgt_tiles = [1] * target_rank
    for sd, td in zip(source_dims, target_dims):
        tgt_tiles[td] = sta.dims[sd]
    tgt_tiles.extend(rta.dims[data_rank(rep):])
    return with_tile_assignment(rep, rta.reshape(tgt_tiles))


# -- merging -----------------------------------------------------------------------------


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


# -- tuples ------------------------------------------------------------------------------


def leaf_count(shape: Shape) -> int:
    """Leaves of a shape as XLA's tuple shardings count them (arrays and tokens)."""
    if not shape.is_tuple:
        return 1
    return sum(leaf_count(s) for s in shape.tuple_shapes)


def required_leaves(shape: Shape) -> int:
    return max(1, leaf_count(shape))


# Leaf offsets per tuple shape, keyed by identity (shapes are immutable; the entry keeps
# the shape alive so its id cannot be reused): a wide tuple (a training step's root has
# hundreds of elements) would otherwise be re-counted for every element it is asked about.
_OFFSETS = BoundedMemo(4096)  # id(shape) -> (shape, offsets)


def _leaf_offsets(shape: Shape) -> tuple[int, ...]:
    hit = _OFFSETS.get(id(shape))
    if hit is not None and hit[0] is shape:
        return hit[1]
    offsets = [0]
    for sub in shape.tuple_shapes:
        offsets.append(offsets[-1] + leaf_count(sub))
    return _OFFSETS.put(id(shape), (shape, tuple(offsets)))[1]


def leaf_range(shape: Shape, index: int) -> tuple[int, int]:
    """[start, end) of tuple element ``index``'s leaves in the flattened sharding."""
    offsets = _leaf_offsets(shape)
    return offsets[index], offsets[index + 1]


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
    if a is b:   # (a shape is compatible with itself)
        return True
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

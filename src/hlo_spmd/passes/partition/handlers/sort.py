"""sort and top-k (opcode ``topk`` and the ``TopK`` custom-call).

Along an unsharded dim both run per tile with no communication. Otherwise the handler
lists its candidates with their prices in the one cost model (strategy.py: reshards from
``reshard_price`` / ``reshard_cost``, collectives from collectives/cost.py, plus the
largest new array), picks the cheapest and emits only that one:

* per tile in a layout that leaves the sort dim whole: the result's or (top-k) the
  operand's -- a batch-partitioned top-k runs on its row block and only the small
  [rows, k] results move;
* with the sort dim's tiling moved onto another dim by an all-to-all, sorted locally,
  resharded back -- XLA's approach in ``SpmdPartitioningVisitor::HandleSort``;
* top-k over the operand's tiled last dim: a local top-k of every shard (padding masked
  to the losing extreme), its indices shifted to global positions, an all-gather of the k
  candidates per shard, and a final stable sort of the gathered candidates cut to k -- the
  two-stage TopK of XLA's spmd_partitioner;
* a sort read only through slices ``[0:k]`` of its sort dim (a top-k written as sort of
  (values, iota) and a slice, as XLA's frontends emit it) over a tiled sort dim: a local
  sort of every shard cut to k, an all-gather of the k candidates per shard, and a sort of
  the gathered candidates cut to k again (any comparator: the candidates keep the global
  order of positions, so stable ties resolve as in the whole sort) -- XLA's
  ``PartitionSortInTopK``. The slices' values are made here (``ModuleState.settled``); the
  full sort never exists;
* the replicated fallback (reported when it is the one emitted; a rank-1 sort has no
  other dim).

An output nobody reads (the indices of a top-k whose users take only the values) is
neither moved nor, where the plan allows, computed: it stays in the layout it is made in,
and the two-stage top-k then gathers and re-ranks the values alone.

Ties keep the lower global index first: candidates arrive in shard (= index) order, each
shard's in top-k order, and the final sort is stable.
"""
from __future__ import annotations

import math

import numpy as np

from hlo_spmd.collectives.cost import bytes_per_device
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.ir.shape import Shape
from hlo_spmd.passes.partition.causes import with_cause
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.handlers.basic import handle_replicated
from hlo_spmd.passes.partition.handlers.slicing import compute_sharding, keep_only_tiled
from hlo_spmd.passes.partition.support.local_dims import _common_leaf, _local, _sharded_dims
from hlo_spmd.passes.partition.masking import (mask_padding, pad_value_identity, padded_dims,
                                               valid_mask)
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import handles, handles_custom_call
from hlo_spmd.passes.partition.reshard import gather_groups, reshard, reshard_cost
from hlo_spmd.passes.partition.support.strategy import (Strategy, cheapest, itemsize, local_bytes,
                                                moves, replicated_price, result_leaves,
                                                result_move)
from hlo_spmd.sharding import HloSharding, device_offsets, partial_replicate, tile_shape


def _plain_tiled(s: HloSharding) -> bool:
    return s.is_tiled and not s.subgroup_types and not s.is_manual and not s.is_tuple


def moved_sharding(s: HloSharding, src: int, dst: int) -> HloSharding:
    """``s`` with the tiling of data dim ``src`` moved onto data dim ``dst`` (merged as
    the minor part of ``dst``'s tiling when ``dst`` is already tiled); same devices, so
    the move is one all-to-all."""
    arr = s.tile_assignment.array()
    order = [a for a in range(arr.ndim) if a != src]
    order.insert(order.index(dst) + 1, src)
    moved = np.transpose(arr, order)
    sizes = [arr.shape[a] for a in order]
    at = order.index(dst)
    sizes[at:at + 2] = [sizes[at] * sizes[at + 1]]
    moved = np.expand_dims(moved.reshape(sizes), src)
    return HloSharding.partial_tile(moved) if s.replicate_on_last_tile_dim \
        else HloSharding.tile(moved)


def _free_dims(s: HloSharding, shape: Shape, busy: int) -> list[int]:
    """Dims that can take ``busy``'s tiling: the unsharded ones if any, else every other
    dim with room for the extra tiles."""
    tiles = s.tile_dims_for_data(shape.rank)
    others = [e for e in range(shape.rank) if e != busy and shape.dims[e] > 1]
    free = [e for e in others if tiles[e] == 1]
    if free:
        return free
    return [e for e in others if shape.dims[e] >= tiles[e] * tiles[busy]]


def _normalized(inst: Instruction, leaf: HloSharding) -> HloSharding:
    return HloSharding.tuple([leaf] * len(inst.shape.tuple_shapes)) if inst.shape.is_tuple \
        else leaf


def _computable(s: HloSharding) -> bool:
    """A sharding the op can run in per tile (its operands resharded to it)."""
    return s.is_tiled and not s.is_manual and not s.subgroup_types or s.is_replicated


def unused_outputs(ctx: PartitionContext, inst: Instruction) -> frozenset[int]:
    """Result indices of a tuple-shaped ``inst`` that nothing reads: every user is a
    get-tuple-element of another index (none when ``inst`` is a root or an array)."""
    if not inst.shape.is_tuple:
        return frozenset()
    read: set[int] = set()
    for u in ctx.state.users().get(id(inst), []):
        if u is None or u.opcode != "get-tuple-element":
            return frozenset()
        read.add(int(u.attrs.tuple_index))
    return frozenset(range(len(inst.shape.tuple_shapes))) - read


def _wanted_for(wanted: HloSharding, c: HloSharding, dead: frozenset[int]) -> HloSharding:
    """``wanted`` with every unused result leaf left in ``c``, the layout it is made in
    (an unread value is never moved)."""
    if not dead or not wanted.is_tuple:
        return wanted
    return HloSharding.tuple([c if i in dead else l
                              for i, l in enumerate(wanted.tuple_elements)])


def _price_local(ctx: PartitionContext, inst: Instruction, arrays: int, c: HloSharding,
                 wanted: HloSharding) -> tuple[float, float]:
    """(bytes, largest new array) of running the op per tile of ``c``: the array operands
    resharded to ``c``, the local op, its results resharded to ``wanted``."""
    nbytes, peak = moves(ctx, [(ctx.value(o), c) for o in inst.operands[:arrays]])
    for shape, leaf in result_leaves(ctx, inst.shape, wanted):
        b, p = result_move(ctx, shape, c, leaf)
        nbytes, peak = nbytes + b, max(peak, p, local_bytes(shape, c))
    return nbytes, peak


def _emit_local(ctx: PartitionContext, inst: Instruction, arrays: int, c: HloSharding,
                wanted: HloSharding) -> PValue:
    """The op per tile of ``c``, resharded to ``wanted``."""
    return reshard(ctx, _local(ctx, inst, arrays, c), wanted)


def _local_strategies(ctx: PartitionContext, inst: Instruction, arrays: int, dim: int,
                      layouts: list[HloSharding], wanted: HloSharding,
                      dead: frozenset[int] = frozenset()) -> list[Strategy]:
    """Running the op per tile: in each of ``layouts`` whose ``dim`` is whole, and in each
    with ``dim``'s tiling moved to another dim (one all-to-all there and back, XLA's
    ``HandleSort``). Results in ``dead`` stay where they are made."""
    shape = inst.operands[0].shape
    comps: list[HloSharding] = []
    for s in layouts:
        if dim not in _sharded_dims(s):
            comps.append(s)
        elif _plain_tiled(s):
            comps += [moved_sharding(s, dim, e) for e in _free_dims(s, shape, dim)]
    out: list[Strategy] = []
    for c in comps:
        if not _computable(c) or c.is_replicated or any(c == o.grid for o in out):
            continue
        w = _wanted_for(wanted, c, dead)
        out.append(Strategy(c, *_price_local(ctx, inst, arrays, c, w),
                            lambda c=c, w=w: _emit_local(ctx, inst, arrays, c, w)))
    return out


def _plan_and_emit(ctx: PartitionContext, inst: Instruction, cands: list[Strategy],
                   fallback_extra: float = 0.0) -> PValue | None:
    """Emit the cheapest of ``cands`` unless the replicated fallback (priced the same
    way plus ``fallback_extra``, reported when it is the one emitted) is strictly
    cheaper. None: the winner settled every user itself."""
    best = cheapest(cands)
    vals = [ctx.value(o) for o in inst.operands]
    # (unread results of the fallback are cut from the whole result for free)
    nbytes, peak = replicated_price(ctx, inst.shape, vals, ctx.sharding_of(inst))
    fallback = Strategy(None, nbytes + fallback_extra, peak,
                        lambda: handle_replicated(ctx, inst))
    if best is None or fallback.key() < best.key():
        return fallback.emit()
    return best.emit()


def _first_k_takes(ctx: PartitionContext, inst: Instruction,
                   dim: int) -> tuple[list[tuple[Instruction, int, int]], list[Instruction]] | None:
    """When the sort is read only through slices ``[0:k]`` of ``dim`` (start 0, stride 1,
    every other dim whole), directly or through get-tuple-elements: ([(slice, result
    index, k)], the get-tuple-elements between), else None."""
    users = ctx.state.users()
    dims = inst.operands[0].shape.dims

    def first_k(sl: Instruction | None) -> int | None:
        if sl is None or sl.opcode != "slice":
            return None
        sd = sl.attrs.slice_dimensions
        if any(d.start != 0 or d.stride != 1 for d in sd):
            return None
        if any(d.limit != dims[e] for e, d in enumerate(sd) if e != dim):
            return None
        return int(sd[dim].limit)

    takes: list[tuple[Instruction, int, int]] = []
    gtes: list[Instruction] = []
    if inst.shape.is_tuple:
        readers = [(g, int(g.attrs.tuple_index)) if g is not None
                   and g.opcode == "get-tuple-element" else (None, -1)
                   for g in users.get(id(inst), [])]
        if any(g is None for g, _ in readers):
            return None
        for g, j in readers:
            gtes.append(g)
            for sl in users.get(id(g), []):
                k = first_k(sl)
                if k is None:
                    return None
                takes.append((sl, j, k))
    else:
        for sl in users.get(id(inst), []):
            k = first_k(sl)
            if k is None:
                return None
            takes.append((sl, 0, k))
    return (takes, gtes) if takes else None


def _first_k_price(ctx: PartitionContext, inst: Instruction, leaf: HloSharding, dim: int,
                   takes: list[tuple[Instruction, int, int]]) -> tuple[float, float] | None:
    """(bytes, largest new array) of ``_first_k_sort``; None when a shard holds fewer
    than k elements."""
    shape = inst.operands[0].shape
    t = leaf.tile_dims_for_data(shape.rank)[dim]
    k = max(k for _, _, k in takes)
    local = tile_shape(leaf, shape.dims)
    if local[dim] < k:
        return None
    rows = float(math.prod(local)) / local[dim]
    nbytes, peak = moves(ctx, [(ctx.value(o), leaf) for o in inst.operands])
    sizes = [itemsize(o.shape) for o in inst.operands]
    if shape.dims[dim] % t:  # padding: a validity flag travels with the candidates
        sizes.append(1.0)
    for size in sizes:
        gathered = rows * k * t * size
        nbytes += bytes_per_device("all-gather", gathered / t, gathered, t)
        peak = max(peak, gathered)
    mid = partial_replicate(leaf, [dim])
    for sl, _, _ in takes:
        b, p = result_move(ctx, sl.shape, mid, compute_sharding(ctx, sl))
        nbytes, peak = nbytes + b, max(peak, p)
    return nbytes, peak


@with_cause("reduction")
def _first_k_sort(ctx: PartitionContext, inst: Instruction, leaf: HloSharding, dim: int,
                  takes: list[tuple[Instruction, int, int]],
                  gtes: list[Instruction]) -> None:
    """The two-stage sort of the module docstring; settles the slices (and the
    get-tuple-elements, which have no value of their own). A sort dim that does not
    split evenly sorts a validity flag along (``valid_first_comparator``): no value is
    known to lose under an arbitrary comparator, so padding is ranked last by the flag."""
    b = ctx.b
    k = max(k for _, _, k in takes)
    ops = [ctx.operand(inst, i, leaf) for i in range(len(inst.operands))]
    cmp = ctx.clone(inst.called_computations[0])
    stable = bool(inst.attrs.is_stable)
    if padded_dims(PValue(ops[0], inst.operands[0].shape, leaf), [dim]):
        ops.append(valid_mask(ctx, PValue(ops[0], inst.operands[0].shape, leaf), [dim]))
        cmp = b.valid_first_comparator(cmp)
    n = len(ops)

    def sorted_first_k(xs: list[Instruction]) -> list[Instruction]:
        both = b.sort(xs, dim, cmp, is_stable=stable)
        out = [b.get_tuple_element(both, i) for i in range(n)] if n > 1 else [both]
        return [b.slice(x, [0] * x.shape.rank,
                        [k if e == dim else d for e, d in enumerate(x.shape.dims)])
                for x in out]

    groups = gather_groups(leaf, dim)
    cands = [ctx.f.all_gather(x, dim, groups) for x in sorted_first_k(ops)]
    best = sorted_first_k(cands)
    mid = partial_replicate(leaf, [dim])
    for sl, j, kj in takes:
        x = best[j]
        if kj < k:
            x = b.slice(x, [0] * x.shape.rank,
                        [kj if e == dim else d for e, d in enumerate(x.shape.dims)])
        ctx.state.settled[id(sl)] = reshard(ctx, PValue(x, sl.shape, mid),
                                            compute_sharding(ctx, sl))
    for g in gtes:
        ctx.state.settled[id(g)] = None


@handles("sort")
def handle_sort(ctx: PartitionContext, inst: Instruction) -> PValue | None:
    arrays = len(inst.operands)
    leaf = _common_leaf(ctx, inst, arrays)
    if leaf is None:
        return handle_replicated(ctx, inst)
    dim = inst.dimensions[0]
    if dim not in _sharded_dims(leaf):
        return _local(ctx, inst, arrays, leaf)
    if not _plain_tiled(leaf):
        return handle_replicated(ctx, inst)
    wanted = _normalized(inst, leaf)
    cands: list[Strategy] = []
    found = _first_k_takes(ctx, inst, dim)
    then = 0.0
    if found is not None:
        takes, gtes = found
        price = _first_k_price(ctx, inst, leaf, dim, takes)
        if price is not None:
            cands.append(Strategy("first-k", *price,
                                  lambda: _first_k_sort(ctx, inst, leaf, dim, takes, gtes)))
            then = _slices_after_price(ctx, inst, leaf, takes)
    others = _local_strategies(ctx, inst, arrays, dim, [leaf], wanted, unused_outputs(ctx, inst))
    for c in others:  # (the first-k plan makes the slices too: same work on both sides)
        c.bytes += then
    return _plan_and_emit(ctx, inst, cands + others, then)


def _slices_after_price(ctx: PartitionContext, inst: Instruction, leaf: HloSharding,
                        takes: list[tuple[Instruction, int, int]]) -> float:
    """Bytes the slices of ``takes`` move after a whole sort left in ``leaf``: each
    reshards its operand to the layout the slice handler reads windows from (the
    windows themselves not counted: a lower bound)."""
    full = inst.operands[0].shape
    total = 0.0
    for sl, j, _ in takes:
        shape = inst.operands[j].shape
        xs = keep_only_tiled(compute_sharding(ctx, sl), leaf, full.rank, range(full.rank))
        total += reshard_cost(shape.dims, itemsize(shape), leaf, xs, ctx.num_devices)
    return total


def _k_largest(inst: Instruction) -> tuple[int, bool]:
    """(k, largest) of a ``topk`` op or a ``TopK`` custom-call (k from its result; the
    custom-call always selects the largest)."""
    if inst.opcode == "topk":
        return int(inst.attrs.k), bool(inst.attrs.largest)
    return int(inst.shape.tuple_shapes[0].dims[-1]), True


def _two_stage_price(ctx: PartitionContext, inst: Instruction, src: HloSharding,
                     wanted: HloSharding, values_only: bool) -> tuple[float, float] | None:
    """(bytes, largest new array) of ``_two_stage_topk``; None when a shard holds fewer
    than k elements."""
    op = inst.operands[0]
    last = op.shape.rank - 1
    k, _ = _k_largest(inst)
    local = tile_shape(src, op.shape.dims)
    if local[last] < k:
        return None
    t = src.tile_dims_for_data(op.shape.rank)[last]
    rows = float(math.prod(local[:last]))
    nbytes, peak = 0.0, 0.0
    if op.shape.dims[last] % t:  # the padding is masked: a new local operand
        peak = local_bytes(op.shape, src)
    mid = partial_replicate(src, [last])
    for shape, leaf in result_leaves(ctx, inst.shape, wanted)[:1 if values_only else 2]:
        gathered = rows * k * t * itemsize(shape)
        nbytes += bytes_per_device("all-gather", gathered / t, gathered, t)
        b, p = result_move(ctx, shape, mid, leaf)
        nbytes, peak = nbytes + b, max(peak, gathered, p)
    return nbytes, peak


@with_cause("reduction")
def _two_stage_topk(ctx: PartitionContext, inst: Instruction, src: HloSharding,
                    wanted: HloSharding, values_only: bool) -> PValue | None:
    """With ``values_only`` (nothing reads the indices) the values alone are gathered and
    ranked again, and the get-tuple-elements reading them are settled: the top-k values
    do not depend on which of equal values wins."""
    b = ctx.b
    op = inst.operands[0]
    last = op.shape.rank - 1
    k, largest = _k_largest(inst)
    pv = ctx.value(op)
    x = pv.hlo
    et = x.shape.element_type
    # Padding must never win: fill it with the extreme that loses.
    x = mask_padding(ctx, pv, [last], pad_value_identity("maximum" if largest else "minimum", et))
    local = b.top_k(x, k, largest)
    vals = b.get_tuple_element(local, 0)
    groups = gather_groups(src, last)
    res = partial_replicate(src, [last])
    if values_only:
        best = b.get_tuple_element(b.top_k(ctx.f.all_gather(vals, last, groups), k, largest), 0)
        out = reshard(ctx, PValue(best, inst.shape.tuple_shapes[0], res),
                      wanted.tuple_elements[0])
        for g in ctx.state.users()[id(inst)]:
            ctx.state.settled[id(g)] = out
        return None
    idx = b.get_tuple_element(local, 1)
    table = device_offsets(src, op.shape.dims, num_devices=ctx.num_devices)[:, last]
    off = ctx.logical_table(table)
    idx = b.add(idx, b.broadcast(off, list(idx.shape.dims), []))
    vals = ctx.f.all_gather(vals, last, groups)
    idx = ctx.f.all_gather(idx, last, groups)
    cmp = b.comparator_computation("GT" if largest else "LT", [et, PrimitiveType.S32])
    both = b.sort([vals, idx], last, cmp, is_stable=True)
    dims = list(vals.shape.dims)
    hi = dims[:last] + [k]
    out = [b.slice(b.get_tuple_element(both, i), [0] * len(dims), hi, [1] * len(dims))
           for i in range(2)]
    y = b.tuple(out, name=inst.name)
    return reshard(ctx, PValue(y, inst.shape, HloSharding.tuple([res, res])), wanted)


@handles_custom_call("TopK")
@handles("topk")
def handle_topk(ctx: PartitionContext, inst: Instruction) -> PValue | None:
    """``topk`` and the ``TopK`` custom-call (same meaning: top k of the last dim, values
    and s32 indices). Candidates, priced before one is emitted: per tile in the result's
    layout or the operand's (when they leave the last dim whole; the other for free
    otherwise), with a tiled last dim moved elsewhere, the two-stage top-k over the
    operand's tiled last dim, and the replicated fallback."""
    if inst.opcode == "custom-call" and not (
            len(inst.operands) == 1 and inst.shape.is_tuple
            and len(inst.shape.tuple_shapes) == 2 and inst.operands[0].shape.rank >= 1):
        return handle_replicated(ctx, inst)
    full = ctx.sharding_of(inst)
    leaves = list(full.tuple_elements) if full.is_tuple else [full] * 2
    if any(l.is_manual for l in leaves):
        return handle_replicated(ctx, inst)
    # Values and indices may want different layouts: both are computed in one, and each
    # is resharded to its own.
    leaf = leaves[0] if not leaves[0].is_maximal else leaves[1]
    wanted = HloSharding.tuple(leaves)
    op = inst.operands[0]
    last = op.shape.rank - 1
    src = ctx.value(op).sharding
    cands = []
    if src == leaf and leaves[0] == leaves[1] and last not in _sharded_dims(leaf):
        return _local(ctx, inst, 1, leaf)
    dead = unused_outputs(ctx, inst)
    values_only = dead == frozenset({1})
    if _plain_tiled(src) and last in _sharded_dims(src):
        price = _two_stage_price(ctx, inst, src, wanted, values_only)
        if price is not None:
            cands.append(Strategy("two-stage", *price,
                                  lambda: _two_stage_topk(ctx, inst, src, wanted, values_only)))
    layouts = [l for l in leaves if not l.is_maximal] + (
        [src] if _computable(src) and not src.is_replicated else [])
    cands += _local_strategies(ctx, inst, 1, last, layouts, wanted, dead)
    return _plan_and_emit(ctx, inst, cands)

"""Shape ops: broadcast, reshape, transpose, iota, dynamic-slice, dynamic-update-slice
(slice, pad, concatenate and reverse live in ``slicing``).

Each handler picks the operand sharding under which the op is local (the result's
sharding pulled back through the op), reshards the operand to it and applies the op to
local shapes; where no such sharding exists it reshards through a correct fallback.
"""
from __future__ import annotations

import math

import numpy as np

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.primitive_types import PrimitiveType, element_bytes
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.handlers.slicing import (
    _fallback, _has_empty, compute_sharding, device_scalar, dynamic_slice_whole_layout,
    position_mask, scalar_starts, tiles_of, tile_index_table)
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.recreate import (  # noqa: F401  (re-exported)
    broadcast_operand_sharding, local_iota, with_kind_of as remake)
from hlo_spmd.passes.partition.registry import handles
from hlo_spmd.passes.partition.support.strategy import Strategy, moves, result_move
from hlo_spmd.sharding import (HloSharding, ShardingType, partial_replicate,
                               partial_replicate_all_except,
                               reshape_sharding, tile_shape,
                               transpose_sharding)
from hlo_spmd.sharding.common import memoised

S32 = PrimitiveType.S32
REPLICATED = HloSharding.replicate()


# -- broadcast ------------------------------------------------------------------------------
@handles("broadcast")
def handle_broadcast(ctx: PartitionContext, inst: Instruction) -> PValue:
    target = compute_sharding(ctx, inst)
    operand = inst.operands[0]
    op_sharding = broadcast_operand_sharding(target, inst.dimensions, operand.shape.dims,
                                             inst.shape.dims)
    x = ctx.reshard(ctx.value(operand), op_sharding).hlo
    local = ctx.local_shape(inst.shape, target)
    return PValue(ctx.emit_like(inst, [x], local), inst.shape, target)


# -- transpose ------------------------------------------------------------------------------
@handles("transpose")
def handle_transpose(ctx: PartitionContext, inst: Instruction) -> PValue:
    target = compute_sharding(ctx, inst)
    perm = inst.dimensions
    # The inverse permutation (a tiny list: numpy's argsort costs more than the sort).
    inverse = sorted(range(len(perm)), key=perm.__getitem__)
    op_sharding = transpose_sharding(target, inverse) if target.is_tiled else target
    x = ctx.reshard(ctx.value(inst.operands[0]), op_sharding).hlo
    local = ctx.local_shape(inst.shape, target)
    return PValue(ctx.emit_like(inst, [x], local), inst.shape, target)


# -- reshape --------------------------------------------------------------------------------
@memoised
def _maps_exactly(s_in: HloSharding, in_dims, out_dims, s_out: HloSharding) -> bool:
    """A local reshape of ``s_in``'s tiles gives ``s_out``'s tiles. Manual subgroups
    qualify too: a reshape never moves data between manual groups, so when the data dims
    map exactly (``mapped == s_out`` compares the manual dims as well) each group's tile
    reshapes on its own."""
    if not (s_in.is_tiled or s_in.is_replicated):
        return False
    if s_in.is_tiled and any(d == 1 and t > 1 for d, t in zip(in_dims,
                                                             s_in.tile_dims_for_data())):
        # reshape_sharding replicates a tiled size-1 dim: the result would claim data
        # that the devices holding its empty shards do not have.
        return False
    try:
        mapped = reshape_sharding(s_in, in_dims, out_dims)
    except Exception:
        return False
    if mapped is None or mapped != s_out:
        return False
    local_in = tile_shape(s_in, in_dims) if s_in.is_tiled else tuple(in_dims)
    local_out = tile_shape(s_out, out_dims) if s_out.is_tiled else tuple(out_dims)
    return math.prod(local_in) == math.prod(local_out)


@handles("reshape")
def handle_reshape(ctx: PartitionContext, inst: Instruction) -> PValue:
    target = compute_sharding(ctx, inst)
    operand = inst.operands[0]
    in_dims, out_dims = operand.shape.dims, inst.shape.dims
    pv = ctx.value(operand)
    b = ctx.b
    if not target.is_tiled:
        x = ctx.reshard(pv, REPLICATED).hlo
        return PValue(b.reshape(x, out_dims, name=inst.name), inst.shape, REPLICATED)
    # 1. The operand sharding whose tiles reshape into the result's tiles.
    back = None
    try:
        back = reshape_sharding(target, out_dims, in_dims)
    except Exception:
        back = None
    if back is not None and _maps_exactly(back, in_dims, out_dims, target):
        x = ctx.reshard(pv, back).hlo
        local = tile_shape(target, out_dims)
        return PValue(b.reshape(x, local, name=inst.name), inst.shape, target)
    # 2. Reshape in the operand's own sharding (when it maps), then reshard the result.
    if pv.sharding.is_tiled:
        try:
            fwd = reshape_sharding(pv.sharding, in_dims, out_dims)
        except Exception:
            fwd = None
        if fwd is not None and fwd.is_tiled and _maps_exactly(pv.sharding, in_dims, out_dims,
                                                              fwd):
            y = b.reshape(pv.hlo, tile_shape(fwd, out_dims), name=inst.name)
            return ctx.reshard(PValue(y, inst.shape, fwd), target)
    # 2b. The operand's tiling kept on the major dims of its reshape groups only (the
    # minor ones gathered), when that maps; the result then reshards from there.
    out = _reshape_major_dims_only(ctx, inst, pv, target)
    if out is not None:
        return out
    # 3. Uneven merges / splits: reshape the local tiles, then exchange halos.
    out = _reshape_with_halos(ctx, inst, pv, target)
    if out is not None:
        return out
    # 4. Whole operand, reshape, cut this device's tile (correct for any pair).
    x = ctx.reshard(pv, REPLICATED).hlo
    y = b.reshape(x, out_dims, name=inst.name)
    return ctx.reshard(PValue(y, inst.shape, REPLICATED), target)


def _reshape_groups(in_dims, out_dims) -> list[tuple[list[int], list[int]]] | None:
    """The dims of a reshape in minimal groups of equal element counts: (input dims,
    output dims) in order (a trailing size-1 dim may form a group with nothing on the
    other side); None for zero-sized shapes."""
    if 0 in in_dims or 0 in out_dims:
        return None
    n_in, n_out = len(in_dims), len(out_dims)
    groups = []
    i = j = 0
    while i < n_in or j < n_out:
        gi, gj = [], []
        pi = pj = 1
        if i < n_in:
            gi.append(i)
            pi *= int(in_dims[i])
            i += 1
        if j < n_out:
            gj.append(j)
            pj *= int(out_dims[j])
            j += 1
        while pi != pj:
            if pi < pj and i < n_in:
                gi.append(i)
                pi *= int(in_dims[i])
                i += 1
            elif pj < pi and j < n_out:
                gj.append(j)
                pj *= int(out_dims[j])
                j += 1
            else:
                return None
        groups.append((gi, gj))
    return groups


def _reshape_major_dims_only(ctx: PartitionContext, inst: Instruction, pv: PValue,
                             target: HloSharding) -> PValue | None:
    from hlo_spmd.passes.partition.reshard import reshard_cost, reshard_price

    src = pv.sharding
    in_dims, out_dims = inst.operands[0].shape.dims, inst.shape.dims
    groups = _reshape_groups(in_dims, out_dims)
    if groups is None or not src.is_tiled or src.subgroup_types and any(
            t != ShardingType.REPLICATED for t in src.subgroup_types):
        return None
    major = [next((i for i in gi if int(in_dims[i]) > 1), None) for gi, _ in groups]
    keep = [i for i in major if i is not None]
    if all(t == 1 for k, t in enumerate(src.tile_dims_for_data()) if k not in keep):
        return None  # nothing to strip: step 2 already tried this sharding
    kept = partial_replicate_all_except(src, keep)
    try:
        fwd = reshape_sharding(kept, in_dims, out_dims) if kept.is_tiled else None
    except Exception:
        fwd = None
    if fwd is None or not fwd.is_tiled or not _maps_exactly(kept, in_dims, out_dims, fwd):
        return None
    itemsize = element_bytes(pv.base_shape.element_type)
    cost = reshard_price(ctx, pv, kept)[0] + reshard_cost(out_dims, itemsize, fwd, target,
                                                          ctx.num_devices)
    if cost >= reshard_price(ctx, pv, REPLICATED)[0]:
        return None
    x = ctx.reshard(pv, kept).hlo
    y = ctx.b.reshape(x, tile_shape(fwd, out_dims), name=inst.name)
    return ctx.reshard(PValue(y, inst.shape, fwd), target)


def _halo_reshape_plan(target: HloSharding, in_dims, out_dims):
    """When every group of the reshape is tiled (if at all) on its major output dim only,
    t ways: (the operand sharding tiling the group's major input dim the same t ways,
    windows cut on input dims before the local reshape, windows cut on output dims after
    it); else None. A window is (dim, local size there, window size, window stride).

    An operand tile is a contiguous run of the group's elements, so when its elements
    fill whole result rows (merging: [7,10] -> [14,5] split 2 ways, a tile of 4 input
    rows is 8 result rows) it reshapes locally into a run of the result dim that a halo
    exchange then cuts each result tile from; when a result tile is whole operand rows
    (splitting: [14] -> [2,7] split 4 ways, a tile of 1 x 7 is 7 input rows) the halo
    exchange cuts it on the operand first."""
    groups = _reshape_groups(in_dims, out_dims)
    if groups is None or not target.is_tiled:
        return None
    if any(t != ShardingType.REPLICATED for t in target.subgroup_types):
        return None
    tt = target.tile_dims_for_data()
    in_tiles = [1] * len(in_dims)
    pre, post = [], []
    for gi, gj in groups:
        tiled = [j for j in gj if tt[j] > 1]
        if not tiled:
            continue
        bo = next((j for j in gj if int(out_dims[j]) > 1), None)
        ai = next((i for i in gi if int(in_dims[i]) > 1), None)
        if bo is None or ai is None or tiled != [bo]:
            return None
        t = tt[bo]
        la = -(-int(in_dims[ai]) // t)
        lb = -(-int(out_dims[bo]) // t)
        m_in = math.prod(int(in_dims[i]) for i in gi if i > ai)
        m_out = math.prod(int(out_dims[j]) for j in gj if j > bo)
        in_tiles[ai] = t
        if (la * m_in) % m_out == 0:
            post.append((bo, la * m_in // m_out, lb, lb))
        elif (lb * m_out) % m_in == 0:
            w = lb * m_out // m_in
            pre.append((ai, la, w, w))
        else:
            return None
    if not (pre or post):
        return None
    ta = target.tile_assignment
    trailing = list(ta.dims[len(out_dims):])
    src = remake(target, ta.reshape(in_tiles + trailing))
    return src, pre, post


def _reshape_with_halos(ctx: PartitionContext, inst: Instruction, pv: PValue,
                        target: HloSharding) -> PValue | None:
    from hlo_spmd.passes.partition.halo import exchange_window, plan_window
    from hlo_spmd.passes.partition.reshard import reshard_price

    in_dims, out_dims = inst.operands[0].shape.dims, inst.shape.dims
    plan = _halo_reshape_plan(target, in_dims, out_dims)
    if plan is None:
        return None
    src, pre, post = plan
    # Priced against the whole-operand fallback: the move to ``src`` plus the halo rows.
    itemsize = element_bytes(pv.base_shape.element_type)
    cost = reshard_price(ctx, pv, src)[0]
    x_local = list(tile_shape(src, in_dims))
    mid = list(tile_shape(target, out_dims))
    for bo, ls, _, _ in post:
        mid[bo] = ls
    for windows, shape, sharding in ((pre, x_local, src), (post, list(mid), target)):
        for d, ls, w, stride in windows:
            t = sharding.tile_dims_for_data()[d]
            size = int((in_dims if windows is pre else out_dims)[d])
            plan_w = plan_window(t, t, ls, size, np.arange(t) * stride, w)
            cost += plan_w.rows * math.prod(v for k, v in enumerate(shape) if k != d) * itemsize
            shape[d] = w
    if cost >= reshard_price(ctx, pv, REPLICATED)[0]:
        return None
    x = ctx.reshard(pv, src).hlo
    for d, _, w, stride in pre:
        t = src.tile_dims_for_data()[d]
        x = exchange_window(ctx, x, src, src, d, int(in_dims[d]), np.arange(t) * stride, w,
                            tile_index_table(ctx, src, d))
    y = ctx.b.reshape(x, mid, name=inst.name)
    for d, _, w, stride in post:
        t = target.tile_dims_for_data()[d]
        y = exchange_window(ctx, y, target, target, d, int(out_dims[d]), np.arange(t) * stride,
                            w, tile_index_table(ctx, target, d))
    return PValue(y, inst.shape, target)


# -- iota -----------------------------------------------------------------------------------
_INT_TYPES = {PrimitiveType.S32, PrimitiveType.S64, PrimitiveType.U32, PrimitiveType.U64}


@handles("iota")
def handle_iota(ctx: PartitionContext, inst: Instruction) -> PValue:
    """Only the local piece: iota over the local shape plus this device's offset."""
    target = compute_sharding(ctx, inst)
    if target.is_manual or not target.is_tiled:
        shape = inst.shape
        return PValue(ctx.emit_like(inst, [], shape), inst.shape,
                      target if target.is_manual else REPLICATED)
    return PValue(local_iota(ctx, inst, target), inst.shape, target)


# -- dynamic-slice --------------------------------------------------------------------------
@handles("dynamic-slice")
def handle_dynamic_slice(ctx: PartitionContext, inst: Instruction) -> PValue:
    """Sliced dims are computed whole (operand replicated there), then cut locally;
    dims kept at full size stay tiled. A short slice of one sharded dim may instead be
    summed from the tiles (``dynamic_window``), whichever costs less."""
    target = compute_sharding(ctx, inst)
    operand = inst.operands[0]
    if not scalar_starts(inst, 1) or _has_empty(operand.shape, inst.shape):
        return _fallback(ctx, inst)
    from hlo_spmd.passes.partition.support.dynamic_window import dynamic_slice_or

    return dynamic_slice_or(ctx, inst, target, lambda: _dynamic_slice_whole(ctx, inst, target))


def _dynamic_slice_whole(ctx: PartitionContext, inst: Instruction,
                         target: HloSharding) -> Strategy:
    """The generic dynamic-slice as a priced plan: the operand resharded to
    ``dynamic_slice_whole_layout``, a local dynamic-slice, the result resharded to ``target``."""
    mid = dynamic_slice_whole_layout(inst, target)
    operand = inst.operands[0]
    nbytes, peak = moves(ctx, [(ctx.value(operand), mid)])
    if mid.is_manual or target.is_manual:
        b, p = 0.0, 0.0
    else:
        b, p = result_move(ctx, inst.shape, mid, target)
    return Strategy(mid, nbytes + b, max(peak, p),
                    lambda: _dynamic_slice_in(ctx, inst, target, mid))


def _dynamic_slice_in(ctx: PartitionContext, inst: Instruction, target: HloSharding,
                      mid: HloSharding) -> PValue:
    operand = inst.operands[0]
    rank = operand.shape.rank
    x = ctx.reshard(ctx.value(operand), mid).hlo
    starts = [ctx.operand(inst, 1 + d, REPLICATED) for d in range(rank)]
    local = tile_shape(mid, inst.shape.dims) if mid.is_tiled else tuple(inst.shape.dims)
    y = ctx.b.dynamic_slice(x, starts, local, name=inst.name)
    return ctx.reshard(PValue(y, inst.shape, mid), target)


# -- dynamic-update-slice -------------------------------------------------------------------
@handles("dynamic-update-slice")
def handle_dynamic_update_slice(ctx: PartitionContext, inst: Instruction) -> PValue:
    """Dims the update covers whole stay tiled in both. Sliced dims the result is tiled
    along keep the base tiled: every device cuts the part of the (replicated) update that
    falls into its tile and selects it in; sliced dims held whole use a local DUS."""
    target = compute_sharding(ctx, inst)
    base_op, upd_op = inst.operands[0], inst.operands[1]
    rank = base_op.shape.rank
    if not scalar_starts(inst, 2) or _has_empty(base_op.shape, upd_op.shape):
        return _fallback(ctx, inst)
    b = ctx.b
    dims = base_op.shape.dims
    usizes = upd_op.shape.dims
    tiles = tiles_of(target, rank)
    sliced = [d for d in range(rank) if usizes[d] < dims[d]]
    split = [d for d in sliced if tiles[d] > 1]
    base = ctx.reshard(ctx.value(base_op), target).hlo
    upd_sharding = partial_replicate(target, split) if target.is_tiled else target
    upd = ctx.reshard(ctx.value(upd_op), upd_sharding).hlo
    starts = [ctx.operand(inst, 2 + d, REPLICATED) for d in range(rank)]
    if not split:
        y = b.dynamic_update_slice(base, upd, starts, name=inst.name)
        return PValue(y, inst.shape, target)
    local = base.shape.dims
    zero = b.constant(np.int64(0), S32)
    # The clamped start of every sliced dim (in its own type, then as s32).
    clamped = {}
    for d in sliced:
        st = starts[d]
        lo = b.scalar(0, st)
        hi = b.scalar(dims[d] - usizes[d], st)
        c = b.clamp(lo, st, hi)
        clamped[d] = c if c.shape.element_type == S32 else b.convert(c, S32)
    # The update window over this device's tile on split dims.
    lows = [0] * rank
    highs = [0] * rank
    for d in split:
        lows[d] = highs[d] = local[d] - 1
    padded = b.pad(upd, b.scalar(0, upd), lows, highs) if any(lows) else upd
    offsets = []
    win_sizes = list(upd.shape.dims)
    masks = []
    for d in range(rank):
        if d not in split:
            offsets.append(zero)
            continue
        tidx = tile_index_table(ctx, target, d)
        kl = device_scalar(ctx, np.arange(tiles[d]) * local[d], tidx)   # tile start
        rel = b.subtract(kl, clamped[d])                                  # tile start - s
        off = b.add(rel, b.constant(np.int64(local[d] - 1), S32))
        off = b.clamp(zero, off, b.constant(np.int64(usizes[d] + local[d] - 2), S32))
        offsets.append(off)
        win_sizes[d] = local[d]
        lo = b.subtract(clamped[d], kl)                                   # s - tile start
        hi = b.add(lo, b.constant(np.int64(usizes[d]), S32))
        masks.append(position_mask(ctx, local, d, lo, hi))
    window = b.dynamic_slice(padded, offsets, win_sizes)
    # Sliced dims held whole: a local DUS places the window where the original would.
    inner = [clamped[d] if (d in sliced and d not in split) else zero for d in range(rank)]
    if tuple(window.shape.dims) == tuple(local):
        merged = window
    else:
        merged = b.dynamic_update_slice(base, window, inner)
    pred = masks[0]
    for m in masks[1:]:
        pred = b.and_(pred, m)
    y = b.select(pred, merged, base, name=inst.name)
    return PValue(y, inst.shape, target)


# -- bitcast-convert between widths ---------------------------------------------------------
def _drop_minor(s: HloSharding, rank: int) -> HloSharding:
    """``s`` (untiled on its last data dim) for the array without that dim."""
    if not s.is_tiled:
        return s
    ta = s.tile_assignment
    return remake(s, ta.reshape(list(ta.dims[:rank - 1]) + list(ta.dims[rank:])))


def _add_minor(s: HloSharding, rank: int) -> HloSharding:
    """``s`` for the array with an extra untiled minor dim (``rank`` = s's data rank)."""
    if not s.is_tiled:
        return s
    ta = s.tile_assignment
    return remake(s, ta.reshape(list(ta.dims[:rank]) + [1] + list(ta.dims[rank:])))


@handles("bitcast-convert")
def handle_bitcast_convert(ctx: PartitionContext, inst: Instruction) -> PValue:
    """Same width: elementwise. Different widths add or drop a minor dim, which stays
    whole on every device."""
    from hlo_spmd.passes.partition.handlers.elementwise import handle_elementwise

    operand = inst.operands[0]
    in_rank, out_rank = operand.shape.rank, inst.shape.rank
    if in_rank == out_rank:
        return handle_elementwise(ctx, inst)
    target = compute_sharding(ctx, inst)
    if out_rank == in_rank - 1:
        # Narrow -> wide: the operand's minor dim is consumed whole.
        op_sharding = _add_minor(target, out_rank)
        x = ctx.reshard(ctx.value(operand), op_sharding).hlo
        local = ctx.local_shape(inst.shape, target)
        return PValue(ctx.emit_like(inst, [x], local), inst.shape, target)
    # Wide -> narrow: compute with the new minor dim whole, then cut if it is tiled.
    mid = partial_replicate(target, [out_rank - 1]) if target.is_tiled else target
    x = ctx.reshard(ctx.value(operand), _drop_minor(mid, out_rank)).hlo
    local = ctx.local_shape(inst.shape, mid)
    y = ctx.emit_like(inst, [x], local)
    return ctx.reshard(PValue(y, inst.shape, mid), target)

"""Slice, pad, concatenate and reverse: ops that move elements along a dimension.

On a dimension the result is tiled along, every device needs a contiguous *window* of the
operand whose start is a function of its tile index (slice: ``start + stride * k * o``;
pad: ``k * o - low``; concatenate: ``k * o - offset``; reverse: ``D - (k + 1) * o``).
``exchange_window`` fetches such windows:

* operand whole on the dimension: pad + dynamic-slice at a per-device offset (no traffic);
* operand tiled like the result: the window spans at most P consecutive source shards;
  shard p of every window arrives by collective-permute (split into rounds so that no
  device sends twice in one permute), the P pieces are concatenated and the window is
  cut out at a per-device offset. A window that spans every shard uses one all-gather.
  Pieces holding no real element of the window are never sent.

Window positions outside the operand hold garbage; handlers mask them (pad value,
concatenate operand choice) or they fall into the result's own end padding.
All per-device quantities are numpy tables indexed by tile index, looked up through
``partition-id`` (never a per-device loop in the emitted program).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.handlers.common import emit_like
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import handles
from hlo_spmd.passes.partition.reshard import gather_groups, pad_to
from hlo_spmd.sharding import HloSharding, device_offsets, partial_replicate, tile_shape

S32 = PrimitiveType.S32


# -- shardings ------------------------------------------------------------------------------
def compute_sharding(ctx: PartitionContext, inst: Instruction) -> HloSharding:
    """The sharding a handler produces: the instruction's, with single-device and
    other non-tiled kinds computed replicated (consumers reshard as they need)."""
    s = ctx.sharding_of(inst)
    if s.is_tiled or s.is_manual:
        return s
    return HloSharding.replicate()


def tiles_of(s: HloSharding, rank: int) -> tuple[int, ...]:
    return tuple(s.tile_dims_for_data()) if s.is_tiled else (1,) * rank


def tile_index_table(ctx: PartitionContext, s: HloSharding, dim: int) -> np.ndarray:
    """``[group size]``: each logical device's tile index along ``dim`` of ``s``."""
    out = np.zeros(ctx.num_devices, dtype=np.int64)
    if not s.is_tiled:
        return out
    arr = s.tile_assignment.array()
    out[arr.ravel()] = np.indices(arr.shape)[dim].ravel()
    return out


def keep_only_tiled(s: HloSharding, current: HloSharding, rank: int,
                    dims: Sequence[int]) -> HloSharding:
    """``s`` with those of ``dims`` that ``current`` does not tile replicated: an operand
    resharded to it is never cut on a dim it holds whole and the handler reads a window
    from (``exchange_window`` works on whole and on tiled dims)."""
    if not s.is_tiled:
        return s
    cur = tiles_of(current, rank) if not current.is_tuple else (1,) * rank
    tiles = s.tile_dims_for_data()
    return partial_replicate(s, [d for d in dims if tiles[d] > 1 and cur[d] == 1])


def _same_tiles_on(a: HloSharding, b: HloSharding, dim: int, ctx: PartitionContext) -> bool:
    return np.array_equal(tile_index_table(ctx, a, dim), tile_index_table(ctx, b, dim))


def to_sharding(ctx: PartitionContext, pv: PValue, target: HloSharding) -> PValue:
    """Reshard, cutting locally when ``target`` only refines ``pv``'s tiling: on every dim
    the source either holds the whole dim or is tiled exactly like the target."""
    src = pv.sharding
    if src == target or not target.is_tiled or not pv.base_shape.is_array:
        return ctx.reshard(pv, target)
    rank = pv.base_shape.rank
    if not (src.is_tiled or src.is_replicated) or src.is_manual_subgroup \
            or target.is_manual_subgroup:
        return ctx.reshard(pv, target)
    st, tt = tiles_of(src, rank), target.tile_dims_for_data()
    refine = []
    for d in range(rank):
        if st[d] == 1:
            if tt[d] > 1:
                refine.append(d)
        elif st[d] != tt[d] or not _same_tiles_on(src, target, d, ctx):
            return ctx.reshard(pv, target)
    if not refine:
        # Same tiles on every tiled dim; only the replication grouping differs.
        if src.is_tiled and _same_groups_ok(ctx, src, target, rank):
            return PValue(pv.hlo, pv.base_shape, target)
        return ctx.reshard(pv, target)
    dims = pv.base_shape.dims
    local = tile_shape(target, dims)
    x = pv.hlo
    padded = [local[d] * tt[d] if d in refine else x.shape.dims[d] for d in range(rank)]
    x = pad_to(ctx, x, padded)
    table = device_offsets(target, dims, num_devices=ctx.num_devices)
    offsets = [ctx.logical_table(table[:, d]) if d in refine else 0 for d in range(rank)]
    sizes = [local[d] if d in refine else x.shape.dims[d] for d in range(rank)]
    return PValue(ctx.b.dynamic_slice(x, offsets, sizes), pv.base_shape, target)


def _same_groups_ok(ctx: PartitionContext, src: HloSharding, dst: HloSharding, rank: int) -> bool:
    """Every device holds the same tile under both (they differ only in replication)."""
    return all(np.array_equal(tile_index_table(ctx, src, d), tile_index_table(ctx, dst, d))
               for d in range(rank))


# -- per-device scalars and masks -----------------------------------------------------------
def device_scalar(ctx: PartitionContext, per_tile: np.ndarray, tidx: np.ndarray) -> Instruction:
    """s32 scalar: ``per_tile[this device's tile index]``."""
    return ctx.logical_table(np.asarray(per_tile, dtype=np.int64)[tidx])


def device_pred(ctx: PartitionContext, per_tile: np.ndarray, tidx: np.ndarray,
                dims: Sequence[int]) -> Instruction:
    """pred array of ``dims``: ``per_tile[this device's tile index]`` everywhere."""
    flag = device_scalar(ctx, np.asarray(per_tile).astype(np.int64), tidx)
    one = ctx.b.constant(np.int64(1), S32)
    pred = ctx.b.compare(flag, one, "EQ")
    return ctx.b.broadcast(pred, list(dims), []) if len(dims) else pred


def position_mask(ctx: PartitionContext, dims: Sequence[int], dim: int,
                  lo: Instruction | None, hi: Instruction | None) -> Instruction:
    """pred array of ``dims``: ``lo <= i < hi`` for the index ``i`` along ``dim``
    (``lo``/``hi`` s32 scalars; None = unbounded)."""
    b = ctx.b
    iota = b.iota(S32, list(dims), dim)
    preds = []
    if lo is not None:
        preds.append(b.compare(iota, b.broadcast(lo, list(dims), []), "GE"))
    if hi is not None:
        preds.append(b.compare(iota, b.broadcast(hi, list(dims), []), "LT"))
    out = preds[0]
    for p in preds[1:]:
        out = b.and_(out, p)
    return out


def mask_outside(ctx: PartitionContext, x: Instruction, dim: int, lo: np.ndarray,
                 hi: np.ndarray, tidx: np.ndarray, value: Instruction,
                 care: np.ndarray | None = None) -> Instruction:
    """Replace positions ``i`` along ``dim`` with ``i < lo[k]`` or ``i >= hi[k]`` (k the
    device's tile index) by the scalar ``value``. ``care[k]``: how many leading positions
    matter on tile k (the rest is the result's padding); skipped when nothing changes."""
    size = x.shape.dims[dim]
    lo = np.asarray(lo, np.int64)
    hi = np.asarray(hi, np.int64)
    care = np.full(lo.shape, size, np.int64) if care is None else np.minimum(care, size)
    need_lo = bool(np.any((lo > 0) & (care > 0)))
    need_hi = bool(np.any(hi < care))
    if not (need_lo or need_hi):
        return x
    pred = position_mask(ctx, x.shape.dims, dim,
                         device_scalar(ctx, lo, tidx) if need_lo else None,
                         device_scalar(ctx, hi, tidx) if need_hi else None)
    fill = ctx.b.broadcast(value, list(x.shape.dims), [])
    return ctx.b.select(pred, x, fill)


def select_from(ctx: PartitionContext, x: Instruction, y: Instruction, dim: int,
                threshold: np.ndarray, tidx: np.ndarray, care: np.ndarray) -> Instruction:
    """``y`` at positions ``i >= threshold[k]`` along ``dim``, ``x`` before."""
    size = x.shape.dims[dim]
    threshold = np.asarray(threshold, np.int64)
    care = np.minimum(care, size)
    if np.all((threshold <= 0) | (care <= 0)):
        return y
    if np.all(threshold >= care):
        return x
    pred = position_mask(ctx, x.shape.dims, dim, device_scalar(ctx, threshold, tidx), None)
    return ctx.b.select(pred, y, x)


# -- windows --------------------------------------------------------------------------------
def exchange_window(ctx: PartitionContext, x: Instruction, xs: HloSharding, cs: HloSharding,
                    dim: int, size: int, starts: np.ndarray, width: int,
                    tidx: np.ndarray) -> Instruction:
    """Per device (tile index k along ``dim`` of the result sharding ``cs``) the operand
    elements ``[starts[k], starts[k] + width)`` along ``dim``; garbage outside ``[0, size)``.

    ``x`` is the local piece with sharding ``xs``, which either holds ``dim`` whole or
    tiles it exactly as ``cs`` does (tile indices ``tidx`` per logical device). Devices
    exchange with the devices that differ from them only along ``dim`` *in ``cs``*: on
    dims handled before, every device already holds its ``cs`` window."""
    b = ctx.b
    starts = np.asarray(starts, dtype=np.int64)
    t = len(starts)
    rank = x.shape.rank
    xt = tiles_of(xs, rank)[dim]
    lsize = x.shape.dims[dim]
    if xt == 1:
        # Whole on this device: cut the window out (padding for out-of-range reads).
        low = max(0, -int(starts.min()))
        high = max(0, int((starts + width).max()) - lsize)
        return _cut(ctx, x, dim, low, high, starts + low, width, tidx)
    assert xt == t, (xt, t)
    k = np.arange(t)
    if width == lsize and np.array_equal(starts, k * lsize):
        return x
    # Real elements each window needs, and the shards holding them.
    lo = np.maximum(starts, 0)
    hi = np.minimum(starts + width, size)
    any_real = lo < hi
    first = np.where(any_real, lo // lsize, np.clip(starts // lsize, 0, t - 1))
    last = np.where(any_real, (np.maximum(hi, 1) - 1) // lsize, first - 1)
    npieces = max(1, int((last - first).max()) + 1)
    groups = gather_groups(cs, dim)
    if npieces >= t:
        full = ctx.f.all_gather(x, dim, groups)
        low = max(0, -int(starts.min()))
        high = max(0, int((starts + width).max()) - t * lsize)
        return _cut(ctx, full, dim, low, high, starts + low, width, tidx)
    pieces = []
    plo0 = 0
    total = 0
    for p in range(npieces):
        src = first + p
        needed = any_real & (src <= last)
        # The part of a source shard any receiver needs: only that part travels.
        nlo = np.maximum(lo - src * lsize, 0)
        nhi = np.minimum(hi - src * lsize, lsize)
        plo = int(nlo[needed].min()) if needed.any() else 0
        phi = int(nhi[needed].max()) if needed.any() else 1
        part = _static_slice(ctx, x, dim, plo, phi)
        if p == 0:
            plo0 = plo
        total += phi - plo
        pieces.append(_fetch_piece(ctx, part, dim, src, needed, nlo - plo, nhi - plo, groups,
                                   tidx))
    window = pieces[0] if len(pieces) == 1 else b.concatenate(pieces, dim)
    # window[j] is element first*lsize + plo0 + j (on windows with real elements; joins
    # between pieces are whole shards); pad where a window reaches past the pieces.
    begin = first * lsize + plo0
    real = any_real
    low = max(0, int((begin - starts)[real].max())) if real.any() else 0
    high = max(0, int((starts + width - begin)[real].max()) - total) if real.any() else 0
    high = max(high, width - total - low)
    offsets = np.where(real, starts - begin + low, 0)
    return _cut(ctx, window, dim, low, high, offsets, width, tidx)


MAX_PERMUTE_ROUNDS = 2


def _fetch_piece(ctx: PartitionContext, part: Instruction, dim: int, src: np.ndarray,
                 needed: np.ndarray, nlo: np.ndarray, nhi: np.ndarray, groups: np.ndarray,
                 tidx: np.ndarray) -> Instruction:
    """Every device (tile k) receives ``part`` of tile ``src[k]`` where ``needed[k]``
    (anything elsewhere; only ``[nlo[k], nhi[k])`` along ``dim`` matters): its own, by
    collective-permute rounds with distinct senders (each round sends just the range its
    receivers need), or -- when one shard feeds many tiles -- by one all-gather."""
    b = ctx.b
    t = len(src)
    k = np.arange(t)
    remote = needed & (src != k)
    if not remote.any():
        return part
    rounds: list[list[tuple[int, int]]] = []
    senders: list[set[int]] = []
    choice = np.full(t, -1, dtype=np.int64)
    for kk in np.nonzero(remote)[0]:
        s = int(src[kk])
        r = next((i for i, used in enumerate(senders) if s not in used), len(senders))
        if r == len(senders):
            senders.append(set())
            rounds.append([])
        senders[r].add(s)
        rounds[r].append((s, int(kk)))
        choice[kk] = r
    dims = part.shape.dims
    if len(rounds) > MAX_PERMUTE_ROUNDS:
        gathered = ctx.f.all_gather(part, dim, groups)
        pw = dims[dim]
        offsets = np.where(needed, np.clip(src, 0, t - 1), 0) * pw
        return _cut(ctx, gathered, dim, 0, 0, offsets, pw, tidx)
    received = []
    width = dims[dim]
    for pairs in rounds:
        logical = np.concatenate([np.stack([groups[:, s_], groups[:, d_]], axis=1)
                                  for s_, d_ in pairs])
        receivers = [d_ for _, d_ in pairs]
        rlo, rhi = int(nlo[receivers].min()), int(nhi[receivers].max())
        sent = ctx.f.collective_permute(_static_slice(ctx, part, dim, rlo, rhi), logical)
        if rlo or rhi != width:
            lows = [0] * part.shape.rank
            highs = [0] * part.shape.rank
            lows[dim], highs[dim] = rlo, width - rhi
            sent = b.pad(sent, b.scalar(0, sent), lows, highs)
        received.append(sent)
    piece = received[0]
    for r in range(1, len(received)):
        piece = b.select(device_pred(ctx, choice == r, tidx, dims), received[r], piece)
    own = needed & (src == k)
    if own.any():
        piece = b.select(device_pred(ctx, own, tidx, dims), part, piece)
    return piece


def _static_slice(ctx: PartitionContext, x: Instruction, dim: int, lo: int,
                  hi: int) -> Instruction:
    if lo == 0 and hi == x.shape.dims[dim]:
        return x
    starts = [0] * x.shape.rank
    limits = list(x.shape.dims)
    starts[dim], limits[dim] = lo, hi
    return ctx.b.slice(x, starts, limits)


def _cut(ctx: PartitionContext, x: Instruction, dim: int, low: int, high: int,
         offsets: np.ndarray, width: int, tidx: np.ndarray) -> Instruction:
    """Pad ``x`` by ``low``/``high`` along ``dim``, then take ``width`` at ``offsets[k]``."""
    b = ctx.b
    rank = x.shape.rank
    if low or high:
        lows = [0] * rank
        highs = [0] * rank
        lows[dim], highs[dim] = low, high
        x = b.pad(x, b.scalar(0, x), lows, highs)
    offsets = np.asarray(offsets, np.int64)
    if np.all(offsets == offsets[0]):
        off = int(offsets[0])
        if off == 0 and width == x.shape.dims[dim]:
            return x
        starts = [0] * rank
        limits = list(x.shape.dims)
        starts[dim], limits[dim] = off, off + width
        return b.slice(x, starts, limits)
    zero = b.constant(np.int64(0), S32)
    idx = [zero] * rank
    idx[dim] = device_scalar(ctx, offsets, tidx)
    sizes = list(x.shape.dims)
    sizes[dim] = width
    return b.dynamic_slice(x, idx, sizes)


def _manual(ctx: PartitionContext, inst: Instruction) -> PValue:
    """Inside a manual region: the op as written on the local values."""
    target = ctx.sharding_of(inst)
    ops = [ctx.operand(inst, i, HloSharding.manual()) for i in range(len(inst.operands))]
    return PValue(emit_like(ctx, inst, ops, inst.shape), inst.shape, target)


def _has_empty(*shapes) -> bool:
    return any(0 in tuple(s.dims) for s in shapes)


def _fallback(ctx: PartitionContext, inst: Instruction) -> PValue:
    from hlo_spmd.passes.partition.handlers.basic import handle_replicated

    return handle_replicated(ctx, inst)


# -- slice ----------------------------------------------------------------------------------
@handles("slice")
def handle_slice(ctx: PartitionContext, inst: Instruction) -> PValue:
    target = compute_sharding(ctx, inst)
    if target.is_manual:
        return _manual(ctx, inst)
    operand = inst.operands[0]
    if _has_empty(operand.shape, inst.shape):
        return _fallback(ctx, inst)
    rank = inst.shape.rank
    cfg = list(inst.attrs.slice_dimensions)
    xs = keep_only_tiled(target, ctx.value(operand).sharding, rank, range(rank))
    x = to_sharding(ctx, ctx.value(operand), xs).hlo
    tiles = tiles_of(target, rank)
    out_local = tile_shape(target, inst.shape.dims) if target.is_tiled else inst.shape.dims
    starts, limits, strides = [], [], []
    for d in range(rank):
        c = cfg[d]
        if tiles[d] == 1:
            starts.append(c.start)
            limits.append(c.limit)
            strides.append(c.stride)
            continue
        o = out_local[d]
        t = tiles[d]
        tidx = tile_index_table(ctx, target, d)
        width = c.stride * (o - 1) + 1
        win_starts = c.start + c.stride * o * np.arange(t)
        x = exchange_window(ctx, x, xs, target, d, operand.shape.dims[d], win_starts, width,
                            tidx)
        starts.append(0)
        limits.append(width)
        strides.append(c.stride)
    if starts != [0] * rank or limits != list(x.shape.dims) or strides != [1] * rank:
        x = ctx.b.slice(x, starts, limits, strides, name=inst.name)
    return PValue(x, inst.shape, target)


# -- pad ------------------------------------------------------------------------------------
@handles("pad")
def handle_pad(ctx: PartitionContext, inst: Instruction) -> PValue:
    target = compute_sharding(ctx, inst)
    if target.is_manual:
        return _manual(ctx, inst)
    operand = inst.operands[0]
    if _has_empty(operand.shape, inst.shape):
        return _fallback(ctx, inst)
    b = ctx.b
    rank = inst.shape.rank
    cfg = list(inst.attrs.padding_config.dimensions)
    value = ctx.operand(inst, 1, HloSharding.replicate())
    xs = keep_only_tiled(target, ctx.value(operand).sharding, rank, range(rank))
    x = to_sharding(ctx, ctx.value(operand), xs).hlo
    tiles = tiles_of(target, rank)
    # Dims the result holds whole: pad locally as written.
    lows = [c.edge_padding_low if tiles[d] == 1 else 0 for d, c in enumerate(cfg)]
    highs = [c.edge_padding_high if tiles[d] == 1 else 0 for d, c in enumerate(cfg)]
    inter = [c.interior_padding if tiles[d] == 1 else 0 for d, c in enumerate(cfg)]
    if any(lows) or any(highs) or any(inter):
        x = b.pad(x, value, lows, highs, inter)
    out_local = tile_shape(target, inst.shape.dims) if target.is_tiled else inst.shape.dims
    for d in range(rank):
        if tiles[d] == 1:
            continue
        c = cfg[d]
        lo, step = c.edge_padding_low, c.interior_padding + 1
        size = operand.shape.dims[d]
        out_size = inst.shape.dims[d]
        o, t = out_local[d], tiles[d]
        tidx = tile_index_table(ctx, target, d)
        k = np.arange(t)
        first = np.floor_divide(k * o - lo, step)              # first operand index needed
        last = np.floor_divide((k + 1) * o - 1 - lo, step)
        width = int((last - first).max()) + 1
        win = exchange_window(ctx, x, xs, target, d, size, first, width, tidx)
        if step > 1:
            # Interior padding locally; the trailing `step - 1` keeps the cut in bounds.
            pl = [0] * rank
            ph = [0] * rank
            pi = [0] * rank
            ph[d], pi[d] = step - 1, step - 1
            win = b.pad(win, value, pl, ph, pi)
        # win[j] is result position lo + first*step + j.
        win = _cut(ctx, win, d, 0, 0, k * o - (lo + first * step), o, tidx)
        valid_lo = lo - k * o                                 # first real position, local
        valid_hi = lo + (size - 1) * step + 1 - k * o         # one past the last
        care = np.clip(out_size - k * o, 0, o)
        x = mask_outside(ctx, win, d, valid_lo, valid_hi, tidx, value, care)
    return PValue(x, inst.shape, target)


# -- concatenate ----------------------------------------------------------------------------
@handles("concatenate")
def handle_concatenate(ctx: PartitionContext, inst: Instruction) -> PValue:
    target = compute_sharding(ctx, inst)
    if target.is_manual:
        return _manual(ctx, inst)
    if _has_empty(inst.shape):
        return _fallback(ctx, inst)
    rank = inst.shape.rank
    dim = inst.dimensions[0]
    tiles = tiles_of(target, rank)
    if tiles[dim] == 1:
        ops = []
        for i, op in enumerate(inst.operands):
            pv = ctx.value(op)
            ops.append(to_sharding(ctx, pv, target).hlo)
        local = ctx.local_shape(inst.shape, target)
        return PValue(emit_like(ctx, inst, ops, local), inst.shape, target)
    o = tile_shape(target, inst.shape.dims)[dim]
    t = tiles[dim]
    k = np.arange(t)
    tidx = tile_index_table(ctx, target, dim)
    care = np.clip(inst.shape.dims[dim] - k * o, 0, o)
    offset = 0
    result = None
    for op in inst.operands:
        size = op.shape.dims[dim]
        if size == 0:
            continue
        pv = ctx.value(op)
        xs = keep_only_tiled(target, pv.sharding, rank, [dim])
        x = to_sharding(ctx, pv, xs).hlo
        win = exchange_window(ctx, x, xs, target, dim, size, k * o - offset, o, tidx)
        result = win if result is None else select_from(ctx, result, win, dim, offset - k * o,
                                                        tidx, care)
        offset += size
    assert result is not None
    return PValue(result, inst.shape, target)


# -- reverse --------------------------------------------------------------------------------
@handles("reverse")
def handle_reverse(ctx: PartitionContext, inst: Instruction) -> PValue:
    from hlo_spmd.sharding import reverse_sharding

    target = compute_sharding(ctx, inst)
    if target.is_manual:
        return _manual(ctx, inst)
    operand = inst.operands[0]
    if _has_empty(inst.shape):
        return _fallback(ctx, inst)
    rank = inst.shape.rank
    rdims = inst.dimensions
    tiles = tiles_of(target, rank)
    sharded = [d for d in rdims if tiles[d] > 1]
    pv = ctx.value(operand)
    dims = operand.shape.dims
    if sharded and all(dims[d] % tiles[d] == 0 for d in sharded):
        # Even: the operand tiled in mirrored order reverses locally.
        mirrored = reverse_sharding(target, sharded)
        if pv.sharding == mirrored:
            x = ctx.b.reverse(pv.hlo, rdims, name=inst.name)
            return PValue(x, inst.shape, target)
    xs = keep_only_tiled(target, pv.sharding, rank, sharded)
    x = to_sharding(ctx, pv, xs).hlo
    out_local = tile_shape(target, inst.shape.dims) if target.is_tiled else inst.shape.dims
    for d in sharded:
        o, t = out_local[d], tiles[d]
        tidx = tile_index_table(ctx, target, d)
        x = exchange_window(ctx, x, xs, target, d, dims[d], dims[d] - (np.arange(t) + 1) * o,
                            o, tidx)
    return PValue(ctx.b.reverse(x, rdims, name=inst.name), inst.shape, target)

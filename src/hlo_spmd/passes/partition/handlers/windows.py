"""reduce-window and select-and-scatter: windowed ops partitioned with halo exchange
(XLA's SpmdPartitioningVisitor::HandleReduceWindow / HandleSelectAndScatter).

On a dim the compute sharding tiles, result tile k reads one window of the operand:
reduce-window output positions ``[k*p, (k+1)*p)`` (``p`` = output tile size) read
operand elements ``[k*p*stride - low, ...)`` of width ``(p-1)*stride + span``; the shared
halo utility (passes/partition/halo) brings that window to the device, positions outside
the operand are masked with the init value (the reduction's identity), and the op runs
with no padding on that dim. A window as wide as the dim (cumsum lowered as
reduce-window) is one all-gather that way; ``choose_compute_sharding`` (slicing.py) also
prices moving the tiling to a dim the window leaves alone (all-to-all there and back)
and dropping it, and the cheapest by bytes per device wins.

select-and-scatter (the gradient of max / min pooling): result tile k (operand positions
``[k*l, (k+1)*l)``) receives from the windows that overlap it; each device takes the
source windows ``[first_k, first_k + n)`` (``n`` the most any tile needs) and the operand
elements they cover, masks operand positions outside the operand with the lowest (for a
max select: never selected) or highest value, source positions outside the source with
the init value, runs the op with no padding on that dim and cuts its own tile out of the
result. Selects other than a max / min comparison, and base dilation on a tiled dim,
keep that dim whole. A reduce-window base-dilated on a tiled dim (of one array) reads
windows like a transposed convolution (halo.dilated_window_need).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.passes.dot_conv_dims import WindowDim, window_dims
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.halo import (_cut, dilated_window_need, drop_extra_rows,
                                            exchange_window, mask_outside, plan_window,
                                            tile_index_table, tiles_of)
from hlo_spmd.passes.partition.support.common import copy_attrs
from hlo_spmd.passes.partition.handlers.slicing import (_rows_bytes, choose_compute_sharding,
                                                       itemsize, keep_only_tiled)
from hlo_spmd.passes.partition.masking import pad_value_identity
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import handles
from hlo_spmd.passes.partition.reshard import reshard_price
from hlo_spmd.sharding import HloSharding, partial_replicate, tile_shape


# -- geometry -----------------------------------------------------------------------------------
def _trivial(w: WindowDim) -> bool:
    return (w.size == 1 and w.stride == 1 and w.padding_low == 0 and w.padding_high == 0
            and w.window_dilation == 1 and w.base_dilation == 1)


def _reduce_window_need(w: WindowDim, size: int, t: int) -> tuple[np.ndarray, int]:
    """(start per tile, width): the operand elements output tile k of ``t`` reads."""
    per = -(-w.output_size(size) // t)
    starts = np.arange(t, dtype=np.int64) * per * w.stride - w.padding_low
    return starts, ((per - 1) * w.stride + w.span if per > 0 else 0)


def _rw_need(d: int, w: WindowDim, size: int, t: int, xt: int) -> tuple[np.ndarray, int]:
    if w.base_dilation > 1:
        first, count, _, _ = _rw_dilated(w, size, t, xt)
        return first, count
    return _reduce_window_need(w, size, t)


def _rw_dilated(w: WindowDim, size: int, t: int, xt: int):
    """``dilated_window_need`` with the windows cheapest to exchange from an operand
    split ``xt`` ways (1 or ``t``) on the dim."""
    lsize = -(-size // xt)
    return dilated_window_need(w, size, t,
                               lambda st, wd: plan_window(xt, t, lsize, size, st, wd).key())


def _scatter_need(w: WindowDim, size: int, out: int, t: int):
    """For select-and-scatter: (first source window per tile, windows per tile, operand
    start per tile, operand width, windows that matter per tile, operand elements that
    matter per tile) so every window overlapping result tile k is there."""
    lsize = -(-size // t)
    k = np.arange(t, dtype=np.int64)
    lo = k * lsize + w.padding_low - w.span + 1          # first window reaching the tile
    first = np.maximum(-(-lo // w.stride), 0)
    last = np.minimum(((k + 1) * lsize - 1 + w.padding_low) // w.stride, out - 1)
    count = max(1, int((last - first).max()) + 1)
    starts = first * w.stride - w.padding_low
    # Windows past ``last`` only scatter outside the tile: their data may be garbage.
    windows = np.clip(last - first + 1, 0, count)
    care = np.where(windows > 0, (windows - 1) * w.stride + w.span, 0)
    return first, count, starts, (count - 1) * w.stride + w.span, windows, care


def _local_window(inst: Instruction, window: Sequence[WindowDim]):
    attrs = copy_attrs(inst)
    for i, w in enumerate(window):
        wd = attrs.window.dimensions[i]
        wd.padding_low, wd.padding_high = w.padding_low, w.padding_high
        if (wd.base_dilation or 1) != w.base_dilation:
            wd.base_dilation = w.base_dilation
    return attrs


def _halo_dims(s: HloSharding, window: Sequence[WindowDim], rank: int) -> list[int]:
    tiles = tiles_of(s, rank)
    return [d for d in range(rank) if tiles[d] > 1 and not _trivial(window[d])]


def _windowable(target: HloSharding, window: Sequence[WindowDim], rank: int,
                ok) -> HloSharding:
    """``target`` without tiling on the dims a window cannot be exchanged on (``ok(d)``
    false): those are held whole (reported as a fallback by the caller)."""
    if not target.is_tiled:
        return target
    bad = [d for d in _halo_dims(target, window, rank) if not ok(d)]
    return partial_replicate(target, bad) if bad else target


# -- reduce-window ---------------------------------------------------------------------------
@handles("reduce-window")
def handle_reduce_window(ctx: PartitionContext, inst: Instruction) -> PValue:
    arrays = len(inst.operands) // 2
    rank = inst.operands[0].shape.rank
    window = window_dims(inst)
    target = _leaf(ctx, inst, arrays)
    if target is None:
        from hlo_spmd.passes.partition.handlers.basic import handle_replicated

        return handle_replicated(ctx, inst)
    # A base-dilated dim is exchanged like a transposed convolution's (the shared
    # dilated_window_need: one static window per tile, extra leading rows dropped after),
    # for one array (the rows of a tuple's results would be dropped one by one).
    work = _windowable(target, window, rank,
                       lambda d: window[d].base_dilation == 1 or arrays == 1)
    if work != target:
        _note(ctx, inst, "reduce-window: base-dilated dim held whole")
    moving = [d for d in range(rank) if not _trivial(window[d])]
    identity = [d for d in range(rank) if _trivial(window[d])]

    def cost(s: HloSharding) -> float | None:
        total = 0.0
        for i in range(arrays):
            c = _operand_cost(ctx, inst.operands[i], s, window, moving, _rw_need)
            if c is None:
                return None
            total += c
        return total

    mid = choose_compute_sharding(ctx, inst, work, moving, identity, cost) \
        if work.is_tiled else work
    pv = _emit_reduce_window(ctx, inst, mid, window, moving, arrays)
    return pv if mid == target else ctx.reshard(pv, _tuple_of(target, inst, arrays))


def _operand_cost(ctx: PartitionContext, operand: Instruction, s: HloSharding,
                  window: Sequence[WindowDim], moving: Sequence[int], need) -> float | None:
    """Bytes per device: the operand resharded to read windows in ``s``, plus the halos."""
    best = _operand_layout(ctx, operand, s, window, moving, need)
    return None if best is None else best[0]


def _operand_layout(ctx: PartitionContext, operand: Instruction, s: HloSharding,
                    window: Sequence[WindowDim], moving: Sequence[int],
                    need) -> tuple[float, HloSharding] | None:
    """(bytes, the operand's sharding before the exchange) of the cheaper way to read the
    windows of ``s``: the operand kept whole on the window dims it holds whole (windows
    cut locally), or resharded to ``s`` itself (an all-to-all moving its tiles to the
    window dims, then halos)."""
    pv = ctx.value(operand)
    rank = operand.shape.rank
    best = None
    for xs in dict.fromkeys((keep_only_tiled(s, pv.sharding, rank, moving), s)):
        c = reshard_price(ctx, pv, xs)[0]
        local = list(tile_shape(xs, operand.shape.dims) if xs.is_tiled else operand.shape.dims)
        st, xt = tiles_of(s, rank), tiles_of(xs, rank)
        for d in _halo_dims(s, window, rank):
            starts, width, *care = need(d, window[d], int(operand.shape.dims[d]), st[d],
                                        xt[d])
            plan = plan_window(xt[d], st[d], local[d], int(operand.shape.dims[d]), starts,
                               width, care[0] if care else None)
            c += plan.rows * _rows_bytes(local, d, itemsize(operand.shape))
            local[d] = width
        if best is None or c < best[0]:
            best = (c, xs)
    return best


def _windows_of(ctx: PartitionContext, pv: PValue, s: HloSharding, window: Sequence[WindowDim],
                moving: Sequence[int], need, fill: Instruction,
                operand: Instruction) -> Instruction:
    """The local operand with every halo dim of ``s`` replaced by this tile's window
    (positions outside the operand set to ``fill``)."""
    rank = pv.base_shape.rank
    best = _operand_layout(ctx, operand, s, window, moving, need)
    xs = best[1] if best is not None else keep_only_tiled(s, pv.sharding, rank, moving)
    x = ctx.reshard(pv, xs).hlo
    st, xt = tiles_of(s, rank), tiles_of(xs, rank)
    for d in _halo_dims(s, window, rank):
        size = int(pv.base_shape.dims[d])
        starts, width, *care = need(d, window[d], size, st[d], xt[d])
        care_k = care[0] if care else None
        tidx = tile_index_table(ctx, s, d)
        x = exchange_window(ctx, x, xs, s, d, size, starts, width, tidx, care_k)
        x = mask_outside(ctx, x, d, -starts, size - starts, tidx, fill, care_k)
    return x


def _emit_reduce_window(ctx: PartitionContext, inst: Instruction, s: HloSharding,
                        window: list[WindowDim], moving: Sequence[int],
                        arrays: int) -> PValue:
    rank = inst.operands[0].shape.rank
    inits = [ctx.operand(inst, arrays + i, HloSharding.replicate()) for i in range(arrays)]
    xs = [_windows_of(ctx, ctx.value(inst.operands[i]), s, window, moving,
                      _rw_need, inits[i], inst.operands[i]) for i in range(arrays)]
    local_window = list(window)
    extras = []
    st = tiles_of(s, rank)
    best = _operand_layout(ctx, inst.operands[0], s, window, moving, _rw_need)
    xt = tiles_of(best[1] if best is not None else
                  keep_only_tiled(s, ctx.value(inst.operands[0]).sharding, rank, moving), rank)
    for d in _halo_dims(s, window, rank):
        w = window[d]
        if w.base_dilation > 1:
            _, _, local_window[d], extra = _rw_dilated(
                w, int(inst.operands[0].shape.dims[d]), st[d], xt[d])
            if extra.any():
                extras.append((d, extra))
        else:
            local_window[d] = WindowDim(w.size, w.stride, 0, 0, w.window_dilation, 1,
                                        w.window_reversal)
    called = [ctx.clone(c) for c in inst.called_computations]
    x = ctx.b.op("reduce-window", xs + inits, _local_window(inst, local_window), called,
                 name=inst.name)
    for d, extra in extras:   # (one array: see handle_reduce_window)
        x = drop_extra_rows(ctx, x, d, extra, tile_index_table(ctx, s, d))
    return PValue(x, inst.shape, _tuple_of(s, inst, arrays))


# -- select-and-scatter -------------------------------------------------------------------------
def _select_fill(inst: Instruction) -> str | None:
    """"maximum" when the select keeps the larger value (never picks the lowest value),
    "minimum" when it keeps the smaller, None otherwise."""
    comp = inst.called_computations[0]
    root = comp.root
    if root.opcode != "compare" or len(comp.parameters) != 2:
        return None
    a, b = root.operands
    params = comp.parameters
    direction = root.attrs.comparison_direction
    if (a, b) == (params[1], params[0]):
        direction = {"GE": "LE", "GT": "LT", "LE": "GE", "LT": "GT"}.get(direction, direction)
    elif (a, b) != (params[0], params[1]):
        return None
    return {"GE": "maximum", "GT": "maximum", "LE": "minimum", "LT": "minimum"}.get(direction)


@handles("select-and-scatter")
def handle_select_and_scatter(ctx: PartitionContext, inst: Instruction) -> PValue:
    operand, source = inst.operands[0], inst.operands[1]
    rank = operand.shape.rank
    window = window_dims(inst)
    target = ctx.sharding_of(inst)
    if not (target.is_tiled or target.is_replicated) or target.is_manual_subgroup or \
            (target.subgroup_types and not target.replicate_on_last_tile_dim):
        from hlo_spmd.passes.partition.handlers.basic import handle_replicated

        return handle_replicated(ctx, inst)
    kind = _select_fill(inst)
    work = _windowable(target, window, rank,
                       lambda d: kind is not None and window[d].base_dilation == 1)
    if work != target:
        _note(ctx, inst, "select-and-scatter: dim held whole (select or dilation)")
    moving = [d for d in range(rank) if not _trivial(window[d])]
    identity = [d for d in range(rank) if _trivial(window[d])]
    op_need, src_need = _scatter_needs(operand, source)

    def cost(s: HloSharding) -> float | None:
        total = 0.0
        for operand_i, need in ((operand, op_need), (source, src_need)):
            c = _operand_cost(ctx, operand_i, s, window, moving, need)
            if c is None:
                return None
            total += c
        return total

    mid = choose_compute_sharding(ctx, inst, work, moving, identity, cost) \
        if work.is_tiled else work
    pv = _emit_select_and_scatter(ctx, inst, mid, window, moving, kind)
    return pv if mid == target else ctx.reshard(pv, target)


def _scatter_needs(operand: Instruction, source: Instruction):
    """``need(d, w, size, t)`` of the operand and of the source of a select-and-scatter
    (the geometry depends on both sizes)."""
    op_dims = [int(x) for x in operand.shape.dims]
    src_dims = [int(x) for x in source.shape.dims]

    def op_need(d: int, w: WindowDim, size: int, t: int, xt: int):
        _, _, starts, width, _, care = _scatter_need(w, size, src_dims[d], t)
        return starts, width, care

    def src_need(d: int, w: WindowDim, size: int, t: int, xt: int):
        first, count, _, _, windows, _ = _scatter_need(w, op_dims[d], size, t)
        return first, count, windows
    return op_need, src_need


def _emit_select_and_scatter(ctx: PartitionContext, inst: Instruction, s: HloSharding,
                             window: list[WindowDim], moving: Sequence[int],
                             kind: str | None) -> PValue:
    operand, source = inst.operands[0], inst.operands[1]
    rank = operand.shape.rank
    halo = _halo_dims(s, window, rank)
    init = ctx.operand(inst, 2, HloSharding.replicate())
    et = operand.shape.element_type
    fill = ctx.b.scalar(pad_value_identity(kind, et), init) if kind else init
    op_dims = [int(x) for x in operand.shape.dims]
    src_dims = [int(x) for x in source.shape.dims]
    op_need, src_need = _scatter_needs(operand, source)
    x = _windows_of(ctx, ctx.value(operand), s, window, moving, op_need, fill, operand)
    y = _windows_of(ctx, ctx.value(source), s, window, moving, src_need, init, source)
    local_window = list(window)
    for d in halo:
        w = window[d]
        local_window[d] = WindowDim(w.size, w.stride, 0, 0, w.window_dilation, 1,
                                    w.window_reversal)
    called = [ctx.clone(c) for c in inst.called_computations]
    r = ctx.b.op("select-and-scatter", [x, y, init], _local_window(inst, local_window),
                 called, name=inst.name)
    # Every device cut its own tile out of the window's result.
    st = tiles_of(s, rank)
    for d in halo:
        t = st[d]
        lsize = -(-op_dims[d] // t)
        _, _, starts, width, _, _ = _scatter_need(window[d], op_dims[d], src_dims[d], t)
        offsets = np.arange(t, dtype=np.int64) * lsize - starts
        low = max(0, -int(offsets.min()))
        high = max(0, int((offsets + lsize).max()) - width)
        r = _cut(ctx, r, d, low, high, offsets + low, lsize, tile_index_table(ctx, s, d))
    return PValue(r, inst.shape, s)


# -- shared bits ---------------------------------------------------------------------------------
def _leaf(ctx: PartitionContext, inst: Instruction, n: int) -> HloSharding | None:
    """The one plain array sharding every result leaf uses, or None."""
    s = ctx.sharding_of(inst)
    leaves = list(s.tuple_elements) if s.is_tuple else [s] * n
    first = leaves[0]
    if any(l != first for l in leaves) or first.is_manual or first.is_maximal or \
            first.is_manual_subgroup or \
            (first.is_tiled and first.subgroup_types and not first.replicate_on_last_tile_dim):
        return None
    return first


def _tuple_of(s: HloSharding, inst: Instruction, n: int) -> HloSharding:
    return HloSharding.tuple([s] * n) if inst.shape.is_tuple else s


def _note(ctx: PartitionContext, inst: Instruction, why: str) -> None:
    """A dim held whole where a window could not be exchanged (``why``): reported as the
    replicated fallback is, by name and opcode."""
    ctx.state.report.replicated_fallbacks.append((inst.name, inst.opcode))

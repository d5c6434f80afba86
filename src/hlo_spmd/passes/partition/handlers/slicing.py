"""Slice, pad, concatenate and reverse: ops that move elements along a dimension.

On a dimension the result is tiled along, every device needs a contiguous *window* of the
operand whose start is a function of its tile index (slice: ``start + stride * k * o``;
pad: ``k * o - low``; concatenate: ``k * o - offset``; reverse: ``D - (k + 1) * o``).
``exchange_window`` (the shared halo utility, partition/halo.py) fetches such windows
the way ``plan_window`` finds cheapest (bytes per device, then collectives):

* operand whole on the dimension: pad + dynamic-slice at a per-device offset (no traffic);
* operand tiled like the result: the window spans at most P consecutive source shards;
  piece p of every window (what it needs of shard ``first + p``) arrives by
  collective-permute rounds (no device sends twice in one permute; every sender cuts
  just the rows its receiver needs, at its own offset, so only the halo travels) or by
  one all-gather of the piece; the P pieces are concatenated and the window is cut out
  at a per-device offset. Or one all-gather of the whole dim, when that is cheaper.
  Nothing is sent for positions that are no real element or fall into the result's
  end padding.

Slice, pad and concatenate may instead compute in another sharding
(``choose_compute_sharding``): the tiling of a dim the op moves elements along goes to a
dim it leaves alone (one all-to-all; XLA's way for concatenate) or is dropped, the op
runs with that dim whole, and the result is resharded back -- when that moves fewer bytes
per device. Both sides are costed as the emitted collectives are (collectives/cost.py):
windows by ``plan_window``, reshards by ``reshard.reshard_cost``.

Window positions outside the operand hold garbage; handlers mask them (pad value,
concatenate operand choice) or they fall into the result's own end padding.
All per-device quantities are numpy tables indexed by tile index, looked up through
``partition-id`` (never a per-device loop in the emitted program).
"""
from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.primitive_types import element_bytes
from hlo_spmd.ir.shape import Shape
from hlo_spmd.passes.partition.causes import with_cause
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import handles
from hlo_spmd.passes.partition.reshard import reshard_cost, reshard_price
from hlo_spmd.passes.partition.support.strategy import Strategy, local_bytes
from hlo_spmd.sharding import HloSharding, partial_replicate, tile_shape
from hlo_spmd.passes.partition.halo import (  # noqa: F401  (the shared halo utility)
    _cut, _static_slice, device_scalar, exchange_window, mask_outside, plan_window,
    position_mask, select_from, tile_index_table, tiles_of)


# -- shardings ------------------------------------------------------------------------------
def compute_sharding(ctx: PartitionContext, inst: Instruction) -> HloSharding:
    """The sharding a handler produces: the instruction's, with single-device and
    other non-tiled kinds computed replicated (consumers reshard as they need)."""
    s = ctx.sharding_of(inst)
    if s.is_tiled or s.is_manual:
        return s
    return HloSharding.replicate()


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


# -- communication costs --------------------------------------------------------------------
def itemsize(shape: Shape) -> float:
    return element_bytes(shape.element_type)


def _rows_bytes(local: Sequence[int], dim: int, size: float) -> float:
    """Bytes of one row along ``dim`` of a local array of shape ``local``."""
    return float(math.prod(int(v) for i, v in enumerate(local) if i != dim)) * size


def _has_empty(*shapes) -> bool:
    return any(0 in tuple(s.dims) for s in shapes)


def _fallback(ctx: PartitionContext, inst: Instruction) -> PValue:
    from hlo_spmd.passes.partition.handlers.basic import handle_replicated

    return handle_replicated(ctx, inst)


# -- where to compute -----------------------------------------------------------------------
MAX_COMPUTE_CANDIDATES = 64


def move_tiling(s: HloSharding, d: int, e: int) -> HloSharding | None:
    """``s`` with the tiling of data dim ``d`` moved onto dim ``e`` as its minor factor (a
    device with tile indices ``i_d``, ``i_e`` gets ``i_e * t_d + i_d`` on ``e``: what one
    all-to-all produces); None for shardings with manual / other subgroups."""
    if not s.is_tiled or (s.subgroup_types and not s.replicate_on_last_tile_dim):
        return None
    ta = s.tile_assignment
    axes = [a for a in range(ta.ndim) if a != d]
    axes.insert(axes.index(e) + 1, d)
    shape = list(ta.dims)
    shape[e] *= shape[d]
    shape[d] = 1
    moved = ta.transpose(axes).reshape(shape)
    if s.replicate_on_last_tile_dim:
        return HloSharding.partial_tile(moved)
    return HloSharding.tile(moved)


def compute_candidates(target: HloSharding, moving: Sequence[int], identity: Sequence[int],
                       rank: int) -> list[HloSharding]:
    """Shardings to compute an op in instead of ``target``: every dim of ``moving`` (the
    dims the op moves elements along) that ``target`` tiles either keeps its tiling, hands
    it to a dim of ``identity`` (dims the op leaves alone; moved there and back by
    all-to-all) or drops it (replicated there: gathered before, cut after)."""
    if not target.is_tiled or target.is_manual_subgroup or \
            (target.subgroup_types and not target.replicate_on_last_tile_dim):
        return []
    tiles = tiles_of(target, rank)
    dims = [d for d in moving if tiles[d] > 1]
    if not dims:
        return []
    options = [["keep", "replicate"] + [e for e in identity if e != d] for d in dims]
    out: list[HloSharding] = []
    for combo in itertools.product(*options):
        if all(c == "keep" for c in combo):
            continue
        cand: HloSharding | None = target
        for d, c in zip(dims, combo):
            if not isinstance(c, str):
                cand = move_tiling(cand, d, c)
                if cand is None:
                    break
        if cand is None:
            continue
        rep = [d for d, c in zip(dims, combo) if c == "replicate"]
        if rep:
            cand = partial_replicate(cand, rep)
        if all(cand != o for o in out):
            out.append(cand)
        if len(out) >= MAX_COMPUTE_CANDIDATES:
            break
    return out


def scalar_starts(inst: Instruction, first: int) -> bool:
    """The start indices from operand ``first`` on are scalars (dynamic-(update-)slice)."""
    return all(o.shape.rank == 0 for o in inst.operands[first:])


def dynamic_slice_whole_layout(inst: Instruction, target: HloSharding) -> HloSharding:
    """``target`` with the sliced dims whole: what the generic dynamic-slice computes in
    (shapes.py), and what it asks of its operand."""
    operand = inst.operands[0]
    rank = operand.shape.rank
    sizes = list(inst.attrs.dynamic_slice_sizes)
    tiles = tiles_of(target, rank)
    sliced = [d for d in range(rank) if sizes[d] < operand.shape.dims[d]]
    return partial_replicate(target, [d for d in sliced if tiles[d] > 1]) \
        if target.is_tiled else target


def users_need(ctx: PartitionContext, inst: Instruction) -> list[HloSharding]:
    """Layouts the users of ``inst`` will reshard it to, where a user's handler is known
    to (a look-ahead for ``choose_compute_sharding``): a dynamic-slice reads its operand
    whole on the dims it slices (XLA's jnp.roll pattern, concatenate + dynamic-slice)."""
    out = []
    for user in ctx.state.readers("dynamic-slice").get(id(inst), ()):
        if user.operands[0] is inst and scalar_starts(user, 1):
            need = dynamic_slice_whole_layout(user, compute_sharding(ctx, user))
            if need.is_tiled or need.is_replicated:
                out.append(need)
    return out


def choose_compute_sharding(ctx: PartitionContext, inst: Instruction, target: HloSharding,
                            moving: Sequence[int], identity: Sequence[int],
                            cost) -> HloSharding:
    """The sharding to compute ``inst`` in: ``target`` (windows exchanged per tiled dim)
    unless computing in a candidate of ``compute_candidates`` and resharding the result to
    ``target`` moves fewer bytes per device. ``cost(s)``: the bytes computing in ``s``
    moves (operands resharded + windows), None when unknown. Users that will reshard the
    result (``users_need``) are priced too: from the candidate they need, the way back
    is remembered (the reshard cache's reverse entry) and costs nothing."""
    base = cost(target)
    if base is None or not inst.shape.is_array:
        return target  # (the way back is priced per array; several results stay put)
    dims, size, n = inst.shape.dims, itemsize(inst.shape), ctx.num_devices
    needs = users_need(ctx, inst) if target.is_tiled else []

    def later(s: HloSharding) -> float:
        return sum(0.0 if need in (s, target) else reshard_cost(dims, size, target, need, n)
                   for need in needs)

    base += later(target)
    if base <= 0:
        return target
    best, best_cost = target, base
    for cand in compute_candidates(target, moving, identity, inst.shape.rank):
        c = cost(cand)
        if c is None or c >= best_cost - 1e-6:
            continue
        back = reshard_cost(dims, size, cand, target, n)
        if c + back + later(cand) < best_cost - 1e-6:
            best, best_cost = cand, c + back + later(cand)
    return best


def _through(ctx: PartitionContext, inst: Instruction, target: HloSharding, moving,
             identity, cost, emit) -> PValue:
    mid = choose_compute_sharding(ctx, inst, target, moving, identity, cost)
    return _emit_in(ctx, inst, target, mid, emit)


def _emit_in(ctx: PartitionContext, inst: Instruction, target: HloSharding, mid: HloSharding,
             emit) -> PValue:
    pv = emit(ctx, inst, mid)
    return pv if mid is target else ctx.reshard(pv, target)


def through_strategy(ctx: PartitionContext, inst: Instruction, target: HloSharding, moving,
                     identity, cost, emit) -> Strategy:
    """``_through`` as a priced plan (for handlers that weigh it against a pattern of
    their own, e.g. rotate.py): its bytes are ``cost`` of the chosen compute sharding plus
    the reshard of the result to ``target`` (``inf`` when unknown); its largest new array
    the result's piece in either layout."""
    priced: dict[HloSharding, float | None] = {}

    def cost_once(s: HloSharding) -> float | None:  # (the chosen one is priced twice)
        if s not in priced:
            priced[s] = cost(s)
        return priced[s]

    mid = choose_compute_sharding(ctx, inst, target, moving, identity, cost_once)
    c = cost_once(mid)
    nbytes = math.inf if c is None else c
    if mid != target:
        nbytes += reshard_cost(inst.shape.dims, itemsize(inst.shape), mid, target,
                               ctx.num_devices)
    peak = max(local_bytes(inst.shape, mid), local_bytes(inst.shape, target))
    return Strategy(mid, nbytes, peak, lambda: _emit_in(ctx, inst, target, mid, emit))


def _operand_plan(ctx: PartitionContext, operand: Instruction, s: HloSharding,
                  dims: Sequence[int]) -> tuple[HloSharding, float | None, list[int]]:
    """(the operand sharding computing in ``s`` reads windows from, the bytes resharding
    the operand to it moves, its local shape)."""
    pv = ctx.value(operand)
    rank = operand.shape.rank
    xs = keep_only_tiled(s, pv.sharding, rank, dims)
    cost = reshard_price(ctx, pv, xs)[0]
    local = list(tile_shape(xs, operand.shape.dims) if xs.is_tiled else operand.shape.dims)
    return xs, cost, local


# -- slice ----------------------------------------------------------------------------------
def _slice_windows(inst: Instruction, s: HloSharding):
    """(dim, window starts, width, needed width) per dim ``s`` tiles."""
    rank = inst.shape.rank
    cfg = list(inst.attrs.slice_dimensions)
    tiles = tiles_of(s, rank)
    out_local = tile_shape(s, inst.shape.dims) if s.is_tiled else inst.shape.dims
    out = []
    for d in range(rank):
        if tiles[d] == 1:
            continue
        c, o, t = cfg[d], out_local[d], tiles[d]
        k = np.arange(t)
        care = np.clip(inst.shape.dims[d] - k * o, 0, o)
        need = np.where(care > 0, c.stride * (care - 1) + 1, 0)
        out.append((d, c.start + c.stride * o * k, c.stride * (o - 1) + 1, need))
    return out


def _slice_cost(ctx: PartitionContext, inst: Instruction, s: HloSharding) -> float | None:
    operand = inst.operands[0]
    rank = inst.shape.rank
    xs, cost, local = _operand_plan(ctx, operand, s, range(rank))
    if cost is None:
        return None
    xt = tiles_of(xs, rank)
    size = itemsize(operand.shape)
    for d, starts, width, need in _slice_windows(inst, s):
        plan = plan_window(xt[d], len(starts), local[d], operand.shape.dims[d], starts, width,
                           need)
        cost += plan.rows * _rows_bytes(local, d, size)
        local[d] = width
    return cost


def _slice_emit(ctx: PartitionContext, inst: Instruction, target: HloSharding) -> PValue:
    operand = inst.operands[0]
    rank = inst.shape.rank
    cfg = list(inst.attrs.slice_dimensions)
    xs = keep_only_tiled(target, ctx.value(operand).sharding, rank, range(rank))
    x = ctx.reshard(ctx.value(operand), xs).hlo
    starts = [c.start for c in cfg]
    limits = [c.limit for c in cfg]
    strides = [c.stride for c in cfg]
    for d, win_starts, width, need in _slice_windows(inst, target):
        tidx = tile_index_table(ctx, target, d)
        x = exchange_window(ctx, x, xs, target, d, operand.shape.dims[d], win_starts, width,
                            tidx, need)
        starts[d], limits[d] = 0, width
    if starts != [0] * rank or limits != list(x.shape.dims) or strides != [1] * rank:
        x = ctx.b.slice(x, starts, limits, strides, name=inst.name)
    return PValue(x, inst.shape, target)


@handles("slice")
def handle_slice(ctx: PartitionContext, inst: Instruction) -> PValue:
    target = compute_sharding(ctx, inst)
    operand = inst.operands[0]
    if _has_empty(operand.shape, inst.shape):
        return _fallback(ctx, inst)
    cfg = list(inst.attrs.slice_dimensions)
    identity = [d for d, c in enumerate(cfg)
                if c.start == 0 and c.stride == 1 and c.limit == operand.shape.dims[d]]
    moving = [d for d in range(inst.shape.rank) if d not in identity]
    from hlo_spmd.passes.partition.support.rotate import shift_or  # pipeline shifts

    return shift_or(ctx, inst, target, lambda: through_strategy(
        ctx, inst, target, moving, identity, lambda s: _slice_cost(ctx, inst, s), _slice_emit))


# -- pad ------------------------------------------------------------------------------------
def _pad_windows(inst: Instruction, s: HloSharding):
    """(dim, first operand index per tile, window width, needed width) per dim ``s``
    tiles."""
    rank = inst.shape.rank
    cfg = list(inst.attrs.padding_config.dimensions)
    tiles = tiles_of(s, rank)
    out_local = tile_shape(s, inst.shape.dims) if s.is_tiled else inst.shape.dims
    out = []
    for d in range(rank):
        if tiles[d] == 1:
            continue
        c = cfg[d]
        lo, step = c.edge_padding_low, c.interior_padding + 1
        o, t = out_local[d], tiles[d]
        k = np.arange(t)
        first = np.floor_divide(k * o - lo, step)              # first operand index needed
        last = np.floor_divide((k + 1) * o - 1 - lo, step)
        width = int((last - first).max()) + 1
        care = np.clip(inst.shape.dims[d] - k * o, 0, o)
        last_cared = np.floor_divide(k * o + care - 1 - lo, step)
        need = np.where(care > 0, np.clip(last_cared - first + 1, 0, width), 0)
        out.append((d, first, width, need))
    return out


def _pad_cost(ctx: PartitionContext, inst: Instruction, s: HloSharding) -> float | None:
    operand = inst.operands[0]
    rank = inst.shape.rank
    xs, cost, local = _operand_plan(ctx, operand, s, range(rank))
    if cost is None:
        return None
    xt = tiles_of(xs, rank)
    tiles = tiles_of(s, rank)
    out_local = tile_shape(s, inst.shape.dims) if s.is_tiled else inst.shape.dims
    for d in range(rank):
        if tiles[d] == 1:
            local[d] = inst.shape.dims[d]
    size = itemsize(operand.shape)
    for d, first, width, need in _pad_windows(inst, s):
        plan = plan_window(xt[d], len(first), local[d], operand.shape.dims[d], first, width,
                           need)
        cost += plan.rows * _rows_bytes(local, d, size)
        local[d] = out_local[d]
    return cost


def _pad_emit(ctx: PartitionContext, inst: Instruction, target: HloSharding) -> PValue:
    operand = inst.operands[0]
    b = ctx.b
    rank = inst.shape.rank
    cfg = list(inst.attrs.padding_config.dimensions)
    value = ctx.operand(inst, 1, HloSharding.replicate())
    xs = keep_only_tiled(target, ctx.value(operand).sharding, rank, range(rank))
    x = ctx.reshard(ctx.value(operand), xs).hlo
    tiles = tiles_of(target, rank)
    out_local = tile_shape(target, inst.shape.dims) if target.is_tiled else inst.shape.dims
    for d, first, width, need in _pad_windows(inst, target):
        c = cfg[d]
        lo, step = c.edge_padding_low, c.interior_padding + 1
        size = operand.shape.dims[d]
        out_size = inst.shape.dims[d]
        o, t = out_local[d], tiles[d]
        tidx = tile_index_table(ctx, target, d)
        k = np.arange(t)
        win = exchange_window(ctx, x, xs, target, d, size, first, width, tidx, need)
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
    # Dims the result holds whole: pad locally as written, after the exchanges (so the
    # halos travel without the padding).
    lows = [c.edge_padding_low if tiles[d] == 1 else 0 for d, c in enumerate(cfg)]
    highs = [c.edge_padding_high if tiles[d] == 1 else 0 for d, c in enumerate(cfg)]
    inter = [c.interior_padding if tiles[d] == 1 else 0 for d, c in enumerate(cfg)]
    if any(lows) or any(highs) or any(inter):
        x = b.pad(x, value, lows, highs, inter)
    return PValue(x, inst.shape, target)


@handles("pad")
def handle_pad(ctx: PartitionContext, inst: Instruction) -> PValue:
    target = compute_sharding(ctx, inst)
    operand = inst.operands[0]
    if _has_empty(operand.shape, inst.shape):
        return _fallback(ctx, inst)
    cfg = list(inst.attrs.padding_config.dimensions)
    identity = [d for d, c in enumerate(cfg)
                if c.edge_padding_low == 0 and c.edge_padding_high == 0
                and c.interior_padding == 0]
    moving = [d for d in range(inst.shape.rank) if d not in identity]
    return _through(ctx, inst, target, moving, identity,
                    lambda s: _pad_cost(ctx, inst, s), _pad_emit)


# -- concatenate ----------------------------------------------------------------------------
def _concat_cost(ctx: PartitionContext, inst: Instruction, s: HloSharding) -> float | None:
    rank = inst.shape.rank
    dim = inst.dimensions[0]
    tiles = tiles_of(s, rank)
    cost = 0.0
    if tiles[dim] == 1:
        # An operand listed twice is resharded once (the reshard cache hands the second
        # use the first one's result), so it is priced once.
        for op in dict.fromkeys(inst.operands):
            cost += reshard_price(ctx, ctx.value(op), s)[0]
        return cost
    o = tile_shape(s, inst.shape.dims)[dim]
    t = tiles[dim]
    k = np.arange(t)
    care = np.clip(inst.shape.dims[dim] - k * o, 0, o)
    offset = 0
    for op in inst.operands:
        size = op.shape.dims[dim]
        if size == 0:
            continue
        xs, c, local = _operand_plan(ctx, op, s, [dim])
        if c is None:
            return None
        plan = plan_window(tiles_of(xs, rank)[dim], t, local[dim], size, k * o - offset, o,
                           care)
        cost += c + plan.rows * _rows_bytes(local, dim, itemsize(op.shape))
        offset += size
    return cost


def _concat_emit(ctx: PartitionContext, inst: Instruction, target: HloSharding) -> PValue:
    rank = inst.shape.rank
    dim = inst.dimensions[0]
    tiles = tiles_of(target, rank)
    if tiles[dim] == 1:
        ops = [ctx.reshard(ctx.value(op), target).hlo for op in inst.operands]
        local = ctx.local_shape(inst.shape, target)
        return PValue(ctx.emit_like(inst, ops, local), inst.shape, target)
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
        x = ctx.reshard(pv, xs).hlo
        win = exchange_window(ctx, x, xs, target, dim, size, k * o - offset, o, tidx, care)
        result = win if result is None else select_from(ctx, result, win, dim, offset - k * o,
                                                        tidx, care)
        offset += size
    assert result is not None
    return PValue(result, inst.shape, target)


@handles("concatenate")
def handle_concatenate(ctx: PartitionContext, inst: Instruction) -> PValue:
    target = compute_sharding(ctx, inst)
    if _has_empty(inst.shape):
        return _fallback(ctx, inst)
    dim = inst.dimensions[0]
    identity = [d for d in range(inst.shape.rank) if d != dim]
    from hlo_spmd.passes.partition.support.rotate import rotate_or  # pipeline rotations

    return rotate_or(ctx, inst, target, lambda: through_strategy(
        ctx, inst, target, [dim], identity, lambda s: _concat_cost(ctx, inst, s), _concat_emit),
        lambda op: _slice_cost(ctx, op, ctx.value(op).sharding))


# -- reverse --------------------------------------------------------------------------------
@handles("reverse")
def handle_reverse(ctx: PartitionContext, inst: Instruction) -> PValue:
    from hlo_spmd.sharding import reverse_sharding

    target = compute_sharding(ctx, inst)
    operand = inst.operands[0]
    if _has_empty(inst.shape):
        return _fallback(ctx, inst)
    rank = inst.shape.rank
    rdims = inst.dimensions
    tiles = tiles_of(target, rank)
    sharded = [d for d in rdims if tiles[d] > 1]
    pv = ctx.value(operand)
    dims = operand.shape.dims
    out_local = tile_shape(target, inst.shape.dims) if target.is_tiled else inst.shape.dims
    if sharded and pv.sharding == reverse_sharding(target, sharded):
        # The operand tiled in mirrored order reverses locally into the reverse of the
        # padded array, which is the result shifted by the padding: even dims are done,
        # uneven ones move each tile's window by the padding (a halo from one neighbour).
        x = ctx.b.reverse(pv.hlo, rdims, name=inst.name)
        for d in sharded:
            o, t = out_local[d], tiles[d]
            pad = o * t - dims[d]
            if pad:
                x = exchange_window(ctx, x, target, target, d, o * t,
                                    pad + np.arange(t) * o, o, tile_index_table(ctx, target, d))
        return PValue(x, inst.shape, target)
    xs = keep_only_tiled(target, pv.sharding, rank, sharded)
    x = ctx.reshard(pv, xs).hlo
    for d in sharded:
        o, t = out_local[d], tiles[d]
        tidx = tile_index_table(ctx, target, d)
        x = exchange_window(ctx, x, xs, target, d, dims[d], dims[d] - (np.arange(t) + 1) * o,
                            o, tidx)
    return PValue(ctx.b.reverse(x, rdims, name=inst.name), inst.shape, target)

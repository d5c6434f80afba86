"""Slice, pad, concatenate and reverse: ops that move elements along a dimension.

On a dimension the result is tiled along, every device needs a contiguous *window* of the
operand whose start is a function of its tile index (slice: ``start + stride * k * o``;
pad: ``k * o - low``; concatenate: ``k * o - offset``; reverse: ``D - (k + 1) * o``).
``exchange_window`` fetches such windows the way ``plan_window`` finds cheapest (bytes
per device, then collectives):

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
windows by ``plan_window``, reshards by ``reshard_routes.plan_reshard``.

Window positions outside the operand hold garbage; handlers mask them (pad value,
concatenate operand choice) or they fall into the result's own end padding.
All per-device quantities are numpy tables indexed by tile index, looked up through
``partition-id`` (never a per-device loop in the emitted program).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.primitive_types import PrimitiveType, bit_width
from hlo_spmd.ir.shape import Shape
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.handlers.common import emit_like
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import handles
from hlo_spmd.passes.partition.reshard import gather_groups, pad_to
from hlo_spmd.passes.partition.reshard_routes import layout_of, plan_cost, plan_reshard
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


def _local_route(ctx: PartitionContext, src: HloSharding, target: HloSharding,
                 rank: int) -> list[int] | None:
    """The dims ``to_sharding`` cuts locally to go from ``src`` to ``target`` ([]: only the
    replication grouping differs), or None when it needs ``ctx.reshard``."""
    if src == target or not target.is_tiled:
        return None
    if not (src.is_tiled or src.is_replicated) or src.is_manual_subgroup \
            or target.is_manual_subgroup:
        return None
    st, tt = tiles_of(src, rank), target.tile_dims_for_data()
    refine = []
    for d in range(rank):
        if st[d] == 1:
            if tt[d] > 1:
                refine.append(d)
        elif st[d] != tt[d] or not _same_tiles_on(src, target, d, ctx):
            return None
    if not refine and not (src.is_tiled and _same_groups_ok(ctx, src, target, rank)):
        return None
    return refine


def to_sharding(ctx: PartitionContext, pv: PValue, target: HloSharding) -> PValue:
    """Reshard, cutting locally when ``target`` only refines ``pv``'s tiling: on every dim
    the source either holds the whole dim or is tiled exactly like the target."""
    if not pv.base_shape.is_array:
        return ctx.reshard(pv, target)
    rank = pv.base_shape.rank
    refine = _local_route(ctx, pv.sharding, target, rank)
    if refine is None:
        return ctx.reshard(pv, target)
    if not refine:
        # Same tiles on every tiled dim; only the replication grouping differs.
        return PValue(pv.hlo, pv.base_shape, target)
    tt = target.tile_dims_for_data()
    dims = pv.base_shape.dims
    local = tile_shape(target, dims)
    x = pv.hlo
    padded = [local[d] * tt[d] if d in refine else x.shape.dims[d] for d in range(rank)]
    x = pad_to(ctx, x, padded)
    table = device_offsets(target, dims, num_devices=ctx.num_devices)
    offsets = [ctx.logical_table(table[:, d]) if d in refine else 0 for d in range(rank)]
    sizes = [local[d] if d in refine else x.shape.dims[d] for d in range(rank)]
    return PValue(ctx.b.dynamic_slice(x, offsets, sizes), pv.base_shape, target)


# -- communication costs --------------------------------------------------------------------
def itemsize(shape: Shape) -> float:
    return bit_width(shape.element_type) / 8.0


def reshard_bytes(ctx: PartitionContext, src: HloSharding, dst: HloSharding,
                  shape: Shape) -> float | None:
    """Bytes per device ``ctx.reshard`` moves to take a value of ``shape`` from ``src`` to
    ``dst`` (the cheaper of its planned route and going through the replicated value,
    costed as collectives/cost.py does); None when the shardings are not plain tiled /
    replicated ones the planner handles."""
    if src == dst:
        return 0.0
    if not shape.is_array:
        return None
    rank = shape.rank
    if rank == 0 or any(int(d) == 0 for d in shape.dims):
        return None
    n = ctx.num_devices
    a, b = layout_of(src, n, rank), layout_of(dst, n, rank)
    if a is None or b is None:
        return None
    if a.same_as(b):
        return 0.0
    best, through = plan_reshard(a, b, shape.dims, itemsize(shape))
    if best is not None and best.key() < through.key():
        return plan_cost(best)
    return _replicate_bytes(a.tiles, shape)


def _replicate_bytes(tiles: Sequence[int], shape: Shape) -> float:
    """What ``reshard``'s route through the replicated value moves: one all-gather per
    tiled dim, in dim order, of the padded local array (the padding is sliced off only
    at the end); cutting the target's tile out of the replicated value is free."""
    local = [-(-int(d) // int(t)) for d, t in zip(shape.dims, tiles)]
    total = 0.0
    for k, t in enumerate(tiles):
        if t > 1:
            total += (t - 1) * math.prod(local) * itemsize(shape)
            local[k] *= t
    return total


def to_sharding_bytes(ctx: PartitionContext, src: HloSharding, dst: HloSharding,
                      shape: Shape) -> float | None:
    """Bytes per device ``to_sharding`` moves (0 when it cuts locally)."""
    if shape.is_array and _local_route(ctx, src, dst, shape.rank) is not None:
        return 0.0
    return reshard_bytes(ctx, src, dst, shape)


def _rows_bytes(local: Sequence[int], dim: int, size: float) -> float:
    """Bytes of one row along ``dim`` of a local array of shape ``local``."""
    return float(math.prod(int(v) for i, v in enumerate(local) if i != dim)) * size


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
@dataclass(eq=False)
class _Round:
    """One collective-permute of a piece: ``pairs`` (source tile, receiving tile) with
    distinct sources; tile s sends rows ``[send[s], send[s] + width)`` of the piece."""
    pairs: list[tuple[int, int]]
    send: np.ndarray
    width: int


@dataclass(eq=False)
class _Piece:
    """Every tile k receives rows ``[nlo[k], nhi[k])`` (of the ``[plo, phi)`` part) of the
    shard of tile ``src[k]`` where ``needed[k]``: ``own`` (nothing remote), by permute
    ``rounds``, or by one all-gather of the part (``gather``)."""
    src: np.ndarray
    needed: np.ndarray
    nlo: np.ndarray
    nhi: np.ndarray
    plo: int
    phi: int
    mode: str
    rounds: list[_Round]
    rows: float


@dataclass(eq=False)
class WindowPlan:
    """How ``exchange_window`` fetches the windows of one dim, and what it costs: ``rows``
    rows (elements along the dim) one device sends, in ``collectives`` collectives.

    kinds: ``same`` (every device's own shard), ``local`` (operand whole on the dim),
    ``gather`` (one all-gather of the whole dim), ``pieces`` (per source shard)."""
    kind: str
    rows: float
    collectives: int
    starts: np.ndarray
    width: int
    lsize: int
    size: int
    pieces: list[_Piece] = field(default_factory=list)
    first: np.ndarray | None = None
    real: np.ndarray | None = None

    def key(self) -> tuple[float, int]:
        return (self.rows, self.collectives)


def plan_window(xt: int, t: int, lsize: int, size: int, starts: np.ndarray, width: int,
                need: np.ndarray | None = None) -> WindowPlan:
    """The cheapest way (rows sent per device, then collectives) to give every tile k of
    ``t`` the operand elements ``[starts[k], starts[k] + width)`` of a dim of ``size``
    split ``xt`` ways (1 or ``t``) into local pieces of ``lsize``. Only the first
    ``need[k]`` elements of a window matter (default: all); the rest may be garbage."""
    starts = np.asarray(starts, dtype=np.int64)
    need = np.full(t, width, np.int64) if need is None else \
        np.clip(np.asarray(need, np.int64), 0, width)
    if xt == 1:
        return WindowPlan("local", 0.0, 0, starts, width, lsize, size)
    assert xt == t, (xt, t)
    k = np.arange(t)
    if width == lsize and np.array_equal(starts, k * lsize):
        return WindowPlan("same", 0.0, 0, starts, width, lsize, size)
    # Real elements each window needs, and the shards holding them.
    lo = np.maximum(starts, 0)
    hi = np.minimum(starts + need, size)
    real = lo < hi
    first = np.where(real, lo // lsize, np.clip(starts // lsize, 0, t - 1))
    last = np.where(real, (np.maximum(hi, 1) - 1) // lsize, first - 1)
    npieces = max(1, int((last - first).max()) + 1)
    pieces = []
    rows = 0.0
    count = 0
    for p in range(npieces):
        src = first + p
        needed = real & (src <= last)
        # The part of a source shard any receiver needs: only that part travels.
        nlo = np.maximum(lo - src * lsize, 0)
        nhi = np.minimum(hi - src * lsize, lsize)
        plo = int(nlo[needed].min()) if needed.any() else 0
        phi = int(nhi[needed].max()) if needed.any() else 1
        piece = _plan_piece(src, needed, nlo - plo, nhi - plo, plo, phi, t)
        rows += piece.rows
        count += 0 if piece.mode == "own" else \
            (1 if piece.mode == "gather" else len(piece.rounds))
        pieces.append(piece)
    plan = WindowPlan("pieces", rows, count, starts, width, lsize, size, pieces, first, real)
    # One all-gather of the whole dim (every window is then cut locally).
    whole = WindowPlan("gather", float((t - 1) * lsize), 1, starts, width, lsize, size)
    return whole if whole.key() < plan.key() else plan


def _plan_piece(src: np.ndarray, needed: np.ndarray, nlo: np.ndarray, nhi: np.ndarray,
                plo: int, phi: int, t: int) -> _Piece:
    """Rounds of collective-permutes with distinct senders, each sending only the rows
    its receivers need (at a per-sender offset), or one all-gather of the part when
    that sends fewer rows (ties: fewer collectives)."""
    k = np.arange(t)
    remote = needed & (src != k)
    pw = phi - plo
    if not remote.any():
        return _Piece(src, needed, nlo, nhi, plo, phi, "own", [], 0.0)
    by_round: list[list[tuple[int, int]]] = []
    senders: list[set[int]] = []
    # Widest needs first, so that rounds carry receivers of similar widths.
    order = sorted(np.nonzero(remote)[0], key=lambda r: (-(int(nhi[r]) - int(nlo[r])), r))
    for kk in order:
        s = int(src[kk])
        r = next((i for i, used in enumerate(senders) if s not in used), len(senders))
        if r == len(senders):
            senders.append(set())
            by_round.append([])
        senders[r].add(s)
        by_round[r].append((s, int(kk)))
    rounds = []
    rows = 0.0
    for pairs in by_round:
        receivers = [d_ for _, d_ in pairs]
        w = int((nhi[receivers] - nlo[receivers]).max())
        send = np.zeros(t, np.int64)
        for s_, d_ in pairs:
            send[s_] = min(int(nlo[d_]), pw - w)
        rounds.append(_Round(sorted(pairs, key=lambda q: q[1]), send, w))
        rows += w
    gather_rows = float((t - 1) * pw)
    if (gather_rows, 1) < (rows, len(rounds)):
        return _Piece(src, needed, nlo, nhi, plo, phi, "gather", [], gather_rows)
    return _Piece(src, needed, nlo, nhi, plo, phi, "permute", rounds, rows)


def exchange_window(ctx: PartitionContext, x: Instruction, xs: HloSharding, cs: HloSharding,
                    dim: int, size: int, starts: np.ndarray, width: int,
                    tidx: np.ndarray, need: np.ndarray | None = None) -> Instruction:
    """Per device (tile index k along ``dim`` of the result sharding ``cs``) the operand
    elements ``[starts[k], starts[k] + width)`` along ``dim``; garbage outside ``[0, size)``
    and past the first ``need[k]`` elements (default: none past).

    ``x`` is the local piece with sharding ``xs``, which either holds ``dim`` whole or
    tiles it exactly as ``cs`` does (tile indices ``tidx`` per logical device). Devices
    exchange with the devices that differ from them only along ``dim`` *in ``cs``*: on
    dims handled before, every device already holds its ``cs`` window."""
    t = len(starts)
    xt = tiles_of(xs, x.shape.rank)[dim]
    plan = plan_window(xt, t, x.shape.dims[dim], size, starts, width, need)
    return emit_window(ctx, x, plan, cs, dim, tidx)


def emit_window(ctx: PartitionContext, x: Instruction, plan: WindowPlan, cs: HloSharding,
                dim: int, tidx: np.ndarray) -> Instruction:
    """The windows of ``plan`` from the local piece ``x`` (see ``exchange_window``)."""
    b = ctx.b
    starts, width, lsize = plan.starts, plan.width, plan.lsize
    t = len(starts)
    if plan.kind == "same":
        return x
    if plan.kind == "local":
        # Whole on this device: cut the window out (padding for out-of-range reads).
        low = max(0, -int(starts.min()))
        high = max(0, int((starts + width).max()) - lsize)
        return _cut(ctx, x, dim, low, high, starts + low, width, tidx)
    groups = gather_groups(cs, dim)
    if plan.kind == "gather":
        full = ctx.f.all_gather(x, dim, groups)
        low = max(0, -int(starts.min()))
        high = max(0, int((starts + width).max()) - t * lsize)
        return _cut(ctx, full, dim, low, high, starts + low, width, tidx)
    pieces = []
    total = 0
    for piece in plan.pieces:
        part = _static_slice(ctx, x, dim, piece.plo, piece.phi)
        total += piece.phi - piece.plo
        pieces.append(_fetch_piece(ctx, part, dim, piece, groups, tidx))
    window = pieces[0] if len(pieces) == 1 else b.concatenate(pieces, dim)
    # window[j] is element first*lsize + plo0 + j (on windows with real elements; joins
    # between pieces are whole shards); pad where a window reaches past the pieces.
    begin = plan.first * lsize + plan.pieces[0].plo
    real = plan.real
    low = max(0, int((begin - starts)[real].max())) if real.any() else 0
    high = max(0, int((starts + width - begin)[real].max()) - total) if real.any() else 0
    high = max(high, width - total - low)
    offsets = np.where(real, starts - begin + low, 0)
    return _cut(ctx, window, dim, low, high, offsets, width, tidx)


def _fetch_piece(ctx: PartitionContext, part: Instruction, dim: int, piece: _Piece,
                 groups: np.ndarray, tidx: np.ndarray) -> Instruction:
    """Every device (tile k) receives ``part`` of tile ``src[k]`` where ``needed[k]``
    (anything elsewhere; only ``[nlo[k], nhi[k])`` along ``dim`` matters), as planned."""
    b = ctx.b
    src, needed = piece.src, piece.needed
    t = len(src)
    k = np.arange(t)
    if piece.mode == "own":
        return part
    dims = part.shape.dims
    pw = dims[dim]
    if piece.mode == "gather":
        gathered = ctx.f.all_gather(part, dim, groups)
        offsets = np.where(needed, np.clip(src, 0, t - 1), 0) * pw
        return _cut(ctx, gathered, dim, 0, 0, offsets, pw, tidx)
    received = []
    choice = np.full(t, -1, dtype=np.int64)
    for r, rnd in enumerate(piece.rounds):
        logical = np.concatenate([np.stack([groups[:, s_], groups[:, d_]], axis=1)
                                  for s_, d_ in rnd.pairs])
        senders = np.asarray([s_ for s_, _ in rnd.pairs], np.int64)
        receivers = np.asarray([d_ for _, d_ in rnd.pairs], np.int64)
        choice[receivers] = r
        w = rnd.width
        sent_off = rnd.send[senders]
        if np.all(sent_off == sent_off[0]):
            out = _static_slice(ctx, part, dim, int(sent_off[0]), int(sent_off[0]) + w)
        else:
            out = _cut(ctx, part, dim, 0, 0, rnd.send, w, tidx)
        got = ctx.f.collective_permute(out, logical)
        # Back to part coordinates: the rows received by tile d start at its sender's
        # offset.
        roff = np.zeros(t, np.int64)
        roff[receivers] = sent_off
        if w != pw:
            lowp = int(roff[receivers].max())
            highp = int((pw - w - roff[receivers]).max())
            offs = np.full(t, lowp - int(roff[receivers[0]]), np.int64)
            offs[receivers] = lowp - roff[receivers]
            got = _cut(ctx, got, dim, lowp, highp, offs, pw, tidx)
        received.append(got)
    out = received[0]
    for r in range(1, len(received)):
        out = b.select(device_pred(ctx, choice == r, tidx, dims), received[r], out)
    own = needed & (src == k)
    if own.any():
        out = b.select(device_pred(ctx, own, tidx, dims), part, out)
    return out


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


def choose_compute_sharding(ctx: PartitionContext, inst: Instruction, target: HloSharding,
                            moving: Sequence[int], identity: Sequence[int],
                            cost) -> HloSharding:
    """The sharding to compute ``inst`` in: ``target`` (windows exchanged per tiled dim)
    unless computing in a candidate of ``compute_candidates`` and resharding the result to
    ``target`` moves fewer bytes per device. ``cost(s)``: the bytes computing in ``s``
    moves (operands resharded + windows), None when unknown."""
    base = cost(target)
    if base is None or base <= 0:
        return target
    best, best_cost = target, base
    for cand in compute_candidates(target, moving, identity, inst.shape.rank):
        c = cost(cand)
        if c is None or c >= best_cost - 1e-6:
            continue
        back = to_sharding_bytes(ctx, cand, target, inst.shape)
        if back is not None and c + back < best_cost - 1e-6:
            best, best_cost = cand, c + back
    return best


def _through(ctx: PartitionContext, inst: Instruction, target: HloSharding, moving,
             identity, cost, emit) -> PValue:
    mid = choose_compute_sharding(ctx, inst, target, moving, identity, cost)
    pv = emit(ctx, inst, mid)
    return pv if mid is target else to_sharding(ctx, pv, target)


def _operand_plan(ctx: PartitionContext, operand: Instruction, s: HloSharding,
                  dims: Sequence[int]) -> tuple[HloSharding, float | None, list[int]]:
    """(the operand sharding computing in ``s`` reads windows from, the bytes resharding
    the operand to it moves, its local shape)."""
    pv = ctx.value(operand)
    rank = operand.shape.rank
    xs = keep_only_tiled(s, pv.sharding, rank, dims)
    cost = to_sharding_bytes(ctx, pv.sharding, xs, operand.shape)
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
    x = to_sharding(ctx, ctx.value(operand), xs).hlo
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
    from hlo_spmd.passes.partition.handlers.rotate import shift_or  # pipeline shifts

    return shift_or(ctx, inst, target, lambda: _through(
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
    x = to_sharding(ctx, ctx.value(operand), xs).hlo
    tiles = tiles_of(target, rank)
    # Dims the result holds whole: pad locally as written.
    lows = [c.edge_padding_low if tiles[d] == 1 else 0 for d, c in enumerate(cfg)]
    highs = [c.edge_padding_high if tiles[d] == 1 else 0 for d, c in enumerate(cfg)]
    inter = [c.interior_padding if tiles[d] == 1 else 0 for d, c in enumerate(cfg)]
    if any(lows) or any(highs) or any(inter):
        x = b.pad(x, value, lows, highs, inter)
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
        for op in inst.operands:
            c = to_sharding_bytes(ctx, ctx.value(op).sharding, s, op.shape)
            if c is None:
                return None
            cost += c
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
        ops = [to_sharding(ctx, ctx.value(op), target).hlo for op in inst.operands]
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
    from hlo_spmd.passes.partition.handlers.rotate import rotate_or  # pipeline rotations

    return rotate_or(ctx, inst, target, lambda: _through(
        ctx, inst, target, [dim], identity, lambda s: _concat_cost(ctx, inst, s), _concat_emit))


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

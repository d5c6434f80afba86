"""Halo exchange: every partition gets the window of an operand it needs along a dim
(GSPMD section 4.3 and appendix A.2; XLA's ExchangeHalo / ExchangeHaloAndGetValidData
and the window logic of spmd_partitioner_util).

A handler says, per tile index k of the result along a dim, which operand elements
``[starts[k], starts[k] + width)`` it needs (the start may depend on k in any way: stride,
low / high / negative padding, window dilation, slicing, padding, concatenation).
``plan_window`` finds the cheapest way (rows sent per device, then collectives):

* operand whole on the dim: pad + dynamic-slice at a per-device offset (no traffic);
* operand tiled like the result: the window spans P consecutive source shards; piece p
  of every window (what it needs of shard ``first + p``) arrives by collective-permute
  rounds -- per side only the largest halo any partition needs is sent, each sender cuts
  just the rows its receiver needs, and pieces wider than a shard come from shards
  further away (multi-hop) -- or by one all-gather of the piece; the pieces are
  concatenated and the window is cut out at a partition-dependent offset. Or one
  all-gather of the whole dim, when that is cheaper.

The operand may tile the dim in another device order than the result (a reversed
window's kernel tiled ``{devices=[2]1,0}`` next to an input tiled ``0,1``):
``source_order`` finds which result tile holds each operand tile, and the pieces travel
between those devices, with no reshard to the result's order first.

Window positions outside the operand hold garbage; ``mask_outside`` replaces them by the
op's identity (0 for convolution, the init value for reduce-window, the pad value).
All per-device quantities are numpy tables indexed by tile index, looked up through
``partition-id`` (never a per-device loop in the emitted program). Used by slicing.py
(slice, pad, concatenate, reverse), convolution.py and windows.py.
"""
from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.passes.dot_conv_dims import WindowDim
from hlo_spmd.passes.partition.causes import with_cause
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.reshard import gather_groups
from hlo_spmd.sharding import HloSharding

S32 = PrimitiveType.S32


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



def source_order(ctx: PartitionContext, xs: HloSharding, cs: HloSharding, dim: int,
                 rank: int) -> np.ndarray | None:
    """``order[j]``: the tile index along ``dim`` in ``cs`` of the devices holding tile
    ``j`` of ``xs``, when ``xs`` tiles ``dim`` as many ways as ``cs`` in another device
    order that is the same in every group of ``cs`` and holds every other dim whole or
    tiled exactly as ``cs`` does (so each group's devices hold the same rows of the other
    dims and trade pieces of ``dim`` only); None when the order is the same or no such
    relabelling exists."""
    if not (xs.is_tiled and cs.is_tiled) or xs == cs:
        return None   # (equal shardings: the same order, no tables to compare)
    xt, ct = tiles_of(xs, rank), tiles_of(cs, rank)
    t = ct[dim]
    if xt[dim] != t or t == 1:
        return None
    for d in range(rank):
        if d != dim and xt[d] != 1 and (xt[d] != ct[d] or not np.array_equal(
                tile_index_table(ctx, xs, d), tile_index_table(ctx, cs, d))):
            return None
    src, dst = tile_index_table(ctx, xs, dim), tile_index_table(ctx, cs, dim)
    order = np.full(t, -1, np.int64)
    order[src] = dst
    if not np.array_equal(order[src], dst) or np.array_equal(order, np.arange(t)):
        return None
    return order


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
def _read_only(*arrays: np.ndarray | None) -> None:
    """Plans are shared (``plan_window`` remembers them), so their tables are frozen: a
    caller that wrote into one would change every later plan of the same window."""
    for a in arrays:
        if a is not None:
            a.flags.writeable = False


# Plain ``__slots__`` records (identity equality, as ``dataclass(eq=False)`` had): a
# dataclass costs ~0.75 ms to create at import.
class _Round:
    """One collective-permute of a piece: ``pairs`` (source tile, receiving tile) with
    distinct sources; tile s sends rows ``[send[s], send[s] + width)`` of the piece."""
    __slots__ = ("pairs", "send", "width")

    def __init__(self, pairs: list[tuple[int, int]], send: np.ndarray, width: int) -> None:
        self.pairs = pairs
        self.send = send
        self.width = width
        _read_only(send)


class _Piece:
    """Every tile k receives rows ``[nlo[k], nhi[k])`` (of the ``[plo, phi)`` part) of the
    shard of tile ``src[k]`` where ``needed[k]``: ``own`` (nothing remote), by permute
    ``rounds``, or by one all-gather of the part (``gather``)."""
    __slots__ = ("src", "needed", "nlo", "nhi", "plo", "phi", "mode", "rounds", "rows")

    def __init__(self, src: np.ndarray, needed: np.ndarray, nlo: np.ndarray,
                 nhi: np.ndarray, plo: int, phi: int, mode: str, rounds: list[_Round],
                 rows: float) -> None:
        self.src = src
        self.needed = needed
        self.nlo = nlo
        self.nhi = nhi
        self.plo = plo
        self.phi = phi
        self.mode = mode
        self.rounds = rounds
        self.rows = rows
        _read_only(src, needed, nlo, nhi)


class WindowPlan:
    """How ``exchange_window`` fetches the windows of one dim, and what it costs: ``rows``
    rows (elements along the dim) one device sends, in ``collectives`` collectives.

    kinds: ``same`` (every device's own shard), ``local`` (operand whole on the dim),
    ``gather`` (one all-gather of the whole dim), ``pieces`` (per source shard)."""
    __slots__ = ("kind", "rows", "collectives", "starts", "width", "lsize", "size",
                 "pieces", "first", "real", "order")

    def __init__(self, kind: str, rows: float, collectives: int, starts: np.ndarray,
                 width: int, lsize: int, size: int, pieces: list[_Piece] | None = None,
                 first: np.ndarray | None = None, real: np.ndarray | None = None,
                 order: np.ndarray | None = None) -> None:
        self.kind = kind
        self.rows = rows
        self.collectives = collectives
        self.starts = starts
        self.width = width
        self.lsize = lsize
        self.size = size
        self.pieces = [] if pieces is None else pieces
        self.first = first
        self.real = real
        self.order = order
        _read_only(starts, first, real, order)

    def key(self) -> tuple[float, int]:
        return (self.rows, self.collectives)


def plan_window(xt: int, t: int, lsize: int, size: int, starts: np.ndarray, width: int,
                need: np.ndarray | None = None,
                order: np.ndarray | None = None) -> WindowPlan:
    """The cheapest way (rows sent per device, then collectives) to give every tile k of
    ``t`` the operand elements ``[starts[k], starts[k] + width)`` of a dim of ``size``
    split ``xt`` ways (1 or ``t``) into local pieces of ``lsize``. Only the first
    ``need[k]`` elements of a window matter (default: all); the rest may be garbage.
    ``order`` (``source_order``): operand tile j sits on the devices of tile
    ``order[j]`` (default: on those of tile j).

    A plan depends on these numbers only, and a model's layers ask for the same windows
    again (each convolution and slice is planned by its strategy choice, then emitted):
    plans are remembered by their arguments and shared, so callers only read them."""
    return _plan_window(int(xt), int(t), int(lsize), int(size), _ints(starts), int(width),
                        None if need is None else _ints(need),
                        None if order is None else _ints(order))


def _ints(values: np.ndarray | Sequence[int]) -> tuple[int, ...]:
    return tuple(np.asarray(values, np.int64).tolist())


@functools.lru_cache(maxsize=1 << 12)
def _plan_window(xt: int, t: int, lsize: int, size: int, starts_: tuple[int, ...],
                 width: int, need_: tuple[int, ...] | None,
                 order_: tuple[int, ...] | None) -> WindowPlan:
    starts = np.asarray(starts_, dtype=np.int64)
    need = np.full(t, width, np.int64) if need_ is None else \
        np.clip(np.asarray(need_, np.int64), 0, width)
    order = None if order_ is None else np.asarray(order_, np.int64)
    if xt == 1:
        return WindowPlan("local", 0.0, 0, starts, width, lsize, size)
    assert xt == t, (xt, t)
    k = np.arange(t)
    if order is None and width == lsize and np.array_equal(starts, k * lsize):
        return WindowPlan("same", 0.0, 0, starts, width, lsize, size)
    at = k if order is None else order
    # Real elements each window needs, and the shards holding them.
    lo = np.maximum(starts, 0)
    hi = np.minimum(starts + need, size)
    real = lo < hi
    # Two ways to number each window's pieces. (a) From the shard holding its first real
    # element (a window starting in the low padding counts from the shard before, like
    # its neighbours). (b) The same offset from the own shard on every device (XLA's
    # halo per side): piece p comes from the same neighbour everywhere, so one permute
    # per side carries the largest halo any device needs. The cheaper wins.
    firsts = [np.where(real, np.maximum(starts // lsize, lo // lsize - 1),
                       np.clip(starts // lsize, 0, t - 1))]
    if real.any() and order is None:
        shift = int((lo // lsize - k)[real].min())
        firsts.append(np.where(real, k + shift, firsts[0]))
    plan = None
    for first in firsts:
        cand = _pieces_plan(first, lo, hi, real, starts, width, lsize, size, t, at)
        if plan is None or cand.key() < plan.key():
            plan = cand
    assert plan is not None
    plan.order = order
    if order is not None:
        return plan  # (a whole-dim all-gather would concatenate the tiles out of order)
    # One all-gather of the whole dim (every window is then cut locally).
    whole = WindowPlan("gather", float((t - 1) * lsize), 1, starts, width, lsize, size)
    return whole if whole.key() < plan.key() else plan


def _pieces_plan(first: np.ndarray, lo: np.ndarray, hi: np.ndarray, real: np.ndarray,
                 starts: np.ndarray, width: int, lsize: int, size: int, t: int,
                 at: np.ndarray) -> WindowPlan:
    """The ``pieces`` plan when window k's piece p comes from shard ``first[k] + p``
    (held by the devices of tile ``at[shard]``)."""
    last = np.where(real, (np.maximum(hi, 1) - 1) // lsize, first - 1)
    npieces = max(1, int((last - first).max()) + 1)
    pieces = []
    rows = 0.0
    count = 0
    for p in range(npieces):
        src = first + p
        needed = real & (src <= last) & (src >= lo // lsize)
        # The part of a source shard any receiver needs: only that part travels.
        nlo = np.maximum(lo - src * lsize, 0)
        nhi = np.minimum(hi - src * lsize, lsize)
        plo = int(nlo[needed].min()) if needed.any() else 0
        phi = int(nhi[needed].max()) if needed.any() else 1
        piece = _plan_piece(src, needed, nlo - plo, nhi - plo, plo, phi, t, at)
        rows += piece.rows
        count += 0 if piece.mode == "own" else \
            (1 if piece.mode == "gather" else len(piece.rounds))
        pieces.append(piece)
    return WindowPlan("pieces", rows, count, starts, width, lsize, size, pieces, first, real)


def _plan_piece(src: np.ndarray, needed: np.ndarray, nlo: np.ndarray, nhi: np.ndarray,
                plo: int, phi: int, t: int, at: np.ndarray) -> _Piece:
    """Rounds of collective-permutes with distinct senders, each sending only the rows
    its receivers need (at a per-sender offset), or one all-gather of the part when
    that sends fewer rows (ties: fewer collectives). Shard j is on tile ``at[j]``."""
    k = np.arange(t)
    remote = needed & (at[np.clip(src, 0, t - 1)] != k)
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


# -- windows over a base-dilated dim ------------------------------------------------------------
def dilated_window_need(w: WindowDim, size: int, t: int, cost=None):
    """(input start per output tile, input width, the per-tile window, extra output rows
    per tile): the input elements output tile k of ``t`` reads, and the one window (the
    same on every tile) that computes the tile from them, preceded by ``extra[k]`` output
    rows the tile drops.

    Output row ``o`` reads dilated positions from ``o * stride - padding_low`` (input
    element ``i`` sits at ``i * d``, ``d`` the base dilation), so tile k starts at
    ``q[k] = k * per * stride - padding_low``. A tile running the window with static low
    padding ``P`` from element ``f[k]`` produces, at local row ``e``, the global row
    starting at ``f[k] * d - P + e * stride``; it needs ``f[k] * d + e[k] * stride =
    q[k] + P`` and no input element hidden by the local padding (``P - e[k] * stride <
    d``). Without base dilation ``P = 0, e = 0``. With it, when ``per * stride`` is a
    multiple of ``d`` one ``P`` gives ``e = 0`` on every tile (XLA's first case); else the
    tiles' phases differ and some compute a few extra rows: stride 1 takes the largest
    low padding any tile needs (XLA's second case), a non-unit stride a ``P`` that puts
    every tile's first row on the stride grid (XLA's third, extra window padding). The
    ``P`` whose windows are cheapest to exchange (``cost(starts, width)``, when given:
    tiles out of phase may need a halo on one side only), then with the fewest extra
    rows, then the narrowest input window, wins."""
    per = -(-w.output_size(size) // t)
    d, s = w.base_dilation, w.stride
    q = np.arange(t, dtype=np.int64) * per * s - w.padding_low
    if per == 0:
        first = -(-q // d)
        return first, 0, WindowDim(w.size, s, 0, 0, w.window_dilation, d,
                                   w.window_reversal), np.zeros(t, np.int64)
    best = None
    # (P + stride, e + 1) is the same tiling with one more row on every tile, and any
    # P >= d forces e >= 1: the best P is below max(d, stride).
    for p in range(max(d, s)):
        e_min = max(0, (p - d) // s + 1)
        cand = np.arange(e_min, e_min + d, dtype=np.int64)            # one period of e
        ok = (q[:, None] + p - cand[None, :] * s) % d == 0
        if not ok.any(axis=1).all():
            continue                                   # some tile has no such e
        extra = cand[np.argmax(ok, axis=1)]
        last = (int(extra.max()) + per - 1) * s - p + w.span - 1     # last position read
        if last < 0:
            continue
        count = last // d + 1
        moved = cost((q + p - extra * s) // d, count) if cost is not None else ()
        key = (moved, int(extra.max()), count, p)
        if best is None or key < best[0]:
            best = (key, p, extra, last)
    assert best is not None, (w, size, t)
    _, p, extra, last = best
    first = (q + p - extra * s) // d
    count = last // d + 1
    high = last - (count - 1) * d
    return first, count, WindowDim(w.size, s, p, high, w.window_dilation, d,
                                   w.window_reversal), extra


def drop_extra_rows(ctx: PartitionContext, x: Instruction, dim: int, extra: np.ndarray,
                     tidx: np.ndarray) -> Instruction:
    """The tile's output rows: skip the ``extra[k]`` leading rows tile k computed."""
    zero = ctx.b.constant(np.int64(0), S32)
    idx = [zero] * x.shape.rank
    idx[dim] = device_scalar(ctx, extra, tidx)
    sizes = list(x.shape.dims)
    sizes[dim] -= int(extra.max())
    return ctx.b.dynamic_slice(x, idx, sizes)


def exchange_window(ctx: PartitionContext, x: Instruction, xs: HloSharding, cs: HloSharding,
                    dim: int, size: int, starts: np.ndarray, width: int,
                    tidx: np.ndarray, need: np.ndarray | None = None) -> Instruction:
    """Per device (tile index k along ``dim`` of the result sharding ``cs``) the operand
    elements ``[starts[k], starts[k] + width)`` along ``dim``; garbage outside ``[0, size)``
    and past the first ``need[k]`` elements (default: none past).

    ``x`` is the local piece with sharding ``xs``, which either holds ``dim`` whole or
    tiles it as ``cs`` does (tile indices ``tidx`` per logical device), possibly in
    another device order (``source_order``). Devices
    exchange with the devices that differ from them only along ``dim`` *in ``cs``*: on
    dims handled before, every device already holds its ``cs`` window."""
    t = len(starts)
    xt = tiles_of(xs, x.shape.rank)[dim]
    order = source_order(ctx, xs, cs, dim, x.shape.rank)
    plan = plan_window(xt, t, x.shape.dims[dim], size, starts, width, need, order)
    return emit_window(ctx, x, plan, cs, dim, tidx)


@with_cause("halo")
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
        pieces.append(_fetch_piece(ctx, part, dim, piece, groups, tidx, plan.order))
    window = pieces[0] if len(pieces) == 1 else b.concatenate(pieces, dim)
    # On a window with real elements, window[j] is element begin + j from its first real
    # piece on (joins between pieces are whole shards); pad where a window reaches past
    # the pieces.
    real = plan.real
    widths = np.asarray([pc.phi - pc.plo for pc in plan.pieces], np.int64)
    offs = np.concatenate([[0], np.cumsum(widths)[:-1]])
    plos = np.asarray([pc.plo for pc in plan.pieces], np.int64)
    lo_real = np.maximum(starts, 0)
    p0 = np.clip(lo_real // lsize - plan.first, 0, len(plan.pieces) - 1)
    begin = (plan.first + p0) * lsize + plos[p0] - offs[p0]
    low = max(0, int((begin - starts)[real].max())) if real.any() else 0
    high = max(0, int((starts + width - begin)[real].max()) - total) if real.any() else 0
    high = max(high, width - total - low)
    offsets = np.where(real, starts - begin + low, 0)
    return _cut(ctx, window, dim, low, high, offsets, width, tidx)


def _fetch_piece(ctx: PartitionContext, part: Instruction, dim: int, piece: _Piece,
                 groups: np.ndarray, tidx: np.ndarray,
                 order: np.ndarray | None = None) -> Instruction:
    """Every device (tile k) receives ``part`` of shard ``src[k]`` where ``needed[k]``
    (anything elsewhere; only ``[nlo[k], nhi[k])`` along ``dim`` matters), as planned.
    Shard j is on the devices of tile ``order[j]`` (default: j)."""
    b = ctx.b
    src, needed = piece.src, piece.needed
    t = len(src)
    k = np.arange(t)
    at = k if order is None else order
    if piece.mode == "own":
        return part
    dims = part.shape.dims
    pw = dims[dim]
    if piece.mode == "gather":
        gathered = ctx.f.all_gather(part, dim, groups)
        offsets = np.where(needed, at[np.clip(src, 0, t - 1)], 0) * pw
        return _cut(ctx, gathered, dim, 0, 0, offsets, pw, tidx)
    received = []
    choice = np.full(t, -1, dtype=np.int64)
    for r, rnd in enumerate(piece.rounds):
        logical = np.concatenate([np.stack([groups[:, at[s_]], groups[:, d_]], axis=1)
                                  for s_, d_ in rnd.pairs])
        senders = np.asarray([s_ for s_, _ in rnd.pairs], np.int64)
        receivers = np.asarray([d_ for _, d_ in rnd.pairs], np.int64)
        choice[receivers] = r
        w = rnd.width
        sent_off = rnd.send[senders]
        if np.all(sent_off == sent_off[0]):
            out = _static_slice(ctx, part, dim, int(sent_off[0]), int(sent_off[0]) + w)
        else:
            # Indexed by the sender's tile in ``cs`` (shard j sends from tile at[j]).
            send = np.zeros(t, np.int64)
            send[at] = rnd.send
            out = _cut(ctx, part, dim, 0, 0, send, w, tidx)
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
    own = needed & (at[np.clip(src, 0, t - 1)] == k)
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
    """Pad ``x`` by ``low``/``high`` along ``dim``, then take ``width`` at ``offsets[k]``.

    The padded array itself is never built when the window is narrower than ``x``: a
    window-sized piece is cut first (its start clamped into ``x``, so it still holds
    every in-range element the window reads), and only that piece is padded. Same
    values, and nothing larger than ``width`` plus the padding a window reaches is
    materialised."""
    b = ctx.b
    rank = x.shape.rank
    size = x.shape.dims[dim]
    offsets = np.asarray(offsets, np.int64)
    if (low or high) and width < size:
        starts = offsets - low  # window starts in x's coordinates
        clamped = np.clip(starts, 0, size - width)
        x = _take(ctx, x, dim, clamped, width, tidx)
        within = starts - clamped  # where each window starts in the piece
        low, high = max(0, -int(within.min())), max(0, int(within.max()))
        offsets = within + low
    if low or high:
        lows = [0] * rank
        highs = [0] * rank
        lows[dim], highs[dim] = low, high
        x = b.pad(x, b.scalar(0, x), lows, highs)
    return _take(ctx, x, dim, offsets, width, tidx)


def _take(ctx: PartitionContext, x: Instruction, dim: int, offsets: np.ndarray, width: int,
          tidx: np.ndarray) -> Instruction:
    """``width`` elements of ``x`` along ``dim`` from ``offsets[k]`` (all in range)."""
    b = ctx.b
    rank = x.shape.rank
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

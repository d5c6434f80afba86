"""Pipeline buffer moves on a sharded dim as collective-permutes (GSPMD paper 3.3 / 4.6).

Two patterns over one array ``x`` and one dim ``d`` (result as long as ``x`` along d):

* rotate: ``concatenate(slice(x)[s:D], slice(x)[0:s])`` -- result[i] = x[(i + s) mod D];
* shift:  ``slice(pad(x, low=a, high=b))[c:c+D]`` (copies between them are looked through)
  -- result[i] = x[i + c - a], the pad value where that falls outside x.

With x tiled along d into t tiles of L rows (D = t*L), the tile k of the result is rows
[r, L) of x's tile k+q and rows [0, r) of tile k+q+1 (q, r = divmod(shift, L)): at most
two collective-permutes along d (one when r == 0 or q == 0), cyclic for a rotation;
for a shift the tiles whose source lies outside x take the pad value. With padded tiles
(t does not divide D) a rotation moving whole tiles rotates the tiles holding data among
themselves; any other is two non-cyclic shifts (by s and by s - D) chosen by row index.
The generic path of a rotation also keeps its slices (and their moves) alive: that is
added to its price. XLA recognises the
same patterns (``SpmdPartitioningVisitor::HandleConcatenate`` rotate detection and
``HandleSlice`` of a pad). Both the move and the generic slice / concatenate path are
priced (strategy.py) and only the cheaper is emitted.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.passes.partition.causes import with_cause
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.halo import select_from, tile_index_table
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.reshard import reshard, reshard_price
from hlo_spmd.passes.partition.support.strategy import Strategy, cheapest, itemsize, local_bytes
from hlo_spmd.sharding import HloSharding, tile_shape


def _full_slice(inst: Instruction, skip: int) -> bool:
    """A stride-1 slice taking every dim whole except ``skip``."""
    src = inst.operands[0].shape.dims
    for d, c in enumerate(inst.attrs.slice_dimensions):
        if c.stride != 1:
            return False
        if d != skip and (c.start != 0 or c.limit != src[d]):
            return False
    return True


def rotation_of(inst: Instruction) -> tuple[Instruction, int, int] | None:
    """(x, dim, s) when ``inst`` is concatenate(x[s:D], x[0:s]) along dim."""
    if inst.opcode != "concatenate" or len(inst.operands) != 2:
        return None
    d = inst.dimensions[0]
    a, b = inst.operands
    if a.opcode != "slice" or b.opcode != "slice" or a.operands[0] is not b.operands[0]:
        return None
    x = a.operands[0]
    if not (_full_slice(a, d) and _full_slice(b, d)) or x.shape.dims[d] != inst.shape.dims[d]:
        return None
    ca, cb = a.attrs.slice_dimensions[d], b.attrs.slice_dimensions[d]
    D = x.shape.dims[d]
    if cb.start != 0 or ca.limit != D or ca.start != cb.limit:
        return None
    return x, d, int(ca.start)


def shift_of(inst: Instruction) -> tuple[Instruction, int, int, Instruction] | None:
    """(x, dim, s, pad value) when ``inst`` is slice(pad(x))[c:c+D] along one dim with
    result[i] = x[i + s]."""
    if inst.opcode != "slice":
        return None
    pad = inst.operands[0]
    while pad.opcode == "copy":  # a copy is the identity: the slice reads the pad itself
        pad = pad.operands[0]
    if pad.opcode != "pad":
        return None
    x = pad.operands[0]
    cfg = list(pad.attrs.padding_config.dimensions)
    moved = [d for d, c in enumerate(cfg) if c.edge_padding_low or c.edge_padding_high
             or c.interior_padding]
    if len(moved) != 1:
        return None
    d = moved[0]
    if cfg[d].interior_padding or not _full_slice(inst, d):
        return None
    c = inst.attrs.slice_dimensions[d]
    if c.limit - c.start != x.shape.dims[d]:
        return None
    return x, d, int(c.start - cfg[d].edge_padding_low), pad.operands[1]


def _eligible(s: HloSharding, shape, d: int, rotate_by: int | None = None) -> bool:
    """Even tiles along d; for a rotation (``rotate_by`` given) also padded tiles when
    whole tiles move: L = ceil(D/t) divides D and the shift, so the D/L tiles holding data
    rotate among themselves and the rest stay padding."""
    if not s.is_tiled or s.subgroup_types or s.is_manual:
        return False
    t = s.tile_dims_for_data(shape.rank)[d]
    D = shape.dims[d]
    if t <= 1:
        return False
    if D % t == 0:
        return True
    L = -(-D // t)
    return rotate_by is not None and D % L == 0 and rotate_by % L == 0


def _data_tiles(s: HloSharding, shape, d: int) -> int:
    """How many tiles along d hold data (the rest are padding)."""
    t = s.tile_dims_for_data(shape.rank)[d]
    return -(-shape.dims[d] // -(-shape.dims[d] // t))


@with_cause("halo")
def _permute(ctx: PartitionContext, x: Instruction, s: HloSharding, d: int, q: int,
             cyclic: bool, n: int | None = None) -> Instruction:
    """Every device receives the tile of the device ``q`` tiles further along ``d``
    (cyclic: modulo the first ``n`` tiles, those holding data; default all)."""
    arr = s.tile_assignment.array()
    t = arr.shape[d]
    n = t if n is None else n
    if q == 0 or (cyclic and q % n == 0):
        return x
    if cyclic:
        k = np.arange(n)
        src, dst = np.take(arr, (k + q) % n, axis=d), np.take(arr, k, axis=d)
    else:
        src, dst = np.roll(arr, -q, axis=d), arr
    pairs = np.stack([src.ravel(), dst.ravel()], axis=1)
    if not cyclic:
        k = np.arange(t)
        ok = (k + q >= 0) & (k + q < t)
        shape = [1] * arr.ndim
        shape[d] = t
        pairs = pairs[np.broadcast_to(ok.reshape(shape), arr.shape).ravel()]
        if len(pairs) == 0:
            return ctx.b.broadcast(ctx.b.scalar(0, x), list(x.shape.dims), [])
    return ctx.f.collective_permute(x, pairs)


def _rows(ctx: PartitionContext, x: Instruction, d: int, lo: int, hi: int) -> Instruction:
    dims = list(x.shape.dims)
    start = [0] * len(dims)
    limit = list(dims)
    start[d], limit[d] = lo, hi
    return ctx.b.slice(x, start, limit, [1] * len(dims))


def _source_valid(ctx: PartitionContext, s: HloSharding, d: int, q: int) -> Instruction:
    """pred[]: whether tile k+q exists for this device's tile index k along ``d``."""
    arr = s.tile_assignment.array()
    t = arr.shape[d]
    k = np.broadcast_to(np.arange(t).reshape([t if a == d else 1 for a in range(arr.ndim)]),
                        arr.shape)
    table = np.zeros(ctx.num_devices, dtype=np.int64)
    table[arr.ravel()] = ((k + q >= 0) & (k + q < t)).ravel()
    one = ctx.b.constant(np.int64(1), PrimitiveType.S32)
    return ctx.b.compare(ctx.logical_table(table), one, "EQ")


def _shifted(ctx: PartitionContext, x: Instruction, d: int, shift: int, target: HloSharding,
             fill: Instruction | None, cyclic: bool, n: int) -> Instruction:
    """Local result[i] = x[i + shift] along d from the local tiles ``x``: cyclic over the
    first ``n`` tiles, else rows from outside x are ``fill`` (left as received when None)."""
    b = ctx.b
    L = x.shape.dims[d]
    q, r = divmod(shift, L)
    pieces = []
    for qq, lo, hi in ((q, r, L), (q + 1, 0, r)):
        if hi <= lo:
            continue
        part = _permute(ctx, _rows(ctx, x, d, lo, hi), target, d, qq, cyclic, n)
        if fill is not None and qq != 0:
            ok = b.broadcast(_source_valid(ctx, target, d, qq), list(part.shape.dims), [])
            part = b.select(ok, part, b.broadcast(fill, list(part.shape.dims), []))
        pieces.append(part)
    return pieces[0] if len(pieces) == 1 else b.concatenate(pieces, d)


def _moved(ctx: PartitionContext, inst: Instruction, x_inst: Instruction, d: int, shift: int,
           target: HloSharding, fill: Instruction | None) -> PValue | None:
    """result[i] = x[i + shift] along d (cyclic when ``fill`` is None)."""
    x = reshard(ctx, ctx.value(x_inst), target).hlo
    y = _shifted(ctx, x, d, shift, target, fill, fill is None, _data_tiles(target, inst.shape, d))
    return PValue(y, inst.shape, target)


def _two_shifts(ctx: PartitionContext, inst: Instruction, x_inst: Instruction, d: int, s: int,
                target: HloSharding) -> PValue:
    """A rotation over padded tiles that does not move whole tiles: rows [0, D-s) are x
    shifted by s and rows [D-s, D) x shifted by s-D (both non-cyclic), chosen by the row's
    global index."""
    x = reshard(ctx, ctx.value(x_inst), target).hlo
    D = x_inst.shape.dims[d]
    t = target.tile_dims_for_data(x_inst.shape.rank)[d]
    L = x.shape.dims[d]
    a = _shifted(ctx, x, d, s, target, None, False, t)
    c = _shifted(ctx, x, d, s - D, target, None, False, t)
    k = np.arange(t)
    y = select_from(ctx, a, c, d, D - s - k * L, tile_index_table(ctx, target, d),
                    np.clip(D - k * L, 0, L))
    return PValue(y, inst.shape, target)


def _two_shifts_price(ctx: PartitionContext, inst: Instruction, x_inst: Instruction, d: int,
                      s: int, target: HloSharding) -> tuple[float, float]:
    """(bytes, largest new array) of ``_two_shifts`` (x resharded once)."""
    D = x_inst.shape.dims[d]
    nbytes, peak = _moved_price(ctx, inst, x_inst, d, s, target, False)
    more, _ = _moved_price(ctx, inst, x_inst, d, s - D, target, False)
    return nbytes + more - reshard_price(ctx, ctx.value(x_inst), target)[0], peak


def _sole_user_slices_price(ctx: PartitionContext, inst: Instruction,
                            slice_price: Callable[[Instruction], float | None]) -> float:
    """What the generic path pays on top of its own price: the rotation reads x itself,
    so the slices feeding only ``inst`` die with their moves when it is chosen; the
    generic path keeps them (their price now, the reshard cache counted as paid)."""
    counts = ctx.state.user_counts()
    total = 0.0
    for op in {id(o): o for o in inst.operands}.values():
        if counts.get(id(op), 0) == 1:
            c = slice_price(op)
            total += c if c is not None else 0.0
    return total


def _moved_price(ctx: PartitionContext, inst: Instruction, x_inst: Instruction, d: int,
                 shift: int, target: HloSharding, cyclic: bool) -> tuple[float, float]:
    """(bytes, largest new array) of ``_moved``: ``x`` resharded to ``target``, then each
    of its at most two row ranges sent by one collective-permute (none when it stays)."""
    nbytes, peak = reshard_price(ctx, ctx.value(x_inst), target)
    local = tile_shape(target, x_inst.shape.dims)
    L, t = local[d], target.tile_dims_for_data(x_inst.shape.rank)[d]
    row = float(math.prod(v for i, v in enumerate(local) if i != d)) * itemsize(x_inst.shape)
    n = _data_tiles(target, inst.shape, d)
    q, r = divmod(shift, L)
    for qq, lo, hi in ((q, r, L), (q + 1, 0, r)):
        if hi <= lo or qq == 0 or (cyclic and qq % n == 0):
            continue
        if cyclic or any(0 <= k + qq < t for k in range(t)):
            nbytes += (hi - lo) * row
    return nbytes, max(peak, local_bytes(inst.shape, target))


def _pick(ctx: PartitionContext, inst: Instruction, x: Instruction, d: int, s: int,
          target: HloSharding, fill: Callable[[], Instruction] | None,
          generic: Callable[[], Strategy],
          slice_price: Callable[[Instruction], float | None] | None = None) -> PValue:
    """Emit the cheaper of the collective-permute move (cyclic when ``fill``, which
    emits the pad value, is None) and the generic path."""
    moved = Strategy("moved", *_moved_price(ctx, inst, x, d, s, target, fill is None),
                     lambda: _moved(ctx, inst, x, d, s, target,
                                    fill() if fill is not None else None))
    return cheapest([moved, _with_slices(ctx, inst, generic(), slice_price)]).emit()


def _with_slices(ctx: PartitionContext, inst: Instruction, g: Strategy,
                 slice_price: Callable[[Instruction], float | None] | None) -> Strategy:
    """The generic plan of a rotation priced with the slices it keeps alive
    (``slice_price``: a slice operand's price in its sharding; None for a shift)."""
    if slice_price is None:
        return g
    return Strategy(g.grid, g.bytes + _sole_user_slices_price(ctx, inst, slice_price),
                    g.peak, g.emit)


def rotate_or(ctx: PartitionContext, inst: Instruction, target: HloSharding,
              generic: Callable[[], Strategy],
              slice_price: Callable[[Instruction], float | None]) -> PValue:
    """The concatenate as a rotation when it is one (and cheaper), else ``generic``."""
    rot = rotation_of(inst)
    if rot is None:
        return generic().emit()
    x, d, s = rot
    if not _eligible(target, inst.shape, d, s):
        if (not target.is_tiled or target.subgroup_types or target.is_manual
                or target.tile_dims_for_data(inst.shape.rank)[d] <= 1):
            return generic().emit()
        two = Strategy("moved", *_two_shifts_price(ctx, inst, x, d, s, target),
                       lambda: _two_shifts(ctx, inst, x, d, s, target))
        return cheapest([two, _with_slices(ctx, inst, generic(), slice_price)]).emit()
    return _pick(ctx, inst, x, d, s, target, None, generic, slice_price)


def shift_or(ctx: PartitionContext, inst: Instruction, target: HloSharding,
             generic: Callable[[], Strategy]) -> PValue:
    """The slice of a pad as a shift when it is one (and cheaper), else ``generic``."""
    sh = shift_of(inst)
    if sh is None or not _eligible(target, inst.shape, sh[1]):
        return generic().emit()
    x, d, s, pad_value = sh
    return _pick(ctx, inst, x, d, s, target,
                 lambda: reshard(ctx, ctx.value(pad_value), HloSharding.replicate()).hlo,
                 generic)

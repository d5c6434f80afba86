"""dynamic-slice along a sharded dim without gathering the operand.

XLA's ``HandleDynamicSlice`` makes every sliced dim whole first (an all-gather of the
operand). When the slice is short, it is cheaper to let every device cut the part of the
window that falls into its own tile and sum over the devices along that dim: the window
[c, c+s) (c the clamped start, as in the unpartitioned op) is read from the local tile
padded with s zero rows on both sides at local start clamp(c - tile start + s, 0, L + s),
which yields the owned rows and zeros elsewhere; an all-reduce (add, or ``or`` for
predicates) over the devices that differ along the dim assembles the window. Each global
row is owned by exactly one device, so the sum is exact. The generic path competes: both
are priced (strategy.py) and only the cheaper is emitted.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from hlo_spmd.collectives.cost import bytes_per_device
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.passes.partition.causes import with_cause
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.handlers.reduce import reduction_groups
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.reshard import reshard, reshard_price
from hlo_spmd.passes.partition.support.strategy import Strategy, cheapest, itemsize, result_move
from hlo_spmd.sharding import HloSharding, device_offsets, partial_replicate, tile_shape

S32 = PrimitiveType.S32


def _window_layout(ctx: PartitionContext, inst: Instruction, dim: int) -> HloSharding | None:
    """The operand sharding the summed window reads from: the operand's own on ``dim``,
    other sliced dims whole (like the generic path); None when ``dim`` is not tiled."""
    operand = inst.operands[0]
    rank = operand.shape.rank
    sizes = list(inst.attrs.dynamic_slice_sizes)
    src = ctx.value(operand).sharding
    if not src.is_tiled or src.subgroup_types:
        return None
    tiles = src.tile_dims_for_data(rank)
    if tiles[dim] == 1:
        return None
    return partial_replicate(src, [d for d in range(rank) if d != dim
                                   and tiles[d] > 1 and sizes[d] < operand.shape.dims[d]])


def _summed_price(ctx: PartitionContext, inst: Instruction, target: HloSharding,
                  dim: int, mid: HloSharding) -> tuple[float, float]:
    """(bytes, largest new array) of ``_summed_window``: the operand resharded to
    ``mid``, padded by s rows on both sides of ``dim``, the all-reduce of the local window,
    the result resharded to ``target``."""
    operand = inst.operands[0]
    sizes = list(inst.attrs.dynamic_slice_sizes)
    nbytes, peak = reshard_price(ctx, ctx.value(operand), mid)
    local = list(tile_shape(mid, operand.shape.dims))
    size = itemsize(operand.shape)
    s = sizes[dim]
    padded = list(local)
    padded[dim] += 2 * s
    window = [s if d == dim else (sizes[d] if sizes[d] < operand.shape.dims[d] else v)
              for d, v in enumerate(local)]
    wbytes = float(math.prod(window)) * size
    nbytes += bytes_per_device("all-reduce", wbytes, wbytes,
                               mid.tile_dims_for_data(operand.shape.rank)[dim])
    b, p = result_move(ctx, inst.shape, partial_replicate(mid, [dim]), target)
    return nbytes + b, max(peak, float(math.prod(padded)) * size, p)


@with_cause("reduction")
def _summed_window(ctx: PartitionContext, inst: Instruction, target: HloSharding,
                   dim: int, mid: HloSharding) -> PValue:
    b = ctx.b
    operand = inst.operands[0]
    rank = operand.shape.rank
    sizes = list(inst.attrs.dynamic_slice_sizes)
    # Compute with the operand in its own sharding on ``dim`` and the result's elsewhere.
    x = reshard(ctx, ctx.value(operand), mid).hlo
    starts = [ctx.operand(inst, 1 + d, HloSharding.replicate()) for d in range(rank)]
    s = sizes[dim]
    L = x.shape.dims[dim]
    st = starts[dim]
    c = b.clamp(b.scalar(0, st), st, b.scalar(operand.shape.dims[dim] - s, st))
    if c.shape.element_type != S32:
        c = b.convert(c, S32)
    table = device_offsets(mid, operand.shape.dims, num_devices=ctx.num_devices)[:, dim]
    off = ctx.logical_table(table)
    lo = b.subtract(c, off)
    lo = b.add(lo, b.constant(np.int64(s), S32))
    lo = b.clamp(b.constant(np.int64(0), S32), lo, b.constant(np.int64(L + s), S32))
    low = [0] * rank
    low[dim] = s
    xp = b.pad(x, b.scalar(0, x), low, low)
    zero = b.constant(np.int64(0), S32)
    idx = []
    local_sizes = list(x.shape.dims)
    for d in range(rank):
        if d == dim:
            idx.append(lo)
            local_sizes[d] = s
        elif sizes[d] < operand.shape.dims[d]:
            idx.append(starts[d])
            local_sizes[d] = sizes[d]
        else:
            idx.append(zero)
    y = b.dynamic_slice(xp, idx, local_sizes)
    op = "or" if y.shape.element_type == PrimitiveType.PRED else "add"
    y = ctx.f.all_reduce(y, op, reduction_groups(mid, [dim]))
    out = partial_replicate(mid, [dim])
    return reshard(ctx, PValue(y, inst.shape, out), target)


def dynamic_slice_or(ctx: PartitionContext, inst: Instruction, target: HloSharding,
                     generic: Callable[[], Strategy]) -> PValue:
    """The dynamic-slice as a summed window when one sharded dim is sliced, and cheaper
    (both priced, only the winner emitted)."""
    operand = inst.operands[0]
    src = ctx.value(operand).sharding
    sizes = list(inst.attrs.dynamic_slice_sizes)
    if not src.is_tiled or src.subgroup_types or src.is_manual or target.is_manual:
        return generic().emit()
    tiles = src.tile_dims_for_data(operand.shape.rank)
    sliced = [d for d in range(operand.shape.rank)
              if sizes[d] < operand.shape.dims[d] and tiles[d] > 1]
    if len(sliced) != 1 or any(o.shape.rank for o in inst.operands[1:]):
        return generic().emit()
    dim = sliced[0]
    mid = _window_layout(ctx, inst, dim)
    if mid is None:
        return generic().emit()
    summed = Strategy(mid, *_summed_price(ctx, inst, target, dim, mid),
                      lambda: _summed_window(ctx, inst, target, dim, mid))
    return cheapest([summed, generic()]).emit()

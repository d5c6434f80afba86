"""dynamic-slice along a sharded dim without gathering the operand.

XLA's ``HandleDynamicSlice`` makes every sliced dim whole first (an all-gather of the
operand). When the slice is short, it is cheaper to let every device cut the part of the
window that falls into its own tile and sum over the devices along that dim: the window
[c, c+s) (c the clamped start, as in the unpartitioned op) is read from the local tile
padded with s zero rows on both sides at local start clamp(c - tile start + s, 0, L + s),
which yields the owned rows and zeros elsewhere; an all-reduce (add, or ``or`` for
predicates) over the devices that differ along the dim assembles the window. Each global
row is owned by exactly one device, so the sum is exact. The generic path competes on
bytes (``choose``).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.passes.partition.causes import with_cause
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.support.choose import cheapest
from hlo_spmd.passes.partition.handlers.reduce import reduction_groups
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.reshard import reshard
from hlo_spmd.sharding import HloSharding, device_offsets, partial_replicate

S32 = PrimitiveType.S32


@with_cause("reduction")
def _summed_window(ctx: PartitionContext, inst: Instruction, target: HloSharding,
                   dim: int) -> PValue | None:
    b = ctx.b
    operand = inst.operands[0]
    rank = operand.shape.rank
    sizes = list(inst.attrs.dynamic_slice_sizes)
    # Compute with the operand in its own sharding on ``dim`` and the result's elsewhere.
    src = ctx.value(operand).sharding
    if not src.is_tiled or src.subgroup_types:
        return None
    others = [d for d in range(rank) if d != dim]
    # Dims other than ``dim`` must be whole or kept at full size (like the generic path).
    tiles = src.tile_dims_for_data(rank)
    if tiles[dim] == 1:
        return None
    mid = partial_replicate(src, [d for d in others
                                  if tiles[d] > 1 and sizes[d] < operand.shape.dims[d]])
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
                     generic: Callable[[], PValue]) -> PValue:
    """The dynamic-slice as a summed window when one sharded dim is sliced, and cheaper."""
    operand = inst.operands[0]
    src = ctx.value(operand).sharding
    sizes = list(inst.attrs.dynamic_slice_sizes)
    if not src.is_tiled or src.subgroup_types or src.is_manual or target.is_manual:
        return generic()
    tiles = src.tile_dims_for_data(operand.shape.rank)
    sliced = [d for d in range(operand.shape.rank)
              if sizes[d] < operand.shape.dims[d] and tiles[d] > 1]
    if len(sliced) != 1 or any(o.shape.rank for o in inst.operands[1:]):
        return generic()
    return cheapest(ctx, [lambda: _summed_window(ctx, inst, target, sliced[0]), generic])

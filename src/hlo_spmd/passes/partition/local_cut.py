"""A value's local arrays grown, trimmed and cut without communication: ``pad_to`` and
``slice_to`` (end padding on and off) and ``slice_replicated``, each device cutting its own
tile of a replicated value at its offsets. The bottom of reshard: its routes
(reshard_routes.py) and steps (reshard.py) and recreate.py build on these."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.sharding import HloSharding, device_offsets, tile_shape

if TYPE_CHECKING:
    from hlo_spmd.passes.partition.state import ReshardContext


def slice_to(ctx: "ReshardContext", x: Instruction, dims) -> Instruction:
    """Slice off end padding so ``x`` has exactly ``dims``."""
    if tuple(x.shape.dims) == tuple(dims):
        return x
    return ctx.b.slice(x, [0] * len(dims), list(dims), [1] * len(dims))


def pad_to(ctx: "ReshardContext", x: Instruction, dims) -> Instruction:
    """Pad at the end with zeros so ``x`` has ``dims`` (each >= the current size)."""
    if tuple(x.shape.dims) == tuple(dims):
        return x
    zero = ctx.b.scalar(0, x)
    high = [int(d) - int(c) for d, c in zip(dims, x.shape.dims)]
    return ctx.b.pad(x, zero, [0] * len(dims), high)


def offsets_for(ctx: "ReshardContext", s: HloSharding, dims) -> list[Instruction]:
    """This device's start offsets (padded coordinates) of sharding ``s`` on ``dims``."""
    table = device_offsets(s, dims, num_devices=ctx.num_devices)
    tiles = s.tile_dims_for_data() if s.is_tiled else [1] * len(dims)
    out = []
    for dim in range(len(dims)):
        if tiles[dim] > 1:
            out.append(ctx.logical_table(table[:, dim]))
        else:
            out.append(ctx.b.constant(np.int64(0), PrimitiveType.S32))
    return out


def slice_replicated(ctx: "ReshardContext", pv: PValue, target: HloSharding) -> PValue:
    """Replicated -> tiled: each device cuts its own tile, no communication."""
    dims = pv.base_shape.dims
    local = tile_shape(target, dims)
    tiles = target.tile_dims_for_data()
    padded = [int(l) * int(t) for l, t in zip(local, tiles)]
    x = pad_to(ctx, pv.hlo, padded)
    if tuple(local) == tuple(x.shape.dims):
        return PValue(x, pv.base_shape, target)
    out = ctx.b.dynamic_slice(x, offsets_for(ctx, target, dims), list(local))
    return PValue(out, pv.base_shape, target)

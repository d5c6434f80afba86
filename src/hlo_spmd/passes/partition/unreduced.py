"""Unreduced values (partial sums): resharding from and to them, and unreduced dots.

A sharding with unreduced devices (``{unreduced}``, or a tiled sharding whose
``last_tile_dims`` include ``unreduced``) says: the devices of one unreduced group
each hold a partial sum of the same tile, and the value is their sum (JAX's
unreduced / reduced API; XLA's UNREDUCED subgroup type).

* unreduced -> reduced (replicated or tiled): all-reduce over the groups, or a
  reduce-scatter when the target tiles one dim across exactly the group
  (XLA's PartitionedHlo::Reshard of an unreduced value): steps of reshard's plan
  (reshard.reshard_plan), priced with every other route;
* reduced -> unreduced: the group's first device keeps the value, the others hold
  zeros (so the sum is the value): ``keep_on_leader``, a step of the same plan;
* a dot whose result is annotated unreduced splits its contraction across the
  group and keeps the local partial sums (no all-reduce).

Which ops may carry partial sums at all is ``ir.opcodes.LINEAR_OPS``: completion and
the elementwise handler reduce before anything else.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hlo_spmd.ir.opcodes import LINEAR_OPS
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.sharding import HloSharding, ShardingType, TileAssignment
from hlo_spmd.sharding.unreduced import is_unreduced, reduced

if TYPE_CHECKING:
    from hlo_spmd.ir.instruction import Instruction
    from hlo_spmd.passes.partition.state import ReshardContext

__all__ = ["LINEAR_OPS", "is_unreduced", "reduced", "groups_of", "scattered", "keep_on_leader",
           "dot_unreduced"]

def _array(s: HloSharding, n: int, rank: int) -> tuple[np.ndarray, int]:
    """(device array, index of the unreduced axis) of an unreduced sharding."""
    if s.is_unreduced:
        return np.arange(n, dtype=np.int64).reshape((1,) * rank + (n,)), rank
    ta = s.tile_assignment
    assert ta is not None
    return ta.array(), s.subgroup_dim(ShardingType.UNREDUCED)  # type: ignore[return-value]


def groups_of(s: HloSharding, n: int, rank: int) -> np.ndarray:
    """[groups, group size] logical devices whose partial sums add up."""
    arr, u = _array(s, n, rank)
    return np.ascontiguousarray(np.moveaxis(arr, u, -1).reshape(-1, arr.shape[u]))


def scattered(s: HloSharding, n: int, rank: int, dim: int) -> HloSharding:
    """The sharding a reduce-scatter over ``s``'s groups along ``dim`` produces: the
    unreduced axis becomes the minor factor of ``dim``."""
    arr, u = _array(s, n, rank)
    moved = np.moveaxis(arr, u, dim + 1)
    shape = list(moved.shape)
    merged = shape[:dim] + [shape[dim] * shape[dim + 1]] + shape[dim + 2:]
    new = moved.reshape(merged)
    types = [t for t in s.subgroup_types if t != ShardingType.UNREDUCED]
    ta = TileAssignment.from_array(new).compact()
    return HloSharding.subgroup(ta, types) if types else HloSharding.tile(ta)


def keep_on_leader(ctx: ReshardContext, pv: PValue, target: HloSharding) -> PValue:
    """``pv`` (held whole by each group of ``target``: its reduced twin) as a partial sum:
    the group's first device holds the value, the rest zeros (a step of reshard's plan)."""
    n = ctx.num_devices
    groups = groups_of(target, n, pv.base_shape.rank)
    leader = np.zeros(n, dtype=np.int64)
    leader[groups[:, 0]] = 1
    b = ctx.b
    x = pv.hlo
    is_leader = b.compare(ctx.logical_table(leader), b.constant(np.int64(1), PrimitiveType.S32),
                          "EQ")
    if x.shape.rank:
        is_leader = b.broadcast(is_leader, list(x.shape.dims), [])
        zero = b.broadcast(b.scalar(0, x), list(x.shape.dims), [])
    else:
        zero = b.scalar(0, x)
    return PValue(b.select(is_leader, x, zero), pv.base_shape, target)


def _operand_sharding(t_arr: np.ndarray, u: int, axis_of: list[int | None]) -> HloSharding:
    """An operand's sharding taken from the result's device array: operand dim i follows
    result axis ``axis_of[i]`` (None: untiled); the other axes replicate it."""
    used = [a for a in axis_of if a is not None]
    rest = [a for a in range(t_arr.ndim) if a not in used]
    arr = np.transpose(t_arr, used + rest)
    sizes = [t_arr.shape[a] if a is not None else 1 for a in axis_of]
    arr = arr.reshape(sizes + [int(np.prod([t_arr.shape[a] for a in rest], dtype=np.int64))])
    return HloSharding.partial_tile(TileAssignment.from_array(arr).compact())


def dot_unreduced(ctx: ReshardContext, inst: Instruction, dims, lhs: PValue, rhs: PValue,
                  target: HloSharding, out_shape, local_op, mask_padding) -> PValue | None:
    """A dot whose result is annotated unreduced: the first contracting dim is split
    across each unreduced group, the result tiles follow the target, and the local
    products are the partial sums.  None when the dot has no contracting dim."""
    if not dims.contracting:
        return None
    t_arr, u = _array(target, ctx.num_devices, dims.out_rank)
    # Flatten any further subgroup axes of the target into one replicated axis.
    t_arr = np.moveaxis(t_arr, u, dims.out_rank)
    t_arr = t_arr.reshape(t_arr.shape[:dims.out_rank + 1] + (-1,))
    u = dims.out_rank
    lhs_axes: list[int | None] = [None] * dims.lhs_rank
    rhs_axes: list[int | None] = [None] * dims.rhs_rank
    for d in dims.batch:
        lhs_axes[d.lhs] = rhs_axes[d.rhs] = d.output
    for d in dims.lhs_non_contracting:
        lhs_axes[d.lhs] = d.output
    for d in dims.rhs_non_contracting:
        rhs_axes[d.rhs] = d.output
    lc, rc = dims.contracting[0].lhs, dims.contracting[0].rhs
    lhs_axes[lc] = rhs_axes[rc] = u
    l = ctx.reshard(lhs, _operand_sharding(t_arr, u, lhs_axes))
    r = ctx.reshard(rhs, _operand_sharding(t_arr, u, rhs_axes))
    k = t_arr.shape[u]
    if lhs.base_shape.dims[lc] % k:   # padding of the split dim would be summed: zero it
        l = mask_padding(ctx, l, [lc])
        r = mask_padding(ctx, r, [rc])
    return PValue(local_op(ctx, inst, dims, l.hlo, r.hlo), out_shape, target)

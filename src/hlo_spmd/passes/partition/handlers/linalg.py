"""Linear algebra on the two minor dims: ``cholesky`` and ``triangular-solve``.

Both act on matrices in the two minor dims and are independent across every other (batch)
dim, as XLA's partitioner treats them: the operands and the result keep the result's
sharding of the batch dims and are whole along the two matrix dims; the result is then
resharded to what its users want. Nothing is gathered along the batch dims.
"""
from __future__ import annotations

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.handlers.basic import handle_replicated
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import handles
from hlo_spmd.passes.partition.reshard import reshard
from hlo_spmd.sharding import partial_replicate_all_except


@handles("cholesky", "triangular-solve")
def handle_batched_matrix_op(ctx: PartitionContext, inst: Instruction) -> PValue:
    target = ctx.sharding_of(inst)
    rank = inst.shape.rank
    if not target.is_tiled or target.is_manual or target.subgroup_types or rank < 3:
        return handle_replicated(ctx, inst)
    batch = partial_replicate_all_except(target, range(rank - 2))
    if not batch.is_tiled:  # nothing sharded along the batch dims
        return handle_replicated(ctx, inst)
    operands = [ctx.operand(inst, i, batch) for i in range(len(inst.operands))]
    local = ctx.emit_like(inst, operands, ctx.local_shape(inst.shape, batch))
    return reshard(ctx, PValue(local, inst.shape, batch), target)

"""Elementwise ops: operands resharded to the result's sharding, op applied per tile."""
from __future__ import annotations

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.opcodes import ELEMENTWISE
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.handlers.common import emit_like
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import handles
from hlo_spmd.sharding import HloSharding


@handles(*sorted(ELEMENTWISE))
def handle_elementwise(ctx: PartitionContext, inst: Instruction) -> PValue:
    target = ctx.sharding_of(inst)
    if target.is_maximal:
        target = HloSharding.replicate()
    operands = []
    for i, op in enumerate(inst.operands):
        # Scalars broadcast implicitly (clamp/select bounds): keep them whole.
        operands.append(ctx.operand(inst, i, target if op.shape.rank == inst.shape.rank
                                    else HloSharding.replicate()))
    local = ctx.local_shape(inst.shape, target)
    return PValue(emit_like(ctx, inst, operands, local), inst.shape, target)

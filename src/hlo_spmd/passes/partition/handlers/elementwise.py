"""Elementwise ops: operands resharded to one common sharding, op applied per tile.

The common sharding is the result's, unless the operands already agree on another one
and resharding the single result moves less data than resharding several operands (the
same choice XLA's partitioner makes, e.g. a select whose three operands are tiled and
whose result is wanted partially replicated: compute tiled, all-gather once).
"""
from __future__ import annotations

from collections import Counter

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.opcodes import ELEMENTWISE
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.handlers.common import emit_like
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import handles
from hlo_spmd.passes.partition.reshard import reshard
from hlo_spmd.sharding import HloSharding


def compute_sharding(target: HloSharding, operand_shardings: list[HloSharding]) -> HloSharding:
    """The sharding to compute in: the one that needs the fewest same-size reshards
    (operands not already in it, plus one for the result if it differs from ``target``).
    Ties go to ``target``. Pure, so it is unit-testable."""
    best, best_cost = target, sum(1 for s in operand_shardings if s != target)
    for cand, _ in Counter(s for s in operand_shardings if s.is_tiled).most_common():
        cost = sum(1 for s in operand_shardings if s != cand) + 1
        if cost < best_cost:
            best, best_cost = cand, cost
    return best


# bitcast-convert between widths changes the rank; ``shapes`` handles it (same widths too).
@handles(*sorted(ELEMENTWISE - {"bitcast-convert"}))
def handle_elementwise(ctx: PartitionContext, inst: Instruction) -> PValue:
    target = ctx.sharding_of(inst)
    if target.is_maximal:
        target = HloSharding.replicate()
    full_rank = [i for i, op in enumerate(inst.operands) if op.shape.rank == inst.shape.rank]
    sharding = target
    if inst.shape.rank and not target.is_manual:
        sharding = compute_sharding(target, [ctx.value(inst.operands[i]).sharding
                                             for i in full_rank])
    operands = []
    for i, op in enumerate(inst.operands):
        # Scalars broadcast implicitly (clamp/select bounds): keep them whole.
        operands.append(ctx.operand(inst, i, sharding if i in full_rank
                                    else HloSharding.replicate()))
    local = ctx.local_shape(inst.shape, sharding)
    pv = PValue(emit_like(ctx, inst, operands, local), inst.shape, sharding)
    return reshard(ctx, pv, target)

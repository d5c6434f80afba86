"""sort and top-k (opcode ``topk``).

Along an unsharded dim both run per tile with no communication. Mirrors XLA's
``SpmdPartitioningVisitor::HandleSort`` and the TopK handling in spmd_partitioner.cc.
"""
from __future__ import annotations

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.handlers.basic import handle_replicated
from hlo_spmd.passes.partition.handlers.local_dims import _common_leaf, _local, _sharded_dims
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import handles


@handles("sort")
def handle_sort(ctx: PartitionContext, inst: Instruction) -> PValue:
    arrays = len(inst.operands)
    leaf = _common_leaf(ctx, inst, arrays)
    if leaf is None or inst.dimensions[0] in _sharded_dims(leaf):
        return handle_replicated(ctx, inst)
    return _local(ctx, inst, arrays, leaf)


@handles("topk")
def handle_topk(ctx: PartitionContext, inst: Instruction) -> PValue:
    leaf = _common_leaf(ctx, inst, 2)
    rank = inst.operands[0].shape.rank
    if leaf is None or (rank - 1) in _sharded_dims(leaf):
        return handle_replicated(ctx, inst)
    return _local(ctx, inst, 1, leaf)

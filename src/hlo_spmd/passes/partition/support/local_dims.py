"""Ops that act along some dims only: local whenever those dims are not sharded.

Helpers for the ops that run per tile when their operating dims are not sharded
(operands resharded to the result's sharding, no communication): ``sort`` (sort and
top-k) uses them. reduce-window lives in ``windows`` (with halo exchange).
"""
from __future__ import annotations

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.sharding import HloSharding


def _leaves(s: HloSharding, n: int) -> list[HloSharding]:
    return list(s.tuple_elements) if s.is_tuple else [s] * n


def _common_leaf(ctx: PartitionContext, inst: Instruction, n: int) -> HloSharding | None:
    """The one array sharding every result leaf uses, or None."""
    leaves = _leaves(ctx.sharding_of(inst), n)
    first = leaves[0]
    if any(l != first for l in leaves) or first.is_manual or first.is_maximal:
        return None
    return first


def _sharded_dims(s: HloSharding) -> set[int]:
    if not s.is_tiled:
        return set()
    return {d for d, t in enumerate(s.tile_dims_for_data()) if t > 1}


def _local(ctx: PartitionContext, inst: Instruction, arrays: int, leaf: HloSharding) -> PValue:
    operands = []
    for i, op in enumerate(inst.operands):
        operands.append(ctx.operand(inst, i, leaf if i < arrays else HloSharding.replicate()))
    # Every result array is tiled like ``leaf`` (which need not be the instruction's own
    # sharding: planners run the op in other layouts and reshard after).
    result_sharding = HloSharding.tuple([leaf] * len(inst.shape.tuple_shapes)) \
        if inst.shape.is_tuple else leaf
    local = ctx.local_shape(inst.shape, result_sharding)
    return PValue(ctx.emit_like(inst, operands, local), inst.shape, result_sharding)



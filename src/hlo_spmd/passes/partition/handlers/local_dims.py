"""Ops that act along some dims only: local whenever those dims are not sharded.

sort along an unsharded dim, topk over an unsharded last dim: operands are resharded to
the result's sharding and the op runs per tile, no communication. Anything else goes to
the replicated fallback. (reduce-window lives in windows.py, with halo exchange.)
"""
from __future__ import annotations

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.handlers.basic import handle_replicated
from hlo_spmd.passes.partition.handlers.common import emit_like
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import handles
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
    target = ctx.sharding_of(inst)
    local = ctx.local_shape(inst.shape, target if inst.shape.is_tuple else leaf)
    result_sharding = HloSharding.tuple([leaf] * len(inst.shape.tuple_shapes)) \
        if inst.shape.is_tuple else leaf
    return PValue(emit_like(ctx, inst, operands, local), inst.shape, result_sharding)


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

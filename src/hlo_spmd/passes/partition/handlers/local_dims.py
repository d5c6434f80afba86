"""Ops that act along some dims only: local whenever those dims are not sharded.

reduce-window whose window is trivial (size 1, stride 1, no padding or dilation) on every
sharded dim: operands are resharded to the result's sharding and the op runs per tile, no
communication. Anything else goes to the replicated fallback (correct; windowed halos are
a later addition). Sort and top-k live in ``sort``, which reuses these helpers.
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


def _trivial_window_dims(inst: Instruction) -> set[int]:
    out = set()
    for d, w in enumerate(inst.attrs.window.dimensions):
        if (w.size == 1 and w.stride == 1 and w.padding_low == 0 and w.padding_high == 0
                and w.window_dilation in (0, 1) and w.base_dilation in (0, 1)):
            out.add(d)
    return out


def _local(ctx: PartitionContext, inst: Instruction, arrays: int, leaf: HloSharding) -> PValue:
    operands = []
    for i, op in enumerate(inst.operands):
        operands.append(ctx.operand(inst, i, leaf if i < arrays else HloSharding.replicate()))
    target = ctx.sharding_of(inst)
    local = ctx.local_shape(inst.shape, target if inst.shape.is_tuple else leaf)
    result_sharding = HloSharding.tuple([leaf] * len(inst.shape.tuple_shapes)) \
        if inst.shape.is_tuple else leaf
    return PValue(emit_like(ctx, inst, operands, local), inst.shape, result_sharding)


@handles("reduce-window")
def handle_reduce_window(ctx: PartitionContext, inst: Instruction) -> PValue:
    arrays = len(inst.operands) // 2
    leaf = _common_leaf(ctx, inst, arrays)
    if leaf is None or not _sharded_dims(leaf) <= _trivial_window_dims(inst):
        return handle_replicated(ctx, inst)
    return _local(ctx, inst, arrays, leaf)

"""Elementwise ops: operands resharded to one common sharding, op applied per tile.

The common sharding is the result's, unless the operands already agree on another one
and resharding the single result moves fewer bytes (``reshard.reshard_cost``, the one
cost model) than resharding the operands (the
same choice XLA's partitioner makes, e.g. a select whose three operands are tiled and
whose result is wanted partially replicated: compute tiled, all-gather once).
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.opcodes import ELEMENTWISE
from hlo_spmd.ir.primitive_types import element_bytes
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import handles
from hlo_spmd.passes.partition.reshard import reshard, reshard_cost, reshard_price
from hlo_spmd.ir.opcodes import LINEAR_OPS
from hlo_spmd.sharding.unreduced import is_unreduced, reduced
from hlo_spmd.sharding import HloSharding

# Shardings are immutable: one shared replicated sharding for the hot paths (a
# fresh one per instruction cost an allocation, and ``s is target`` tests hit first).
_REPLICATED = HloSharding.replicate()


def compute_sharding(target: HloSharding, operand_shardings: list[HloSharding],
                     cost: Callable[[int | None, HloSharding, HloSharding], float] | None = None
                     ) -> HloSharding:
    """The sharding to compute in: the one whose operand reshards (plus the result's, if
    it differs from ``target``) cost least. ``cost(k, src, dst)``: bytes per device of
    resharding operand ``k`` (None: the result); the handler passes
    ``reshard.reshard_cost``; without it every reshard counts 1. Ties go to ``target``.
    Pure, so it is unit-testable. ``cost(k, s, s)`` must be 0."""
    if all(s is target or s == target for s in operand_shardings):
        return target  # the common case: no candidate can beat a free target
    if cost is None:
        def cost(k: int | None, a: HloSharding, b: HloSharding) -> float:
            return 0.0 if a == b else 1.0

    best, best_cost = target, sum(cost(k, s, target) for k, s in enumerate(operand_shardings))
    for cand, _ in Counter(s for s in operand_shardings if s.is_tiled).most_common():
        c = sum(cost(k, s, cand) for k, s in enumerate(operand_shardings)) + \
            cost(None, cand, target)
        if c < best_cost - 1e-9:
            best, best_cost = cand, c
    return best


# bitcast-convert between widths changes the rank; ``shapes`` handles it (same widths too).
@handles(*sorted(ELEMENTWISE - {"bitcast-convert"}))
def handle_elementwise(ctx: PartitionContext, inst: Instruction) -> PValue:
    target = inst.sharding
    if target is None or target.is_maximal:
        target = _REPLICATED
    rank = len(inst.shape.dims)
    operands = inst.operands
    partitioned = ctx.values
    try:  # (the values map directly: this handler runs for most instructions)
        values = [partitioned[id(op)] for op in operands]
    except KeyError:
        values = [ctx.value(op) for op in operands]  # raises, naming the operand
    common = True
    for op, v in zip(operands, values):
        s = v.sharding
        if len(op.shape.dims) != rank or (s is not target and s != target):
            common = False
            break
    if common and (inst.opcode in LINEAR_OPS or not is_unreduced(target)):
        # The common case: every operand is whole-rank and already at the target, which
        # compute_sharding would choose (no candidate beats a free target), so nothing
        # is resharded, before or after.
        local = ctx.local_shape(inst.shape, target)
        return PValue(ctx.emit_like(inst, [v.hlo for v in values], local), inst.shape, target)
    full_rank = [i for i, op in enumerate(inst.operands) if op.shape.rank == rank]
    sharding = target
    if inst.shape.rank and not target.is_manual:
        shapes = [inst.operands[i].shape for i in full_rank]

        def cost(k: int | None, a: HloSharding, b: HloSharding) -> float:
            if k is not None and a == values[full_rank[k]].sharding:
                # this operand's own price (0 when it is re-made where it is needed)
                return reshard_price(ctx, values[full_rank[k]], b)[0]
            shape = inst.shape if k is None else shapes[k]
            size = element_bytes(shape.element_type)
            return reshard_cost(shape.dims, size, a, b, ctx.num_devices)

        sharding = compute_sharding(target, [values[i].sharding for i in full_rank], cost)
    if inst.opcode not in LINEAR_OPS and is_unreduced(sharding):
        sharding = reduced(sharding)   # partial sums only go through linear ops
    operands = []
    for i, op in enumerate(inst.operands):
        # Scalars broadcast implicitly (clamp/select bounds): keep them whole.
        operands.append(ctx.operand(inst, i, sharding if i in full_rank
                                    else _REPLICATED))
    local = ctx.local_shape(inst.shape, sharding)
    pv = PValue(ctx.emit_like(inst, operands, local), inst.shape, sharding)
    return reshard(ctx, pv, target)

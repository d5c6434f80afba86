"""Control flow: while, conditional, call (GSPMD section 4: called computations are
partitioned recursively with the shardings at their boundaries fixed by the caller).

* ``while``: the loop carry has ONE sharding, the while instruction's (a tuple sharding
  over the carry). It is used for the body parameter, the body root, and the condition
  parameter, so every iteration hands the next one the same per-device layout. The
  condition's root is resharded to replicated: every device must take the same branch
  of the loop. The initial value is resharded to the carry sharding once, before the loop.
  A manual carry (inside shard_map) keeps the predicate manual: each device (or manual
  group) runs its own loop, as the user wrote it.
* ``conditional``: the branch index / predicate is replicated (all devices take the same
  branch), or stays manual when it is a manual value. Branch ``i`` is partitioned with its operand's current sharding as the
  parameter sharding (no resharding of branch arguments) and the conditional's sharding
  as the root sharding, so all branches return the same per-device layout.
* ``call``: the callee is partitioned with the arguments' current shardings and the
  call's sharding as its root sharding, and called (not inlined: the partitioned module
  keeps the original call structure).

A computation called from several places is partitioned once per distinct signature
(parameter shardings, root sharding, device grouping); callers with the same signature
share the copy.
"""
from __future__ import annotations

import weakref
from typing import Sequence

from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.shape import Shape
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.support.common import copy_attrs
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import handles
from hlo_spmd.sharding import HloSharding, replicate_all_data_dims
from hlo_spmd.sharding.array_key import array_token

# out module -> {signature: partitioned computation}; lives as long as the output module.
_COPIES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def normalize(s: HloSharding, shape: Shape) -> HloSharding:
    """``s`` in the form a value of ``shape`` carries: one element per leaf for a flat
    tuple (a non-tuple sharding on a tuple applies to every element)."""
    if not shape.is_tuple or s.is_tuple:
        return s
    if any(e.is_tuple for e in shape.tuple_shapes):
        return s  # nested tuples: the shared sharding applies to every leaf as it is
    return HloSharding.tuple([s] * len(shape.tuple_shapes))


def partitioned_callee(ctx: PartitionContext, comp: Computation,
                       param_shardings: Sequence[HloSharding],
                       root_sharding: HloSharding) -> Computation:
    """The partitioned copy of ``comp`` for this signature (made on first use)."""
    from hlo_spmd.passes.partition.driver import partition_computation

    groups = ctx.grouping.groups
    key = (id(comp), tuple(param_shardings), root_sharding, array_token(groups))
    copies = _COPIES.setdefault(ctx.state.out, {})
    hit = copies.get(key)
    if hit is not None and hit[0] is comp and hit[1] in ctx.state.out.computations:
        return hit[1]
    out = partition_computation(ctx, comp, list(param_shardings), root_sharding)
    copies[key] = (comp, out)
    return out


def uniform_scalar(s: HloSharding | None) -> HloSharding:
    """Sharding of a predicate every participant must agree on: replicated, or within
    each manual group when ``s`` (a value it depends on) is manual or partially manual."""
    leaves = s.tuple_elements if s is not None and s.is_tuple else (s,)
    for leaf in leaves:
        if leaf is not None and (leaf.is_manual or leaf.is_manual_subgroup):
            return replicate_all_data_dims(leaf, 0)
    return HloSharding.replicate()


@handles("while")
def handle_while(ctx: PartitionContext, inst: Instruction) -> PValue:
    body, cond = inst.called_computations
    carry = normalize(ctx.sharding_of(inst), inst.shape)
    init = ctx.operand(inst, 0, carry)
    new_body = partitioned_callee(ctx, body, [carry], carry)
    new_cond = partitioned_callee(ctx, cond, [carry], uniform_scalar(carry))
    out = ctx.b.op("while", [init], copy_attrs(inst), [new_body, new_cond],
                   declared=ctx.local_shape(inst.shape, carry), name=inst.name)
    return PValue(out, inst.shape, carry)


@handles("conditional")
def handle_conditional(ctx: PartitionContext, inst: Instruction) -> PValue:
    out_sharding = normalize(ctx.sharding_of(inst), inst.shape)
    index = ctx.operand(inst, 0, uniform_scalar(ctx.value(inst.operands[0]).sharding))
    args: list[Instruction] = []
    branches: list[Computation] = []
    for i, comp in enumerate(inst.called_computations):
        operand = inst.operands[i + 1]
        pv = ctx.value(operand)
        s = normalize(pv.sharding, operand.shape)
        args.append(pv.hlo)
        branches.append(partitioned_callee(ctx, comp, [s], out_sharding))
    out = ctx.b.op("conditional", [index, *args], copy_attrs(inst), branches,
                   declared=ctx.local_shape(inst.shape, out_sharding), name=inst.name)
    return PValue(out, inst.shape, out_sharding)


@handles("call")
def handle_call(ctx: PartitionContext, inst: Instruction) -> PValue:
    out_sharding = normalize(ctx.sharding_of(inst), inst.shape)
    args: list[Instruction] = []
    shardings: list[HloSharding] = []
    for operand in inst.operands:
        pv = ctx.value(operand)
        args.append(pv.hlo)
        shardings.append(normalize(pv.sharding, operand.shape))
    callee = partitioned_callee(ctx, inst.called_computations[0], shardings, out_sharding)
    out = ctx.b.op("call", args, copy_attrs(inst), [callee],
                   declared=ctx.local_shape(inst.shape, out_sharding), name=inst.name)
    return PValue(out, inst.shape, out_sharding)

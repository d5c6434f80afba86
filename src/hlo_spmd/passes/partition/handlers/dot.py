"""The dot handler: GSPMD's einsum partitioning with recursive device grouping.

``handle_dot`` classifies the dims (dot_dims.DotDims), asks the planner (dot_plan) for
the cheapest strategy by estimated bytes communicated per device, and emits it:

* a base plan reshards both operands to the tiles of one iteration-space sharding, masks
  the padding of unevenly sharded contracting dims to zero, runs one local dot, and
  combines partial sums with an all-reduce or a reduce-scatter;
* a group plan reshards the operands so that device groups hold blocks of the matched
  dims, masks grouped contracting dims, and recurses inside
  ``ctx.in_group(ctx.grouping.subgroup(groups))`` on per-group shapes and inner
  shardings - collectives created there act within every group at once - followed by an
  all-reduce across groups when the grouped dims were contracting dims.

The result always ends with exactly the instruction's sharding (reshard at the end).
Manual shardings: fully manual dots run as written; partially manual (manual subgroup)
dots recurse inside the manual groups.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.primitive_types import PrimitiveType, element_bytes
from hlo_spmd.memo import BoundedMemo
from hlo_spmd.passes.partition.causes import with_cause
from hlo_spmd.errors import PartitionError
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.support.dot_dims import (CONTRACTING, DotDims, data_tiles,
                                                       is_plain, manual_groups)
from hlo_spmd.passes.partition.support.dot_plan import (BasePlan, GroupPlan, Plan, Planner,
                                                       Problem, reduction_groups_of)
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import handles
from hlo_spmd.passes.partition.reshard import pad_to
from hlo_spmd.sharding import HloSharding

from hlo_spmd.passes.partition.masking import mask_padding as _shared_mask_padding

# Shardings are immutable: one shared replicated sharding for the hot paths (a
# fresh one per instruction cost an allocation, and ``s is target`` tests hit first).
_REPLICATED = HloSharding.replicate()


# -- entry point ---------------------------------------------------------------------------
# One planner for the process: a plan depends only on its Problem (shapes, shardings,
# device count), and a training step repeats the same few dot problems per layer.
_PLANNER = Planner()


@handles("dot")
def handle_dot(ctx: PartitionContext, inst: Instruction) -> PValue:
    if len(inst.operands) != 2:  # sparse dots (metadata operands): whole-value fallback
        from hlo_spmd.passes.partition.handlers.basic import handle_replicated

        return handle_replicated(ctx, inst)
    dims = DotDims.of(inst)
    lhs, rhs = ctx.value(inst.operands[0]), ctx.value(inst.operands[1])
    target = ctx.sharding_of(inst)
    return partition_dot(ctx, inst, dims, lhs, rhs, target)


def partition_dot(ctx: PartitionContext, inst: Instruction, dims: DotDims, lhs: PValue,
                  rhs: PValue, target: HloSharding, local_op: "LocalOp | None" = None) -> PValue:
    """``inst`` (a dot, or a convolution read as one, with ``dims``) on partitioned
    operands, with sharding ``target``. ``local_op(ctx, inst, dims, l, r)`` emits the
    per-device op (default: ``inst`` on the local operands; the convolution handler passes
    one that rewrites the window and group counts)."""
    local_op = local_op or _local_dot
    out_dims = dims.out_dims(lhs.base_shape.dims, rhs.base_shape.dims)
    out_shape = inst.shape.with_dims(out_dims) if tuple(inst.shape.dims) != out_dims \
        else inst.shape
    lf, rf, tf = _facts(lhs.sharding), _facts(rhs.sharding), _facts(target)
    if tf[1] or (lf[1] and rf[1]):  # manual
        if not (tf[1] and lf[1] and rf[1]):
            raise PartitionError("a dot mixes manual and non-manual operands or result",
                                 f"instruction {inst.name}")
        return PValue(local_op(ctx, inst, dims, lhs.hlo, rhs.hlo), out_shape, target)
    if tf[2]:  # unreduced, with no manual subgroup
        from hlo_spmd.passes.partition import unreduced

        out = unreduced.dot_unreduced(ctx, inst, dims, lhs, rhs, target, out_shape,
                                      local_op, mask_padding)
        if out is not None:
            return out
    if lf[3] or rf[3] or tf[3]:  # tiled with a manual subgroup
        return _partition_in_manual_groups(ctx, inst, dims, lhs, rhs, target, out_shape,
                                           local_op)
    work_target = target if tf[4] else _REPLICATED
    if not lf[4]:
        lhs = ctx.reshard(lhs, _REPLICATED)
    if not rf[4]:
        rhs = ctx.reshard(rhs, _REPLICATED)
    problem = Problem(dims, tuple(lhs.base_shape.dims), tuple(rhs.base_shape.dims),
                      lhs.sharding, rhs.sharding, work_target, ctx.num_devices,
                      (_ebytes(lhs.hlo), _ebytes(rhs.hlo), element_bytes(inst.shape.element_type)))
    plan = _PLANNER.plan(problem)
    _record_plan(ctx, inst, plan)
    threshold = ctx.state.options.windowed_einsum_threshold_mib
    if threshold is not None and local_op is _local_dot:
        from hlo_spmd.passes.partition.support.dot_windowed import windowed_dot

        out = windowed_dot(ctx, inst, plan, problem, lhs, rhs, out_shape, threshold,
                           ctx.state.options.windowed_einsum_bidirectional,
                           local_dot=_local_dot)
        if out is not None:
            return ctx.reshard(ctx.reshard(out, problem.out), target)
    out = emit_plan(ctx, inst, plan, problem, lhs, rhs, out_shape, local_op)
    return ctx.reshard(out, target)


# id(sharding) -> (sharding, manual, unreduced without a manual subgroup, tiled with a
# manual subgroup, plain): what partition_dot asks of each of its three shardings, for
# every dot of every layer. Shardings are immutable shared objects, held in the entry.
_FACTS = BoundedMemo(4096)


def _facts(s: HloSharding) -> tuple:
    got = _FACTS.get(id(s))
    if got is None:
        from hlo_spmd.passes.partition import unreduced

        manual_dim = s.subgroup_manual_dim
        got = _FACTS.put(id(s), (s, s.is_manual,
                                 unreduced.is_unreduced(s) and manual_dim is None,
                                 s.is_tiled and manual_dim is not None, is_plain(s)))
    return got


# -- emission ------------------------------------------------------------------------------
def emit_plan(ctx: PartitionContext, inst: Instruction, plan: Plan, p: Problem, lhs: PValue,
              rhs: PValue, out_shape, local_op: "LocalOp | None" = None) -> PValue:
    """Emit ``plan`` for problem ``p``; the result has sharding ``p.out``."""
    local_op = local_op or _local_dot
    threshold = ctx.state.options.windowed_einsum_threshold_mib
    pv = None
    if isinstance(plan, GroupPlan):
        pv = _emit_group(ctx, inst, plan, p, lhs, rhs, out_shape, local_op)
    elif threshold is not None and local_op is _local_dot and plan.post == "reduce-scatter":
        # Windowed einsum, reduce-scatter form (here so it applies inside groups too).
        from hlo_spmd.passes.partition.support.dot_windowed import windowed_reduce_scatter

        pv = windowed_reduce_scatter(ctx, inst, plan, p, lhs, rhs, out_shape, threshold,
                                     ctx.state.options.windowed_einsum_bidirectional,
                                     local_dot=_local_dot, mask_padding=mask_padding)
    if pv is None:
        pv = _emit_base(ctx, inst, plan, p, lhs, rhs, out_shape, local_op)
    return ctx.reshard(pv, p.out)


@with_cause("contraction")
def _emit_base(ctx: PartitionContext, inst: Instruction, plan: BasePlan, p: Problem,
               lhs: PValue, rhs: PValue, out_shape, local_op: "LocalOp") -> PValue:
    d = p.dims
    l = ctx.reshard(lhs, plan.lhs_t)
    r = ctx.reshard(rhs, plan.rhs_t)
    tiles = data_tiles(plan.t, d.iter_rank)
    sizes = p.iter_sizes
    lmask, rmask = [], []
    for j, c in enumerate(d.kind_dims(CONTRACTING)):
        k = d.out_rank + j
        if tiles[k] > 1 and sizes[k] % tiles[k]:
            lmask.append(c.lhs)
            rmask.append(c.rhs)
    l = mask_padding(ctx, l, lmask)
    r = mask_padding(ctx, r, rmask)
    x = local_op(ctx, inst, d, l.hlo, r.hlo)
    if plan.post == "all-reduce":
        x = ctx.f.all_reduce(x, _adder(x), reduction_groups_of(plan, d))
    elif plan.post == "reduce-scatter":
        groups = reduction_groups_of(plan, d)
        k = groups.shape[1]
        dim = plan.scatter_dim
        padded = list(x.shape.dims)
        padded[dim] = -(-padded[dim] // k) * k
        x = ctx.f.reduce_scatter(pad_to(ctx, x, padded), dim, _adder(x), groups)
    return PValue(x, out_shape, plan.result)


@with_cause("contraction")
def _emit_group(ctx: PartitionContext, inst: Instruction, plan: GroupPlan, p: Problem,
                lhs: PValue, rhs: PValue, out_shape, local_op: "LocalOp") -> PValue:
    l = ctx.reshard(lhs, plan.lhs_t)
    r = ctx.reshard(rhs, plan.rhs_t)
    if plan.kind == CONTRACTING:
        # Padding of the grouped contracting dims becomes data inside the groups: zero it.
        l = mask_padding(ctx, l, list(plan.x_dims[0]))
        r = mask_padding(ctx, r, list(plan.x_dims[1]))
    grouping = ctx.grouping
    sub = plan.subgroups.get(id(grouping))
    if sub is None:  # (the outer grouping is held, so its id stays its own)
        sub = plan.subgroups[id(grouping)] = (grouping, grouping.subgroup(plan.groups))
    inner_ctx = ctx.in_group(sub[1])
    inner = plan.inner
    li = PValue(l.hlo, _with_dims(l.base_shape, inner.lhs_shape), inner.lhs)
    ri = PValue(r.hlo, _with_dims(r.base_shape, inner.rhs_shape), inner.rhs)
    res = emit_plan(inner_ctx, inst, plan.inner_plan, inner, li, ri,
                    _with_dims(out_shape, inner.out_shape), local_op)
    x = res.hlo
    if plan.kind == CONTRACTING:
        x = ctx.f.all_reduce(x, _adder(x), plan.cross_groups)
    return PValue(x, out_shape, plan.result)


# (id(shape), dims) -> (shape, shape.with_dims(dims)): the per-group shapes of a grouped
# plan, asked for by every dot of every layer. Shapes are immutable and held in the entry.
_GROUP_SHAPES = BoundedMemo(4096)


def _with_dims(shape, dims: tuple[int, ...]):
    key = (id(shape), dims)
    hit = _GROUP_SHAPES.get(key)
    if hit is None:
        hit = _GROUP_SHAPES.put(key, (shape, shape.with_dims(dims)))
    return hit[1]


def _partition_in_manual_groups(ctx: PartitionContext, inst: Instruction, dims: DotDims,
                                lhs: PValue, rhs: PValue, target: HloSharding,
                                out_shape, local_op: "LocalOp") -> PValue:
    """Partially manual dot: recurse inside the manual groups (GSPMD 4.4), which operands
    and result must share; the non-manual rest of the shardings is partitioned there."""
    found = manual_groups((lhs.sharding, rhs.sharding, target),
                          (dims.lhs_rank, dims.rhs_rank, dims.out_rank))
    assert found is not None  # the caller saw a partially manual sharding
    groups, inner = found
    if any(g is None for g in inner):
        raise PartitionError(f"the dot's operands and result are not in the same manual "
                             f"groups ({lhs.sharding}, {rhs.sharding} -> {target})",
                             f"instruction {inst.name}")
    inner_ctx = ctx.in_group(ctx.grouping.subgroup(groups))
    res = partition_dot(inner_ctx, inst, dims, lhs.with_hlo(lhs.hlo, inner[0]),
                        rhs.with_hlo(rhs.hlo, inner[1]), inner[2], local_op)
    return PValue(res.hlo, out_shape, target)


def _record_plan(ctx: PartitionContext, inst: Instruction, plan: Plan) -> None:
    """Remember the chosen strategy on the report (``report.dot_plans[name]``)."""
    plans = ctx.state.report.dot_plans
    if inst.name not in plans:
        # Plans are shared by every dot with the same problem: describe each once (the
        # text holds sharding strings). The entry keeps the plan, so its id stays unique.
        got = _DESCRIBED.get(id(plan))
        if got is None or got[0] is not plan:
            got = _DESCRIBED.put(id(plan), (plan, plan.describe()))
        plans[inst.name] = got[1]


_DESCRIBED = BoundedMemo(4096)  # id(plan) -> (plan, description): the plan stays alive


# -- helpers -------------------------------------------------------------------------------
LocalOp = Callable[[PartitionContext, Instruction, DotDims, Instruction, Instruction],
                   Instruction]


def _local_dot(ctx: PartitionContext, inst: Instruction, dims: DotDims, l: Instruction,
               r: Instruction) -> Instruction:
    from hlo_spmd.ir.shape_inference import array_shape

    return ctx.emit_like(inst, [l, r], array_shape(inst.shape.element_type, ()))


def _adder(x: Instruction) -> str:
    return "or" if x.shape.element_type == PrimitiveType.PRED else "add"


def _ebytes(x: Instruction) -> float:
    return element_bytes(x.shape.element_type)


def mask_padding(ctx: PartitionContext, pv: PValue, dims: list[int]) -> PValue:
    """``pv`` with the padding of its uneven shards on ``dims`` replaced by zeros."""
    s = pv.sharding
    if not dims or not s.is_tiled:
        return pv
    base = pv.base_shape.dims
    tiles = s.tile_dims_for_data()
    dims = [d for d in dims if tiles[d] > 1 and base[d] % tiles[d]]
    if not dims:
        return pv
    out = _shared_mask_padding(ctx, pv, dims, 0)
    return out if isinstance(out, PValue) else pv.with_hlo(out)


__all__ = ["handle_dot", "partition_dot", "mask_padding"]

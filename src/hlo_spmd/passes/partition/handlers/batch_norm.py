"""batch-norm-training, batch-norm-inference and batch-norm-grad without replication (XLA's
partitioner replicates them; PyTorch/XLA emits them for every LayerNorm).

The operand keeps its sharding. The per-feature vectors (scale, offset, mean, variance and
the statistics the ops return) take the operand's sharding of the feature dim, replicated
over the other dims (``reduce.reduced_sharding``). A sharded feature dim is local work. A
sharded reduced dim (batch, spatial) needs the statistics of every shard: each device
sums its real elements (padding masked to 0, ``reduce.mask_reduced_padding``) and the two
sums of an op (training: sum and sum of squares; grad: sum of the output gradient and of
its product with the normalized operand) are combined with one all-reduce over the
devices that split the reduced dims (``reduce.reduction_groups``). Then, as XLA's
BatchNormExpander does: mean = E[x], var = E[x^2] - mean^2; the grad is
scale * rsqrt(var + eps) * (dy - E[dy] - xhat * E[dy * xhat]).
"""
from __future__ import annotations

import math

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.passes.partition.causes import with_cause
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.handlers.basic import handle_replicated
from hlo_spmd.passes.partition.handlers.reduce import (leaf_elements, mask_reduced_padding,
                                                       reduced_sharding, reduction_groups)
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import handles
from hlo_spmd.passes.partition.reshard import reshard
from hlo_spmd.sharding import HloSharding


def _operand_sharding(ctx: PartitionContext, inst: Instruction) -> HloSharding | None:
    """The operand's sharding, or the result's (0th element) when the operand is
    replicated (cutting tiles is free); None when it is not a plain (partially) tiled or
    replicated sharding."""
    src = ctx.value(inst.operands[0]).sharding
    full = ctx.sharding_of(inst)
    out0 = full.tuple_elements[0] if full.is_tuple else full
    plain = (lambda s: not (s.is_tuple or s.is_manual or s.is_maximal or s.subgroup_types)
             and (s.is_tiled or s.is_replicated))
    if not plain(src) or not plain(out0):
        return None
    if src.is_replicated and out0.is_tiled:
        return out0
    return src


class _Local:
    """The local pieces shared by the three ops."""

    def __init__(self, ctx: PartitionContext, inst: Instruction, src: HloSharding) -> None:
        self.ctx, self.inst, self.src = ctx, inst, src
        shape = inst.operands[0].shape
        self.shape = shape
        self.f = int(inst.attrs.feature_index)
        self.eps = float(inst.attrs.epsilon)
        self.red = [d for d in range(shape.rank) if d != self.f]
        self.feat = reduced_sharding(src, self.red)
        tiles = src.tile_dims_for_data(shape.rank) if src.is_tiled else (1,) * shape.rank
        self.sharded = [d for d in self.red if tiles[d] > 1]
        self.count = math.prod(shape.dims[d] for d in self.red)

    def feature(self, i: int) -> Instruction:
        return self.ctx.operand(self.inst, i, self.feat)

    def bcast(self, v: Instruction, like: Instruction) -> Instruction:
        return self.ctx.b.broadcast(v, list(like.shape.dims), [self.f])

    def masked(self, xs: list[Instruction]) -> list[Instruction]:
        zero = self.ctx.b.scalar(0, xs[0])
        return mask_reduced_padding(self.ctx, xs, self.shape, self.src, self.sharded,
                                    [zero] * len(xs))

    def sums(self, xs: list[Instruction]) -> list[Instruction]:
        """Per-feature sums of each of ``xs`` over the reduced dims, over all shards
        (one all-reduce for all of them)."""
        b = self.ctx.b
        parts = [b.reduce(x, b.scalar(0, x), self.red, "add") for x in xs]
        if not self.sharded:
            return parts
        n = parts[0].shape.dims[0]
        stacked = b.concatenate([b.reshape(p, [1, n]) for p in parts], 0)
        total = self.ctx.f.all_reduce(stacked, "add", reduction_groups(self.src, self.sharded))
        return [b.reshape(b.slice(total, [k, 0], [k + 1, n], [1, 1]), [n])
                for k in range(len(parts))]

    def rsqrt(self, var: Instruction) -> Instruction:
        b = self.ctx.b
        return b.unary("rsqrt", b.binary("add", var, b.broadcast(b.scalar(self.eps, var),
                                                                 list(var.shape.dims), [])))

    def per_feature(self, value: float, like: Instruction) -> Instruction:
        return self.ctx.b.broadcast(self.ctx.b.scalar(value, like), list(like.shape.dims), [])

    def finish(self, out: Instruction, shardings: list[HloSharding]) -> PValue:
        inst = self.inst
        s = HloSharding.tuple(shardings) if inst.shape.is_tuple else shardings[0]
        target = self.ctx.sharding_of(inst)
        if inst.shape.is_tuple:
            target = HloSharding.tuple(leaf_elements(target, len(shardings)))
        return reshard(self.ctx, PValue(out, inst.shape, s), target)


@handles("batch-norm-training", "batch-norm-inference", "batch-norm-grad")
@with_cause("reduction")
def handle_batch_norm(ctx: PartitionContext, inst: Instruction) -> PValue:
    src = _operand_sharding(ctx, inst)
    if src is None or any(d == 0 for d in inst.operands[0].shape.dims):
        return handle_replicated(ctx, inst)
    loc = _Local(ctx, inst, src)
    b = ctx.b
    x = ctx.operand(inst, 0, src)
    if inst.opcode == "batch-norm-inference":
        scale, offset, mean, var = (loc.feature(i) for i in range(1, 5))
        y = b.binary("multiply", b.binary("subtract", x, loc.bcast(mean, x)),
                     loc.bcast(b.binary("multiply", loc.rsqrt(var), scale), x))
        y = b.binary("add", y, loc.bcast(offset, x))
        return loc.finish(y, [src])
    if inst.opcode == "batch-norm-training":
        scale, offset = loc.feature(1), loc.feature(2)
        (xm,) = loc.masked([x])
        s1, s2 = loc.sums([xm, b.binary("multiply", xm, xm)])
        inv_n = loc.per_feature(1.0 / loc.count, s1)
        mean = b.binary("multiply", s1, inv_n)
        var = b.binary("subtract", b.binary("multiply", s2, inv_n),
                       b.binary("multiply", mean, mean))
        y = b.binary("multiply", b.binary("subtract", x, loc.bcast(mean, x)),
                     loc.bcast(b.binary("multiply", loc.rsqrt(var), scale), x))
        y = b.binary("add", y, loc.bcast(offset, x))
        return loc.finish(b.tuple([y, mean, var]), [src, loc.feat, loc.feat])
    # batch-norm-grad(operand, scale, mean, variance, grad_output)
    scale, mean, var = loc.feature(1), loc.feature(2), loc.feature(3)
    dy = ctx.operand(inst, 4, src)
    xm, dym = loc.masked([x, dy])
    rs = loc.rsqrt(var)
    xhat = b.binary("multiply", b.binary("subtract", xm, loc.bcast(mean, xm)), loc.bcast(rs, xm))
    sum_dy, sum_dy_xhat = loc.sums([dym, b.binary("multiply", dym, xhat)])
    inv_n = loc.per_feature(1.0 / loc.count, sum_dy)
    centred = b.binary("subtract", dy, loc.bcast(b.binary("multiply", sum_dy, inv_n), dy))
    xhat_full = b.binary("multiply", b.binary("subtract", x, loc.bcast(mean, x)),
                         loc.bcast(rs, x))
    centred = b.binary("subtract", centred, b.binary(
        "multiply", xhat_full, loc.bcast(b.binary("multiply", sum_dy_xhat, inv_n), x)))
    dx = b.binary("multiply", centred, loc.bcast(b.binary("multiply", scale, rs), x))
    return loc.finish(b.tuple([dx, sum_dy_xhat, sum_dy]), [src, loc.feat, loc.feat])

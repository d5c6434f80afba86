"""Windowed einsum (collective matmul): a dot whose plan all-gathers one operand becomes a
loop of collective-permutes, each step computing a partial dot on the piece at hand, so
no device ever holds the whole gathered operand (``windowed_dot``); a dot whose plan sums
partial results with a reduce-scatter becomes a loop that passes the accumulator of one
output piece around the ring instead, so no device holds the whole unreduced result
(``windowed_reduce_scatter``, XLA's windowed einsum at contracting dims).

Both mirror XLA's windowed einsum loops in dot_handler.cc
(``threshold_for_windowed_einsum_mib``, ``bidirectional_windowed_einsum``). The threshold
is compared with the bytes the replaced collective would leave on one device: the
gathered operand, or the unreduced local result.

The all-gather form applies to a base plan (dot_plan) in which one operand ("the
window") is tiled on a single dim ``c`` across every device of the current group, evenly,
and must be gathered whole (its target is replicated), the other operand needs no
partial-sum reduction, and the gather exceeds the threshold. With ``n`` devices, at step
``i`` logical device ``j`` holds piece ``(j + i) mod n`` of the window:

* ``c`` contracting: the other operand's matching slice times the piece is added to the
  accumulator (the full local result);
* ``c`` non-contracting: the piece's result is written into its place of the result dim.

The piece moves one device down the ring after each step (``n - 1`` collective-permutes
of one piece: the bytes of the all-gather it replaces). The loop runs ``n - 1`` steps; the
last piece is computed after it. Bidirectional (XLA's windowed_einsum bidirectional
form, ``n`` even): a second stream walks the ring the other way (pieces ``j - 1 - i``),
two partial dots per step, ``n / 2 - 1`` steps -- the same bytes in half the rounds.

The reduce-scatter form is described at ``windowed_reduce_scatter``; it is called where
base plans are emitted (dot.emit_plan), so it also runs inside device groups.

The dot handler passes in its per-device dot (``local_dot``) and its padding mask, so
this module does not import the handler that calls it.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from hlo_spmd.ir.builder import Builder
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.primitive_types import PrimitiveType, element_bytes
from hlo_spmd.ir.shape import Shape
from hlo_spmd.passes.partition.causes import with_cause
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.support.dot_dims import (CONTRACTING, LHS_NC, RHS_NC, DotDims,
                                                       data_tiles)
from hlo_spmd.passes.partition.support.dot_plan import (BasePlan, GroupPlan, Plan, Problem,
                                                       reduction_groups_of)
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.local_cut import pad_to

S32 = PrimitiveType.S32
# dot._local_dot: the per-device dot of ``inst`` on local operands.
LocalDot = Callable[[PartitionContext, Instruction, DotDims, Instruction, Instruction],
                    Instruction]
# dot.mask_padding: ``pv`` with the padding of its uneven shards on ``dims`` zeroed.
MaskPadding = Callable[[PartitionContext, PValue, list[int]], PValue]


@with_cause("contraction")
def windowed_dot(ctx: PartitionContext, inst: Instruction, plan: Plan, p: Problem,
                 lhs: PValue, rhs: PValue, out_shape: Shape,
                 threshold_mib: float, bidirectional: bool = False, *,
                 local_dot: LocalDot) -> PValue | None:
    """The windowed form of ``plan``, or None when it does not apply (then the plan is
    emitted as usual). The result has sharding ``plan.result``."""
    if not _no_reduction(plan):
        return None
    n = ctx.num_devices
    for side, (win, win_t, other, other_t) in enumerate(
            ((lhs, plan.lhs_t, rhs, plan.rhs_t), (rhs, plan.rhs_t, lhs, plan.lhs_t))):
        c = _window_dim(win, win_t, n)
        if c is None:
            continue
        gathered = math.prod(win.base_shape.dims) * element_bytes(win.hlo.shape.element_type)
        if gathered <= threshold_mib * 2 ** 20:
            continue
        kind, pos = _role(p, side, c)
        if kind is None:
            continue
        return _emit(ctx, inst, plan, p, side, c, kind, pos, win,
                     ctx.reshard(other, other_t), out_shape, bidirectional, local_dot)
    return None


def _no_reduction(plan: Plan) -> bool:
    """A plan of one local dot per device with no partial sums: a base plan without a
    reduction, or a grouping down to single devices on non-contracting dims (the same
    program; the planner prefers that form on ties)."""
    if isinstance(plan, BasePlan):
        return plan.post == "none"
    return (isinstance(plan, GroupPlan) and plan.kind != CONTRACTING and
            plan.inner.n == 1 and isinstance(plan.inner_plan, BasePlan))


def _window_dim(win: PValue, target, n: int) -> int | None:
    """The one dim ``win`` is tiled on, over all ``n`` devices and evenly, when its plan
    gathers it whole."""
    s = win.sharding
    if n < 2 or not target.is_replicated or not s.is_tiled or s.is_partial_replicated \
            or s.subgroup_types:
        return None
    tiles = data_tiles(s, win.base_shape.rank)
    tiled = [k for k, t in enumerate(tiles) if t > 1]
    if len(tiled) != 1 or tiles[tiled[0]] != n or win.base_shape.dims[tiled[0]] % n:
        return None
    # Logical device j must hold piece j (the ring below walks pieces in device order).
    if not np.array_equal(s.tile_assignment.array().reshape(-1), np.arange(n)):
        return None
    return tiled[0]


def _role(p: Problem, side: int, c: int) -> tuple[str | None, int]:
    """("contracting", the other operand's matching dim) or ("output", the result dim of
    a non-contracting dim); batch dims are not windowed."""
    d = p.dims
    for cd in d.contracting:
        ld, rd = cd.lhs, cd.rhs
        if (ld, rd)[side] == c:
            return "contracting", (rd, ld)[side]
    it = d.tensor_iter(side)[c]  # iteration dims 0..out_rank-1 are the output dims
    if it in d.kind_iter(LHS_NC) or it in d.kind_iter(RHS_NC):
        return "output", it
    return None, -1


def _emit(ctx: PartitionContext, inst: Instruction, plan: Plan, p: Problem, side: int,
          c: int, kind: str, pos: int, win: PValue, other: PValue, out_shape: Shape,
          bidirectional: bool, local_dot: LocalDot) -> PValue:
    n = ctx.num_devices
    b = ctx.b
    piece = int(win.hlo.shape.dims[c])
    et = inst.shape.element_type
    ring = np.arange(n)
    # Streams of pieces: (piece held at step i as (j + sign * i + start) mod n, the pairs
    # that pass it on). Forward: piece j + i, received from j + 1. Backward (the
    # bidirectional form): piece j - 1 - i, received from j - 1, after a first shift.
    forward = (1, 0, np.stack([(ring + 1) % n, ring], axis=1))
    backward = (-1, -1, np.stack([(ring - 1) % n, ring], axis=1))
    streams = [forward, backward] if bidirectional and n % 2 == 0 and n >= 4 else [forward]
    steps = n // len(streams)  # pieces per stream

    def step(bctx: PartitionContext, o: Instruction, w: Instruction, acc: Instruction,
             i: Instruction, sign: int, start: int) -> Instruction:
        """Add (or place) the partial dot of the piece ``w`` this device holds."""
        bb = bctx.b
        me = bctx.logical_table(ring.astype(np.int64))
        k = bb.add(me, bb.multiply(i, bb.constant(np.int64(sign), S32))) if sign > 0 else \
            bb.subtract(me, i)
        k = bb.add(k, bb.constant(np.int64(start + n), S32))  # keep it non-negative
        k = bb.remainder(k, bb.constant(np.int64(n), S32))
        off = bb.multiply(k, bb.constant(np.int64(piece), S32))
        zero = bb.constant(np.int64(0), S32)
        if kind == "contracting":
            starts = [zero] * o.shape.rank
            starts[pos] = off
            sizes = list(o.shape.dims)
            sizes[pos] = piece
            o = bb.dynamic_slice(o, starts, sizes)
        part = local_dot(bctx, inst, p.dims, *((w, o) if side == 0 else (o, w)))
        if kind == "contracting":
            return bb.add(acc, part)
        starts = [zero] * acc.shape.rank
        starts[pos] = off
        return bb.dynamic_update_slice(acc, part, starts)

    # The accumulator: the full local result of the plan, zero.
    acc0 = b.broadcast(b.constant(np.asarray(0), et), list(_result_local(p, plan)), [])
    pieces = [win.hlo if start == 0 else ctx.f.collective_permute(win.hlo, pairs)
              for _, start, pairs in streams]
    zero = b.constant(np.int64(0), S32)
    init = b.tuple([other.hlo, acc0, zero] + pieces)
    state = init.shape

    # Body: one step per stream, then every piece moves on.
    body_b = b.new_computation(f"{inst.name}.windowed_body")
    bctx = ctx.for_computation(body_b)
    param = body_b.parameter(0, state, name="state")
    o, acc, i, *ws = (body_b.get_tuple_element(param, k) for k in range(3 + len(streams)))
    for w, (sign, start, _) in zip(ws, streams):
        acc = step(bctx, o, w, acc, i, sign, start)
    moved = [bctx.f.collective_permute(w, pairs) for w, (_, _, pairs) in zip(ws, streams)]
    i_next = body_b.add(i, body_b.constant(np.int64(1), S32))
    body_b.set_root(body_b.tuple([o, acc, i_next] + moved))

    loop = _counted_loop(b, f"{inst.name}.windowed", init, body_b, steps - 1)
    # The last pieces, after the loop (no permute left to do).
    o, acc, i, *ws = (b.get_tuple_element(loop, k) for k in range(3 + len(streams)))
    for w, (sign, start, _) in zip(ws, streams):
        acc = step(ctx, o, w, acc, i, sign, start)
    return PValue(acc, out_shape, plan.result)


@with_cause("contraction")
def windowed_reduce_scatter(ctx: PartitionContext, inst: Instruction, plan: BasePlan,
                            p: Problem, lhs: PValue, rhs: PValue, out_shape: Shape,
                            threshold_mib: float, bidirectional: bool = False, *,
                            local_dot: LocalDot, mask_padding: MaskPadding
                            ) -> PValue | None:
    """The reduce-scatter form of a base plan whose partial sums end in a reduce-scatter
    (called where base plans are emitted, so it also applies inside device groups).
    Instead of one local dot whose whole (unreduced) result is then reduce-scattered over
    the ``k`` devices of each contracting group, the device at position ``q`` of its
    group (its reduce-scatter shard index) computes at step ``i`` only the partial dot of
    output piece ``(q + i + 1) mod k`` (its operands sliced on the scatter dim), adds it
    to the accumulator it received, and passes the accumulator to position ``q - 1``.
    After ``k - 1`` permutes of one piece (the reduce-scatter's bytes) and ``k`` partial
    dots, position ``q`` holds the full sum of piece ``q``: what the reduce-scatter gives
    it. Bidirectional: each piece is split in two halves on the scatter dim, one summed
    around the ring each way (half the bytes per link and round).

    Applies when the unreduced local result exceeds the threshold; None otherwise. The result has
    sharding ``plan.result``, as the reduce-scatter's."""
    d = p.dims
    if plan.post != "reduce-scatter":
        return None
    groups = reduction_groups_of(plan, d)  # [g, k] logical ids, position = piece index
    k = int(groups.shape[1])
    tiles = data_tiles(plan.t, d.iter_rank)
    sizes = p.iter_sizes
    if k < 2:
        return None
    dim = plan.scatter_dim
    local = [-(-s // t) for s, t in zip(sizes[:d.out_rank], tiles[:d.out_rank])]
    if math.prod(local) * p.ebytes[2] <= threshold_mib * 2 ** 20:
        return None
    piece = -(-local[dim] // k)  # padded at the end when uneven, as the reduce-scatter's
    halves = 2 if bidirectional and k >= 3 and piece % 2 == 0 else 1
    sub = piece // halves
    # Which dim of each operand carries the scatter dim (iteration dim ``dim``).
    slice_dims = [d.tensor_iter(side).index(dim) if dim in d.tensor_iter(side) else None
                  for side in (0, 1)]
    # Padding of unevenly tiled contracting dims must add nothing: zero it (as the
    # one-dot form does).
    uneven = [c for j, c in enumerate(d.kind_dims(CONTRACTING)) if tiles[d.out_rank + j] > 1]
    l = mask_padding(ctx, ctx.reshard(lhs, plan.lhs_t), [c.lhs for c in uneven]).hlo
    r = mask_padding(ctx, ctx.reshard(rhs, plan.rhs_t), [c.rhs for c in uneven]).hlo
    # Operands padded on the scatter dim to ``k`` whole pieces (the rows added only make
    # result padding).
    l, r = (x if sd is None else
            pad_to(ctx, x, [piece * k if j == sd else e for j, e in enumerate(x.shape.dims)])
            for x, sd in zip((l, r), slice_dims))
    pos = np.empty(ctx.num_devices, np.int64)
    pos[groups.reshape(-1)] = np.tile(np.arange(k), groups.shape[0])
    # Stream 0 sends position q to q - 1 and works on piece q + i + 1; stream 1 (the
    # other half of every piece) sends q to q + 1 and works on piece q - i - 1.
    streams = [(1, np.roll(groups, 1, axis=1)), (-1, np.roll(groups, -1, axis=1))][:halves]
    streams = [(sign, np.stack([groups.reshape(-1), dst.reshape(-1)], axis=1))
               for sign, dst in streams]
    b = ctx.b
    et = inst.shape.element_type

    def step(bctx: PartitionContext, o: list[Instruction], acc: Instruction, i: Instruction,
             sign: int, half: int) -> Instruction:
        """``acc`` plus this device's partial dot of the piece for step ``i``."""
        bb = bctx.b
        c = lambda v: bb.constant(np.int64(v), S32)  # noqa: E731
        me = bctx.logical_table(pos)
        kk = bb.add(me, bb.add(i, c(1))) if sign > 0 else \
            bb.add(bb.subtract(me, bb.add(i, c(1))), c(k))  # kept non-negative
        kk = bb.remainder(kk, c(k))
        off = bb.add(bb.multiply(kk, c(piece)), c(half * sub))
        ops = []
        for x, sd in zip(o, slice_dims):
            if sd is not None:
                starts = [c(0)] * x.shape.rank
                starts[sd] = off
                dims_ = list(x.shape.dims)
                dims_[sd] = sub
                x = bb.dynamic_slice(x, starts, dims_)
            ops.append(x)
        return bb.add(acc, local_dot(bctx, inst, d, *ops))

    acc_dims = list(local)
    acc_dims[dim] = sub
    acc0 = b.broadcast(b.constant(np.asarray(0), et), acc_dims, [])
    zero = b.constant(np.int64(0), S32)
    init = b.tuple([l, r, zero] + [acc0] * halves)
    state = init.shape

    body_b = b.new_computation(f"{inst.name}.windowed_rs_body")
    bctx = ctx.for_computation(body_b)
    param = body_b.parameter(0, state, name="state")
    bl, br, i, *accs = (body_b.get_tuple_element(param, j) for j in range(3 + halves))
    moved = [bctx.f.collective_permute(step(bctx, [bl, br], acc, i, sign, h), pairs)
             for h, (acc, (sign, pairs)) in enumerate(zip(accs, streams))]
    i_next = body_b.add(i, body_b.constant(np.int64(1), S32))
    body_b.set_root(body_b.tuple([bl, br, i_next] + moved))

    loop = _counted_loop(b, f"{inst.name}.windowed_rs", init, body_b, k - 1)
    ol, orr, i, *accs = (b.get_tuple_element(loop, j) for j in range(3 + halves))
    # The last partial dot (this device's own piece), after the loop.
    parts = [step(ctx, [ol, orr], acc, i, sign, h)
             for h, (acc, (sign, _)) in enumerate(zip(accs, streams))]
    out = parts[0] if halves == 1 else b.concatenate(parts, dim)
    return PValue(out, out_shape, plan.result)


def _counted_loop(b: Builder, name: str, init: Instruction, body_b: Builder,
                  trips: int) -> Instruction:
    """The while loop of both windowed forms: ``body_b``'s computation run ``trips`` times
    on ``init``, whose element 2 is the step counter the body increments (the last step
    runs after the loop, outside it)."""
    cond_b = b.new_computation(f"{name}_cond")
    cparam = cond_b.parameter(0, init.shape, name="state")
    ci = cond_b.get_tuple_element(cparam, 2)
    cond_b.set_root(cond_b.compare(ci, cond_b.constant(np.int64(trips), S32), "LT"))
    return b.while_loop(cond_b.computation, body_b.computation, init, name=name)


def _result_local(p: Problem, plan: Plan) -> tuple[int, ...]:
    tiles = data_tiles(plan.result, len(p.out_shape))
    return tuple(-(-s // t) for s, t in zip(p.out_shape, tiles))


__all__ = ["windowed_dot", "windowed_reduce_scatter"]

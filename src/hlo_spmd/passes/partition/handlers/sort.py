"""sort and top-k (opcode ``topk``).

Along an unsharded dim both run per tile with no communication. Along a sharded dim:

* sort moves the sharding off the sort dim onto another dim with an all-to-all (the
  reshard route picks it), sorts locally and reshards back -- XLA's approach in
  ``SpmdPartitioningVisitor::HandleSort``; the replicated fallback competes on bytes (a
  rank-1 sort has no other dim);
* top-k (also over a sharded last dim) is a local top-k of every shard (padding masked to
  the losing extreme), its indices shifted to global positions, an all-gather of the k
  candidates per shard, and a final stable sort of the gathered candidates cut to k -- the
  two-stage TopK of XLA's spmd_partitioner (``topk`` and the custom-call ``TopK``). It
  competes with moving the sharding (as for sort) and with the replicated fallback.

Ties keep the lower global index first: candidates arrive in shard (= index) order, each
shard's in top-k order, and the final sort is stable.
"""
from __future__ import annotations

import numpy as np

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.ir.shape import Shape
from hlo_spmd.passes.partition.causes import with_cause
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.handlers.basic import handle_replicated
from hlo_spmd.passes.partition.support.choose import cheapest_or_replicated
from hlo_spmd.passes.partition.support.common import emit_like
from hlo_spmd.passes.partition.support.local_dims import _common_leaf, _local, _sharded_dims
from hlo_spmd.passes.partition.masking import mask_padding, pad_value_identity
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import handles, handles_custom_call
from hlo_spmd.passes.partition.reshard import gather_groups, reshard
from hlo_spmd.sharding import HloSharding, device_offsets, partial_replicate


def _plain_tiled(s: HloSharding) -> bool:
    return s.is_tiled and not s.subgroup_types and not s.is_manual and not s.is_tuple


def moved_sharding(s: HloSharding, src: int, dst: int) -> HloSharding:
    """``s`` with the tiling of data dim ``src`` moved onto data dim ``dst`` (merged as
    the minor part of ``dst``'s tiling when ``dst`` is already tiled); same devices, so
    the move is one all-to-all."""
    arr = s.tile_assignment.array()
    order = [a for a in range(arr.ndim) if a != src]
    order.insert(order.index(dst) + 1, src)
    moved = np.transpose(arr, order)
    sizes = [arr.shape[a] for a in order]
    at = order.index(dst)
    sizes[at:at + 2] = [sizes[at] * sizes[at + 1]]
    moved = np.expand_dims(moved.reshape(sizes), src)
    return HloSharding.partial_tile(moved) if s.replicate_on_last_tile_dim \
        else HloSharding.tile(moved)


def _free_dims(s: HloSharding, shape: Shape, busy: int) -> list[int]:
    """Dims that can take ``busy``'s tiling: the unsharded ones if any, else every other
    dim with room for the extra tiles."""
    tiles = s.tile_dims_for_data(shape.rank)
    others = [e for e in range(shape.rank) if e != busy and shape.dims[e] > 1]
    free = [e for e in others if tiles[e] == 1]
    if free:
        return free
    return [e for e in others if shape.dims[e] >= tiles[e] * tiles[busy]]


def _normalized(inst: Instruction, leaf: HloSharding) -> HloSharding:
    return HloSharding.tuple([leaf] * len(inst.shape.tuple_shapes)) if inst.shape.is_tuple \
        else leaf


def _moved_local(ctx: PartitionContext, inst: Instruction, arrays: int, leaf: HloSharding,
                 dim: int, other: int) -> PValue:
    """Run the op per tile of ``leaf`` with ``dim``'s tiling moved to ``other``."""
    pv = _local(ctx, inst, arrays, moved_sharding(leaf, dim, other))
    return reshard(ctx, pv, _normalized(inst, leaf))


@handles("sort")
def handle_sort(ctx: PartitionContext, inst: Instruction) -> PValue:
    arrays = len(inst.operands)
    leaf = _common_leaf(ctx, inst, arrays)
    if leaf is None:
        return handle_replicated(ctx, inst)
    dim = inst.dimensions[0]
    if dim not in _sharded_dims(leaf):
        return _local(ctx, inst, arrays, leaf)
    if not _plain_tiled(leaf):
        return handle_replicated(ctx, inst)
    shape = inst.operands[0].shape
    cands = [(lambda e=e: _moved_local(ctx, inst, arrays, leaf, dim, e))
             for e in _free_dims(leaf, shape, dim)]
    cands.append(lambda: handle_replicated(ctx, inst))
    return cheapest_or_replicated(ctx, inst, cands)


def _k_largest(inst: Instruction) -> tuple[int, bool]:
    """(k, largest) of a ``topk`` op or a ``TopK`` custom-call (k from its result; the
    custom-call always selects the largest)."""
    if inst.opcode == "topk":
        return int(inst.attrs.k), bool(inst.attrs.largest)
    return int(inst.shape.tuple_shapes[0].dims[-1]), True


@with_cause("reduction")
def _two_stage_topk(ctx: PartitionContext, inst: Instruction, src: HloSharding,
                    leaf: HloSharding) -> PValue | None:
    b = ctx.b
    op = inst.operands[0]
    last = op.shape.rank - 1
    k, largest = _k_largest(inst)
    pv = ctx.value(op)
    x = pv.hlo
    if x.shape.dims[last] < k:
        return None
    et = x.shape.element_type
    # Padding must never win: fill it with the extreme that loses.
    x = mask_padding(ctx, pv, [last], pad_value_identity("maximum" if largest else "minimum", et))
    local = b.top_k(x, k, largest)
    vals = b.get_tuple_element(local, 0)
    idx = b.get_tuple_element(local, 1)
    table = device_offsets(src, op.shape.dims, num_devices=ctx.num_devices)[:, last]
    off = ctx.logical_table(table)
    idx = b.add(idx, b.broadcast(off, list(idx.shape.dims), []))
    groups = gather_groups(src, last)
    vals = ctx.f.all_gather(vals, last, groups)
    idx = ctx.f.all_gather(idx, last, groups)
    cmp = b.comparator_computation("GT" if largest else "LT", [et, PrimitiveType.S32])
    both = b.sort([vals, idx], last, cmp, is_stable=True)
    dims = list(vals.shape.dims)
    hi = dims[:last] + [k]
    out = [b.slice(b.get_tuple_element(both, i), [0] * len(dims), hi, [1] * len(dims))
           for i in range(2)]
    res = partial_replicate(src, [last])
    y = b.tuple(out, name=inst.name)
    return reshard(ctx, PValue(y, inst.shape, HloSharding.tuple([res, res])),
                   _normalized(inst, leaf))


@handles_custom_call("TopK")
@handles("topk")
def handle_topk(ctx: PartitionContext, inst: Instruction) -> PValue:
    """``topk`` and the ``TopK`` custom-call (same meaning: top k of the last dim, values
    and s32 indices)."""
    if inst.opcode == "custom-call" and not (
            len(inst.operands) == 1 and inst.shape.is_tuple
            and len(inst.shape.tuple_shapes) == 2 and inst.operands[0].shape.rank >= 1):
        return handle_replicated(ctx, inst)
    leaf = _common_leaf(ctx, inst, 2)
    op = inst.operands[0]
    last = op.shape.rank - 1
    src = ctx.value(op).sharding
    if leaf is None:
        return handle_replicated(ctx, inst)
    src_split = _plain_tiled(src) and last in _sharded_dims(src)
    leaf_split = last in _sharded_dims(leaf)
    if not src_split and not leaf_split:
        return _local(ctx, inst, 1, leaf)
    cands = []
    if src_split:
        cands.append(lambda: _two_stage_topk(ctx, inst, src, leaf))
    if leaf_split and _plain_tiled(leaf):
        cands += [(lambda e=e: _moved_local(ctx, inst, 1, leaf, last, e))
                  for e in _free_dims(leaf, op.shape, last)]
    elif not leaf_split:
        cands.append(lambda: _local(ctx, inst, 1, leaf))
    cands.append(lambda: handle_replicated(ctx, inst))
    return cheapest_or_replicated(ctx, inst, [c for c in cands])

"""Values cheaper to re-make than to move: a ``reshard`` plan step that costs 0 bytes.

An iota, a small constant, a broadcast whose operand is itself re-makeable or already
available in the sharding the broadcast needs at no cost, and elementwise ops (convert
included) whose array operands are such values, transposes and reshapes (tile for tile)
of such values or of values available at no cost, and small slices, reshapes, transposes
and reverses of such values hold the same data whatever sharding they are computed in.
When the plan of ``reshard`` would move such a value, each device re-makes its own tile
in the target sharding instead (XLA moves 0 bytes for them: its partitioner re-emits a
broadcast of a replicated operand in the sharding a user asks for). ``reshard`` asks
``plan`` for the step; the emitted ops are the handlers' own local forms (iota: the local
iota plus this device's offset, ``local_iota``; the rest: the op on local operands).

Size bound, so re-making stays cheaper than moving and the program does not grow:
at most ``MAX_OPS`` instructions re-emitted for one reshard (a longer chain is moved as
data), and constants of at most ``MAX_CONSTANT_ELEMENTS`` elements (a larger literal
would be copied into the program once more). Only values the source module computes
(``origin``: the instruction a handler partitioned) are re-made, into tiled, partially
replicated, replicated or single-device (maximal) targets; manual and unreduced
targets move as data.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.opcodes import (ARITY, COLLECTIVES, ELEMENTWISE, LINEAR_OPS,
                                  SIDE_EFFECTING)
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.passes.partition.local_cut import slice_replicated
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.sharding import (HloSharding, ShardingType, device_offsets,
                               partial_replicate_all_except, tile_shape)
from hlo_spmd.sharding.algebra import memoised, reshape_sharding, transpose_sharding

if TYPE_CHECKING:
    from hlo_spmd.passes.partition.state import ReshardContext

MAX_OPS = 8
MAX_CONSTANT_ELEMENTS = 1 << 12
# Ops that only rearrange their one operand's elements (slice, reshape, transpose,
# reverse, bitcast; broadcast has its own way, get-tuple-element has no array operand,
# copy is elementwise): re-made from the operand re-made replicated (the op on the full value,
# then this device's cut), so only small values (at most MAX_CONSTANT_ELEMENTS, operand
# and result) take this way.
_REARRANGE = frozenset(op for op in LINEAR_OPS if ARITY.get(op) == 1) \
    - COLLECTIVES - ELEMENTWISE - {"broadcast"}

_REPLICATED = HloSharding.replicate()
_GROUP_KINDS = (ShardingType.REPLICATED, ShardingType.MANUAL)


def origin(ctx: "ReshardContext", pv: PValue) -> Instruction | None:
    """The source instruction whose partitioned value ``pv`` is (its handler's result), or
    None (a value made by a reshard, a parameter, another computation's value)."""
    if not ctx.grouping.is_flat or pv.sharding.is_manual or pv.base_shape.is_tuple:
        return None  # (inside a device group, source values speak of other devices)
    hit = ctx.state.origins.get((id(pv.hlo), pv.base_shape.dims))
    if hit is None or hit[0] is not pv.hlo:
        return None
    inst = hit[1]
    if ctx.values.get(id(inst)) is None or inst.shape != pv.base_shape:
        return None
    return inst


def _target_ok(s: HloSharding) -> bool:
    # (a value on one device is held whole by every device, meaningful on its owner: a
    # value re-made everywhere is right there too)
    if s.is_tile_maximal:
        return True
    # (manual subgroups too: a re-made value's data is the same in every manual group, and
    # an operand taken where it is is that group's own value)
    return s.is_tiled and all(t in _GROUP_KINDS for t in s.subgroup_types)


def ops_to_remake(ctx: "ReshardContext", inst: Instruction, target: HloSharding,
                  budget: int = MAX_OPS) -> int | None:
    """How many instructions re-making ``inst``'s value in ``target`` emits (its operands
    taken where they are free: already there, in the reshard cache, or cut locally), or
    None when it is not re-makeable within ``budget``."""
    if budget <= 0 or not _target_ok(target) or not inst.shape.is_array:
        return None
    op = inst.opcode
    if op == "iota":
        return 1
    if op == "constant":
        return 1 if math.prod(inst.shape.dims) <= MAX_CONSTANT_ELEMENTS else None
    used = 1
    # (operand, the sharding it is needed in, whether it may be taken where it is when
    # that is free): a broadcast's operand may (the broadcast re-made from a value that
    # is already there), so may an elementwise op's scalar bounds; an elementwise op's
    # array operands must be re-makeable values themselves (an op over data computed
    # elsewhere, cos(parameter), is data to move, not to compute again at every size).
    if op == "broadcast":
        needs = [(inst.operands[0], _broadcast_need(inst, target), True)]
    elif op in ELEMENTWISE and op not in SIDE_EFFECTING:
        rank = inst.shape.rank
        needs = [(o, target, False) if o.shape.rank == rank else (o, _REPLICATED, True)
                 for o in inst.operands]
    elif _exact_need(inst, target) is not None:
        # a transpose / reshape whose operand maps onto the target tile for tile: the
        # operand re-made (or taken where it is free) in that sharding, the op local
        needs = [(inst.operands[0], _exact_need(inst, target), True)]
    elif op in _REARRANGE and len(inst.operands) == 1 and inst.operands[0].shape.is_array:
        if max(math.prod(inst.shape.dims), math.prod(inst.operands[0].shape.dims)) \
                > MAX_CONSTANT_ELEMENTS:
            return None
        # the operand must itself be re-makeable: data computed elsewhere is moved
        needs = [(inst.operands[0], _REPLICATED, False)]
        used = 1 if target.is_replicated else 2  # (the op, then this device's cut)
    else:
        return None
    for operand, s, free_ok in needs:
        n = _operand_ops(ctx, operand, s, budget - used, free_ok)
        if n is None:
            return None
        used += n
    return used


def _operand_ops(ctx: "ReshardContext", operand: Instruction, s: HloSharding,
                 budget: int, free_ok: bool) -> int | None:
    pv = ctx.values.get(id(operand))
    if pv is None:
        return None
    if free_ok and (pv.sharding == s or (not pv.base_shape.is_tuple and ctx.reshard_price(
            pv, s, recreate=False)[0] == 0)):
        return 0
    inst = origin(ctx, pv)
    return None if inst is None else ops_to_remake(ctx, inst, s, budget)


@memoised
def broadcast_operand_sharding(target: HloSharding, dims_map, op_dims, out_dims) -> HloSharding:
    """The broadcast result's sharding restricted to the operand's dims: new dims (and
    size-1 operand dims that are stretched) replicated, the rest in operand order."""
    if not target.is_tiled:
        return target
    rank = len(out_dims)
    kept = [dims_map[i] for i in range(len(dims_map)) if op_dims[i] == out_dims[dims_map[i]]]
    s = partial_replicate_all_except(target, kept)
    if not s.is_tiled:
        return s
    ta = s.tile_assignment
    rest = [d for d in range(rank) if d not in dims_map]
    perm = list(dims_map) + rest + list(range(rank, ta.ndim))
    new = ta.transpose(perm).reshape([ta.dims[d] for d in dims_map] + list(ta.dims[rank:]))
    if not dims_map and not s.subgroup_types and not s.replicate_on_last_tile_dim:
        return _REPLICATED
    return with_kind_of(s, new)


def with_kind_of(like: HloSharding, ta) -> HloSharding:
    """A sharding with tile assignment ``ta`` and ``like``'s kind of trailing dims."""
    if like.replicate_on_last_tile_dim:
        return HloSharding.partial_tile(ta)
    if like.subgroup_types:
        return HloSharding.subgroup(ta, like.subgroup_types)
    return HloSharding.tile(ta)


def _exact_need(inst: Instruction, target: HloSharding) -> HloSharding | None:
    """The sharding a transpose's / reshape's operand needs for the op to make ``target``
    locally (every device's tile the op of its operand tile), or None."""
    op = inst.opcode
    if (op != "transpose" and op != "reshape") or not inst.operands[0].shape.is_array:
        return None
    if not target.is_tiled:
        return target if target.is_replicated else None
    if op == "transpose":
        inverse = [0] * len(inst.dimensions)
        for i, d in enumerate(inst.dimensions):
            inverse[d] = i
        return transpose_sharding(target, inverse)
    in_dims, out_dims = inst.operands[0].shape.dims, inst.shape.dims
    back = reshape_sharding(target, out_dims, in_dims)
    if back is None or not back.is_tiled or reshape_sharding(back, in_dims,
                                                             out_dims) != target:
        return None
    # (even tiles only: a padded tile reshaped locally would mix padding into data)
    for s, dims in ((target, out_dims), (back, in_dims)):
        if any(int(d) % int(t) for d, t in zip(dims, s.tile_dims_for_data())):
            return None
    return back


def _broadcast_need(inst: Instruction, target: HloSharding) -> HloSharding:
    return broadcast_operand_sharding(target, inst.dimensions, inst.operands[0].shape.dims,
                                      inst.shape.dims)


def remake(ctx: "ReshardContext", inst: Instruction, target: HloSharding) -> PValue:
    """``inst``'s value in ``target``, re-made on every device (``ops_to_remake`` said it
    can be): operands through ``reshard`` (so they are re-made or cut the same way, and
    remembered), the op on the local operands."""
    op = inst.opcode
    local = ctx.local_shape(inst.shape, target)
    if op == "iota":
        return PValue(local_iota(ctx, inst, target), inst.shape, target)
    need = _exact_need(inst, target)
    if need is not None:
        x = ctx.reshard(ctx.value(inst.operands[0]), need).hlo
        return PValue(ctx.emit_like(inst, [x], local), inst.shape, target)
    if op == "constant" or op in _REARRANGE:
        args = [ctx.reshard(ctx.value(inst.operands[0]), _REPLICATED).hlo] \
            if op in _REARRANGE else []
        full = ctx.emit_like(inst, args, inst.shape)
        if target.is_tile_maximal:
            return PValue(full, inst.shape, target)
        return slice_replicated(ctx, PValue(full, inst.shape, _REPLICATED), target)
    if op == "broadcast":
        needs = [_broadcast_need(inst, target)]
    else:
        rank = inst.shape.rank
        needs = [target if o.shape.rank == rank else _REPLICATED for o in inst.operands]
    operands = [ctx.reshard(ctx.value(o), s).hlo for o, s in zip(inst.operands, needs)]
    return PValue(ctx.emit_like(inst, operands, local), inst.shape, target)


def local_iota(ctx: "ReshardContext", inst: Instruction, target: HloSharding) -> Instruction:
    """This device's tile of iota ``inst`` in ``target`` (tiled or replicated): an iota
    over the local shape, plus this device's offset when the iota dim is tiled."""
    dims = inst.shape.dims
    dim = inst.dimensions[0]
    if not target.is_tiled:
        return ctx.emit_like(inst, [], inst.shape)
    local = tile_shape(target, dims)
    if target.tile_dims_for_data()[dim] == 1:
        return ctx.emit_like(inst, [], inst.shape.with_dims(local))
    b = ctx.b
    et = inst.shape.element_type
    it = PrimitiveType.S32 if dims[dim] < 2 ** 31 else PrimitiveType.S64
    x = b.iota(it, local, dim)
    table = device_offsets(target, dims, num_devices=ctx.num_devices)[:, dim]
    off = ctx.logical_table(table)
    if it != PrimitiveType.S32:
        off = b.convert(off, it)
    x = b.add(x, b.broadcast(off, list(local), []))
    if et != it:
        x = b.convert(x, et, name=inst.name)
    return x

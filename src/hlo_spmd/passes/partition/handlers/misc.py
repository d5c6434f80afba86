"""Ops whose partitioning is about semantics more than data layout: random numbers, device
ids, tokens, barriers, side effects, and collectives already present in the input.

The reference point for every rule here is the input module's meaning: it is ONE logical
program run as a single partition (what the unpartitioned module computes on one device;
this is what ``runtime.verify`` compares against). The partitioned program must compute
the same global values.

* ``rng``: the values are random, but a replicated result must be the SAME on every device.
  Replicated / maximal results are generated once (the value of logical device 0, or of
  the maximal owner) and broadcast (select + all-reduce), as XLA does. A tiled result is
  generated per tile (each device draws its own tile: a valid sample of the whole, no
  communication).
* ``rng-bit-generator``: a pure function of its state operand; computed from the
  replicated state so the bits equal the unpartitioned program's, then cut to the result
  sharding (deliberately replicated; not reported as a fallback).
* ``partition-id``: inside a fully manual region (sharding ``{manual}``) the program is
  per-device by definition and the real ``partition-id`` is kept.  Anywhere else it is
  an error, as in XLA's partitioner (HandlePartitionId, checked with jaxlib 0.10.2):
  whether the instruction or the data is meant to be replicated is ambiguous.  That
  includes a partially manual sharding (a manual subgroup): XLA refuses it too, and JAX
  writes ``axis_index`` inside a partially manual shard_map as a fully manual call
  leaving through ``SPMDShardToFullShape`` instead.
* ``replica-id``: partitioning does not change the replica count, so the instruction is
  kept as is (0 on a single-replica run, as in the original).
* ``after-all`` / ``add-dependency`` / tokens: tokens carry no data; they are re-created
  on the local operands (one per program, so ordering is kept on every device).
* ``opt-barrier``: a tuple pass-through; the operand is resharded to the barrier's
  per-element shardings and the barrier emitted on the local tuple.
* collectives in the input (all-reduce, all-gather, reduce-scatter, all-to-all,
  collective-permute, collective-broadcast) outside manual regions. Which partitions one
  of them combines follows from its mode (channel id, ``use_global_device_ids``; the
  module has one replica). When every device is alone in its group (cross-replica
  collectives, singleton groups) the collective is the identity -- the operand resharded
  to the result sharding; a cross-replica collective-permute whose pairs do not send
  replica 0 to itself yields zeros. A cross-partition collective whose groups hold
  several partitions means what XLA's partitioner makes of it (HandleAllReduce /
  DefaultAction, checked with jaxlib 0.10.2): the operands are made whole (replicated)
  on every device and the collective runs as written across the devices' copies (an
  all-reduce over 4 devices of a replicated ``x`` is ``4 x``); its result is replicated,
  then resharded to the instruction's sharding. As in XLA, such an all-reduce must be
  replicated itself (its tiled form has no meaning), and a collective-permute moves the
  local tiles of its own sharding instead of whole copies.
  Inside manual regions the collective is the user's per-device code and is kept as
  written (with a fresh channel id).
* ``infeed`` / ``outfeed`` / side-effecting custom-calls: replicated semantics (every
  device performs the effect on whole values, as XLA does for replicated side effects);
  with a ``{maximal device=d}`` sharding the op runs on device d only, inside a
  conditional on the partition id (the others produce zeros), so it is not duplicated.
"""
from __future__ import annotations

import numpy as np

from hlo_spmd.ir.builder import Builder, next_channel_id
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.opcodes import GLOBAL_DEVICE_ID_COLLECTIVES
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.ir.shape import Shape
from hlo_spmd.errors import PartitionError
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.handlers.basic import CUSTOM_CALLS, custom_call_by_target
from hlo_spmd.passes.partition.support.common import copy_attrs
from hlo_spmd.passes.partition.handlers.control_flow import normalize
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import handles
from hlo_spmd.passes.partition.reshard import reshard
from hlo_spmd.sharding import HloSharding

PT = PrimitiveType


def _replicated_like(shape: Shape) -> HloSharding:
    if shape.is_tuple:
        return HloSharding.tuple([_replicated_like(s) for s in shape.tuple_shapes])
    return HloSharding.replicate()


def _in_manual_region(ctx: PartitionContext, inst: Instruction) -> bool:
    s = ctx.sharding_of(inst)
    leaves = s.tuple_elements if s.is_tuple else (s,)
    if any(e.is_manual or e.is_manual_subgroup for e in leaves):
        return True
    for op in inst.operands:
        ps = ctx.value(op).sharding
        for e in (ps.tuple_elements if ps.is_tuple else (ps,)):
            if e.is_manual or e.is_manual_subgroup:
                return True
    return False


# -- single device execution ------------------------------------------------------------------
def zeros_like_shape(b: Builder, shape: Shape) -> Instruction:
    """A value of ``shape`` made of zeros (tokens: a fresh after-all)."""
    if shape.is_tuple:
        return b.tuple([zeros_like_shape(b, s) for s in shape.tuple_shapes])
    if shape.is_token:
        return b.after_all()
    zero = b.scalar(0, shape.element_type)
    return b.broadcast(zero, list(shape.dims), []) if shape.rank else zero


def run_on_single_device(ctx: PartitionContext, inst: Instruction, device: int) -> PValue:
    """``inst`` on whole operands, executed only by logical device ``device`` (a
    conditional on the partition id); the other devices produce zeros. The result has
    sharding ``{maximal device=device}``."""
    return run_on_devices(ctx, inst, (int(device),), HloSharding.maximal(int(device)))


def _maximal_like(shape: Shape, device: int) -> HloSharding:
    if shape.is_tuple:
        return HloSharding.tuple([_maximal_like(s, device) for s in shape.tuple_shapes])
    return HloSharding.maximal(device)


def _leaf_devices(s: HloSharding) -> tuple[int, ...]:
    """The devices named by the leaves of an all-maximal sharding, sorted."""
    leaves = s.tuple_elements if s.is_tuple else (s,)
    return tuple(sorted({int(e.device) for e in leaves}))


def run_on_devices(ctx: PartitionContext, inst: Instruction, devices: tuple[int, ...],
                   result: HloSharding) -> PValue:
    """``inst`` on whole operands, executed only by the logical ``devices`` (a conditional
    on the partition id); the other devices produce zeros. With one device the operands
    only need to be whole there (free when they already are, XLA's HandleSingleDevice);
    with several (a tuple whose leaves are on different devices) they are made whole
    everywhere. ``result`` is the sharding of the value: each leaf valid where it says."""
    b = ctx.b
    operands = []
    for op in inst.operands:
        pv = ctx.value(op)
        want = (_maximal_like(op.shape, devices[0]) if len(devices) == 1
                else _replicated_like(op.shape))
        operands.append(reshard(ctx, pv, want).hlo)
    n = ctx.num_devices
    is_owner = ctx.logical_table(np.isin(np.arange(n), devices).astype(np.int64))
    pred = b.compare(is_owner, b.constant(np.int64(1), PT.S32), "EQ")
    packed = b.tuple(operands)
    on = b.new_computation(f"{inst.name}.on_device")
    param = on.parameter(0, packed.shape, name="operands")
    args = [on.get_tuple_element(param, i) for i in range(len(operands))]
    called = [ctx.clone(c) for c in inst.called_computations]
    on.set_root(on.op(inst.opcode, args, copy_attrs(inst), called, declared=inst.shape,
                      name=inst.name))
    off = b.new_computation(f"{inst.name}.elsewhere")
    off.parameter(0, packed.shape, name="operands")
    off.set_root(zeros_like_shape(off, inst.shape))
    out = b.op("conditional", [pred, packed, packed], called=[on.computation, off.computation],
               name=f"{inst.name}.single_device")
    return PValue(out, inst.shape, result)


def _run_where_maximal(ctx: PartitionContext, inst: Instruction) -> PValue:
    """A side effect whose sharding is maximal: on its one device, or on each device a
    leaf names (XLA runs such an op on every device; only the named ones count)."""
    target = normalize(ctx.sharding_of(inst), inst.shape)
    devices = _leaf_devices(target)
    if len(devices) == 1:
        return run_on_single_device(ctx, inst, devices[0])
    return run_on_devices(ctx, inst, devices, target)


def _replicated_effect(ctx: PartitionContext, inst: Instruction) -> PValue:
    """Side-effecting op with replicated semantics, or on one device when maximal."""
    target = ctx.sharding_of(inst)
    if target.is_maximal:
        return _run_where_maximal(ctx, inst)
    operands = [reshard(ctx, ctx.value(op), _replicated_like(op.shape)).hlo
                for op in inst.operands]
    out = ctx.emit_like(inst, operands, inst.shape)
    return reshard(ctx, PValue(out, inst.shape, _replicated_like(inst.shape)),
                   normalize(target, inst.shape))


# -- random numbers ---------------------------------------------------------------------------
@handles("rng")
def handle_rng(ctx: PartitionContext, inst: Instruction) -> PValue:
    target = ctx.sharding_of(inst)
    operands = [ctx.operand(inst, i, HloSharding.replicate()) for i in range(len(inst.operands))]
    if target.is_tiled and not target.is_manual_subgroup:
        local = ctx.local_shape(inst.shape, target)
        return PValue(ctx.emit_like(inst, operands, local), inst.shape, target)
    if target.is_manual:
        return PValue(ctx.emit_like(inst, operands, inst.shape), inst.shape, target)
    owner = target.device if target.is_maximal else 0
    full = ctx.emit_like(inst, operands, inst.shape)
    # Only the owner's draw counts; resharding broadcasts it.
    return reshard(ctx, PValue(full, inst.shape, HloSharding.maximal(owner)), target)


@handles("rng-bit-generator")
def handle_rng_bit_generator(ctx: PartitionContext, inst: Instruction) -> PValue:
    state = ctx.operand(inst, 0, HloSharding.replicate())
    full = ctx.emit_like(inst, [state], inst.shape)
    return reshard(ctx, PValue(full, inst.shape, _replicated_like(inst.shape)),
                   normalize(ctx.sharding_of(inst), inst.shape))


# -- device ids -------------------------------------------------------------------------------
@handles("partition-id")
def handle_partition_id(ctx: PartitionContext, inst: Instruction) -> PValue:
    target = ctx.sharding_of(inst)
    if target.is_manual:
        return PValue(ctx.b.op("partition-id", name=inst.name), inst.shape, target)
    # XLA's partitioner refuses it (HandlePartitionId): outside a fully manual region it
    # is ambiguous whether the instruction or the data it indexes is replicated.
    where = "in a partially manual region" if target.is_manual_subgroup else \
        "outside a manual region"
    raise PartitionError(f"partition-id with sharding {target} is {where}; XLA's SPMD "
                         "partitioning does not support it (ambiguous: only a fully manual "
                         "{manual} partition-id is kept)", f"instruction {inst.name}")


@handles("replica-id")
def handle_replica_id(ctx: PartitionContext, inst: Instruction) -> PValue:
    target = ctx.sharding_of(inst)
    out = ctx.b.op("replica-id", name=inst.name)
    if target.is_manual:
        return PValue(out, inst.shape, target)
    return reshard(ctx, PValue(out, inst.shape, HloSharding.replicate()), target)


# -- tokens and barriers ----------------------------------------------------------------------
@handles("after-all")
def handle_after_all(ctx: PartitionContext, inst: Instruction) -> PValue:
    tokens = [ctx.value(op).hlo for op in inst.operands]
    out = ctx.b.op("after-all", tokens, copy_attrs(inst), name=inst.name)
    return PValue(out, inst.shape, ctx.sharding_of(inst))


@handles("add-dependency")
def handle_add_dependency(ctx: PartitionContext, inst: Instruction) -> PValue:
    target = normalize(ctx.sharding_of(inst), inst.shape)
    if target.is_maximal:
        target = _replicated_like(inst.shape)
    value = ctx.operand(inst, 0, target)
    token = ctx.value(inst.operands[1]).hlo
    out = ctx.b.op("add-dependency", [value, token], copy_attrs(inst), name=inst.name)
    return PValue(out, inst.shape, target)


@handles("opt-barrier")
def handle_optimization_barrier(ctx: PartitionContext, inst: Instruction) -> PValue:
    target = normalize(ctx.sharding_of(inst), inst.shape)
    operand = ctx.operand(inst, 0, target)
    out = ctx.b.op("opt-barrier", [operand], copy_attrs(inst), name=inst.name)
    return PValue(out, inst.shape, target)


# -- side effects -----------------------------------------------------------------------------
@handles("infeed", "outfeed")
def handle_feed(ctx: PartitionContext, inst: Instruction) -> PValue:
    return _replicated_effect(ctx, inst)


@handles("custom-call")
def handle_custom_call(ctx: PartitionContext, inst: Instruction) -> PValue:
    """Side-effecting custom-calls without a rule of their own keep replicated semantics and
    run on one device only when their sharding is maximal; everything else goes to the
    custom-call table (``basic.CUSTOM_CALLS``)."""
    if (inst.attrs.custom_call_has_side_effect and inst.custom_call_target not in CUSTOM_CALLS
            and ctx.sharding_of(inst).is_maximal):
        return _run_where_maximal(ctx, inst)
    return custom_call_by_target(ctx, inst)


# -- collectives in the input -----------------------------------------------------------------
def _group_size(inst: Instruction) -> int | None:
    from hlo_spmd.ir.shape_inference import replica_groups

    groups = replica_groups(inst.attrs)
    if groups is None:
        return None
    sizes = {len(g) for g in groups} if groups.dtype == object else {groups.shape[1]}
    return max(sizes)


def _check_within_manual_groups(ctx: PartitionContext, inst: Instruction) -> None:
    """In a partially manual region a user collective may only talk among the devices of
    one manual subgroup (those holding the same automatic tile); XLA rejects the module
    otherwise ("across devices that belong to different manual subgroups")."""
    from hlo_spmd.ir.shape_inference import replica_groups

    s = ctx.sharding_of(inst)
    leaf = next((e for e in (s.tuple_elements if s.is_tuple else (s,)) if e.is_manual_subgroup),
                None)
    if leaf is None or leaf.tile_assignment is None:
        return
    ta = leaf.tile_assignment
    mdim = leaf.subgroup_manual_dim
    assert mdim is not None
    arr = np.moveaxis(ta.array(), mdim, -1).reshape(-1, ta.dims[mdim])
    subgroup = np.empty(arr.size, dtype=np.int64)
    subgroup[arr.reshape(-1)] = np.repeat(np.arange(arr.shape[0]), arr.shape[1])
    if inst.opcode == "collective-permute":
        pairs = np.asarray([(p.source, p.target) for p in inst.attrs.source_target_pairs],
                           dtype=np.int64).reshape(-1, 2)
        bad = pairs[subgroup[pairs[:, 0]] != subgroup[pairs[:, 1]]] if pairs.size else pairs
        if bad.size:
            raise PartitionError(
                f"collective-permute pair {bad[0].tolist()} crosses manual subgroups of "
                f"{leaf} (XLA rejects this module)", f"instruction {inst.name}")
        return
    groups = replica_groups(inst.attrs)
    if groups is None:
        groups = np.arange(arr.size, dtype=np.int64).reshape(1, -1)
    rows = [np.asarray(g, dtype=np.int64) for g in groups] if groups.dtype == object \
        else [groups]   # ragged groups one by one, a uniform array at once
    for g in rows:
        ids = subgroup[g]
        if np.any(ids != ids[..., :1]):
            raise PartitionError(
                f"{inst.opcode} replica groups cross the manual subgroups of {leaf}: a "
                "partially manual collective may only combine devices of one manual group "
                "(XLA rejects this module)", f"instruction {inst.name}")


def _emit_as_written(ctx: PartitionContext, inst: Instruction, operands: list,
                     declared: Shape | None) -> Instruction:
    """``inst`` on the given local operands, with a fresh channel id and mesh-axis groups
    written as device groups."""
    attrs = copy_attrs(inst)
    if attrs.channel_id:
        attrs.channel_id = next_channel_id(ctx.b.module)
    _mesh_groups_as_device_groups(attrs)
    called = [ctx.clone(c) for c in inst.called_computations]
    return ctx.b.op(inst.opcode, operands, attrs, called, declared=declared, name=inst.name)


def _keep_manual_collective(ctx: PartitionContext, inst: Instruction) -> PValue:
    """The user's own per-device collective: kept as written, on local operands."""
    _check_within_manual_groups(ctx, inst)
    operands = [ctx.value(op).hlo for op in inst.operands]
    target = ctx.sharding_of(inst)
    declared = ctx.local_shape(inst.shape, target) if target.is_manual else None
    out = _emit_as_written(ctx, inst, operands, declared)
    return PValue(out, inst.shape, normalize(target, inst.shape))




def _spans_partitions(ctx: PartitionContext, inst: Instruction) -> bool:
    """Whether the collective combines several partitions (XLA's collective op group
    mode, one replica): cross-replica ones never do; cross-replica-and-partition ones
    combine all partitions; cross-partition / flattened-id ones their groups (all
    partitions when the groups are empty)."""
    if inst.attrs.channel_id <= 0:
        return False
    if inst.opcode == "collective-permute":
        return any(p.source != p.target for p in inst.attrs.source_target_pairs)
    if inst.opcode in GLOBAL_DEVICE_ID_COLLECTIVES and not inst.attrs.use_global_device_ids:
        return ctx.num_devices > 1
    size = _group_size(inst)
    return (ctx.num_devices if size is None else size) > 1


def _across_copies(ctx: PartitionContext, inst: Instruction) -> PValue:
    """XLA's meaning of a cross-partition collective outside manual regions: run as
    written across every device's whole copy of the operands; the result is replicated."""
    target = normalize(ctx.sharding_of(inst), inst.shape)
    if inst.opcode == "all-reduce":
        leaves = target.tuple_elements if target.is_tuple else (target,)
        if not all(e.is_replicated for e in leaves):
            raise PartitionError(
                f"all-reduce across partitions outside a manual region must be replicated, "
                f"not {target} (XLA rejects it too); a tiled value has no single-program "
                "meaning for it", f"instruction {inst.name}")
    operands = [ctx.operand(inst, i, _replicated_like(op.shape))
                for i, op in enumerate(inst.operands)]
    out = _emit_as_written(ctx, inst, operands, None)
    return reshard(ctx, PValue(out, inst.shape, _replicated_like(inst.shape)), target)


def _mesh_groups_as_device_groups(attrs) -> None:
    """Mesh-axis replica groups (``replica_groups=mesh[...] {axes}``) written as device
    groups: jaxlib 0.10.2's HLO -> StableHLO import drops the mesh's device order, so
    a permuted mesh would silently become the identity one."""
    from hlo_spmd.collectives.factory import replica_groups_for
    from hlo_spmd.ir.builder import set_replica_groups
    from hlo_spmd.ir.shape_inference import replica_group_list_kind, replica_groups

    if replica_group_list_kind(attrs) == "mesh":
        set_replica_groups(attrs, replica_groups_for(replica_groups(attrs)))


@handles("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-broadcast")
def handle_input_collective(ctx: PartitionContext, inst: Instruction) -> PValue:
    if _in_manual_region(ctx, inst):
        return _keep_manual_collective(ctx, inst)
    if _spans_partitions(ctx, inst):
        return _across_copies(ctx, inst)
    size = _group_size(inst)
    if size not in (None, 1):
        raise PartitionError(f"cross-replica {inst.opcode} over groups of {size} replicas, "
                             "but the program has one replica", f"instruction {inst.name}")
    # One participant: the identity (operand shapes equal the result shapes).
    target = normalize(ctx.sharding_of(inst), inst.shape)
    n = len(inst.operands)
    if inst.shape.is_tuple and n > 1:
        elems = list(target.tuple_elements) if target.is_tuple else [target] * n
        parts = [ctx.operand(inst, i, elems[i]) for i in range(n)]
        return PValue(ctx.b.tuple(parts, name=inst.name), inst.shape, HloSharding.tuple(elems))
    if inst.operands[0].shape.without_layout() != inst.shape.without_layout():
        raise PartitionError(f"{inst.opcode} result {inst.shape} differs from its operand "
                             f"{inst.operands[0].shape} with one participant",
                             f"instruction {inst.name}")
    return PValue(ctx.operand(inst, 0, target), inst.shape, target)


@handles("collective-permute")
def handle_input_collective_permute(ctx: PartitionContext, inst: Instruction) -> PValue:
    if _in_manual_region(ctx, inst):
        return _keep_manual_collective(ctx, inst)
    if len(inst.operands) == 1 and _spans_partitions(ctx, inst):
        # XLA moves the tiles: the operand in the permute's own sharding, each device
        # sending its local tile as written (its copy, when that sharding is replicated).
        target = normalize(ctx.sharding_of(inst), inst.shape)
        operand = ctx.operand(inst, 0, target)
        out = _emit_as_written(ctx, inst, [operand], ctx.local_shape(inst.shape, target))
        return PValue(out, inst.shape, target)
    target = ctx.sharding_of(inst)
    pairs = {(p.source, p.target) for p in inst.attrs.source_target_pairs}
    if len(inst.operands) == 1 and (0, 0) in pairs:
        return PValue(ctx.operand(inst, 0, target), inst.shape, target)
    if len(inst.operands) != 1:
        raise PartitionError("in-place collective-permute is not supported outside manual "
                             "regions", f"instruction {inst.name}")
    # Device 0 receives nothing: XLA defines the result as zeros.
    zeros = zeros_like_shape(ctx.b, inst.shape)
    return reshard(ctx, PValue(zeros, inst.shape, HloSharding.replicate()), target)

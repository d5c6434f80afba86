"""Parameters, constants, tuples, annotation custom-calls, and the replicated fallback."""
from __future__ import annotations

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.passes.partition.causes import with_cause
from hlo_spmd.errors import PartitionError
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import (CUSTOM_CALL_HANDLERS, handles,
                                                handles_custom_call, without_handler)
from hlo_spmd.passes.partition.reshard import reshard
from hlo_spmd.passes.propagation.sharding_ops import sub_sharding
from hlo_spmd.sharding import HloSharding


@handles("constant", "rng-get-and-update-state")
def handle_full_then_slice(ctx: PartitionContext, inst: Instruction) -> PValue:
    """Materialize the whole value on every device, then cut this device's tile (no traffic)."""
    full = ctx.emit_like(inst, [], inst.shape)
    pv = PValue(full, inst.shape, HloSharding.replicate())
    return reshard(ctx, pv, ctx.sharding_of(inst))


@handles("tuple")
def handle_tuple(ctx: PartitionContext, inst: Instruction) -> PValue:
    target = ctx.sharding_of(inst)
    # A tuple sharding lists the leaves of the whole (possibly nested) tuple: each operand
    # takes its own leaves (a tuple sharding of them when it is itself a tuple).
    elems = ([sub_sharding(target, inst.shape, i) for i in range(len(inst.operands))]
             if target.is_tuple else [target] * len(inst.operands))
    parts = [ctx.operand(inst, i, elems[i]) for i in range(len(inst.operands))]
    leaves = [leaf for e in elems for leaf in (e.tuple_elements if e.is_tuple else (e,))]
    return PValue(ctx.b.tuple(parts, name=inst.name), inst.shape, HloSharding.tuple(leaves))


@handles("get-tuple-element")
def handle_gte(ctx: PartitionContext, inst: Instruction) -> PValue:
    src = ctx.value(inst.operands[0])
    i = inst.tuple_index
    elem_sharding = sub_sharding(src.sharding, src.base_shape, i)
    gte = ctx.b.get_tuple_element(src.hlo, i, name=inst.name)
    pv = PValue(gte, inst.shape, elem_sharding)
    return reshard(ctx, pv, ctx.sharding_of(inst))


def custom_call_by_target(ctx: PartitionContext, inst: Instruction) -> PValue:
    """The rule registered for the custom-call's target; unknown targets are replicated
    (and reported as fallbacks). The ``custom-call`` handler itself lives in ``misc``."""
    rule = CUSTOM_CALLS.get(inst.custom_call_target)
    if rule is None:
        target = ctx.sharding_of(inst)
        if all(e.is_manual for e in (target.tuple_elements if target.is_tuple else (target,))):
            # The user's own per-device call inside a fully manual region: as written
            # (no partitioning rule is needed, and nothing fell back).
            ops = [ctx.operand(inst, i, _manual_like(op.shape))
                   for i, op in enumerate(inst.operands)]
            return PValue(ctx.emit_like(inst, ops, inst.shape), inst.shape, target)
        ctx.state.report.unknown_custom_calls.append((inst.name, inst.custom_call_target))
        return handle_replicated(ctx, inst)
    return rule(ctx, inst)


def _manual_like(shape) -> HloSharding:
    if shape.is_tuple:
        return HloSharding.tuple([_manual_like(s) for s in shape.tuple_shapes])
    return HloSharding.manual()


def _sharding_annotation(ctx: PartitionContext, inst: Instruction) -> PValue:
    """`Sharding` custom-call: the value, resharded to the annotation."""
    return reshard(ctx, ctx.value(inst.operands[0]), ctx.sharding_of(inst))


def _full_to_shard(ctx: PartitionContext, inst: Instruction) -> PValue:
    """Enter a manual region: the operand's local tile is the manual value."""
    operand = inst.operands[0]
    pv = ctx.value(operand)
    full_sharding = ctx.sharding_of(operand)
    if not full_sharding.is_tiled:
        full_sharding = pv.sharding
    local = reshard(ctx, pv, full_sharding).hlo
    # Fully manual: the tile is the manual value. Partially manual (last_tile_dims=
    # {manual}): the value is still tiled over the non-manual devices.
    expected = ctx.local_shape(inst.shape, ctx.sharding_of(inst))
    if tuple(local.shape.dims) != tuple(expected.dims):
        raise PartitionError(f"manual region shard shape {list(inst.shape.dims)} does not match "
                             f"the local tile {list(local.shape.dims)}", f"instruction {inst.name}")
    return PValue(local, inst.shape, ctx.sharding_of(inst))


def _shard_to_full(ctx: PartitionContext, inst: Instruction) -> PValue:
    """Leave a manual region: the manual value becomes the tile of the full sharding."""
    pv = ctx.value(inst.operands[0])
    full = ctx.sharding_of(inst)
    if full.is_manual:
        raise PartitionError("SPMDShardToFullShape needs a non-manual sharding",
                             f"instruction {inst.name}")
    return PValue(pv.hlo, inst.shape, full)


def _global_to_local(ctx: PartitionContext, inst: Instruction) -> PValue:
    """Shardy's manual-region entry (one or several operands): each operand's local tile
    in its partitioned sharding is the manual value."""
    from hlo_spmd.annotations.manual import sdy_entry_full_shardings

    locals_ = []
    shapes = inst.shape.tuple_shapes if inst.shape.is_tuple else (inst.shape,)
    result = ctx.sharding_of(inst)
    leaves = result.tuple_elements if result.is_tuple else (result,) * len(shapes)
    full = sdy_entry_full_shardings(inst)
    for i, (op, shape) in enumerate(zip(inst.operands, shapes)):
        pv = ctx.value(op)
        if full is not None:
            # The global operand in in_shardings: its tile is the manual value, and
            # its non-manual axes stay automatic inside the body.
            pv = reshard(ctx, pv, full[i])
        local = pv.hlo
        expected = ctx.local_shape(shape, leaves[i]) if full is not None else shape
        if tuple(local.shape.dims) != tuple(expected.dims):
            raise PartitionError(f"manual region shard shape {list(shape.dims)} does not match "
                                 f"the local tile {list(local.shape.dims)}",
                                 f"instruction {inst.name}")
        locals_.append(local)
    hlo = ctx.b.tuple(locals_, name=inst.name) if inst.shape.is_tuple else locals_[0]
    return PValue(hlo, inst.shape, ctx.sharding_of(inst))


def _local_to_global(ctx: PartitionContext, inst: Instruction) -> PValue:
    """Shardy's manual-region exit: manual values become tiles of the global shardings."""
    from hlo_spmd.annotations.manual import sdy_exit_local_shardings

    local = sdy_exit_local_shardings(inst)
    # Each manual value first in the out_shardings' local view, so its tile is the tile
    # of the global sharding (the body may have left it tiled otherwise).
    parts = [(reshard(ctx, ctx.value(op), local[i]) if local is not None else ctx.value(op)).hlo
             for i, op in enumerate(inst.operands)]
    hlo = ctx.b.tuple(parts, name=inst.name) if inst.shape.is_tuple else parts[0]
    return PValue(hlo, inst.shape, ctx.sharding_of(inst))


def _identity(ctx: PartitionContext, inst: Instruction) -> PValue:
    """Propagation-only markers: the operand, in the marker's sharding if it has one."""
    pv = ctx.value(inst.operands[0])
    return reshard(ctx, pv, inst.sharding) if inst.sharding is not None else pv


def _layout_constraint(ctx: PartitionContext, inst: Instruction) -> PValue:
    """``LayoutConstraint``: the identity on values (it only pins a layout), so it runs on
    the local tile in the instruction's own sharding -- partial sums included, the op
    being linear -- with its layout constraint restated for the local shape."""
    target = ctx.sharding_of(inst)
    if target.is_tuple or len(inst.operands) != 1 or inst.shape.is_tuple:
        return handle_replicated(ctx, inst)
    operand = ctx.operand(inst, 0, target)
    local = ctx.local_shape(inst.shape, target)
    out = ctx.emit_like(inst, [operand], local)
    for proto in out.attrs.operand_shapes_with_layout:
        del proto.dimensions[:]
        proto.dimensions.extend(int(d) for d in operand.shape.dims)
        del proto.is_dynamic_dimension[:]
    return PValue(out, inst.shape, target)


for _target, _rule in {
    "LayoutConstraint": _layout_constraint,
    "Sharding": _sharding_annotation,
    "SPMDFullToShardShape": _full_to_shard,
    "SPMDShardToFullShape": _shard_to_full,
    # Shardy's round-trip custom-calls (JAX's default export).
    "xla.sdy.FuncResultSharding": _sharding_annotation,
    "xla.sdy.PropagationBarrier": _identity,
    "xla.sdy.GlobalToLocalShape": _global_to_local,
    "xla.sdy.LocalToGlobalShape": _local_to_global,
}.items():
    handles_custom_call(_target)(_rule)
CUSTOM_CALLS = CUSTOM_CALL_HANDLERS  # target -> rule, filled by every handler family


@with_cause("fallback")
def handle_replicated(ctx: PartitionContext, inst: Instruction) -> PValue:
    """Any op without a handler: run it on whole (replicated) operands, then cut the
    result's tiles. Correct for every op; reported so users see what was not partitioned."""
    ctx.state.report.replicated_fallbacks.append((inst.name, inst.opcode))
    operands = []
    for op in inst.operands:
        pv = ctx.value(op)
        target = _replicated_like(pv.sharding, op.shape)
        operands.append(reshard(ctx, pv, target).hlo)
    full = ctx.emit_like(inst, operands, inst.shape)
    pv = PValue(full, inst.shape, _replicated_like(HloSharding.replicate(), inst.shape))
    return reshard(ctx, pv, ctx.sharding_of(inst))


# The opcodes without a handler, and why: each runs through handle_replicated (XLA's
# DefaultAction does the same for the ops its visitor has no Handle* method for).
without_handler("a computation's input: made by its caller (the entry interface, the "
                "control-flow handlers); the driver never visits it", "parameter")
without_handler("one half of an asynchronous pair (or a send / recv): run as written on "
                "whole values; start and done are not partitioned apart",
                "async-start", "async-update", "async-done", "all-gather-start",
                "all-gather-done", "all-reduce-start", "all-reduce-done",
                "collective-permute-start", "collective-permute-done", "copy-start",
                "copy-done", "send", "send-done", "recv", "recv-done")
without_handler("after partitioning in XLA's pipeline (layout assignment, fusion, sharding "
                "domains): not expected before it; run on whole values", "bitcast",
                "fusion", "domain")
without_handler("dynamic shapes are not partitioned: run on whole values",
                "dynamic-reshape", "get-dimension-size", "set-dimension-size")
without_handler("no partitioning rule yet: run on whole values", "fft", "scan", "shuffle",
                "ragged-dot", "scaled-dot", "ragged-all-to-all", "collective-reduce")


def _replicated_like(s: HloSharding, shape) -> HloSharding:
    if shape.is_tuple:
        return HloSharding.tuple([_replicated_like(s, c) for c in shape.tuple_shapes])
    if s.is_manual:
        return s
    return HloSharding.replicate()


__all__ = ["handle_replicated", "CUSTOM_CALLS"]

"""Refining the open (unspecified) dims of ``Sharding`` annotations, and the manual /
auto shardings of the manual-region boundary right after them
(XLA's InferUnspecifiedDimsFrom{Operand,Users} and RefineManualAutoSharding*).

Only the unspecified dims may change: the annotation keeps its specified dims and
gains tiling on the open ones when a neighbour's sharding merges compatibly.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from hlo_spmd.annotations import parse_unspecified_dims
from hlo_spmd.errors import HloSpmdError
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.passes.propagation import graph as g
from hlo_spmd.passes.propagation import sharding_ops as ops
from hlo_spmd.sharding import (HloSharding, ShardingType, is_spatially_partitioned,
                               merge_if_compatible, partial_replicate_all_except)

if TYPE_CHECKING:
    from hlo_spmd.passes.propagation.interface import PropagatorInterface

Pair = tuple[HloSharding, HloSharding]


def _boundary_dims(inst: Instruction) -> tuple[int, ...] | None:
    raw = inst.attrs.backend_config
    try:
        return parse_unspecified_dims(raw)
    except (HloSpmdError, ValueError):
        return None


def refine_from_auto(to_merge: HloSharding, unspecified: Sequence[int], auto: HloSharding,
                     manual: HloSharding) -> Pair | None:
    """RefineManualAutoShardingFromAuto: (new auto, new manual) or None."""
    if (not manual.is_manual_subgroup or auto.is_manual_subgroup
            or not manual.has_partial_replication or len(manual.subgroup_types) != 2):
        return None
    rep = partial_replicate_all_except(to_merge, unspecified)
    if rep.is_tile_maximal or not rep.is_tiled:
        return None
    new_auto = merge_if_compatible(rep, auto)
    if new_auto is None:
        return None
    r = ops.data_rank(rep)
    ta = rep.tile_assignment
    dims = list(ta.dims)
    dims.insert(r, 1)
    rep_for_manual = HloSharding.partial_tile(ta.reshape(dims))
    mta = manual.tile_assignment
    if manual.subgroup_types[-1] != ShardingType.REPLICATED:
        perm = list(range(mta.ndim))
        perm[-1], perm[r] = perm[r], perm[-1]
        mta = mta.transpose(perm)
    tmp = HloSharding.partial_tile(mta)
    merged = merge_if_compatible(rep_for_manual, tmp)
    if merged is None or merged.tile_assignment is None:
        return None
    types = [ShardingType.MANUAL] + ([ShardingType.REPLICATED]
                                     if merged.has_partial_replication else [])
    return new_auto, HloSharding.subgroup(merged.tile_assignment, types)


def refine_from_manual(to_merge: HloSharding, unspecified: Sequence[int], auto: HloSharding,
                       manual: HloSharding) -> Pair | None:
    """RefineManualAutoShardingFromManual: (new auto, new manual) or None."""
    if (not to_merge.is_manual_subgroup or not manual.is_manual_subgroup
            or not manual.has_partial_replication or auto.is_manual_subgroup
            or len(manual.subgroup_types) != 2):
        return None
    rep = partial_replicate_all_except(to_merge, unspecified)
    if rep.is_tile_maximal or not rep.is_tiled:
        return None
    new_manual = _merge_manual(rep, manual)
    if new_manual is None:
        return None
    rep_for_auto = HloSharding.subgroup(rep.tile_assignment,
                                        [ShardingType.REPLICATED] * len(rep.subgroup_types))
    new_auto = merge_if_compatible(rep_for_auto, auto)
    if new_auto is None:
        return None
    return new_auto, new_manual


def _merge_manual(to_merge: HloSharding, dst: HloSharding) -> HloSharding | None:
    """MergeShardingIfCompatible for two manual-subgroup shardings."""
    return merge_if_compatible(to_merge, dst)


def _conversion_after(p: "PropagatorInterface", annotate: Instruction, unspecified: tuple[int, ...],
                      sort_user_dims: bool) -> tuple[bool, Instruction | None]:
    """(usable, the SPMDFullToShard/ShardToFull right after ``annotate`` if any)."""
    users = p.graph.users_of(annotate)
    if len(users) != 1:
        return True, None
    user = users[0]
    if not (g.is_custom_call(user, g.FULL_TO_SHARD) or g.is_custom_call(user, g.SHARD_TO_FULL)):
        return True, None
    dims = _boundary_dims(user)
    if dims is None:
        return False, None
    if sort_user_dims:
        dims = tuple(sorted(dims))
    if tuple(unspecified) != tuple(dims):
        return False, None
    return True, user


def _apply(p: "PropagatorInterface", annotate: Instruction, conv: Instruction | None,
           source: HloSharding, unspecified: tuple[int, ...], operand_side: bool,
           rule: str, src: Instruction) -> bool:
    """Merge ``source`` into the annotation (and its boundary op) along open dims."""
    if conv is None:
        rep = partial_replicate_all_except(source, unspecified)
        if annotate.sharding is None or rep.is_manual:
            return False
        merged = merge_if_compatible(rep, annotate.sharding)
        if merged is None:
            p.reject(annotate, rep, rule, (src,), "incompatible")
            return False
        p.set(annotate, merged, rule, (src,), direction="refine")
        return True
    enters = g.is_custom_call(conv, g.FULL_TO_SHARD)
    # annotate -> FullToShard: annotate is the auto side; ShardToFull: the manual side.
    auto_inst, manual_inst = (annotate, conv) if enters else (conv, annotate)
    if auto_inst.sharding is None or manual_inst.sharding is None:
        return False
    # The source is on the auto side when it is the annotation's operand before a
    # FullToShard, or a user after a ShardToFull.
    fn = refine_from_auto if enters == operand_side else refine_from_manual
    res = fn(source, unspecified, auto_inst.sharding, manual_inst.sharding)
    if res is None:
        return False
    p.set(auto_inst, res[0], rule, (src,), direction="refine")
    p.set(manual_inst, res[1], rule, (src,), direction="refine")
    return True


def from_operand(p: "PropagatorInterface", annotate: Instruction,
                 unspecified: tuple[int, ...]) -> tuple[bool, Instruction | None]:
    """InferUnspecifiedDimsFromOperand: (changed, boundary op refined with it)."""
    from hlo_spmd.passes.propagation import sdy_manual

    if sdy_manual.is_sdy_boundary(annotate):   # Shardy's manual entry / exit: open dims
        return sdy_manual.refine_entry_from_operands(p, annotate), None
    op = annotate.operands[0]
    if not is_spatially_partitioned(op.sharding) or not ops.is_tiled(op.sharding):
        return False, None
    usable, conv = _conversion_after(p, annotate, unspecified, True)
    if not usable:
        return False, None
    changed = _apply(p, annotate, conv, op.sharding, unspecified, True,
                     "annotation.refine_open_dims(operand)", op)
    return changed, conv


def from_users(p: "PropagatorInterface", annotate: Instruction, unspecified: tuple[int, ...],
               level: int) -> tuple[bool, Instruction | None]:
    """InferUnspecifiedDimsFromUsers: (changed, boundary op refined with it)."""
    from hlo_spmd.passes.propagation import sdy_manual
    from hlo_spmd.passes.propagation.backward import operand_from_user

    if sdy_manual.is_sdy_boundary(annotate):   # refined from its operands only
        return False, None

    # XLA compares the boundary op's dims unsorted here.
    usable, conv = _conversion_after(p, annotate, unspecified, False)
    if not usable:
        return False, None
    target = conv if conv is not None else annotate
    changed = False
    for user in p.graph.users_of(target):
        if user.sharding is None or not ops.is_tiled(user.sharding):
            continue
        us = operand_from_user(p, target, user, level)
        if us is None or us.is_tuple or us.is_tile_maximal:
            continue
        changed |= _apply(p, annotate, conv, us, unspecified, False,
                          "annotation.refine_open_dims(user)", user)
    return changed, conv

"""``shard_as`` / ``shard_like`` groups (JAX's ``shard_alike``): values that should be
sharded alike.  Members take shardings from each other at every level
(InferShardingFromShardGroup); after the levels, ``shard_as`` groups are forced onto one
common sharding.  Members are kept in discovery order (XLA keeps them in hash sets, so
its order is arbitrary; ours is deterministic)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.passes.propagation import backward as bw
from hlo_spmd.passes.propagation import sharding_ops as ops
from hlo_spmd.records import Record
from hlo_spmd.sharding import (HloSharding, is_spatially_partitioned, merge_if_compatible,
                               partial_replicate_all_except)

if TYPE_CHECKING:
    from hlo_spmd.passes.propagation.interface import PropagatorInterface


class ShardGroups(Record):
    """Group id -> members, and which groups are ``shard_as`` (hard) groups."""
    # A records.Record: equality and repr as the dataclass it was, ~1 ms less start-up.
    __match_args__ = ("members", "shard_as", "of")
    __slots__ = __match_args__

    def __init__(self, members: dict[int, list[Instruction]] | None = None,
                 shard_as: set[int] | None = None, of: dict[int, int] | None = None) -> None:
        self.members = {} if members is None else members
        self.shard_as = set() if shard_as is None else shard_as
        self.of = {} if of is None else of   # id(instruction) -> group id

    def add(self, inst: Instruction, group_id: int, shard_as: bool) -> None:
        group = self.members.setdefault(group_id, [])
        if not any(m is inst for m in group):
            group.append(inst)
        if shard_as:
            self.shard_as.add(group_id)
        self.of[id(inst)] = group_id

    def group_of(self, inst: Instruction) -> list[Instruction] | None:
        gid = self.of.get(id(inst))
        return None if gid is None else self.members[gid]

    def __bool__(self) -> bool:
        return bool(self.members)


def strip_group(s: HloSharding) -> HloSharding:
    if s.is_tuple:
        return HloSharding.tuple([e.with_shard_group(None) for e in s.tuple_elements])
    return s.with_shard_group(None)


def with_group(s: HloSharding, like: HloSharding) -> HloSharding:
    """``s`` carrying ``like``'s shard group (on every leaf of a tuple)."""
    spec = like.shard_group if not like.is_tuple else next(
        (e.shard_group for e in like.tuple_elements if e.shard_group is not None), None)
    if s.is_tuple:
        return HloSharding.tuple([e.with_shard_group(spec) for e in s.tuple_elements])
    return s.with_shard_group(spec)


def group_spec(s: HloSharding | None) -> tuple[int, bool] | None:
    """(group id, is shard_as) of a sharding's shard group, or None."""
    if s is None:
        return None
    g = s.shard_group if not s.is_tuple else next(
        (e.shard_group for e in s.tuple_elements if e.shard_group is not None), None)
    return None if g is None else (g.id, g.shard_as)


def infer_from_group(p: "PropagatorInterface", inst: Instruction, group: list[Instruction]) -> bool:
    """InferShardingFromShardGroup."""
    if not bw.can_propagate_at_level(inst, p.level):
        return False
    s = inst.sharding
    if s is not None and s.is_manual:
        return False
    if s is None or s.is_tile_maximal:
        for m in group:
            if m is not inst and m.sharding is not None and m.sharding.is_manual:
                p.set(inst, m.sharding, "shard-group.manual", (m,))
                return True
    changed = False
    for m in group:
        if m is inst or m.sharding is None:
            continue
        changed |= p.improve(inst, m.sharding, "shard-group", (m,))
    return changed


def refine_open_dims_from_group(p: "PropagatorInterface", inst: Instruction, unspecified: tuple[int, ...],
                                group: list[Instruction]) -> bool:
    """InferUnspecifiedDimsFromShardGroup."""
    changed = False
    for m in group:
        s = m.sharding
        if m is inst or not is_spatially_partitioned(s) or not ops.is_tiled(s):
            continue
        rep = partial_replicate_all_except(s, unspecified)
        merged = merge_if_compatible(rep, inst.sharding) if inst.sharding is not None else None
        if merged is not None:
            p.set(inst, merged, "shard-group.refine_open_dims", (m,), direction="refine")
            changed = True
    return changed


def align_shard_as(p: "PropagatorInterface", groups: ShardGroups) -> None:
    """Give every member of a ``shard_as`` group one common sharding."""
    for gid in sorted(groups.shard_as):
        members = groups.members[gid]
        shardings = [m.sharding for m in members if m.sharding is not None]
        default = next((s for s in shardings if not s.is_replicated), HloSharding.replicate())
        common = ops.find_common_sharding(shardings, default) if shardings else default
        for m in members:
            if m.sharding != common:
                p.set(m, common, "shard-as.align", tuple(x for x in members if x is not m),
                      direction="computation")

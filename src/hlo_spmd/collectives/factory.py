"""The one place collectives and partition-dependent values are created.

Handlers pass logical device groups (ids within the current device group); the factory
maps them to physical devices, writes compact iota replica groups when the physical
groups have that form (explicit lists otherwise), gives every collective a fresh channel
id with ``use_global_device_ids=true`` (so groups name partitions), and derives
per-device values (offsets, masks) from ``partition-id`` through constant tables.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from hlo_spmd.collectives.groups import DeviceGrouping
from hlo_spmd.ir.builder import Builder, IotaGroups
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.memo import BoundedMemo
from hlo_spmd.sharding.array_key import array_token
from hlo_spmd.sharding.grouping import iota_replica_groups

# Collective statistics are read off the output module; nothing is counted here.


def replica_groups_for(physical: np.ndarray) -> IotaGroups | np.ndarray:
    """The compact iota form when it exists, else the explicit group array."""
    iota = iota_replica_groups(physical)
    if iota is not None:
        return IotaGroups(*iota)
    return physical


# Replica groups per distinct (device grouping, logical groups): a training step asks for
# the same few groups thousands of times, and finding the iota form is O(devices) numpy
# work per call. Pure in the two arrays; explicit results are made read-only.
_GROUPS = BoundedMemo(1024)


def _groups_memo(grouping: DeviceGrouping, logical_groups: np.ndarray) -> IotaGroups | np.ndarray:
    lg = np.asarray(logical_groups, dtype=np.int64)
    key = (grouping.key, array_token(lg))
    hit = _GROUPS.get(key)
    if hit is None:
        hit = replica_groups_for(grouping.physical(lg))
        if isinstance(hit, np.ndarray):
            hit.flags.writeable = False
        _GROUPS.put(key, hit)
    return hit


def _table_facts(values: np.ndarray) -> tuple:
    """(values, every entry equal, the bytes naming the table): what a lookup needs."""
    return values, bool(values.size and np.all(values == values.flat[0])), values.tobytes()


# (grouping key, logical table dtype, shape and bytes) -> _table_facts of the physical
# table. Pure in the two arrays; the physical tables are never written.
_PHYSICAL_TABLES = BoundedMemo(4096)


class CollectiveFactory:
    def __init__(self, builder: Builder, grouping: DeviceGrouping, log: Any) -> None:
        # ``log``: the caller's record of why each collective exists (the partitioner's
        # ``causes.CauseLog``; anything with ``note(instruction) -> instruction``), passed
        # in so this layer imports nothing of the passes; derived factories share it.
        self.b = builder
        self.grouping = grouping
        self.log = log  # why each collective exists
        self._tables: dict[tuple, Instruction] = {}
        self._pid: Instruction | None = None

    def with_grouping(self, grouping: DeviceGrouping) -> "CollectiveFactory":
        out = CollectiveFactory(self.b, grouping, self.log)
        out._pid = self._pid
        return out

    def with_builder(self, builder: Builder) -> "CollectiveFactory":
        return CollectiveFactory(builder, self.grouping, self.log)

    # -- groups -------------------------------------------------------------------------
    def _groups(self, logical_groups: np.ndarray) -> IotaGroups | np.ndarray:
        return _groups_memo(self.grouping, logical_groups)

    # -- collectives --------------------------------------------------------------------
    def all_reduce(self, x: Instruction, reducer: str, logical_groups: np.ndarray,
                   name: str | None = None) -> Instruction:
        if np.asarray(logical_groups).shape[-1] == 1:
            return x
        return self.log.note(self.b.all_reduce(x, reducer, self._groups(logical_groups), name=name))

    def all_gather(self, x: Instruction, dim: int, logical_groups: np.ndarray,
                   name: str | None = None) -> Instruction:
        if np.asarray(logical_groups).shape[-1] == 1:
            return x
        return self.log.note(self.b.all_gather(x, dim, self._groups(logical_groups), name=name))

    def reduce_scatter(self, x: Instruction, dim: int, reducer: str,
                       logical_groups: np.ndarray, name: str | None = None) -> Instruction:
        if np.asarray(logical_groups).shape[-1] == 1:
            return x
        return self.log.note(self.b.reduce_scatter(x, dim, reducer, self._groups(logical_groups), name=name))

    def all_to_all(self, x: Instruction, dim: int, logical_groups: np.ndarray,
                   name: str | None = None) -> Instruction:
        """Array all-to-all: ``dim`` is split into group-size chunks, chunk j goes to group
        member j, received chunks are concatenated along ``dim`` in member order."""
        if np.asarray(logical_groups).shape[-1] == 1:
            return x
        return self.log.note(self.b.all_to_all(x, self._groups(logical_groups), split_dimension=dim, name=name))

    def collective_permute(self, x: Instruction, logical_pairs: Sequence[tuple[int, int]] | np.ndarray,
                           name: str | None = None) -> Instruction:
        pairs = self.grouping.physical_pairs(np.asarray(logical_pairs, dtype=np.int64))
        return self.log.note(self.b.collective_permute(x, [tuple(p) for p in pairs.tolist()], name=name))

    # -- partition-dependent values -----------------------------------------------------
    def partition_id(self) -> Instruction:
        """The physical partition id (u32 scalar), once per computation."""
        if self._pid is None or self._pid.parent is not self.b.computation:
            self._pid = self.b.partition_id()
        return self._pid

    def table_lookup(self, physical_values: np.ndarray, element_type=PrimitiveType.S32,
                     name: str | None = None) -> Instruction:
        """This device's entry of a per-physical-device table (a scalar)."""
        return self._lookup(_table_facts(np.asarray(physical_values)), element_type, name)

    def _lookup(self, facts: tuple, element_type, name: str | None = None) -> Instruction:
        values, uniform, data = facts
        if uniform:
            return self.b.constant(np.asarray(values.flat[0]).astype(np.int64), element_type)
        key = (data, int(element_type), self.b.computation.name)
        cached = self._tables.get(key)
        if cached is not None and cached.parent is self.b.computation:
            return cached
        table = self.b.constant(values.astype(np.int64), element_type, name=name or "offsets")
        pid = self.partition_id()
        sliced = self.b.dynamic_slice(table, [pid], [1])
        out = self.b.reshape(sliced, [])
        self._tables[key] = out
        return out

    def logical_table_lookup(self, logical_values: np.ndarray,
                             element_type=PrimitiveType.S32) -> Instruction:
        """This device's entry of a per-LOGICAL-device table (ids within its group)."""
        lv = np.asarray(logical_values)
        # Handlers ask for the same few tables in every layer: the physical table and its
        # facts once per distinct (grouping, logical table).
        key = (self.grouping.key, array_token(lv))
        facts = _PHYSICAL_TABLES.get(key)
        if facts is None:
            facts = _PHYSICAL_TABLES.put(key, _table_facts(self.grouping.expand_table(lv)))
        return self._lookup(facts, element_type)

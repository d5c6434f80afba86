"""Everything a handler needs: the builder of the computation being written, the
collective factory (with the current device grouping), the partitioned values of
already-handled instructions, and the report of what was done."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from hlo_spmd.collectives.factory import CollectiveFactory
from hlo_spmd.collectives.groups import DeviceGrouping
from hlo_spmd.errors import PartitionError
from hlo_spmd.ir.builder import Builder
from hlo_spmd.ir.clone import clone_computation
from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction, iter_operand_users
from hlo_spmd.ir.module import Module
from hlo_spmd.ir.shape import Shape
from hlo_spmd.memo import BoundedMemo
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.proto import hlo_pb2
from hlo_spmd.passes.partition.reshard import reshard as _reshard
from hlo_spmd.records import Record
from hlo_spmd.sharding import HloSharding, tile_shape

# Shardings are immutable: one shared replicated sharding for the hot paths (a
# fresh one per instruction cost an allocation, and ``s is target`` tests hit first).
_REPLICATED = HloSharding.replicate()


_LOCAL_SHAPES = BoundedMemo(1 << 15)  # (id(shape), sharding) -> (shape, local shape)


# The three records below are hlo_spmd.records.Record classes (a dataclass costs ~0.4-0.8
# ms to create at import); equality and repr as the dataclasses had.
class PartitionReport(Record):
    """What the partitioner did that a user may want to know."""
    __match_args__ = ("replicated_fallbacks", "unknown_custom_calls", "unsharded_inputs",
                      "handler_of", "causes")
    # + ``dot_plans``: instruction name -> the dot handler's chosen plan (handlers/dot.py);
    # outside equality and repr.
    __slots__ = __match_args__ + ("dot_plans",)

    def __init__(self, replicated_fallbacks: list[tuple[str, str]] | None = None,
                 unknown_custom_calls: list[tuple[str, str]] | None = None,
                 unsharded_inputs: list[str] | None = None,
                 handler_of: dict[str, str] | None = None, causes: object = None) -> None:
        self.replicated_fallbacks = (  # (name, opcode)
            [] if replicated_fallbacks is None else replicated_fallbacks)
        # custom-calls whose target has no partitioning rule: (instruction name, target)
        self.unknown_custom_calls = (
            [] if unknown_custom_calls is None else unknown_custom_calls)
        self.unsharded_inputs = [] if unsharded_inputs is None else unsharded_inputs
        self.handler_of = {} if handler_of is None else handler_of
        self.causes = causes  # causes.CauseLog: why each output collective exists
        self.dot_plans: dict[str, str] = {}


class PartitionOptions(Record):
    """User choices that change the program (not its numbers)."""
    __match_args__ = ("windowed_einsum_threshold_mib", "windowed_einsum_bidirectional",
                      "combine_threshold_mib")
    __slots__ = __match_args__

    def __init__(self, windowed_einsum_threshold_mib: float | None = None,
                 windowed_einsum_bidirectional: bool = False,
                 combine_threshold_mib: float | None = 30.0) -> None:
        # XLA's threshold_for_windowed_einsum_mib: a dot whose operand all-gather is larger
        # (MiB per device) runs as a loop of collective-permutes (support/dot_windowed.py).
        # None: off.
        self.windowed_einsum_threshold_mib = windowed_einsum_threshold_mib
        # two streams of pieces, half the steps
        self.windowed_einsum_bidirectional = windowed_einsum_bidirectional
        # XLA's combine_threshold_in_bytes: independent collectives of one kind and device
        # grouping are combined into one while the result stays under this many MiB
        # (passes/partition/combine.py). 0 or None: off.
        self.combine_threshold_mib = combine_threshold_mib


class ModuleState(Record):
    """Shared by every context of one partitioning run."""
    __match_args__ = ("source", "out", "num_devices", "report", "clone_memo",
                      "reshard_cache", "options")
    __slots__ = __match_args__ + ("origins", "_user_counts", "_users")

    def __init__(self, source: Module, out: Module, num_devices: int,
                 report: PartitionReport, clone_memo: dict[int, Computation] | None = None,
                 reshard_cache: dict[tuple, tuple] | None = None,
                 options: PartitionOptions | None = None) -> None:
        self.source = source
        self.out = out
        self.num_devices = num_devices
        self.report = report
        self.clone_memo = {} if clone_memo is None else clone_memo
        # reshard's memory (reshard.py): (computation, device grouping, value, target) ->
        # the value already produced, so every later user shares one set of collectives.
        self.reshard_cache = {} if reshard_cache is None else reshard_cache
        self.options = PartitionOptions() if options is None else options
        # id(local instruction) -> (it, the source instruction whose handler made it): what
        # reshard asks to re-make a value instead of moving it (partition/recreate.py).
        self.origins: dict[tuple, tuple[Instruction, Instruction]] = {}
        self._user_counts: dict[int, int] | None = None
        self._users: dict[int, list[Instruction]] | None = None

    def user_counts(self) -> dict[int, int]:
        """id(source instruction) -> how many instructions read it (a root counts as
        read); built once, on first ask."""
        if self._user_counts is None:
            counts: dict[int, int] = {}
            for comp in self.source.computations:
                for inst in comp.instructions:
                    for op in {id(o): o for o in inst.operands}:
                        counts[op] = counts.get(op, 0) + 1
                if comp.root is not None:
                    counts[id(comp.root)] = counts.get(id(comp.root), 0) + 1
            self._user_counts = counts
        return self._user_counts

    def users(self, inst: Instruction) -> list[Instruction]:
        """The source instructions that read ``inst`` (each once, in program order); the
        map is built once, on first ask (planners looking ahead at what users need)."""
        if self._users is None:
            users: dict[int, list[Instruction]] = {}
            for comp in self.source.computations:
                for key, mine in iter_operand_users(comp.instructions).items():
                    users.setdefault(key, []).extend(mine)
            self._users = users
        return self._users.get(id(inst), [])


class PartitionContext:
    def __init__(self, state: ModuleState, builder: Builder, factory: CollectiveFactory,
                 values: dict[int, PValue] | None = None) -> None:
        self.state = state
        self.b = builder
        self.f = factory
        self.values: dict[int, PValue] = values if values is not None else {}

    # -- derived contexts ---------------------------------------------------------------
    def in_group(self, grouping: DeviceGrouping) -> "PartitionContext":
        """Same computation and values; collectives and tables act within ``grouping``."""
        return PartitionContext(self.state, self.b, self.f.with_grouping(grouping), self.values)

    def for_computation(self, builder: Builder) -> "PartitionContext":
        """A fresh value map for another computation (same device grouping)."""
        return PartitionContext(self.state, builder, self.f.with_builder(builder), {})

    @property
    def grouping(self) -> DeviceGrouping:
        return self.f.grouping

    @property
    def num_devices(self) -> int:
        """Devices in the current group (the logical partition count)."""
        return self.f.grouping.group_size

    # -- values -------------------------------------------------------------------------
    def value(self, inst: Instruction) -> PValue:
        try:
            return self.values[id(inst)]
        except KeyError:
            raise PartitionError(f"operand {inst.name} has not been partitioned",
                                 f"instruction {inst.name}") from None

    def operand(self, inst: Instruction, i: int, target: HloSharding) -> Instruction:
        """Operand ``i`` of ``inst`` as a local instruction with sharding ``target``."""
        try:  # (the map directly: asked for nearly every operand of the module)
            pv = self.values[id(inst.operands[i])]
        except KeyError:
            pv = self.value(inst.operands[i])  # raises, naming the operand
        s = pv.sharding
        if s is target or s == target:  # the common case; ``reshard`` returns it as is
            return pv.hlo
        return _reshard(self, pv, target).hlo

    def reshard(self, pv: PValue, target: HloSharding) -> PValue:
        return _reshard(self, pv, target)

    def cause(self, kind: str | None = None, serves: Instruction | None = None):
        """Scope: collectives created inside exist because of ``kind``, for ``serves``."""
        return self.f.log.scope(kind, serves)

    # -- helpers ------------------------------------------------------------------------
    def emit_like(self, inst: Instruction, operands: Sequence[Instruction], local_shape: Shape,
                  name: str | None = None) -> Instruction:
        """``inst``'s opcode and attributes on local operands, with a declared local shape.
        Called computations are copied as-is (reducers, comparators, map bodies)."""
        called = [self.clone(c) for c in inst.called_computations] \
            if inst.called_computations else ()
        attrs = hlo_pb2.HloInstructionProto()  # copy_attrs, inline: once per emitted op
        attrs.CopyFrom(inst.attrs)
        # ``op`` copies the operand list itself.
        return self.b.op(inst.opcode, operands, attrs, called, local_shape, name or inst.name)

    def clone(self, comp: Computation) -> Computation:
        """A computation called as-is (reducers, comparators): copied once."""
        copy = clone_computation(comp, self.state.out, self.state.clone_memo)
        # Copies are appended; keep them before every partitioned caller.
        return copy

    def local_shape(self, shape: Shape, sharding: HloSharding) -> Shape:
        if shape.is_tuple:
            from hlo_spmd.passes.propagation.sharding_ops import sub_sharding

            # (a tuple sharding lists the leaves of the whole nested tuple)
            elems = [sub_sharding(sharding, shape, i) for i in range(len(shape.tuple_shapes))]
            return Shape.tuple_of([self.local_shape(s, e) for s, e in zip(shape.tuple_shapes, elems)])
        if not shape.is_array or not sharding.is_tiled:
            return shape
        # Asked for every value of every handler, with the same few (shape, sharding)
        # pairs in every layer; both are immutable values, so one answer per pair. The
        # shape is keyed by identity (shapes are shared objects; hashing one hashes all
        # its fields) and held in the entry, so its id stays its own meanwhile.
        key = (id(shape), sharding)
        hit = _LOCAL_SHAPES.get(key)
        if hit is None:
            hit = _LOCAL_SHAPES.put(key, (shape, shape.with_dims(tile_shape(sharding,
                                                                             shape.dims))))
        return hit[1]

    def sharding_of(self, inst: Instruction) -> HloSharding:
        """The instruction's sharding; unannotated means replicated."""
        return inst.sharding if inst.sharding is not None else _REPLICATED

    def logical_table(self, values: np.ndarray) -> Instruction:
        return self.f.logical_table_lookup(values)

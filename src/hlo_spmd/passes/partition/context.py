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
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.shape import Shape
from hlo_spmd.memo import BoundedMemo
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.reshard import reshard as _reshard
from hlo_spmd.passes.partition.reshard import reshard_price as _reshard_price
from hlo_spmd.passes.partition.state import ModuleState
from hlo_spmd.proto import hlo_pb2
from hlo_spmd.sharding import HloSharding, tile_shape

# Shardings are immutable: one shared replicated sharding for the hot paths (a
# fresh one per instruction cost an allocation, and ``s is target`` tests hit first).
_REPLICATED = HloSharding.replicate()


_LOCAL_SHAPES = BoundedMemo(1 << 15)  # (id(shape), sharding) -> (shape, local shape)


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

    def reshard_price(self, pv: PValue, target: HloSharding,
                      recreate: bool = True) -> tuple[float, float]:
        """``reshard.reshard_price``: what ``reshard(pv, target)`` would cost now."""
        return _reshard_price(self, pv, target, recreate)

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

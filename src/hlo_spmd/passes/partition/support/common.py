"""Small helpers shared by handlers."""
from __future__ import annotations

from typing import Sequence

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.shape import Shape
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.proto import hlo_pb2


def copy_attrs(inst: Instruction) -> hlo_pb2.HloInstructionProto:
    """The instruction's attributes minus its sharding (shardings are re-derived)."""
    attrs = hlo_pb2.HloInstructionProto()
    attrs.CopyFrom(inst.attrs)
    return attrs


def emit_like(ctx: PartitionContext, inst: Instruction, operands: Sequence[Instruction],
              local_shape: Shape, name: str | None = None) -> Instruction:
    """``inst``'s opcode and attributes on local operands, with a declared local shape.
    Called computations are copied as-is (reducers, comparators, map bodies)."""
    called = [ctx.clone(c) for c in inst.called_computations] if inst.called_computations \
        else ()
    attrs = hlo_pb2.HloInstructionProto()  # copy_attrs, inline: once per emitted op
    attrs.CopyFrom(inst.attrs)
    # ``op`` copies the operand list itself.
    return ctx.b.op(inst.opcode, operands, attrs, called, local_shape, name or inst.name)

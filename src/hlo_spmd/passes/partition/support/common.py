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
    """``inst``'s opcode and attributes on local operands, with a declared local shape
    (``PartitionContext.emit_like``)."""
    return ctx.emit_like(inst, operands, local_shape, name)

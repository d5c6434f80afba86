"""Small helpers shared by handlers."""
from __future__ import annotations

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.proto import hlo_pb2


def copy_attrs(inst: Instruction) -> hlo_pb2.HloInstructionProto:
    """The instruction's attributes minus its sharding (shardings are re-derived)."""
    attrs = hlo_pb2.HloInstructionProto()
    attrs.CopyFrom(inst.attrs)
    return attrs


"""Copying computations between modules (callees first, each copied once)."""
from __future__ import annotations

from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.module import Module
from hlo_spmd.proto import hlo_pb2


def clone_instruction(inst: Instruction, operands: list[Instruction],
                      called: list[Computation]) -> Instruction:
    attrs = hlo_pb2.HloInstructionProto()
    attrs.CopyFrom(inst.attrs)
    out = Instruction(inst.opcode, inst.shape, operands, inst.name, attrs, called, inst.sharding)
    out.source_sharding = inst.source_sharding
    return out


def clone_computation(comp: Computation, into: Module,
                      memo: dict[int, Computation]) -> Computation:
    """A copy of ``comp`` (and, recursively, what it calls) registered in ``into``.

    ``memo`` maps id(original computation) -> copy, so shared callees are copied once.
    Copies are appended to ``into.computations`` callees-first.
    """
    done = memo.get(id(comp))
    if done is not None:
        return done
    for inst in comp.instructions:
        for callee in inst.called_computations:
            clone_computation(callee, into, memo)
    new = Computation(comp.name)
    new.is_fusion_computation = comp.is_fusion_computation
    new.execution_thread = comp.execution_thread
    if comp.attrs is not None:
        new.attrs = hlo_pb2.HloComputationProto()
        new.attrs.CopyFrom(comp.attrs)
        new.attrs.ClearField("program_shape")
    mapping: dict[int, Instruction] = {}
    for inst in comp.instructions:
        copy = clone_instruction(inst, [mapping[id(o)] for o in inst.operands],
                                 [memo[id(c)] for c in inst.called_computations])
        copy.control_predecessors = [mapping[id(p)] for p in inst.control_predecessors]
        mapping[id(inst)] = copy
        new.instructions.append(copy)
        copy.parent = new
    new.root = mapping[id(comp.root)]
    into.add_computation(new)
    memo[id(comp)] = new
    return new

"""Inline `call` instructions, as XLA's CallInliner does before sharding propagation.

JAX wraps nested jit functions (relu, remainder, ...) in calls; inlining them lets
completion and partitioning treat their bodies like any other code, so the shardings
match XLA's and no resharding is forced at call boundaries. Calls marked
``inlineable="false"`` (Shardy's manual computation bodies) are kept.
"""
from __future__ import annotations

from hlo_spmd.ir.clone import clone_instruction
from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.module import Module


def _inlineable(inst: Instruction) -> bool:
    if inst.opcode != "call" or len(inst.called_computations) != 1:
        return False
    if inst.frontend_attributes.get("inlineable") == "false":
        return False
    return not inst.attrs.is_composite


def _inline_one(module: Module, comp: Computation, call: Instruction) -> None:
    callee = call.called_computations[0]
    mapping: dict[int, Instruction] = {}
    new: list[Instruction] = []
    for inst in callee.instructions:
        if inst.opcode == "parameter":
            mapping[id(inst)] = call.operands[inst.parameter_number]
            continue
        copy = clone_instruction(inst, [mapping[id(o)] for o in inst.operands],
                                 list(inst.called_computations))
        copy.control_predecessors = [mapping[id(p)] for p in inst.control_predecessors]
        copy.name = module.unique_name(inst.name)
        copy.id = module.next_instruction_id()
        copy.parent = comp
        mapping[id(inst)] = copy
        new.append(copy)
    root = mapping[id(callee.root)]
    if call.sharding is not None and root in new and root.sharding is None:
        root.sharding = call.sharding
    at = comp.instructions.index(call)
    comp.instructions[at:at + 1] = new
    comp.replace_all_uses(call, root)
    for inst in comp.instructions:
        if call in inst.control_predecessors:
            inst.control_predecessors = [root if p is call else p for p in inst.control_predecessors]


def inline_calls(module: Module) -> int:
    """Inline every inlineable call (callees first, so nested calls vanish); returns the
    number inlined. Computations no longer called are dropped."""
    count = 0
    for comp in list(module.computations):  # callees before callers
        for inst in [i for i in comp.instructions if _inlineable(i)]:
            _inline_one(module, comp, inst)
            count += 1
    if count:
        module.remove_unreachable_computations()
    return count

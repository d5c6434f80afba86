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


def _inline_into(module: Module, comp: Computation, calls: set[int]) -> None:
    """Replace every call in ``calls`` (ids of instructions of ``comp``) by a copy of its
    callee's body, in one pass over ``comp``: uses are redirected through a replacement
    map as instructions are visited (operands come first in program order), instead of a
    scan of the whole computation per call."""
    replaced: dict[int, Instruction] = {}  # id(call) -> the value that stands for it

    def now(inst: Instruction) -> Instruction:
        return replaced.get(id(inst), inst)

    out: list[Instruction] = []
    stale = replaced.keys()   # (a live view: ``isdisjoint`` tests without a Python loop)
    for inst in comp.instructions:
        if replaced:
            ops = inst.operands
            if ops and not stale.isdisjoint(map(id, ops)):
                inst.operands = [now(o) for o in ops]
            preds = inst.control_predecessors
            if preds and not stale.isdisjoint(map(id, preds)):
                inst.control_predecessors = [now(p) for p in preds]
        if id(inst) not in calls:
            out.append(inst)
            continue
        callee = inst.called_computations[0]
        mapping: dict[int, Instruction] = {}
        new: list[Instruction] = []
        for body in callee.instructions:
            if body.opcode == "parameter":
                mapping[id(body)] = inst.operands[body.parameter_number]
                continue
            copy = clone_instruction(body, [mapping[id(o)] for o in body.operands],
                                     list(body.called_computations))
            copy.control_predecessors = [mapping[id(p)] for p in body.control_predecessors]
            copy.name = module.unique_name(body.name)
            copy.id = module.next_instruction_id()
            copy.parent = comp
            mapping[id(body)] = copy
            new.append(copy)
        root = mapping[id(callee.root)]
        if inst.sharding is not None and root in new and root.sharding is None:
            root.sharding = inst.sharding
        out.extend(new)
        replaced[id(inst)] = root
    comp.instructions = out
    if comp.root is not None:
        comp.root = now(comp.root)


def inline_calls(module: Module) -> int:
    """Inline every inlineable call (callees first, so nested calls vanish); returns the
    number inlined. Computations no longer called are dropped."""
    count = 0
    for comp in list(module.computations):  # callees before callers
        calls = {id(i) for i in comp.instructions if _inlineable(i)}
        if calls:
            _inline_into(module, comp, calls)
            count += len(calls)
    if count:
        module.remove_unreachable_computations()
    return count

"""Held-out models for the search: a module annotated by its author (a framework's
export with its shardings and sharding constraints), stripped of every annotation, is
what the search gets; the author's own program (the module partitioned as annotated)
is what its result is compared with, on the same mesh and with that program's peak as
the memory budget.
"""
from __future__ import annotations

from hlo_spmd.ir.module import Module


def strip_annotations(module: Module) -> Module:
    """``module`` (in place) without shardings: ``Sharding`` custom-calls (sharding
    constraints) bypassed, every instruction's sharding cleared, dead code removed."""
    for comp in module.computations:
        for inst in list(comp.instructions):
            if inst.opcode == "custom-call" and inst.custom_call_target == "Sharding":
                comp.replace_all_uses(inst, inst.operands[0])
            inst.sharding = None
        comp.remove_dead()
    return module


__all__ = ["strip_annotations"]

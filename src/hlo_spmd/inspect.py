"""Selecting what `hlo-spmd show` prints: a computation, annotated instructions, or one
instruction with its operands and users. Returns text; rendering is the CLI's job."""
from __future__ import annotations

from hlo_spmd.errors import HloSpmdError
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.module import Module
from hlo_spmd.ir.text_printer import print_instruction, print_module


def _neighbourhood_text(module: Module, name: str, print_metadata: bool) -> str:
    inst = module.find(name)
    if inst is None:
        raise HloSpmdError(f"no instruction named {name!r} in module {module.name}")
    comp = inst.parent
    users = comp.users().get(id(inst), [])

    def line(i: Instruction) -> str:
        return "  " + print_instruction(i, print_metadata=print_metadata)

    parts = [f"// computation {comp.name}", "// operands:"]
    parts += [line(o) for o in _unique(inst.operands)] or ["  (none)"]
    parts += ["// instruction:", ("  ROOT " if inst.is_root else "  ") +
              print_instruction(inst, print_metadata=print_metadata), "// users:"]
    parts += [line(u) for u in users] or ["  (none)"]
    if inst.called_computations:
        parts.append("// calls: " + ", ".join(c.name for c in inst.called_computations))
    return "\n".join(parts) + "\n"


def _unique(insts: list[Instruction]) -> list[Instruction]:
    seen: set[int] = set()
    out = []
    for i in insts:
        if id(i) not in seen:
            seen.add(id(i))
            out.append(i)
    return out


def select_text(module: Module, *, computation: str | None = None,
                annotated_only: bool = False, instruction: str | None = None,
                print_metadata: bool = True) -> str:
    """The module's HLO text, narrowed by the given filters."""
    if instruction is not None:
        return _neighbourhood_text(module, instruction, print_metadata)
    comp = None
    if computation is not None:
        comp = module.computation(computation)
        if comp is None:
            names = ", ".join(c.name for c in module.computations[:8])
            raise HloSpmdError(f"no computation named {computation!r} (have: {names})")

    def keep(inst: Instruction) -> bool:
        if comp is not None and inst.parent is not comp:
            return False
        return not annotated_only or inst.sharding is not None

    only = keep if (comp is not None or annotated_only) else None
    return print_module(module, print_metadata=print_metadata, only=only)

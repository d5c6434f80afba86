"""HLO computations: an ordered list of instructions with one root."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from hlo_spmd.ir.instruction import Instruction, iter_operand_users
from hlo_spmd.ir.shape import Shape

if TYPE_CHECKING:
    from hlo_spmd.ir.module import Module


class Computation:
    __slots__ = ("name", "instructions", "root", "id", "module", "is_fusion_computation",
                 "execution_thread", "attrs")

    def __init__(self, name: str) -> None:
        self.name = name
        # Program order: operands before users (XLA's proto order).
        self.instructions: list[Instruction] = []
        self.root: Instruction | None = None
        self.id: int = -1
        self.module: Module | None = None
        self.is_fusion_computation = False
        self.execution_thread = ""
        # HloComputationProto fields we do not model (kept for lossless save).
        self.attrs: Any = None

    # -- queries ------------------------------------------------------------------------
    @property
    def parameters(self) -> list[Instruction]:
        params = [i for i in self.instructions if i.opcode == "parameter"]
        return sorted(params, key=lambda i: i.parameter_number)

    def parameter_shapes(self) -> list[Shape]:
        return [p.shape for p in self.parameters]

    def users(self) -> dict[int, list[Instruction]]:
        """id(instruction) -> its users; derived on demand, so never stale."""
        return iter_operand_users(self.instructions)

    def find(self, name: str) -> Instruction | None:
        for inst in self.instructions:
            if inst.name == name:
                return inst
        return None

    def __iter__(self) -> Iterator[Instruction]:
        return iter(self.instructions)

    def __len__(self) -> int:
        return len(self.instructions)

    # -- edits --------------------------------------------------------------------------
    def add(self, inst: Instruction, name: str | None = None) -> Instruction:
        """Append an instruction, giving it a module-unique name and id."""
        inst.parent = self
        if self.module is not None:
            inst.name = self.module.unique_name(name or inst.name or inst.opcode)
            inst.id = self.module.next_instruction_id()
        elif name:
            inst.name = name
        self.instructions.append(inst)
        return inst

    def replace_all_uses(self, old: Instruction, new: Instruction) -> None:
        # ``in`` on a list is a C-level scan that compares by identity first, and an
        # Instruction has no __eq__: the same test as ``any(o is old ...)``, ~10x cheaper
        # (callers such as the tidy pass run this once per rewrite on large bodies).
        for inst in self.instructions:
            if old in inst.operands and inst is not new:
                inst.replace_operand(old, new)
        if self.root is old:
            self.root = new

    def remove_dead(self) -> int:
        """Remove instructions that do not reach the root (side effects kept); count removed."""
        from hlo_spmd.ir.opcodes import SIDE_EFFECTING

        live: set[int] = set()
        stack = [self.root] + [i for i in self.instructions
                               if i.opcode in SIDE_EFFECTING or i.opcode == "parameter"]
        while stack:
            inst = stack.pop()
            if inst is None or id(inst) in live:
                continue
            live.add(id(inst))
            stack.extend(inst.operands)
            stack.extend(inst.control_predecessors)
        before = len(self.instructions)
        self.instructions = [i for i in self.instructions if id(i) in live]
        return before - len(self.instructions)

    def sort_topologically(self) -> None:
        """Reorder so operands (and control predecessors) come before users; stable."""
        position = {id(inst): n for n, inst in enumerate(self.instructions)}
        order: list[Instruction] = []
        state: dict[int, int] = {}
        for start in self.instructions:
            if id(start) in state:
                continue
            stack: list[tuple[Instruction, int]] = [(start, 0)]
            while stack:
                inst, k = stack.pop()
                deps = inst.operands + inst.control_predecessors
                if k == 0:
                    if state.get(id(inst)) == 2:
                        continue
                    state[id(inst)] = 1
                if k < len(deps):
                    stack.append((inst, k + 1))
                    dep = deps[k]
                    if id(dep) in position and state.get(id(dep)) is None:
                        stack.append((dep, 0))
                    continue
                state[id(inst)] = 2
                order.append(inst)
        self.instructions = order

    def __repr__(self) -> str:
        return f"<Computation {self.name}: {len(self.instructions)} instructions>"

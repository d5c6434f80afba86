"""HLO computations: an ordered list of instructions with one root."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from hlo_spmd.ir.instruction import Instruction, iter_operand_users
from hlo_spmd.ir.opcodes import SIDE_EFFECTING
from hlo_spmd.ir.shape import Shape

if TYPE_CHECKING:
    from hlo_spmd.ir.module import Module


def has_side_effect(inst: Instruction) -> bool:
    """HloInstruction::HasSideEffect by opcode (in an SPMD module channel ids make no
    collective side-effecting): the opcode's trait, or such an op anywhere in a called
    computation. A custom-call's ``custom_call_has_side_effect`` is not read: the
    partitioner's own markers (``xla.sdy.ShardingGroup``) carry it and must go when dead."""
    if inst.opcode in SIDE_EFFECTING:
        return True
    return any(has_side_effect(i) for c in inst.called_computations for i in c.instructions)


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
        # Marked when first reached, so each instruction is pushed once (the tidy pass
        # runs this on a 10k-instruction entry after each rewrite).
        stack = [i for i in self.instructions
                 if i.opcode == "parameter" or i.opcode in SIDE_EFFECTING
                 or (i.called_computations and has_side_effect(i))]
        if self.root is not None:
            stack.append(self.root)
        # Instructions hash by identity: a set of them, not of their id()s (cheaper).
        live = set(stack)
        add = live.add
        push = stack.append
        while stack:
            inst = stack.pop()
            for dep in inst.operands:
                if dep not in live:
                    add(dep)
                    push(dep)
            if inst.control_predecessors:  # (rare: no empty loop per instruction)
                for dep in inst.control_predecessors:
                    if dep not in live:
                        add(dep)
                        push(dep)
        before = len(self.instructions)
        self.instructions = [i for i in self.instructions if i in live]
        return before - len(self.instructions)

    def sort_topologically(self, settled: int = 0) -> None:
        """Reorder so operands (and control predecessors) come before users; stable: a
        depth-first post-order from each instruction in program order, so an already
        ordered computation keeps its order. Each instruction's dependencies are walked
        by one iterator (linear in the edges, also for ops with many operands).

        ``settled``: the caller knows the first ``settled`` instructions read only
        instructions before them (e.g. a rewrite changed no operand there): the walk
        would place each of them where it is, so it starts after them."""
        members = set(self.instructions)  # identity sets (see remove_dead)
        order: list[Instruction] = self.instructions[:settled]
        state: set[Instruction] = set(order)  # on the stack or done
        append = order.append
        mark = state.add
        for start in self.instructions[settled:] if settled else self.instructions:
            if start in state:
                continue
            mark(start)
            deps = start.operands + start.control_predecessors if start.control_predecessors \
                else start.operands
            # The common case, everything it reads already placed: no stack needed.
            for dep in deps:
                if dep not in state and dep in members:
                    break
            else:
                append(start)
                continue
            stack = [(start, iter(deps))]
            while stack:
                inst, it = stack[-1]
                for dep in it:
                    if dep in members and dep not in state:
                        mark(dep)
                        stack.append((dep, iter(dep.operands + dep.control_predecessors)))
                        break
                else:
                    stack.pop()
                    append(inst)
        self.instructions = order

    def __repr__(self) -> str:
        return f"<Computation {self.name}: {len(self.instructions)} instructions>"

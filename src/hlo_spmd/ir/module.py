"""HLO modules: computations (callees before callers), the entry, and module attributes."""
from __future__ import annotations

import re
from typing import Any, Iterable, Iterator

from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.memo import BoundedMemo

_SUFFIX = re.compile(r"^(.*?)(?:\.(\d+))?$")
# wanted name -> its base without the ``.N`` suffix (a pure function of the text; the
# partitioner asks it for every clash, mostly of the same few opcode names).
_BASES = BoundedMemo(1 << 16)


class Module:
    __slots__ = ("name", "computations", "entry", "id", "attrs", "_names", "_next_suffix",
                 "_next_instruction_id", "_next_computation_id", "config", "builder_state",
                 "__weakref__")

    def __init__(self, name: str) -> None:
        self.name = name
        self.computations: list[Computation] = []
        self.entry: Computation | None = None
        self.id = 0
        # HloModuleProto fields we do not model (schedule, aliasing, stack frames, ...).
        self.attrs: Any = None
        self._names: set[str] = set()
        self._next_suffix: dict[str, int] = {}
        self._next_instruction_id = 0
        self._next_computation_id = 0
        # HloModuleConfig fields that only HLO text carries (num_partitions, replica_count, ...).
        self.config: dict = {}
        # ir.builder's per-module state (channel ids, scalar computations, the shape
        # inference memo). On the module, not in a weak-keyed table: the state holds the
        # module's computations, which hold the module, so a table's value would keep
        # its own key alive forever (every partitioned module leaked, ~1 MB each).
        self.builder_state: Any = None

    # -- naming and ids -----------------------------------------------------------------
    def unique_name(self, wanted: str) -> str:
        """``wanted`` if free, else ``base.N`` with the next free N (XLA's NameUniquer style)."""
        names = self._names
        if wanted not in names:
            names.add(wanted)
            return wanted
        base = _BASES.get(wanted)
        if base is None:
            base = _BASES.put(wanted, _SUFFIX.match(wanted).group(1) or wanted)
        n = self._next_suffix.get(base, 1)
        name = f"{base}.{n}"
        while name in names:
            n += 1
            name = f"{base}.{n}"
        self._next_suffix[base] = n + 1
        names.add(name)
        return name

    def reserve_name(self, name: str) -> None:
        self._names.add(name)

    def reserve_names(self, names: Iterable[str]) -> None:
        self._names.update(names)

    def next_instruction_id(self) -> int:
        self._next_instruction_id += 1
        return self._next_instruction_id

    def note_instruction_id(self, i: int) -> None:
        self._next_instruction_id = max(self._next_instruction_id, i)

    def next_computation_id(self) -> int:
        self._next_computation_id += 1
        return self._next_computation_id

    def note_computation_id(self, i: int) -> None:
        self._next_computation_id = max(self._next_computation_id, i)

    # -- structure ----------------------------------------------------------------------
    def add_computation(self, comp: Computation, assign_ids: bool = True) -> Computation:
        """Register a computation (append order = callees before callers)."""
        comp.module = self
        if assign_ids:
            comp.name = self.unique_name(comp.name)
            comp.id = self.next_computation_id()
            for inst in comp.instructions:
                inst.name = self.unique_name(inst.name or inst.opcode)
                inst.id = self.next_instruction_id()
        self.computations.append(comp)
        return comp

    def computation(self, name: str) -> Computation | None:
        for comp in self.computations:
            if comp.name == name:
                return comp
        return None

    def instructions(self) -> Iterator[Instruction]:
        for comp in self.computations:
            yield from comp.instructions

    def find(self, name: str) -> Instruction | None:
        for inst in self.instructions():
            if inst.name == name:
                return inst
        return None

    def instruction_count(self) -> int:
        return sum(len(c.instructions) for c in self.computations)

    def sort_computations(self) -> None:
        """Order computations callees-before-callers (XLA requires it in the proto)."""
        order: list[Computation] = []
        seen: set[int] = set()

        def visit(comp: Computation) -> None:
            stack = [(comp, iter(_callees(comp)))]
            seen.add(id(comp))
            while stack:
                top, it = stack[-1]
                nxt = next(it, None)
                if nxt is None:
                    stack.pop()
                    order.append(top)
                elif id(nxt) not in seen:
                    seen.add(id(nxt))
                    stack.append((nxt, iter(_callees(nxt))))

        for comp in self.computations:
            if id(comp) not in seen:
                visit(comp)
        self.computations = order

    def remove_unreachable_computations(self) -> int:
        reachable: set[int] = set()
        stack = [self.entry]
        while stack:
            comp = stack.pop()
            if comp is None or id(comp) in reachable:
                continue
            reachable.add(id(comp))
            stack.extend(_callees(comp))
        before = len(self.computations)
        self.computations = [c for c in self.computations if id(c) in reachable]
        return before - len(self.computations)

    def __repr__(self) -> str:
        return f"<Module {self.name}: {len(self.computations)} computations>"


def _callees(comp: Computation) -> list[Computation]:
    out: list[Computation] = []
    for inst in comp.instructions:
        out.extend(inst.called_computations)
    return out

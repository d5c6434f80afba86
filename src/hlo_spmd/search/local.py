"""Local prices for modules too large to partition once per candidate (the 28-layer
training step takes ~15-20 s per whole-module partition here).

A move of group ``g`` to candidate ``c`` is priced on a *slice*: the instructions within
``radius`` hops (operands and users) of one representative layer of ``g``'s members
(the members near the middle one, so a weight moves with its optimizer states), cut
out of the entry computation into a module of its own. Values entering the slice from
outside become its parameters and values leaving it its outputs, each pinned to the
sharding the incumbent's completed program gave it, so a move pays for the
resharding it forces at the slice's border. The slice is completed and partitioned
with the representatives at ``c`` and at the incumbent's candidate, and the
difference in bytes (and collectives) is scaled by the number of copies of the
representative layer in the group: the repeated structure is priced once. Interactions
of two groups are priced on the union of their slices when their representatives are
within ``radius`` of each other.

The peak is not local (it is the maximum over the whole program of what is live); a
move's peak change is the change in the per-device bytes of the group's parameters.
These are estimates that steer the integer program; the driver partitions the chosen
assignment once, whole, and that program's figures are the reported ones.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from hlo_spmd.errors import HloSpmdError
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.module import Module
from hlo_spmd.ir.opcodes import is_elementwise
from hlo_spmd.search.candidates import Mesh, OutputSlot, Spec
from hlo_spmd.search.pricing import Price, Pricer

Delta = tuple[float, float, float]

#: Hops (operands and users) around the representatives that a slice covers.
RADIUS = 4
#: A value with more users than this (a broadcast scalar, the learning rate) is kept in a
#: slice but not walked through: it would pull the whole program in.
HUB_USERS = 12


def local_bytes(dims: Sequence[int], itemsize: float, spec: Spec, mesh: Mesh) -> float:
    sizes = dict(mesh)
    n = itemsize
    for d, axes in zip(dims, spec):
        if axes is None:
            n *= d
        else:
            names = (axes,) if isinstance(axes, str) else axes
            n *= -(-d // math.prod(sizes[a] for a in names))
    return float(n)


class LocalPricer:
    """Deltas of moves around ``incumbent`` (one candidate index per group), priced on
    slices. ``completed``: instruction name -> sharding in the incumbent's completed
    program; ``probe``: the module with calls inlined (names as in ``completed``)."""

    def __init__(self, probe: Module, groups: Sequence[Sequence[Instruction]],
                 cands: Sequence[Sequence[Spec]], incumbent: Sequence[int],
                 completed: Mapping[str, object], mesh: Mesh, num_partitions: int,
                 radius: int = RADIUS) -> None:
        self.probe = probe
        self.comp = probe.entry
        self.users = self.comp.users()
        self.order = {id(i): k for k, i in enumerate(self.comp.instructions)}
        self.groups = groups
        self.cands = cands
        self.incumbent = list(incumbent)
        self.completed = completed
        self.mesh = mesh
        self.n = num_partitions
        self.radius = radius
        self.group_of = {id(p): g for g, members in enumerate(groups) for p in members
                         if isinstance(p, Instruction)}
        self.reps: list[list[Instruction]] = []
        self.mult: list[float] = []
        for members in groups:
            params = [p for p in members if isinstance(p, Instruction)]
            if not params:  # outputs alone: nothing to cut a slice around
                self.reps.append([])
                self.mult.append(1.0)
                continue
            near = self.layer(params[len(params) // 2])
            reps = [p for p in params if p in near]
            self.reps.append(reps)
            self.mult.append(len(params) / len(reps))
        self._slices: dict[tuple, tuple | None] = {}
        self.partitions = 0

    # -- geometry -------------------------------------------------------------------------
    def ball(self, seeds: Sequence[Instruction]) -> set[Instruction]:
        root = self.comp.root
        out = set(seeds)
        frontier = list(seeds)
        for _ in range(self.radius):
            nxt = []
            for inst in frontier:
                if inst.opcode == "parameter" and inst not in seeds:
                    continue  # another parameter: its own other uses are not ours
                users = self.users.get(id(inst), ())
                near = list(inst.operands)
                if len(users) <= HUB_USERS:
                    near += users
                for x in near:
                    if x in out or (x is root and x.opcode == "tuple"):
                        continue
                    out.add(x)
                    nxt.append(x)
            frontier = nxt
        return out

    def layer(self, p: Instruction, steps: int = 12) -> set[Instruction]:
        """What ``p`` reaches through elementwise values of its own shape (operands and
        users, up to ``steps`` hops): a weight's optimizer states and gradient, not the
        next layer's weight (layers meet through activations, of other shapes)."""
        out = {p}
        frontier = [p]
        for _ in range(steps):
            nxt = []
            for inst in frontier:
                users = self.users.get(id(inst), ())
                near = list(inst.operands) + (list(users) if len(users) <= HUB_USERS else [])
                for x in near:
                    if x not in out and x.shape == p.shape:
                        out.add(x)
                        # Walked on through elementwise ops only (the update
                        # chain): not through a parameter, nor a broadcast learning
                        # rate that every layer's update shares.
                        if is_elementwise(x.opcode):
                            nxt.append(x)
            frontier = nxt
        return out

    def partner(self, g: int, h: int) -> list[Instruction] | None:
        """Members of ``h`` within reach of ``g``'s representatives (None: not close)."""
        near = self.ball(self.reps[g])
        members = [p for p in self.groups[h] if p in near]
        return members or None

    # -- slices ---------------------------------------------------------------------------
    def _slice(self, key: tuple, moved: Sequence[Instruction]) -> tuple | None:
        if key in self._slices:
            return self._slices[key]
        from hlo_spmd.ir.io import module_bytes

        inside = self.ball(moved)
        try:
            module, numbers, outs = self._cut(inside, set(moved))
            got = (Pricer(module_bytes(module), self.mesh, self.n), numbers, outs)
        except HloSpmdError:
            got = None
        self._slices[key] = got
        return got

    def _cut(self, inside: set[Instruction], moved: set[Instruction]
             ) -> tuple[Module, dict[int, int], dict[int, int]]:
        """The slice as a module: (module, original parameter number -> slice number of
        each moved parameter, id(instruction) -> slice output index)."""
        from hlo_spmd.ir.clone import clone_computation, clone_instruction
        from hlo_spmd.ir.computation import Computation
        from hlo_spmd.ir.shape import Shape
        from hlo_spmd.proto import hlo_pb2
        from hlo_spmd.sharding import HloSharding

        order = sorted(inside, key=lambda i: self.order[id(i)])
        module = Module(f"{self.probe.name}.slice")
        module.config = dict(self.probe.config) if isinstance(self.probe.config, dict) else {}
        memo: dict[int, Computation] = {}
        for inst in order:
            for callee in inst.called_computations:
                clone_computation(callee, module, memo)
        comp = Computation("slice")
        module.add_computation(comp)
        module.entry = comp
        mapping: dict[int, Instruction] = {}
        numbers: dict[int, int] = {}

        def pinned(inst: Instruction):
            return self.completed.get(inst.name)

        params: list[Instruction] = []

        def param_for(inst: Instruction, sharding) -> Instruction:
            p = Instruction("parameter", inst.shape, [], inst.name,
                            hlo_pb2.HloInstructionProto(parameter_number=len(params)),
                            [], sharding)
            params.append(p)
            comp.add(p)
            return p

        for inst in order:
            for o in inst.operands:
                if id(o) not in mapping and o not in inside:
                    mapping[id(o)] = param_for(o, pinned(o))
            if inst.opcode == "parameter":
                p = param_for(inst, None if inst in moved else
                              inst.sharding if inst.sharding is not None else pinned(inst))
                if inst in moved:
                    numbers[inst.parameter_number] = p.parameter_number
                mapping[id(inst)] = p
                continue
            copy = clone_instruction(inst, [mapping[id(o)] for o in inst.operands],
                                     [memo[id(c)] for c in inst.called_computations])
            comp.add(copy)
            mapping[id(inst)] = copy
        outs = [i for i in order if i.opcode != "parameter" and (
            any(u not in inside for u in self.users.get(id(i), ()))
            or i is self.comp.root)]
        if not outs:
            raise HloSpmdError("empty slice")
        shardings = [pinned(i) for i in outs]
        root = Instruction("tuple", Shape.tuple_of([mapping[id(i)].shape for i in outs]),
                           [mapping[id(i)] for i in outs], "slice_root")
        if all(s is not None for s in shardings):
            root.sharding = HloSharding.tuple(shardings)
        comp.add(root)
        comp.root = root
        return module, numbers, {id(i): j for j, i in enumerate(outs)}

    def _price(self, key: tuple, moved: Sequence[Instruction],
               choice: Mapping[int, int]) -> Price | None:
        sl = self._slice(key, moved)
        if sl is None:
            return None
        pricer, numbers, outs = sl
        assignment: dict = {numbers[p.parameter_number]: self.cands[self.group_of[id(p)]][
            choice[self.group_of[id(p)]]] for p in moved}
        for g, c in choice.items():  # the group's outputs move with it
            for slot in self.groups[g]:
                if isinstance(slot, OutputSlot):
                    j = outs.get(id(slot.value(self.comp)))
                    if j is not None:
                        assignment[f"out#{j}"] = self.cands[g][c]
        before = pricer.partitions
        got = pricer.price(assignment)
        self.partitions += pricer.partitions - before
        return got

    # -- deltas ---------------------------------------------------------------------------
    def _peak_delta(self, g: int, c: int) -> float:
        from hlo_spmd.ir.primitive_types import element_bytes

        p = self.groups[g][0]
        item = element_bytes(p.shape.element_type)
        now = local_bytes(p.shape.dims, item, self.cands[g][self.incumbent[g]], self.mesh)
        new = local_bytes(p.shape.dims, item, self.cands[g][c], self.mesh)
        return (new - now) * len(self.groups[g])

    def unary(self, g: int, c: int) -> Delta | None:
        if not self.reps[g]:
            return None
        base = {g: self.incumbent[g]}
        key = (g,)
        b = self._price(key, self.reps[g], base)
        p = self._price(key, self.reps[g], {g: c})
        if b is None or p is None:
            return None
        m = self.mult[g]
        return ((p.bytes - b.bytes) * m, (p.collectives - b.collectives) * m,
                self._peak_delta(g, c))

    def interaction(self, g: int, c: int, h: int, d: int) -> Delta | None:
        if not self.reps[g]:
            return None
        partner = self.partner(g, h)
        if partner is None:
            return None
        moved = list(self.reps[g]) + [p for p in partner if p not in self.reps[g]]
        key = (g, h)
        ig, ih = self.incumbent[g], self.incumbent[h]
        prices = [self._price(key, moved, {g: a, h: b})
                  for a, b in ((c, d), (c, ih), (ig, d), (ig, ih))]
        if any(x is None for x in prices):
            return None
        both, only_g, only_h, base = prices
        m = self.mult[g]
        return ((both.bytes - only_g.bytes - only_h.bytes + base.bytes) * m,
                (both.collectives - only_g.collectives - only_h.collectives
                 + base.collectives) * m, 0.0)

    def site(self, members: Sequence[Instruction], spec: Spec) -> Delta | None:
        """The change a sharding constraint ``spec`` on every member of a group of
        intermediate values (:func:`~hlo_spmd.search.candidates.constraint_sites`, named
        as in ``probe``) makes, priced on the slice around the middle member and scaled
        by the group's size. The peak change is the slice's (an estimate: the driver
        partitions the chosen constraints whole)."""
        by_name = {i.name: i for i in self.comp.instructions}
        here = [by_name[m.name] for m in members if m.name in by_name]
        if not here:
            return None
        rep = here[len(here) // 2]
        key = ("site", rep.name)
        sl = self._slice(key, [rep])
        if sl is None:
            return None
        pricer = sl[0]
        before = pricer.partitions
        b, p = pricer.price({}), pricer.price({rep.name: spec})
        self.partitions += pricer.partitions - before
        if b is None or p is None:
            return None
        m = float(len(members))
        return ((p.bytes - b.bytes) * m, (p.collectives - b.collectives) * m,
                float(p.peak - b.peak))

    def meeting_pairs(self) -> set[tuple[int, int]]:
        out = set()
        for g in range(len(self.groups)):
            near = self.ball(self.reps[g]) if self.reps[g] else set()
            for h in range(g + 1, len(self.groups)):
                if any(p in near for p in self.groups[h]):
                    out.add((g, h))
        return out


__all__ = ["LocalPricer", "RADIUS"]

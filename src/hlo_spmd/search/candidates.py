"""The search's decision space: per entry parameter, its candidate shardings, and groups of
parameters that share one decision (repeated structure solved once).

A candidate assigns every mesh axis to at most one dim of the parameter (or to none:
that axis replicates it); several axes on one dim go major first in mesh order, as
``PartitionSpec(("data", "model"))``. Only assignments whose dims divide evenly are
candidates (uneven ones are valid programs, but pad every tile and never beat the even
choice on the same dim). The all-``None`` candidate (replicated) is always first.

Groups: parameters with the same shape, element type and the same structural signature
-- a Weisfeiler-Lehman hash of their neighbourhood in the entry computation (opcode and
shape of each instruction, combined over a few rounds with its operands, in order, and
its users with the operand position they read) -- share one decision variable. The 28
identical layers of an unrolled stack give one group per weight role (the first and last
layer, whose neighbourhood differs, may form their own), so the solver sees one layer's
problem. The grouping only shapes the search space: every price is the whole module's.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Union

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.module import Module

DimSpec = Union[str, tuple[str, ...], None]
Spec = tuple[DimSpec, ...]
Mesh = list[tuple[str, int]]

#: Rounds of neighbourhood hashing: a dot, its operands' producers and their producers.
WL_ROUNDS = 3


def replicated(rank: int) -> Spec:
    return (None,) * rank


def spec_text(spec: Spec) -> str:
    """``("data", None)`` -> ``"data,_"`` (the ``--shard`` form); a scalar -> ``""``."""
    return ",".join("_" if d is None else d if isinstance(d, str) else "+".join(d)
                    for d in spec)


def partition_spec_text(spec: Spec) -> str:
    """``("data", ("x", "y"), None)`` -> ``PartitionSpec('data', ('x', 'y'), None)``."""
    def one(d: DimSpec) -> str:
        if d is None:
            return "None"
        if isinstance(d, str):
            return repr(d)
        return "(" + ", ".join(repr(a) for a in d) + ")"
    return "PartitionSpec(" + ", ".join(one(d) for d in spec) + ")"


def parameter_candidates(dims: Sequence[int], mesh: Mesh) -> list[Spec]:
    """Every even assignment of the mesh axes to ``dims`` (replicated first)."""
    rank = len(dims)
    out: list[Spec] = [replicated(rank)]
    seen = {out[0]}
    for choice in itertools.product(range(-1, rank), repeat=len(mesh)):
        per_dim: list[list[str]] = [[] for _ in range(rank)]
        for (name, _), d in zip(mesh, choice):
            if d >= 0:
                per_dim[d].append(name)
        sizes = dict(mesh)
        if any(dims[d] % math.prod(sizes[a] for a in axes) for d, axes in enumerate(per_dim)):
            continue
        spec: Spec = tuple(None if not axes else axes[0] if len(axes) == 1 else tuple(axes)
                           for axes in per_dim)
        if spec not in seen:
            seen.add(spec)
            out.append(spec)
    return out


def structural_groups(module: Module, params: Sequence[Instruction],
                      rounds: int = WL_ROUNDS) -> list[list[Instruction]]:
    """``params`` (entry parameters) grouped by structural signature; groups ordered by
    their first parameter number, members by parameter number."""
    comp = module.entry
    shape_key: dict[int, str] = {}
    label: dict[Instruction, int] = {}
    for inst in comp.instructions:
        k = shape_key.get(id(inst.shape))
        if k is None:
            k = shape_key[id(inst.shape)] = inst.shape.to_text(print_layout=False)
        # (no parameter number, no name: two layers' weights must hash alike)
        label[inst] = hash((inst.opcode, k))
    users = comp.users()
    for _ in range(rounds):
        new: dict[Instruction, int] = {}
        for inst in comp.instructions:
            ins = tuple(label[o] for o in inst.operands)
            # A tuple's operand position is where the value sits among the outputs
            # (the root tuple lists every layer's updated weights in order): not a
            # structural difference, so tuple users count without it.
            outs = tuple(sorted((label[u], -1 if u.opcode == "tuple" else
                                 u.operands.index(inst))
                                for u in users.get(id(inst), ())))
            new[inst] = hash((label[inst], ins, outs))
        label = new
    groups: dict[int, list[Instruction]] = {}
    position = {id(i): k for k, i in enumerate(comp.instructions)}
    for p in sorted(params, key=lambda p: (p.parameter_number if p.opcode == "parameter"
                                           else -1, position[id(p)])):
        groups.setdefault(label[p], []).append(p)
    return list(groups.values())


def constraint_sites(module: Module, limit: int) -> list[list[Instruction]]:
    """Candidate sites of intermediate sharding constraints: the unannotated array
    results of dots and convolutions in the entry computation (not its root: that is an
    output decision), grouped by structural signature like the parameters (the same
    activation of every repeated layer is one decision). The ``limit`` groups of the
    largest values (per-member bytes x members) come first; the rest are not tried."""
    from hlo_spmd.ir.opcodes import CONTRACTIONS
    from hlo_spmd.ir.primitive_types import element_bytes

    comp = module.entry
    root = comp.root
    # (the contractions' results: activations and gradients, where completion picks a
    # layout from whichever operand it reaches first and a constraint can pick another)
    sites = [i for i in comp.instructions
             if i.opcode in CONTRACTIONS and i is not root and i.sharding is None
             and i.shape.is_array and i.shape.rank > 0]
    if not sites or limit <= 0:
        return []
    groups = structural_groups(module, sites)

    def size(g: Sequence[Instruction]) -> float:
        s = g[0].shape
        return math.prod(s.dims) * element_bytes(s.element_type) * len(g)

    return sorted(groups, key=size, reverse=True)[:limit]


def site_candidates(site: Instruction, mesh: Mesh, current: object = None) -> list[Spec]:
    """A constraint site's candidate specs (as a parameter's), without the one equal to
    ``current``, the sharding completion already gives it: that constraint changes
    nothing (no constraint, the free default, is the incumbent)."""
    from hlo_spmd.annotations.cli_spec import spec_sharding

    out = parameter_candidates(site.shape.dims, mesh)
    if current is None:
        return out
    rank = site.shape.rank
    return [s for s in out if spec_sharding(mesh, s, rank, site.name) != current]


def elementwise_bundles(module: Module, groups: Sequence[Sequence[Instruction]]
                        ) -> list[list[Instruction]]:
    """Groups merged when their parameters are combined elementwise, at their own shape,
    with another group's (a weight and its optimizer states: ``w - lr * m / sqrt(v)``):
    such values want one sharding, and one decision for them all cuts the search space
    of a training step by the number of states per weight. Reach is followed forward
    through same-shape elementwise ops only."""
    from hlo_spmd.ir.opcodes import is_elementwise

    users = module.entry.users()
    parent = list(range(len(groups)))

    def find(g: int) -> int:
        while parent[g] != g:
            parent[g] = parent[parent[g]]
            g = parent[g]
        return g

    owner: dict[Instruction, int] = {}  # elementwise value -> first group reaching it
    for g, members in enumerate(groups):
        for p in members:
            stack, seen = [p], {p}
            while stack:
                inst = stack.pop()
                for u in users.get(id(inst), ()):
                    if u in seen or not is_elementwise(u.opcode) or u.shape != p.shape:
                        continue
                    seen.add(u)
                    stack.append(u)
                    if u in owner:
                        a, b = find(owner[u]), find(g)
                        if a != b and groups[a][0].shape == groups[b][0].shape:
                            parent[max(a, b)] = min(a, b)
                    else:
                        owner[u] = g
    merged: dict[int, list[Instruction]] = {}
    for g, members in enumerate(groups):
        merged.setdefault(find(g), []).extend(members)
    return [sorted(m, key=lambda p: p.parameter_number) for m in merged.values()]


__all__ = ["constraint_sites", "site_candidates", "elementwise_bundles", "Spec", "DimSpec", "replicated", "spec_text", "partition_spec_text",
           "parameter_candidates", "structural_groups"]


class OutputSlot:
    """An entry output as a decision: element ``index`` of the root tuple (None: the
    root itself), written ``out#K`` / ``out`` as a ``--shard`` target."""
    __slots__ = ("index", "shape")

    def __init__(self, index: int | None, shape) -> None:
        self.index = index
        self.shape = shape

    @property
    def target(self) -> str:
        return "out" if self.index is None else f"out#{self.index}"

    def value(self, comp) -> Instruction | None:
        """The instruction that produces this output in ``comp`` (None: not visible)."""
        root = comp.root
        if self.index is None:
            return root
        if root.opcode == "tuple":
            return root.operands[self.index]
        return None


def output_slots(module: Module) -> list[OutputSlot]:
    """The array outputs of the entry computation."""
    root = module.entry.root
    if root.shape.is_tuple:
        return [OutputSlot(k, s) for k, s in enumerate(root.shape.tuple_shapes) if s.is_array]
    return [OutputSlot(None, root.shape)] if root.shape.is_array else []


def attach_outputs(module: Module, groups: Sequence[Sequence[Instruction]],
                   slots: Sequence[OutputSlot]) -> list[list]:
    """``groups`` with each output joined to the group of the parameter it is computed
    from elementwise at its own shape (an updated weight or optimizer state takes its
    parameter's sharding: the next step reads it back); other outputs form groups of
    their own."""
    from hlo_spmd.ir.opcodes import is_elementwise

    comp = module.entry
    group_of = {p: g for g, members in enumerate(groups) for p in members}
    out = [list(members) for members in groups]
    for slot in slots:
        start = slot.value(comp)
        found = None
        stack, seen = ([start] if start is not None else []), set()
        while stack and found is None:
            inst = stack.pop()
            if inst in seen or inst.shape != slot.shape:
                continue
            seen.add(inst)
            if inst in group_of:
                found = group_of[inst]
            elif is_elementwise(inst.opcode):
                stack.extend(inst.operands)
        if found is None:
            out.append([slot])
        else:
            out[found].append(slot)
    return out


def member_key(member) -> int | str:
    """A group member's key in an assignment: a parameter number, or ``out``/``out#K``."""
    return member.target if isinstance(member, OutputSlot) else member.parameter_number

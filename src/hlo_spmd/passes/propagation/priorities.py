"""Shardy user priorities (``{"x"}p1`` in ``xla.sdy.sharding``): completion in rounds.

Mirrors Shardy's ``UserPriorityPropagationPass`` (user_priority_propagation.cc) on top of
this project's GSPMD-style propagation, as an outer layer around the fix point:

* Round 0: every annotated dim whose priority is above 0 is held back: it is closed
  and unsharded (its axes count as replicated), so only the p0 dims (a dim without a
  priority is p0, Shardy's default) seed propagation, which runs to its fix point.
* Round p (the annotations' distinct priorities, ascending): the dims of priority p get
  their annotated axes back (open dims become open again) and propagation runs to its
  fix point once more, starting from everything the earlier rounds decided.

Propagation only refines, never replaces, a sharding it set itself, so what a higher
priority decided stands; an annotated instruction always ends with its full annotation
(its open dims as refined). Priorities are honoured on values annotated with a Shardy
sharding (the classic ``sharding=`` field has no priorities).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from hlo_spmd.annotations import sdy
from hlo_spmd.records import Record
from hlo_spmd.sharding import HloSharding
from hlo_spmd.sharding.algebra import merge_if_compatible

if TYPE_CHECKING:  # pragma: no cover
    from hlo_spmd.annotations.normalize import AnnotationRecord, AnnotationReport
    from hlo_spmd.ir.instruction import Instruction
    from hlo_spmd.ir.module import Module
    from hlo_spmd.passes.propagation.engine import Propagator

__all__ = ["PrioritizedAnnotation", "prioritized_annotations", "run_with_priorities"]


class PrioritizedAnnotation(Record):
    """One instruction whose Shardy sharding has dims of priority above 0."""
    # A records.Record: equality and repr as the dataclass it was, ~1 ms less start-up.
    __match_args__ = ("inst", "values", "record")
    __slots__ = __match_args__

    def __init__(self, inst: "Instruction", values: tuple[sdy.TensorSharding, ...],
                 record: "AnnotationRecord") -> None:
        self.inst = inst
        self.values = values     # one per result leaf
        self.record = record

    @property
    def priorities(self) -> set[int]:
        return {d.priority or 0 for v in self.values for d in v.dims}


def _at_priority(value: sdy.TensorSharding, p: int) -> sdy.TensorSharding:
    """``value`` as round ``p`` sees it: dims of priority above ``p`` closed and empty
    (their axes replicated, as Shardy's initialisation writes them), the rest without
    their priority."""
    dims: list[sdy.DimSharding] = []
    held: list[sdy.AxisRef] = []
    for d in value.dims:
        if (d.priority or 0) <= p:
            dims.append(sdy.DimSharding(d.axes, d.is_closed, None))
        else:
            dims.append(sdy.DimSharding((), True, None))
            held.extend(d.axes)
    return sdy.TensorSharding(value.mesh, tuple(dims), tuple(value.replicated) + tuple(held),
                              value.unreduced)


def prioritized_annotations(module: "Module", report: "AnnotationReport"
                            ) -> list[PrioritizedAnnotation]:
    """The annotations with a dim of priority above 0, in module order."""
    by_key = {(r.computation, r.name): r for r in report.records if r.sdy_text}
    out: list[PrioritizedAnnotation] = []
    if not by_key:
        return out
    for comp in module.computations:
        for inst in comp.instructions:
            r = by_key.get((comp.name, inst.name))
            if r is None or "}p" not in r.sdy_text:
                continue
            values, _ = sdy.parse_shardings(r.sdy_text, f"instruction {inst.name}")
            a = PrioritizedAnnotation(inst, tuple(values), r)
            if a.priorities - {0}:
                out.append(a)
    return out


def _sharding_at(a: PrioritizedAnnotation, p: int, meshes) -> HloSharding:
    inst = a.inst
    leaves = [s for _, s in inst.shape.leaves()] if inst.shape.is_tuple else [inst.shape]
    where = f"instruction {inst.name}"
    conv = [sdy.to_hlo_sharding(_at_priority(v, p), meshes, a.record.manual_axes, where,
                                None if leaf.is_token else leaf.rank)
            for v, leaf in zip(a.values, leaves)]
    return HloSharding.tuple(conv) if inst.shape.is_tuple else conv[0]


def _open_at(a: PrioritizedAnnotation, full_open: Sequence[int], p: int) -> tuple[int, ...]:
    """Open dims in round ``p``: held-back dims are closed."""
    if a.inst.shape.is_tuple:
        return tuple(full_open)
    dims = a.values[0].dims
    return tuple(i for i in full_open if i < len(dims) and (dims[i].priority or 0) <= p)


def _restore(prop: "Propagator", a: PrioritizedAnnotation, p: int, meshes) -> None:
    new = _sharding_at(a, p, meshes)
    cur = a.inst.sharding
    merged = None
    if cur is not None and not new.is_tuple:
        # Keep what propagation refined on the open dims of the earlier rounds.
        merged = merge_if_compatible(cur, new, 1)
    prop.set(a.inst, merged if merged is not None else new, f"annotation.priority(p{p})",
             (), direction="user")


def run_with_priorities(prop: "Propagator", annotations: Sequence[PrioritizedAnnotation],
                        meshes) -> None:
    """Propagator.run, one round per priority (see the module docstring)."""
    rounds = sorted(set().union(*(a.priorities for a in annotations)) | {0})
    for a in annotations:
        a.inst.sharding = _sharding_at(a, 0, meshes)
    prop.setup()
    full_open = {id(a.inst): prop.unspecified.get(id(a.inst), ()) for a in annotations}

    def set_open(p: int) -> None:
        for a in annotations:
            dims = _open_at(a, full_open[id(a.inst)], p)
            if dims:
                prop.unspecified[id(a.inst)] = dims
            else:
                prop.unspecified.pop(id(a.inst), None)

    set_open(0)
    prop.run_levels()
    for p in rounds[1:]:
        for a in annotations:
            if p in a.priorities:
                _restore(prop, a, p, meshes)
        set_open(p)
        prop.run_levels()
    prop.finish()

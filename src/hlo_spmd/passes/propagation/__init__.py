"""Sharding completion: infer a sharding for every instruction from a few annotations.

This is XLA's sharding propagation (``xla/service/sharding_propagation.cc``), the
priority-based completion of the GSPMD paper, re-implemented on this project's IR:

* per-opcode rules in tables: forward (operands -> result, ``forward.FORWARD_RULES``)
  and backward (user -> operand, ``backward.BACKWARD_RULES``), elementwise ops sharing
  one rule each way;
* XLA's driver: aggressiveness levels 0..3 gate the risky rules (broadcast backward
  from 2, forward from 3; most shape-changing ops from 1), each level iterated to a
  fixpoint with a forward pass in post order and a backward pass in reverse;
* a sharding is only ever replaced by a strictly finer, compatible one (partially
  replicated shardings combine); user annotations stay fixed except for their open
  (``unspecified_dims``) dims; while / conditional / call bodies stay in sync with
  their callers; manual regions keep their manual shardings;
* ``shard_as`` / ``shard_like`` groups (JAX ``shard_alike``) as XLA handles them;
* a ``Decision`` per instruction says which rule and neighbour produced its sharding
  and which candidates lost; ``explain_chain`` follows them back to an annotation.

Module map: ``engine`` (driver), ``forward`` / ``backward`` (rule tables), ``improve``
(when a candidate replaces a sharding), ``sharding_ops`` (the few sharding maps only
propagation needs; the algebra itself is ``hlo_spmd.sharding.algebra``), ``dims`` and
``gather_scatter`` (dimension bookkeeping), ``unspecified`` (open dims, manual
boundaries), ``shard_groups``, ``graph`` (post order, users, opcode classes),
``provenance``, ``coverage``.

Usage::

    result = propagate(module)            # sets inst.sharding everywhere
    result.decisions["dot.3"].rule        # 'dot.from_lhs'
    explain_chain(result, "dot.3")        # [dot.3 <- x.1 (user)]
"""
from __future__ import annotations

import time
from typing import Sequence

from hlo_spmd.ir.module import Module
from hlo_spmd.passes.propagation.engine import Propagator
from hlo_spmd.passes.propagation.graph import Graph
from hlo_spmd.passes.propagation.provenance import Alternative, Decision, Recorder, explain_chain
from hlo_spmd.records import Record

__all__ = ["propagate", "PropagationResult", "Decision", "Alternative", "explain_chain"]


class PropagationResult(Record):
    """What ``propagate`` did: the completed module plus per-instruction provenance."""
    # A records.Record: equality and repr as the dataclass it was, ~1 ms less start-up.
    __match_args__ = ("module", "decisions", "fixed", "iterations", "level_iterations",
                      "seconds", "annotations", "unsharded", "shard_groups")
    __slots__ = __match_args__

    def __init__(self, module: Module, decisions: dict[str, Decision],
                 fixed: tuple[str, ...] = (), iterations: int = 0,
                 level_iterations: tuple[int, ...] = (), seconds: float = 0.0,
                 annotations: object = None, unsharded: tuple[str, ...] = (),
                 shard_groups: dict[int, tuple[str, ...]] | None = None) -> None:
        self.module = module
        self.decisions = decisions
        self.fixed = fixed                        # instructions whose annotation was kept
        self.iterations = iterations              # fixpoint iterations over all levels
        self.level_iterations = level_iterations
        self.seconds = seconds
        self.annotations = annotations            # the AnnotationReport used
        self.unsharded = unsharded                # token-shaped values
        self.shard_groups = {} if shard_groups is None else shard_groups  # id -> members

    def sharding_of(self, name: str):
        d = self.decisions.get(name)
        return None if d is None else d.sharding

    def explain(self, name: str) -> list[Decision]:
        return explain_chain(self, name)


def propagate(module: Module, *,
              propagate_to_parameters: bool | Sequence[bool] = False,
              propagate_to_output: bool | Sequence[bool] = False,
              annotations=None) -> PropagationResult:
    """Complete the sharding of every instruction of ``module`` in place.

    ``annotations``: the ``AnnotationReport`` of ``normalize_annotations`` if the caller
    already ran it; otherwise it is run here (it reads Shardy attributes into
    ``inst.sharding``).  ``propagate_to_parameters`` / ``propagate_to_output`` let
    propagation change (only refine) entry parameter / root shardings, as XLA's
    ``allow_spmd_sharding_propagation_to_{parameters,output}``; uneven results are
    then replicated. Each is one bool, or XLA's list: one bool per entry parameter /
    per output (root tuple element), or a single one for all; an output not allowed
    keeps the sharding it was given (replicated when none).  Deterministic: the same module always gets the same shardings.
    """
    start = time.perf_counter()
    if annotations is None:
        from hlo_spmd.annotations import normalize_annotations
        annotations = normalize_annotations(module)
    graph = Graph(module)
    rec = Recorder()
    prop = Propagator(module, graph, rec, to_output=propagate_to_output,
                      to_params=propagate_to_parameters, annotations=annotations)
    from hlo_spmd.passes.propagation.priorities import (prioritized_annotations,
                                                        run_with_priorities)
    prioritized = prioritized_annotations(module, annotations)
    if prioritized:  # Shardy user priorities: one propagation round per priority
        run_with_priorities(prop, prioritized, getattr(annotations, "meshes", {}))
    else:
        prop.run()
    prop.close()
    fixed = tuple(i.name for i in graph.instructions() if id(i) in prop.provided)
    unsharded = tuple(i.name for i in graph.instructions() if i.sharding is None)
    return PropagationResult(module, rec.decisions, fixed, prop.iterations,
                             tuple(prop.level_iterations), time.perf_counter() - start,
                             annotations, unsharded,
                             {gid: tuple(m.name for m in ms)
                              for gid, ms in sorted(prop.groups.members.items())})

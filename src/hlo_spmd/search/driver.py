"""The sharding search: entry-parameter and output shardings chosen by rounds of an
integer program (:mod:`~hlo_spmd.search.solver`, HiGHS) over measured prices.

1. Decision space (:mod:`~hlo_spmd.search.candidates`): each free entry parameter
   (not annotated in the module nor by ``shard``: those are constraints kept) picks a
   mesh-axis assignment; parameters of one structural group share the pick, and so do
   groups whose parameters are combined elementwise (a weight and its optimizer states).
   Unless the module fixes its result's sharding, each output is a decision too: with
   the group of the parameter it is computed from elementwise (an updated weight), or
   in a group of its own.
2. Starting points: all replicated and the named baselines
   (:mod:`~hlo_spmd.search.baselines`), each projected onto the groups; rounds run
   from each of the ``restarts`` best (from the best only on slices), and the best
   end point wins.
3. A round, around the incumbent: price every single-group move (unary deltas) and, for
   groups that meet in one op within a few instructions, the pairs of each one's best
   moves (interaction deltas); solve the integer program for its ``top_k`` best
   assignments; price each exactly; the best becomes the incumbent if it beats it (by
   :func:`~hlo_spmd.search.pricing.price_key`). Rounds stop when nothing improves.
   Prices are whole-module partitions (:mod:`~hlo_spmd.search.pricing`) while
   ``instructions x moves`` stays under ``EXACT_WORK``; above it (a 28-layer step), one
   round prices the moves on slices of one representative layer
   (:mod:`~hlo_spmd.search.local`), the baselines are priced whole as the seeds they
   are, and the solver's assignment is partitioned whole once and kept only if it
   beats the incumbent.
4. Intermediate sharding constraints (:func:`_constraint_round`): once the parameter
   and output search has converged, the results of the largest contractions (dots,
   convolutions: activations and gradients; ``constraint_sites`` groups of them, each
   group one repeated layer's value, :func:`~hlo_spmd.search.candidates.constraint_sites`)
   try each candidate spec, "no constraint" being the incumbent; a constraint is kept
   only when it lowers the price (within the limit: bytes, collectives, peak). Priced
   whole, or on slices for large modules (then the choice with them is partitioned
   whole first and kept only if it beats the one without). A kept constraint is the
   instruction's own sharding in the annotated module (how XLA reads one).
5. The annotated module is partitioned once more: that program's figures are the
   ones reported and checked against the memory limit.

Completion fills in every other instruction. (The expert annotation of the generated
L-layer training step constrains activations, gathered weights and gradients, but its
parameter and output shardings alone give the same program figures: 83,918,852 B moved
/ 208,412,676 B peak at L=2, both ways; the search reaches them from the
``megatron_fsdp`` baseline.)
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hlo_spmd.errors import HloSpmdError
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.module import Module
from hlo_spmd.records import Record
from hlo_spmd.search.candidates import (Spec, attach_outputs, elementwise_bundles, member_key,
                                        output_slots, parameter_candidates, structural_groups)
from hlo_spmd.search.report import figures
from hlo_spmd.search.pricing import (Price, Pricer, assignment_key, price_key, price_of,
                                     target)

#: Forward distance (instructions) within which two parameters count as interacting.
MEET_RADIUS = 2
#: Groups of intermediate values (the largest activations first) the constraint round
#: tries: each costs a partition per candidate spec.
MAX_SITES = 4
#: Above this (entry instructions x single moves), moves are priced on slices
#: (:mod:`~hlo_spmd.search.local`) instead of whole-module partitions.
EXACT_WORK = 20_000


class SearchError(HloSpmdError):
    """No assignment found fits the memory limit."""


class SearchResult(Record):
    """The annotated module, its partitioned program (``api.PartitionResult``, exactly
    what partitioning ``annotated`` gives) and the report dict."""
    __match_args__ = ("annotated", "partition", "report")
    __slots__ = __match_args__

    def __init__(self, annotated: Module, partition: Any, report: dict) -> None:
        self.annotated = annotated
        self.partition = partition
        self.report = report


def _delta(p: Price, base: Price) -> tuple[float, float, float]:
    return (p.bytes - base.bytes, float(p.collectives - base.collectives),
            float(p.peak - base.peak))


def _meeting_pairs(module: Module, groups: Sequence[Sequence[Instruction]]) -> set[tuple[int, int]]:
    """Pairs of groups with members that reach one instruction within MEET_RADIUS."""
    users = module.entry.users()
    reach: dict[Instruction, set[int]] = {}
    for g, members in enumerate(groups):
        for p in members:
            frontier = [p]
            for _ in range(MEET_RADIUS):
                nxt = []
                for inst in frontier:
                    for u in users.get(id(inst), ()):
                        reach.setdefault(u, set()).add(g)
                        nxt.append(u)
                frontier = nxt
    out = set()
    for gs in reach.values():
        if len(gs) > 1:
            ordered = sorted(gs)
            for i, a in enumerate(ordered):
                for b in ordered[i + 1:]:
                    out.add((a, b))
    return out


def _exact_deltas(pricer: Pricer, expand, incumbent: Sequence[int], base: Price):
    """(unary, interaction) delta functions that price whole-module partitions."""
    def unary(g: int, c: int):
        choice = list(incumbent)
        choice[g] = c
        p = pricer.price(expand(choice))
        return None if p is None else _delta(p, base)

    def interaction(g: int, c: int, h: int, d: int):
        choice = list(incumbent)
        choice[g], choice[h] = c, d
        p = pricer.price(expand(choice))
        ug, uh = unary(g, c), unary(h, d)  # (cached prices)
        if p is None or ug is None or uh is None:
            return None
        full = _delta(p, base)
        return (full[0] - ug[0] - uh[0], full[1] - ug[1] - uh[1], full[2] - ug[2] - uh[2])

    return unary, interaction


def _local_pricer(pricer: Pricer, groups, cands, incumbent, completed, mesh, n_dev):
    """A LocalPricer around ``incumbent``, whose completed shardings ``pricer`` kept."""
    from hlo_spmd.passes.inline_calls import inline_calls
    from hlo_spmd.search.local import LocalPricer

    probe = pricer.module()
    inline_calls(probe)  # as partitioning does: names match the completed program's
    by_number = {p.parameter_number: p for p in probe.entry.parameters}
    local_groups = [[by_number[p.parameter_number] if isinstance(p, Instruction) else p
                     for p in members] for members in groups]
    return LocalPricer(probe, local_groups, cands, incumbent, completed, mesh, n_dev)


def _parameter_bytes(module: Module, assignment: Mapping, mesh) -> float:
    """Per-device bytes of the entry parameters under ``assignment`` (unassigned ones
    whole): a lower bound of the peak, all of them being live when the program starts."""
    from hlo_spmd.ir.primitive_types import element_bytes
    from hlo_spmd.search.local import local_bytes

    total = 0.0
    for p in module.entry.parameters:
        if p.shape.is_array:
            spec = assignment.get(p.parameter_number, (None,) * p.shape.rank)
            total += local_bytes(p.shape.dims, element_bytes(p.shape.element_type), spec, mesh)
    return total


def _constraint_rows(annotated: Module, extra: Mapping[str, Spec], axes) -> list[dict]:
    """The report's rows of the chosen intermediate constraints, as written into the
    annotated module (each one the instruction's own sharding attribute)."""
    from hlo_spmd.search.candidates import partition_spec_text, spec_text

    by_name = {i.name: i for i in annotated.entry.instructions}
    return [{"name": name, "shape": by_name[name].shape.to_text(print_layout=False),
             "spec": spec_text(spec), "partition_spec": partition_spec_text(spec),
             "hlo": str(by_name[name].sharding)} for name, spec in sorted(extra.items())]


def _local_constraints(local_pricer, probe: Module, axes, max_sites: int,
                       base: Price | None, limit: int | None,
                       say: Callable[[str], None]) -> tuple[dict[str, Spec], int]:
    """Large modules: each site group's best candidate spec by its slice delta, kept
    when it lowers it: (bytes, collectives, peak) while the incumbent ``base`` fits
    ``limit`` (and the estimated peak stays within it), the peak first while it does
    not. The driver partitions the result whole and keeps it only if it wins."""
    over = base is not None and limit is not None and base.peak > limit

    def rank(d: tuple[float, float, float]) -> tuple | None:
        if over:
            return (d[2], d[0], d[1])
        if base is not None and limit is not None and base.peak + d[2] > limit:
            return None
        return d
    from hlo_spmd.search.candidates import constraint_sites, site_candidates

    sites = constraint_sites(probe, max_sites)
    if sites:
        say(f"constraint round: pricing {len(sites)} intermediate site groups on slices")
    extra: dict[str, Spec] = {}
    for members in sites:
        best = None
        rep = members[len(members) // 2]
        for spec in site_candidates(rep, axes, local_pricer.completed.get(rep.name)):
            d = local_pricer.site(members, spec)
            r = None if d is None else rank(d)
            if r is not None and r < (0.0, 0.0, 0.0) and (best is None or r < best[0]):
                best = (r, spec)
        if best is not None:
            extra.update({m.name: best[1] for m in members})
    return extra, len(sites)


def _no_fit(pricer: Pricer, limit: int | None):
    peaks = [p.peak for p in pricer.cache.values() if p is not None]
    smallest = min(peaks) if peaks else None
    raise SearchError(
        f"no sharding found fits the memory limit of {limit} bytes per device; the "
        f"smallest peak found is {smallest} bytes" if smallest is not None else
        "no candidate sharding could be partitioned")


def _finish(pricer: Pricer, axes, n_dev: int, winner: Mapping[int, Spec], root_fixed: bool,
            limit: int | None, complete_only: bool = False):
    """(annotated, completed source, price, result): ``winner`` written into the module,
    with the output sharding completion gives it when that does not cost more.
    ``complete_only``: the output sharding is read from completion alone (no partition
    of the module without it, so no comparison: half a partition for large modules)."""
    from hlo_spmd.annotations.cli_spec import ShardSpec, apply_shards
    from hlo_spmd.api import copy_module, partition_owned
    from hlo_spmd.passes.partition import prepare

    def build(root):
        annotated = pricer.module()
        apply_shards(annotated, axes, [ShardSpec(target(k), s, target(k))
                                       for k, s in winner.items()])
        kept = pricer.last_kept
        if root is None and kept is not None and kept[0] == assignment_key(winner):
            # already partitioned while pricing (the same shards on the same module)
            return annotated, kept[1], price_of(kept[2]), kept[2]
        if root is not None:
            annotated.entry.root.sharding = root
        source = copy_module(annotated)
        try:
            result = partition_owned(source, n_dev)
        except HloSpmdError:
            return None
        pricer.partitions += 1
        return annotated, source, price_of(result), result

    if complete_only and not root_fixed:
        probe = pricer.module()
        apply_shards(probe, axes, [ShardSpec(target(k), s, target(k))
                                   for k, s in winner.items()])
        try:
            prepare(probe, n_dev)
        except HloSpmdError:
            return None
        if probe.entry.root.sharding is not None:
            return build(probe.entry.root.sharding)
    free = build(None)
    if free is None or root_fixed or free[1].entry.root.sharding is None:
        return free
    pinned = build(free[1].entry.root.sharding)
    if pinned is None or price_key(pinned[2], limit) > price_key(free[2], limit):
        return free  # the output annotation changed completion for the worse
    return pinned


def _constraint_round(pricer: Pricer, probe: Module, axes,
                      start: Mapping, limit: int | None, max_sites: int,
                      say: Callable[[str], None]) -> tuple[dict, int]:
    """``start`` (the converged parameter/output assignment) with intermediate sharding
    constraints added where they pay, and how many sites were tried. Each site group
    (:func:`~hlo_spmd.search.candidates.constraint_sites`) tries its candidate specs on
    all its members at once; "no constraint" is the incumbent. The groups whose best
    candidate beats the incumbent (by :func:`~hlo_spmd.search.pricing.price_key`) are
    then added one by one, best first, each kept only if it still improves the
    assignment with the ones kept before it (constraints interact: two activations of
    one chain)."""
    from hlo_spmd.search.candidates import constraint_sites, site_candidates

    sites = constraint_sites(probe, max_sites)
    if not sites:
        return dict(start), 0
    say(f"constraint round: pricing {len(sites)} intermediate site groups")
    price = pricer.price
    base_key = price_key(pricer.price(start, keep=True), limit)
    now = pricer.completed(start) if assignment_key(start) in pricer.kept else {}
    paying: list[tuple[tuple, list[Instruction], Spec]] = []
    for members in sites:
        best: tuple[tuple, Spec] | None = None
        for spec in site_candidates(members[0], axes, now.get(members[0].name)):
            trial = dict(start)
            trial.update({m.name: spec for m in members})
            k = price_key(price(trial), limit)
            if k < base_key and (best is None or k < best[0]):
                best = (k, spec)
        if best is not None:
            paying.append((best[0], members, best[1]))
    current, current_key = dict(start), base_key
    for _, members, spec in sorted(paying, key=lambda t: t[0]):
        trial = dict(current)
        trial.update({m.name: spec for m in members})
        k = price_key(price(trial), limit)
        if k < current_key:
            current, current_key = trial, k
    return current, len(sites)


def search(src: Any, mesh: Any, memory_limit: int | str | None, shard: Any = None, *,
           progress: Callable[[str], None] | None = None, rounds: int = 4, top_k: int = 4,
           pair_top: int = 2, restarts: int = 3, constraint_sites: int = MAX_SITES
           ) -> SearchResult:
    """Choose entry-parameter (and output) shardings of ``src`` on ``mesh`` minimising the
    bytes per device the partitioned program moves, with its peak live memory per device
    within ``memory_limit`` (bytes, or a size such as ``"16GiB"``; None: no limit).
    ``shard``: annotations kept as constraints (the ``partition`` API's form).
    ``constraint_sites``: how many groups of intermediate values (activations) may get
    a sharding constraint (0: parameters and outputs only).
    ``progress`` is called with the name of each step (the library never prints)."""
    from hlo_spmd.annotations import normalize_annotations
    from hlo_spmd.annotations.cli_spec import parse_mesh
    from hlo_spmd.api import annotate, copy_module, load
    from hlo_spmd.ir.io import module_bytes
    from hlo_spmd.search.baselines import baselines
    from hlo_spmd.search.report import build_report
    from hlo_spmd.search.solver import solve
    from hlo_spmd.units import parse_size

    try:
        import scipy.optimize  # noqa: F401  (HiGHS: the solver of every round)
    except ImportError:
        raise HloSpmdError("search needs scipy (HiGHS): pip install 'hlo-spmd[search]'") \
            from None
    t0 = time.monotonic()
    say = progress or (lambda _s: None)
    module = copy_module(src) if isinstance(src, Module) else load(src)
    axes = parse_mesh(mesh)
    n_dev = math.prod(s for _, s in axes)
    limit = None if memory_limit is None else (
        parse_size(memory_limit) if isinstance(memory_limit, str) else int(memory_limit))

    probe = copy_module(module)
    normalize_annotations(probe)
    own = any(i.sharding is not None for i in probe.instructions())
    annotate(module, axes, shard)  # the constraints every price keeps
    probe = copy_module(module)
    normalize_annotations(probe)
    params = probe.entry.parameters
    free = [p for p in params if p.sharding is None and p.shape.is_array]
    root_fixed = probe.entry.root.sharding is not None
    pricer = Pricer(module_bytes(module), axes, n_dev)

    groups = elementwise_bundles(probe, structural_groups(probe, free))
    slots = [] if root_fixed else output_slots(probe)
    groups = attach_outputs(probe, groups, slots)
    outputs_decided = bool(slots) and len(slots) == len(
        probe.entry.root.shape.tuple_shapes if probe.entry.root.shape.is_tuple else [0])
    cands = [parameter_candidates(g[0].shape.dims, axes) for g in groups]

    def expand(choice: Sequence[int]) -> dict[int, Spec]:
        return {member_key(p): cands[g][choice[g]] for g, members in enumerate(groups)
                for p in members}

    def key_of(choice: Sequence[int]) -> tuple:
        return price_key(pricer.price(expand(choice)), limit)

    say(f"pricing baselines ({len(free)} free parameters in {len(groups)} groups)")
    named = baselines(probe, free, axes)
    priced_baselines: dict[str, tuple[dict[int, Spec], Price | None]] = {}
    moves = sum(len(c) - 1 for c in cands)
    local = len(probe.entry.instructions) * moves > EXACT_WORK
    def project(assignment: Mapping) -> list[int]:
        """A baseline as a choice per group (its first member's spec)."""
        seed = []
        for g, members in enumerate(groups):
            spec = assignment.get(member_key(members[0]))
            seed.append(cands[g].index(spec) if spec in cands[g] else 0)
        return seed

    for name, assignment in named.items():
        if not local:
            priced_baselines[name] = (assignment, pricer.price(assignment))
            continue
        # Large modules: a baseline is priced as its projection on the groups (outputs
        # follow their parameters), which is the seed the search starts from, and its
        # completed shardings are kept (slice borders are pinned to the incumbent's); one
        # whose parameters alone exceed the limit cannot fit and is not partitioned.
        full = expand(project(assignment))
        if limit is not None and _parameter_bytes(probe, full, axes) > limit:
            priced_baselines[name] = (full, None)
        else:
            priced_baselines[name] = (full, pricer.price(full, keep=True))
    if own:
        priced_baselines["annotations"] = ({}, pricer.price({}))

    seeds = [] if local and any(p is not None for _, p in priced_baselines.values()) \
        else [[0] * len(groups)]
    for assignment, p in priced_baselines.values():
        if p is not None or not local:
            seeds.append(project(assignment))
    # Starting points: the best seed; for modules priced whole, the next best seeds too
    # (a descent by single moves and pairs from one start stops at a local optimum: a
    # layout that differs from it in every group is reached from another start).
    starts: list[list[int]] = []
    for s in sorted(seeds, key=key_of):
        if s not in starts:
            starts.append(s)
    starts = starts[:1 if local else max(1, restarts)]
    done_rounds = 0
    local_pricer = None
    best_found: list[int] | None = None
    solutions: list[list[int]] = []
    for start_choice in starts:
        incumbent = list(start_choice)
        for r in range(1 if local else rounds):
            done_rounds += 1
            base = pricer.price(expand(incumbent), keep=local)
            if base is None:
                break
            if local:
                local_pricer = _local_pricer(pricer, groups, cands, incumbent,
                                             pricer.completed(expand(incumbent)), axes, n_dev)
                unary_of, interaction_of = local_pricer.unary, local_pricer.interaction
                meets = local_pricer.meeting_pairs()
            else:
                unary_of, interaction_of = _exact_deltas(pricer, expand, incumbent, base)
                meets = _meeting_pairs(probe, groups)
            say(f"round {r + 1}: pricing {moves} single moves"
                + (" on slices" if local else ""))
            unary: list[list[tuple[float, float, float] | None]] = [
                [(0.0, 0.0, 0.0) if c == incumbent[g] else unary_of(g, c)
                 for c in range(len(cands[g]))] for g in range(len(groups))]
            top: list[list[int]] = []
            for g, row in enumerate(unary):
                ranked = sorted((c for c, d in enumerate(row) if d is not None and c != incumbent[g]),
                                key=lambda c: (row[c][0], row[c][1], row[c][2]))
                top.append(ranked[:pair_top])
            say(f"round {r + 1}: pricing interactions of {len(meets)} group pairs")
            pairs: dict[tuple[int, int, int, int], tuple[float, float, float]] = {}
            for g, h in sorted(meets):
                for c in top[g]:
                    for d in top[h]:
                        got = interaction_of(g, c, h, d)
                        if got is not None:
                            pairs[(g, c, h, d)] = got
            slack = None if limit is None else float(limit - base.peak)
            if local:
                say(f"round {r + 1}: solving")
                solutions = solve(unary, pairs, slack, k=1)
                if solutions and solutions[0] != incumbent:
                    solutions = [solutions[0]]
                break
            say(f"round {r + 1}: solving and pricing the solver's best {top_k}")
            solutions = solve(unary, pairs, slack, k=top_k)
            # (the single moves were priced whole: the best of them is a candidate too, for
            # when the model's sum of deltas misjudges the memory limit)
            singles = [incumbent[:g] + [c] + incumbent[g + 1:] for g, row in enumerate(unary)
                       for c, d in enumerate(row) if d is not None and c != incumbent[g]]
            best = min(solutions + [min(singles + [incumbent], key=key_of),
                                                  incumbent], key=key_of)
            if key_of(best) >= key_of(incumbent):
                break
            incumbent = best
        if best_found is None or key_of(incumbent) < key_of(best_found):
            best_found = incumbent
    incumbent = best_found if best_found is not None else starts[0]

    candidates = [incumbent]
    if local and solutions and solutions[0] != incumbent:
        candidates.insert(0, solutions[0])  # priced whole once, below; kept if it wins
    without = pricer.price(expand(incumbent))
    extra: dict[str, Spec] = {}
    sites_tried = 0
    if not local:
        with_sites, sites_tried = _constraint_round(
            pricer, probe, axes, expand(incumbent), limit, constraint_sites, say)
        extra = {k: v for k, v in with_sites.items() if isinstance(k, str)
                 and k not in expand(incumbent)}
    elif local_pricer is not None:
        extra, sites_tried = _local_constraints(local_pricer, probe, axes, constraint_sites,
                                                without, limit, say)
    # (large modules: the constraints were priced on slices; the choices with them are
    # partitioned whole first, those without stay as the fallback)
    tries = [(c, extra) for c in candidates] + ([(c, {}) for c in candidates]
                                               if local and extra else [])
    final = None
    final_extra: dict[str, Spec] = {}
    for choice, with_extra in tries:
        winner = {**expand(choice), **with_extra}
        if not local:
            win_price = pricer.price(winner)
            if win_price is None or (limit is not None and win_price.peak > limit):
                _no_fit(pricer, limit)
        say("partitioning the annotated module")
        got = _finish(pricer, axes, n_dev, winner, root_fixed or outputs_decided, limit,
                      complete_only=local)
        if got is None:
            continue
        got_key = price_key(got[2], limit)
        if not with_extra and local and extra:
            without = got[2] if without is None or got_key < price_key(without, limit) \
                else without
        # (a tie goes to the program without constraints)
        if final is None or got_key < price_key(final[2], limit) or (
                got_key == price_key(final[2], limit) and final_extra and not with_extra):
            final, final_extra = got, with_extra
        inc_key = price_key(pricer.price(expand(incumbent)), limit)
        if not local or (limit is None or got[2].peak <= limit) and (
                got_key < inc_key if with_extra else got_key <= inc_key):
            break
    if final is None or (limit is not None and final[2].peak > limit):
        _no_fit(pricer, limit)
    annotated, final_source, final_price, final = final
    report = build_report(
        final_source, axes, limit, final_price, priced_baselines,
        fixed={p.parameter_number for p in params if p.sharding is not None},
        groups=groups, constraints=_constraint_rows(annotated, final_extra, axes), search={
            "solver": "HiGHS (scipy.optimize.milp)", "groups": len(groups),
            "free_parameters": len(free),
            "candidates": sum(len(c) for c in cands), "rounds": done_rounds,
            "pricing": "slices" if local else "whole module",
            "partitions_priced": pricer.partitions,
            "slice_partitions": local_pricer.partitions if local_pricer else 0,
            "constraint_sites_tried": sites_tried,
            "without_constraints": figures(without, limit),
            "seconds": round(time.monotonic() - t0, 3)})
    return SearchResult(annotated, final, report)


__all__ = ["search", "SearchResult", "SearchError"]

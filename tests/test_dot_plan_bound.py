"""The dot planner's branch and bound chooses exactly the plan of the full comparison.

``Planner.plan`` stops pricing a candidate once its bytes exceed the best plan's so far.
The reference below prices every candidate fully (the search as it was before the
bound) and keeps the first of equal costs; both must choose the same plan, at the same
cost, for every problem, including the inner problems of grouped plans.
"""
from __future__ import annotations

import itertools

import pytest

from hlo_spmd.ir.text_parser import parse_module
from hlo_spmd.passes.partition.support import dot_dims as dd
from hlo_spmd.passes.partition.support.dot_plan import MAX_DEPTH, Planner, Problem
from hlo_spmd.sharding import parse_sharding


class ExhaustivePlanner(Planner):
    """Every candidate fully priced, in the bounded search's order."""

    def plan(self, p: Problem, depth: int = 0):
        key = (p, depth)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        cands = list(self._base_plans(p))
        if depth < MAX_DEPTH:
            cands += self._group_plans(p, depth)
        best = None
        for cand in cands:
            if best is None or cand.cost < best.cost:
                best = cand
        self.memo[key] = best
        return best


def _dims(lhs: str, rhs: str, out: str, dnums: str) -> dd.DotDims:
    module = parse_module(f"""HloModule m
ENTRY e {{
  a = f32[{lhs}] parameter(0)
  b = f32[{rhs}] parameter(1)
  ROOT d = f32[{out}] dot(a, b), {dnums}
}}
""")
    return dd.DotDims.of(module.entry.root)


def _describe(plan) -> tuple:
    """The chosen plan down to its inner plans (what emission reads)."""
    out = [plan.describe(), plan.cost]
    if hasattr(plan, "inner_plan"):
        out.append((plan.lhs_t, plan.rhs_t, plan.result, _describe(plan.inner_plan)))
    else:
        out.append((plan.t, plan.lhs_t, plan.rhs_t, plan.post, plan.scatter_dim,
                    plan.result))
    return tuple(out)


RANK2 = ["{replicated}", "{devices=[8,1]<=[8]}", "{devices=[1,8]<=[8]}",
         "{devices=[2,4]<=[8]}", "{devices=[4,2]<=[8]}", "{devices=[4,2]<=[2,4]T(1,0)}",
         "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
         "{devices=[1,2,4]<=[4,2]T(1,0) last_tile_dim_replicate}"]
RANK3 = ["{replicated}", "{devices=[2,1,4]<=[8]}", "{devices=[2,4,1]<=[8]}",
         "{devices=[8,1,1]<=[8]}", "{devices=[2,2,2]<=[8]}",
         "{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}"]


def _cases():
    mm = _dims("64,48", "48,40", "64,40",
               "lhs_contracting_dims={1}, rhs_contracting_dims={0}")
    for shapes in (((64, 48), (48, 40)), ((6, 48), (48, 4096)), ((4096, 12), (12, 40))):
        for ls, rs, os_ in itertools.product(RANK2[:6], RANK2[:6], RANK2):
            yield mm, shapes, ls, rs, os_
    bmm = _dims("8,16,24", "8,24,12", "8,16,12",
                "lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, "
                "rhs_contracting_dims={1}")
    for ls, rs, os_ in itertools.product(RANK3, RANK3, RANK3[:4]):
        yield bmm, ((8, 16, 24), (8, 24, 12)), ls, rs, os_


def test_bound_chooses_the_exhaustive_plan(monkeypatch):
    from hlo_spmd.passes.partition.support import dot_plan

    # The distinct reshards each search prices (reshard_cost, the one pricing entry).
    priced: dict[str, set] = {"bounded": set(), "full": set()}
    who = ["bounded"]
    real = dot_plan.reshard_cost

    def counting(dims, itemsize, src, dst, n):
        priced[who[0]].add((tuple(dims), itemsize, src, dst, n))
        return real(dims, itemsize, src, dst, n)

    monkeypatch.setattr(dot_plan, "reshard_cost", counting)
    bounded, full = Planner(), ExhaustivePlanner()
    n = 0
    for dims, (ls_shape, rs_shape), ls, rs, os_ in _cases():
        p = Problem(dims, ls_shape, rs_shape, parse_sharding(ls), parse_sharding(rs),
                    parse_sharding(os_), 8, (4, 4, 4))
        who[0] = "bounded"
        got = bounded.plan(p)
        who[0] = "full"
        want = full.plan(p)
        assert _describe(got) == _describe(want), (ls_shape, rs_shape, ls, rs, os_)
        n += 1
    assert n > 600
    # The bound prunes: fewer reshards priced than the full search.
    assert 0 < len(priced["bounded"]) < len(priced["full"])


@pytest.mark.parametrize("bound", [0.0, 1.0])
def test_pruned_candidates_report_none(bound):
    """A candidate whose bytes exceed the bound is dropped, not returned half-priced."""
    dims = _dims("64,48", "48,40", "64,40",
                 "lhs_contracting_dims={1}, rhs_contracting_dims={0}")
    rows = parse_sharding("{devices=[8,1]<=[8]}")
    p = Problem(dims, (64, 48), (48, 40), rows, rows, rows, 8, (4, 4, 4))
    planner = Planner()
    for t in planner._iteration_candidates(p):
        full = planner._base_plan(p, t)
        cut = planner._base_plan(p, t, bound)
        if cut is None:  # dropped only when it loses to a plan of ``bound`` bytes
            assert full.cost.bytes > bound
        else:
            assert cut.cost == full.cost
        if full.cost.bytes <= bound:
            assert cut is not None

"""The fix point's per-run tables and shortcuts give what they stand for.

``Graph`` reads every instruction's opcode and elementwise-ness once (``Graph.op``,
``Graph.elementwise``) and keeps one instruction list; the fix point skips a
computation with no flagged inference in either direction.  Here: the tables equal
``graph.opcode`` / ``graph.is_elementwise`` on every instruction of every fixture, and
a run with the skip gives exactly the decisions of a check-mode run (which walks every
computation and runs every skipped inference).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from hlo_spmd.ir.io import load_module
from hlo_spmd.ir.text_parser import parse_module
from hlo_spmd.passes.inline_calls import inline_calls
from hlo_spmd.passes.propagation import propagate
from hlo_spmd.passes.propagation import graph as g

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hlo"
ALL_FIXTURES = sorted(FIXTURES.glob("*.pb")) + sorted((FIXTURES / "handwritten").glob("*.hlo"))


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: p.stem)
def test_graph_tables_match_the_opcode_classes(path):
    module = load_module(path)
    inline_calls(module)
    graph = g.Graph(module)
    seen = 0
    for inst in graph.instructions():
        assert graph.op[inst] == g.opcode(inst), inst.name
        assert graph.elementwise[inst] == g.is_elementwise(inst), inst.name
        seen += 1
    assert seen == sum(len(graph.post_orders[c.name]) for c in graph.computations)
    assert [i for _k, i in graph.walk[0]] == list(graph.instructions())


def _decisions(module, **kw) -> list:
    r = propagate(module, **kw)
    return [(k, str(d.sharding), d.rule, d.direction, d.sources, d.level, d.iteration,
             [(str(a.sharding), a.rule, a.sources, a.reason) for a in d.alternatives])
            for k, d in r.decisions.items()]


# Reducers (one-add computations) are walked once per sweep but never flagged after the
# first: the skip applies to them; the while body is flagged again when its carry changes.
SKIP_MODULE = """HloModule m

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

body {
  p = (f32[8,16], s32[]) parameter(0)
  x = f32[8,16] get-tuple-element(p), index=0
  i = s32[] get-tuple-element(p), index=1
  y = f32[8,16] multiply(x, x)
  one = s32[] constant(1)
  j = s32[] add(i, one)
  ROOT t = (f32[8,16], s32[]) tuple(y, j)
}

cond {
  p = (f32[8,16], s32[]) parameter(0)
  i = s32[] get-tuple-element(p), index=1
  n = s32[] constant(4)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY e {
  x = f32[8,16] parameter(0), sharding={devices=[4,1]<=[4]}
  zero = s32[] constant(0)
  init = (f32[8,16], s32[]) tuple(x, zero)
  w = (f32[8,16], s32[]) while(init), condition=cond, body=body
  r = f32[8,16] get-tuple-element(w), index=0
  z = f32[] constant(0)
  sum1 = f32[8] reduce(r, z), dimensions={1}, to_apply=add
  e2 = f32[8,16] exponential(r)
  sum2 = f32[16] reduce(e2, z), dimensions={0}, to_apply=add
  ROOT out = (f32[8], f32[16]) tuple(sum1, sum2)
}
"""


def test_skipping_unflagged_computations_changes_no_decision(monkeypatch):
    fast = _decisions(parse_module(SKIP_MODULE))
    monkeypatch.setenv("HLO_SPMD_CHECK_SKIPS", "1")   # (walks every computation)
    checked = _decisions(parse_module(SKIP_MODULE))
    assert fast == checked
    by_name = {k: s for k, s, *_ in fast}
    assert by_name["sum1"] != "None" and by_name["y"] != "None"


@pytest.mark.parametrize("path", [p for p in ALL_FIXTURES
                                  if p.stem in ("while_tuple_carry", "conditional",
                                                "transformer_layer_fwd", "pipeline_shift",
                                                "cnn_train_step", "while_loop",
                                                "shardy_sharding_group")],
                         ids=lambda p: p.stem)
def test_fixture_decisions_with_and_without_the_skip(path, monkeypatch):
    def run():
        m = load_module(path)
        inline_calls(m)
        return _decisions(m)

    fast = run()
    monkeypatch.setenv("HLO_SPMD_CHECK_SKIPS", "1")
    assert run() == fast

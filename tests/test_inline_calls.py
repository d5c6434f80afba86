"""inline_calls (passes/inline_calls.py): every inlineable call replaced by its body in one
pass per computation, uses redirected, same numbers on XLA."""
from __future__ import annotations

import numpy as np
import pytest

from hlo_spmd.ir.io import module_bytes
from hlo_spmd.ir.text_parser import parse_module
from hlo_spmd.ir.verifier import verify_module
from hlo_spmd.passes.inline_calls import inline_calls

# Calls chained through each other, a callee that returns its parameter, a nested call,
# a call that is a control predecessor, a call used twice, a call as the root, and one
# call marked inlineable="false" that must stay.
CHAINED = """
HloModule chained

%twice (p: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0)
  ROOT %s = f32[4] add(%p, %p)
}

%ident (q: f32[4]) -> f32[4] {
  ROOT %q = f32[4] parameter(0)
}

%outer (r: f32[4], t: f32[4]) -> f32[4] {
  %r = f32[4] parameter(0)
  %t = f32[4] parameter(1)
  %inner = f32[4] call(%r), to_apply=%twice
  ROOT %m = f32[4] multiply(%inner, %t)
}

%kept (k: f32[4]) -> f32[4] {
  %k = f32[4] parameter(0)
  ROOT %e = f32[4] exponential(%k)
}

ENTRY %main (x: f32[4], y: f32[4]) -> f32[4] {
  %x = f32[4] parameter(0)
  %y = f32[4] parameter(1)
  %c1 = f32[4] call(%x), to_apply=%twice
  %c2 = f32[4] call(%c1), to_apply=%ident
  %c3 = f32[4] call(%c2, %c1), to_apply=%outer
  %neg = f32[4] negate(%c3), control-predecessors={%c2}
  %k1 = f32[4] call(%neg), to_apply=%kept, frontend_attributes={inlineable="false"}
  %sub = f32[4] subtract(%k1, %c2)
  ROOT %c4 = f32[4] call(%sub), to_apply=%twice
}
"""


def _opcodes(comp):
    return [i.opcode for i in comp.instructions]


def test_every_inlineable_call_is_replaced_and_uses_follow():
    m = parse_module(CHAINED, "chained")
    assert inline_calls(m) == 5  # c1, c2, c3, c4 and outer's inner (callees first)
    verify_module(m)
    calls = [i for i in m.instructions() if i.opcode == "call"]
    assert [c.name for c in calls] == ["k1"]
    assert {c.name for c in m.computations} == {"main", "kept"}
    main = m.entry
    names = {i.name: i for i in main.instructions}
    # c2 (ident) stands for c1's root; c3's body reads it and c1's root.
    neg = names["neg"]
    (pred,) = neg.control_predecessors
    assert pred.opcode == "add" and pred.operands == [names["x"], names["x"]]
    assert names["sub"].operands[1] is pred
    assert main.root.opcode == "add" and main.root.operands == [names["sub"], names["sub"]]
    # c1's add, c3's body (the inner add, the multiply), c4's add; c2 left nothing.
    assert _opcodes(main) == ["parameter", "parameter", "add", "add", "multiply", "negate",
                              "call", "subtract", "add"]
    (mul,) = [i for i in main.instructions if i.opcode == "multiply"]
    assert mul.operands[0].opcode == "add" and mul.operands[0].operands == [pred, pred]
    assert mul.operands[1] is pred
    ids = [i.id for i in m.instructions()]
    assert len(ids) == len(set(ids))


def test_nothing_to_inline_leaves_the_module_alone():
    m = parse_module(CHAINED.replace('to_apply=%twice\n  %c2', 'to_apply=%twice, '
                                     'frontend_attributes={inlineable="false"}\n  %c2'), "x")
    before = module_bytes(m)
    m2 = parse_module("""
HloModule plain
ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4] parameter(0)
  ROOT %n = f32[4] negate(%x)
}
""", "plain")
    plain = module_bytes(m2)
    assert inline_calls(m2) == 0 and module_bytes(m2) == plain
    assert inline_calls(m) == 4 and module_bytes(m) != before


def test_inlined_module_computes_the_same_numbers():
    pytest.importorskip("jax")
    from hlo_spmd.runtime import run_unpartitioned

    original = parse_module(CHAINED, "chained")
    inlined = parse_module(CHAINED, "chained")
    inline_calls(inlined)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(4).astype(np.float32) for _ in range(2)]
    want = run_unpartitioned(module_bytes(original), inputs)
    got = run_unpartitioned(module_bytes(inlined), inputs)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)

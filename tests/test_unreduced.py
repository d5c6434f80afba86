"""Unreduced (partial-sum) values: resharding, unreduced dots, linear ops, completion."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jax")

from hlo_spmd.ir.io import load_module_bytes, module_bytes  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.passes.propagation import propagate  # noqa: E402
from hlo_spmd.runtime import verify  # noqa: E402
from hlo_spmd.sharding import HloSharding, parse_sharding  # noqa: E402
from hlo_spmd.sharding.unreduced import is_unreduced, reduced  # noqa: E402


def test_reduced_twin():
    assert reduced(HloSharding.unreduced()) == HloSharding.replicate()
    s = parse_sharding("{devices=[2,1,4]<=[8] last_tile_dims={unreduced}}")
    assert is_unreduced(s)
    assert reduced(s) == parse_sharding("{devices=[2,1,4]<=[8] last_tile_dim_replicate}")
    m = parse_sharding("{devices=[2,2,2]<=[8] last_tile_dims={manual, unreduced}}")
    assert reduced(m) == parse_sharding("{devices=[2,2,2]<=[8] last_tile_dims={manual, "
                                        "replicated}}")
    assert not is_unreduced(parse_sharding("{devices=[2,4]<=[8]}"))


MODULE = """HloModule m, num_partitions=4

ENTRY %e (a: f32[8,32], b: f32[32,16]) -> f32[8,16] {
  %a = f32[8,32] parameter(0), sharding={devices=[1,4]<=[4]}
  %b = f32[32,16] parameter(1), sharding={devices=[4,1]<=[4]}
  %d = f32[8,16] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %n = f32[8,16] OP(%d), sharding={unreduced}
  ROOT %r = f32[8,16] copy(%n), sharding=ROOT_SHARDING
}
"""


def _run(text: str, n: int):
    original = load_module_bytes(text.encode())
    out = partition_in_place(load_module_bytes(text.encode()), n).module
    report = verify(module_bytes(original), module_bytes(out), n, poison_padding=True)
    assert report.ok, str(report)
    return [i.opcode for i in out.instructions()]


def test_unreduced_dot_keeps_partial_sums_through_linear_ops():
    ops = _run(MODULE.replace("OP", "negate").replace("ROOT_SHARDING", "{unreduced}"), 4)
    # Contraction split as the operands are: no collective at all, outputs summed by
    # the harness from the per-device partial sums.
    assert not {"all-reduce", "reduce-scatter", "all-gather"} & set(ops)


@pytest.mark.parametrize("root, collective", [
    ("{replicated}", "all-reduce"),
    ("{devices=[4,1]<=[4]}", "reduce-scatter"),
    ("{devices=[1,4]<=[4]}", "reduce-scatter"),
])
def test_unreduced_to_replicated_is_all_reduce_and_to_tiled_reduce_scatter(root, collective):
    ops = _run(MODULE.replace("OP", "negate").replace("ROOT_SHARDING", root), 4)
    assert ops.count(collective) == 1
    assert not {"all-reduce", "reduce-scatter", "all-gather"} - {collective} & set(ops)


def test_nonlinear_op_annotated_unreduced_reduces_first():
    # tanh of partial sums is not a partial sum of tanh: reduce, apply, then hand the
    # value back as partial sums (one device holds it, the others zeros).
    ops = _run(MODULE.replace("OP", "tanh").replace("ROOT_SHARDING", "{unreduced}"), 4)
    assert ops.count("all-reduce") == 1


def test_completion_moves_partial_sums_only_through_linear_ops():
    text = """HloModule m, num_partitions=4

ENTRY %e (a: f32[8,32], b: f32[32,16]) -> f32[8,16] {
  %a = f32[8,32] parameter(0), sharding={devices=[1,4]<=[4]}
  %b = f32[32,16] parameter(1), sharding={devices=[4,1]<=[4]}
  %d = f32[8,16] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={unreduced}
  %n = f32[8,16] negate(%d)
  %t = f32[8,16] tanh(%n)
  ROOT %e2 = f32[8,16] exponential(%t)
}
"""
    module = load_module_bytes(text.encode())
    propagate(module)
    by = {i.name: i.sharding for i in module.instructions()}
    for name in ("t", "e2"):
        assert by[name] is None or not is_unreduced(by[name]), (name, by[name])


def test_unreduced_value_under_a_tiled_user_through_layout_constraints():
    # Found by the randomized test (test_partition_random_manual): completion tried to
    # merge the tiled sharding coming back from the multiply with the partial sums of
    # the unannotated layout constraints and crashed ("{unreduced} does not say how
    # many devices there are"). Partial sums and tilings never merge.
    text = """HloModule m

ENTRY main {
  p0 = f32[4,4] parameter(0), sharding={unreduced}
  p2 = f32[4,4] parameter(1), sharding={replicated}
  v0 = f32[4,4] custom-call(p0), custom_call_target="LayoutConstraint", operand_layout_constraints={f32[4,4]{0,1}}
  v1 = f32[4,4] custom-call(v0), custom_call_target="LayoutConstraint", operand_layout_constraints={f32[4,4]{0,1}}
  ROOT out = f32[4,4] multiply(v1, p2), sharding={devices=[1,2]0,1}
}
"""
    ops = _run(text, 2)
    assert ops.count("reduce-scatter") + ops.count("all-reduce") == 1

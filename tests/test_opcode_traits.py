"""The opcode-traits table (ir/opcodes.py): the facts where copies used to disagree, decided
by XLA (hlo_opcode.h arities, HloInstruction::HasSideEffectNoRecurse, IsElementwise)."""
from __future__ import annotations

import pytest

from hlo_spmd.ir import opcodes
from hlo_spmd.ir.opcodes import (ARITY, JAXLIB_ARITY, NO_OWN_BUFFER, REDUCERS, SIDE_EFFECTING,
                                 TRAITS, reducer_opcode, traits)
from hlo_spmd.ir.text_parser import parse_module


def test_every_derived_set_is_a_subset_of_the_table():
    for name in ("ELEMENTWISE", "COLLECTIVES", "SIDE_EFFECTING", "NO_OWN_BUFFER",
                 "CONTROL_FLOW", "APPLIES", "TO_APPLY", "RESULT_ACCURACY", "LINEAR_OPS",
                 "REDUCERS", "IDEMPOTENT_REDUCERS", "ASYNC_STARTS", "ASYNC_DONES"):
        derived = getattr(opcodes, name)
        assert derived and derived <= opcodes.ALL_OPCODES, name


def test_side_effects_follow_xla():
    # HasSideEffectNoRecurse: the *-done halves are side-effecting, after-all and the async
    # wrappers are not by opcode (an async op is through its wrapped computation).
    for op in ("all-reduce-done", "all-gather-done", "collective-permute-done", "send",
               "recv-done", "infeed", "outfeed", "rng"):
        assert op in SIDE_EFFECTING, op
    for op in ("after-all", "async-start", "async-update", "async-done", "all-reduce", "add"):
        assert op not in SIDE_EFFECTING, op


def test_arity_hlo_opcode_h_versus_verifier():
    # hlo_opcode.h spells dot variadic; newer XLA gives dot and convolution extra operands
    # (block scales, sparsity metadata), so the verifier fixes neither count.
    assert traits("dot").arity is None and "dot" not in ARITY
    assert traits("convolution").arity is None and "convolution" not in ARITY
    assert JAXLIB_ARITY["dot"] is None and JAXLIB_ARITY["convolution"] is None
    assert ARITY["async-update"] == 1 and ARITY["add"] == 2 and "tuple" not in ARITY
    assert "atan" not in JAXLIB_ARITY and "atan" in TRAITS


def test_no_own_buffer_includes_after_all():
    assert {"tuple", "get-tuple-element", "bitcast", "opt-barrier", "add-dependency",
            "after-all"} == NO_OWN_BUFFER


def test_async_pairs():
    assert opcodes.async_pair("all-reduce") == ("all-reduce-start", "all-reduce-done")
    assert opcodes.async_pair("all-to-all") is None
    assert "all-reduce" in opcodes.SYNC_COLLECTIVES
    assert "all-reduce-start" not in opcodes.SYNC_COLLECTIVES


REDUCER = """HloModule m
r {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT c = s32[] OP(a, b)
}
ENTRY e {
  x = s32[4] parameter(0)
  z = s32[] constant(0)
  ROOT y = s32[] reduce(x, z), dimensions={0}, to_apply=r
}
"""


@pytest.mark.parametrize("op", sorted(REDUCERS))
def test_reducer_recognised(op):
    m = parse_module(REDUCER.replace("OP", op), "t")
    assert reducer_opcode(m.computation("r")) == op


@pytest.mark.parametrize("op", ["subtract", "divide", "power"])
def test_non_reducer_not_recognised(op):
    m = parse_module(REDUCER.replace("OP", op), "t")
    assert reducer_opcode(m.computation("r")) is None


def test_remove_dead_drops_dead_after_all_keeps_send():
    m = parse_module("""HloModule m
ENTRY e {
  x = f32[4] parameter(0)
  t = token[] after-all()
  t2 = token[] after-all()
  snd = (f32[4], u32[], token[]) send(x, t), channel_id=1
  sd = token[] send-done(snd), channel_id=1
  ROOT y = f32[4] negate(x)
}
""", "t")
    entry = m.entry
    entry.remove_dead()
    names = {i.name for i in entry.instructions}
    assert "t2" not in names
    assert {"t", "snd", "sd", "y"} <= names


# -- the traits that were sets of their own in other modules (issue 23 item 1) --------------
def test_every_pass_classification_is_a_subset_of_the_table():
    for name in ("SHARDED_FROM_USERS", "COMPUTATION_SYNC", "MANUAL_TUPLE_FORWARD",
                 "MANUAL_FORWARD_LATE", "FED_IN", "ELEMENTWISE_PER_INSTRUCTION",
                 "MANUAL_OWN_HANDLER", "COMBINABLE_COLLECTIVES", "VALUE_LEAVES",
                 "SLICE_SIZES_PER_PAIR", "ASYNC_CHAIN_OPEN", "ASYNC_CHAIN_LATER",
                 "BUILDER_TAKES_ATTRS", "SDY_SHARDING_ATTR", "WINDOW_SUM_DEPTH",
                 "WEIGHT_PASS_THROUGH", "WEIGHT_SAME_DIMS"):
        derived = getattr(opcodes, name)
        assert derived and derived <= opcodes.ALL_OPCODES, name
    for rewrite, starts in opcodes.TIDY_TRIGGERS.items():
        assert starts and starts <= opcodes.ALL_OPCODES, rewrite


def test_traits_agree_with_each_other():
    # The async chain: an -update / -done follows a start or an update; walking back from
    # an -update / -done reaches the start. Both are the generic wrappers only.
    assert opcodes.ASYNC_CHAIN_OPEN | opcodes.ASYNC_CHAIN_LATER == opcodes.ASYNC_WRAPPERS
    assert opcodes.ASYNC_CHAIN_OPEN & opcodes.ASYNC_CHAIN_LATER == {"async-update"}
    # Value leaves take no operands; weight paths and builder exceptions are one-operand /
    # elementwise facts; the combiner and the cost model speak of synchronous collectives.
    assert all(traits(op).arity == 0 for op in opcodes.VALUE_LEAVES)
    assert opcodes.WEIGHT_SAME_DIMS < opcodes.WEIGHT_PASS_THROUGH
    assert all(traits(op).arity == 1 for op in opcodes.WEIGHT_PASS_THROUGH)
    assert opcodes.BUILDER_TAKES_ATTRS <= opcodes.ELEMENTWISE
    assert opcodes.COMBINABLE_COLLECTIVES <= set(opcodes.COST_KINDS) <= opcodes.SYNC_COLLECTIVES
    assert opcodes.MANUAL_TUPLE_FORWARD <= opcodes.APPLIES
    assert opcodes.WINDOW_SUM_DEPTH <= opcodes.APPLIES
    assert opcodes.ELEMENTWISE_PER_INSTRUCTION - {"custom-call"} <= opcodes.ELEMENTWISE
    assert set(opcodes.CALLED_ATTRS) <= opcodes.ALL_OPCODES - opcodes.TO_APPLY


def test_cost_kinds_and_formulas():
    from hlo_spmd.collectives.cost import COLLECTIVE_KINDS, bytes_per_device

    assert COLLECTIVE_KINDS == ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                                "collective-permute")
    # g = 4: (g-1)/g = 0.75; operand 100 B, result 400 B (a gather) / 25 B (a scatter).
    assert bytes_per_device("all-reduce", 100, 100, 4) == 150.0
    assert bytes_per_device("all-gather", 100, 400, 4) == 300.0
    assert bytes_per_device("reduce-scatter", 100, 25, 4) == 75.0
    assert bytes_per_device("all-to-all", 100, 100, 4) == 75.0
    assert bytes_per_device("collective-permute", 100, 100, 1) == 100.0
    assert bytes_per_device("all-reduce", 100, 100, 1) == 0.0
    with pytest.raises(ValueError):
        bytes_per_device("add", 100, 100, 4)


def test_unknown_trait_word_and_two_formulas_are_rejected():
    with pytest.raises(ValueError, match="unknown trait"):
        opcodes._make("x", 1, "elementwise no-such-word")
    with pytest.raises(ValueError, match="more than one"):
        opcodes._make("x", 1, "cost-ring cost-sent")


def test_builder_generates_methods_except_for_ops_needing_more_than_operands():
    from hlo_spmd.ir.builder import BINARY_OPCODES, UNARY_OPCODES

    assert "negate" in UNARY_OPCODES and "add" in BINARY_OPCODES
    assert not (set(UNARY_OPCODES) | set(BINARY_OPCODES)) & opcodes.BUILDER_TAKES_ATTRS
    assert set(UNARY_OPCODES) | opcodes.BUILDER_TAKES_ATTRS >= opcodes.ELEMENTWISE_UNARY

"""while / conditional / call partitioning, checked on XLA (2/4/8 CPU devices, padding
poisoned). Every instruction, inside the called computations too, carries its sharding."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hlo_spmd.runtime import ensure_host_devices

ensure_host_devices(8)
pytest.importorskip("jax")

from hlo_spmd.ir.io import load_module, module_bytes  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.runtime import random_inputs, verify  # noqa: E402
from hlo_spmd.runtime.module_io import strip_shardings  # noqa: E402
from hlo_spmd.stats import module_stats  # noqa: E402

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hlo"
R = "{replicated}"


def partition_and_verify(text: str, n: int, inputs_list=(None,), **kw):
    module = parse_module(text, "test")
    original = strip_shardings(module_bytes(module))
    result = partition_in_place(module, n, complete=True)
    for inputs in inputs_list:
        report = verify(original, module_bytes(result.module), n, inputs=inputs,
                        poison_padding=True, **kw)
        assert report.ok, str(report)
    return result


def calls_of(module, opcode):
    return [i for c in module.computations for i in c.instructions if i.opcode == opcode]


# -- while ----------------------------------------------------------------------------------
def matmul_loop(n: int, x_param: str, carry_x: str, trips: int = 3) -> str:
    """x <- tanh(x @ w) `trips` times while sum(x) < 1000; the carry keeps x sharded."""
    carry = f"{{{R}, {carry_x}, {R}, {{devices=[{n}]<=[{n}]}}}}"
    acc = f"{{devices=[{n}]<=[{n}]}}"
    return f"""
HloModule while_matmul

%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = f32[] add(%a, %b)
}}

%body (p: (s32[], f32[10,6], f32[6,6], f32[10])) -> (s32[], f32[10,6], f32[6,6], f32[10]) {{
  %p = (s32[], f32[10,6]{{1,0}}, f32[6,6]{{1,0}}, f32[10]{{0}}) parameter(0), sharding={carry}
  %i = s32[] get-tuple-element(%p), index=0, sharding={R}
  %one = s32[] constant(1), sharding={R}
  %i2 = s32[] add(%i, %one), sharding={R}
  %x = f32[10,6]{{1,0}} get-tuple-element(%p), index=1, sharding={carry_x}
  %w = f32[6,6]{{1,0}} get-tuple-element(%p), index=2, sharding={R}
  %d = f32[10,6]{{1,0}} dot(%x, %w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={carry_x}
  %t = f32[10,6]{{1,0}} tanh(%d), sharding={carry_x}
  %acc = f32[10]{{0}} get-tuple-element(%p), index=3, sharding={acc}
  %zero = f32[] constant(0), sharding={R}
  %rs = f32[10]{{0}} reduce(%t, %zero), dimensions={{1}}, to_apply=%add, sharding={acc}
  %acc2 = f32[10]{{0}} add(%acc, %rs), sharding={acc}
  ROOT %r = (s32[], f32[10,6]{{1,0}}, f32[6,6]{{1,0}}, f32[10]{{0}}) tuple(%i2, %t, %w, %acc2), sharding={carry}
}}

%cond (q: (s32[], f32[10,6], f32[6,6], f32[10])) -> pred[] {{
  %q = (s32[], f32[10,6]{{1,0}}, f32[6,6]{{1,0}}, f32[10]{{0}}) parameter(0), sharding={carry}
  %j = s32[] get-tuple-element(%q), index=0, sharding={R}
  %n = s32[] constant({trips}), sharding={R}
  %lt = pred[] compare(%j, %n), direction=LT, sharding={R}
  %y = f32[10,6]{{1,0}} get-tuple-element(%q), index=1, sharding={carry_x}
  %z = f32[] constant(0), sharding={R}
  %s = f32[] reduce(%y, %z), dimensions={{0,1}}, to_apply=%add, sharding={R}
  %big = f32[] constant(1000), sharding={R}
  %lt2 = pred[] compare(%s, %big), direction=LT, sharding={R}
  ROOT %and = pred[] and(%lt, %lt2), sharding={R}
}}

ENTRY %main (x: f32[10,6], w: f32[6,6], a: f32[10]) -> (f32[10,6], f32[10]) {{
  %x = f32[10,6]{{1,0}} parameter(0), sharding={x_param}
  %w = f32[6,6]{{1,0}} parameter(1), sharding={R}
  %a = f32[10]{{0}} parameter(2), sharding={acc}
  %zero = s32[] constant(0), sharding={R}
  %init = (s32[], f32[10,6]{{1,0}}, f32[6,6]{{1,0}}, f32[10]{{0}}) tuple(%zero, %x, %w, %a), sharding={carry}
  %wh = (s32[], f32[10,6]{{1,0}}, f32[6,6]{{1,0}}, f32[10]{{0}}) while(%init), condition=%cond, body=%body, sharding={carry}
  %out = f32[10,6]{{1,0}} get-tuple-element(%wh), index=1, sharding={carry_x}
  %acc = f32[10]{{0}} get-tuple-element(%wh), index=3, sharding={acc}
  ROOT %res = (f32[10,6]{{1,0}}, f32[10]{{0}}) tuple(%out, %acc), sharding={{{carry_x}, {acc}}}
}}
"""


@pytest.mark.parametrize("n", [2, 4, 8])
def test_while_matmul_loop_keeps_the_carry_sharded(n):
    rows = f"{{devices=[{n},1]<=[{n}]}}"
    result = partition_and_verify(matmul_loop(n, rows, rows), n)
    (wh,) = calls_of(result.module, "while")
    body, cond = wh.called_computations
    # the carry is per device: x is [ceil(10/n), 6] in the loop
    assert list(wh.shape.tuple_shapes[1].dims) == [-(-10 // n), 6]
    assert list(body.parameters[0].shape.tuple_shapes[1].dims) == [-(-10 // n), 6]
    assert cond.root.shape.rank == 0
    stats = module_stats(result.module)
    # the condition's sum is an all-reduce in the loop; the carry is never gathered outside
    assert stats.collectives["all-reduce"].count_in_loops >= 1
    assert not [r for r in stats.records if r.computation == result.module.entry.name]


@pytest.mark.parametrize("n", [4, 8])
def test_while_init_is_resharded_to_the_carry(n):
    cols = f"{{devices=[1,{n}]<=[{n}]}}"
    grid = f"{{devices=[2,{n // 2}]<=[{n}]}}"
    partition_and_verify(matmul_loop(n, cols, f"{{devices=[{n},1]<=[{n}]}}"), n)
    partition_and_verify(matmul_loop(n, cols, grid), n)


SHARED = """
HloModule shared

%body (p: (s32[], f32[10,6])) -> (s32[], f32[10,6]) {
  %p = (s32[], f32[10,6]{1,0}) parameter(0), sharding={{replicated}, @S@}
  %i = s32[] get-tuple-element(%p), index=0, sharding={replicated}
  %one = s32[] constant(1), sharding={replicated}
  %i2 = s32[] add(%i, %one), sharding={replicated}
  %x = f32[10,6]{1,0} get-tuple-element(%p), index=1, sharding=@S@
  %t = f32[10,6]{1,0} sine(%x), sharding=@S@
  ROOT %r = (s32[], f32[10,6]{1,0}) tuple(%i2, %t), sharding={{replicated}, @S@}
}

%cond (q: (s32[], f32[10,6])) -> pred[] {
  %q = (s32[], f32[10,6]{1,0}) parameter(0), sharding={{replicated}, @S@}
  %j = s32[] get-tuple-element(%q), index=0, sharding={replicated}
  %n = s32[] constant(5), sharding={replicated}
  ROOT %lt = pred[] compare(%j, %n), direction=LT, sharding={replicated}
}

ENTRY %main (x: f32[10,6]) -> (f32[10,6], f32[10,6]) {
  %x = f32[10,6]{1,0} parameter(0), sharding=@S@
  %zero = s32[] constant(0), sharding={replicated}
  %two = s32[] constant(2), sharding={replicated}
  %init = (s32[], f32[10,6]{1,0}) tuple(%zero, %x), sharding={{replicated}, @S@}
  %init2 = (s32[], f32[10,6]{1,0}) tuple(%two, %x), sharding={{replicated}, @S@}
  %w1 = (s32[], f32[10,6]{1,0}) while(%init), condition=%cond, body=%body, sharding={{replicated}, @S@}
  %w2 = (s32[], f32[10,6]{1,0}) while(%init2), condition=%cond, body=%body, sharding={{replicated}, @S@}
  %o1 = f32[10,6]{1,0} get-tuple-element(%w1), index=1, sharding=@S@
  %o2 = f32[10,6]{1,0} get-tuple-element(%w2), index=1, sharding=@S@
  ROOT %res = (f32[10,6]{1,0}, f32[10,6]{1,0}) tuple(%o1, %o2), sharding={@S@, @S@}
}
"""


@pytest.mark.parametrize("n", [2, 4])
def test_loops_sharing_body_and_condition_share_the_partitioned_copy(n):
    result = partition_and_verify(SHARED.replace("@S@", f"{{devices=[{n},1]<=[{n}]}}"), n)
    w1, w2 = calls_of(result.module, "while")
    assert w1.called_computations[0] is w2.called_computations[0]
    assert w1.called_computations[1] is w2.called_computations[1]


NESTED = """
HloModule nested

%inner_body (p: (s32[], f32[12,4])) -> (s32[], f32[12,4]) {
  %p = (s32[], f32[12,4]{1,0}) parameter(0), sharding={{replicated}, @S@}
  %i = s32[] get-tuple-element(%p), index=0, sharding={replicated}
  %one = s32[] constant(1), sharding={replicated}
  %i2 = s32[] add(%i, %one), sharding={replicated}
  %x = f32[12,4]{1,0} get-tuple-element(%p), index=1, sharding=@S@
  %h = f32[] constant(0.5), sharding={replicated}
  %hb = f32[12,4]{1,0} broadcast(%h), dimensions={}, sharding=@S@
  %y = f32[12,4]{1,0} multiply(%x, %hb), sharding=@S@
  %s = f32[12,4]{1,0} sine(%y), sharding=@S@
  ROOT %r = (s32[], f32[12,4]{1,0}) tuple(%i2, %s), sharding={{replicated}, @S@}
}

%inner_cond (q: (s32[], f32[12,4])) -> pred[] {
  %q = (s32[], f32[12,4]{1,0}) parameter(0), sharding={{replicated}, @S@}
  %j = s32[] get-tuple-element(%q), index=0, sharding={replicated}
  %two = s32[] constant(2), sharding={replicated}
  ROOT %lt = pred[] compare(%j, %two), direction=LT, sharding={replicated}
}

%outer_body (p: (s32[], f32[12,4])) -> (s32[], f32[12,4]) {
  %p = (s32[], f32[12,4]{1,0}) parameter(0), sharding={{replicated}, @T@}
  %i = s32[] get-tuple-element(%p), index=0, sharding={replicated}
  %one = s32[] constant(1), sharding={replicated}
  %i2 = s32[] add(%i, %one), sharding={replicated}
  %x = f32[12,4]{1,0} get-tuple-element(%p), index=1, sharding=@T@
  %zero = s32[] constant(0), sharding={replicated}
  %it = (s32[], f32[12,4]{1,0}) tuple(%zero, %x), sharding={{replicated}, @S@}
  %w = (s32[], f32[12,4]{1,0}) while(%it), condition=%inner_cond, body=%inner_body, sharding={{replicated}, @S@}
  %y = f32[12,4]{1,0} get-tuple-element(%w), index=1, sharding=@T@
  ROOT %r = (s32[], f32[12,4]{1,0}) tuple(%i2, %y), sharding={{replicated}, @T@}
}

%outer_cond (q: (s32[], f32[12,4])) -> pred[] {
  %q = (s32[], f32[12,4]{1,0}) parameter(0), sharding={{replicated}, @T@}
  %j = s32[] get-tuple-element(%q), index=0, sharding={replicated}
  %three = s32[] constant(3), sharding={replicated}
  ROOT %lt = pred[] compare(%j, %three), direction=LT, sharding={replicated}
}

ENTRY %main (x: f32[12,4]) -> f32[12,4] {
  %x = f32[12,4]{1,0} parameter(0), sharding=@T@
  %zero = s32[] constant(0), sharding={replicated}
  %t = (s32[], f32[12,4]{1,0}) tuple(%zero, %x), sharding={{replicated}, @T@}
  %w = (s32[], f32[12,4]{1,0}) while(%t), condition=%outer_cond, body=%outer_body, sharding={{replicated}, @T@}
  ROOT %y = f32[12,4]{1,0} get-tuple-element(%w), index=1, sharding=@T@
}
"""


@pytest.mark.parametrize("n", [2, 4, 8])
def test_nested_while_with_different_carry_shardings(n):
    text = (NESTED.replace("@S@", f"{{devices=[{n},1]<=[{n}]}}")
            .replace("@T@", f"{{devices=[1,{min(n, 4)},{n // min(n, 4)}]<=[{n}] "
                          "last_tile_dim_replicate}" if n > 4 else f"{{devices=[1,{n}]<=[{n}]}}"))
    result = partition_and_verify(text, n)
    assert len(calls_of(result.module, "while")) == 2
    stats = module_stats(result.module)
    # resharding between the two carries happens inside the outer loop
    assert stats.total_count >= 1 and stats.total_count_in_loops == stats.total_count


# -- conditional ------------------------------------------------------------------------------
def conditional_module(n: int) -> str:
    rows = f"{{devices=[{n},1]<=[{n}]}}"
    cols = f"{{devices=[1,{n}]<=[{n}]}}"
    return f"""
HloModule cond

%b0 (p: (f32[10,6], f32[10,6])) -> f32[10,6] {{
  %p = (f32[10,6]{{1,0}}, f32[10,6]{{1,0}}) parameter(0), sharding={{{rows}, {cols}}}
  %a = f32[10,6]{{1,0}} get-tuple-element(%p), index=0, sharding={rows}
  %b = f32[10,6]{{1,0}} get-tuple-element(%p), index=1, sharding={cols}
  ROOT %s = f32[10,6]{{1,0}} subtract(%a, %b), sharding={cols}
}}

%b1 (q: f32[10,6]) -> f32[10,6] {{
  %q = f32[10,6]{{1,0}} parameter(0), sharding={cols}
  ROOT %e = f32[10,6]{{1,0}} exponential(%q), sharding={cols}
}}

%b2 (q2: f32[10,6]) -> f32[10,6] {{
  %q2 = f32[10,6]{{1,0}} parameter(0), sharding={R}
  ROOT %n = f32[10,6]{{1,0}} negate(%q2), sharding={rows}
}}

%t0 (u: f32[10,6]) -> f32[10,6] {{
  %u = f32[10,6]{{1,0}} parameter(0), sharding={rows}
  ROOT %c = f32[10,6]{{1,0}} cosine(%u), sharding={rows}
}}

%t1 (v: f32[10,6]) -> f32[10,6] {{
  %v = f32[10,6]{{1,0}} parameter(0), sharding={rows}
  ROOT %c = f32[10,6]{{1,0}} sine(%v), sharding={rows}
}}

%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = f32[] add(%a, %b)
}}

ENTRY %main (x: f32[10,6], y: f32[10,6], k: s32[]) -> (f32[10,6], f32[10,6]) {{
  %x = f32[10,6]{{1,0}} parameter(0), sharding={rows}
  %y = f32[10,6]{{1,0}} parameter(1), sharding={cols}
  %k = s32[] parameter(2), sharding={R}
  %t = (f32[10,6]{{1,0}}, f32[10,6]{{1,0}}) tuple(%x, %y), sharding={{{rows}, {cols}}}
  %c = f32[10,6]{{1,0}} conditional(%k, %t, %y, %x), branch_computations={{%b0, %b1, %b2}}, sharding={cols}
  %zero = f32[] constant(0), sharding={R}
  %sum = f32[] reduce(%x, %zero), dimensions={{0,1}}, to_apply=%add, sharding={R}
  %gt = pred[] compare(%sum, %zero), direction=GT, sharding={R}
  %p = f32[10,6]{{1,0}} conditional(%gt, %x, %x), true_computation=%t0, false_computation=%t1, sharding={rows}
  ROOT %r = (f32[10,6]{{1,0}}, f32[10,6]{{1,0}}) tuple(%c, %p), sharding={{{cols}, {rows}}}
}}
"""


@pytest.mark.parametrize("n", [2, 4, 8])
def test_conditional_with_sharded_operands(n):
    base = random_inputs([((10, 6), np.float32), ((10, 6), np.float32)], seed=n)
    inputs_list = []
    for k, sign in [(0, 1), (1, -1), (2, 1), (7, -1), (-3, 1)]:  # out of range -> last branch
        inputs_list.append([base[0] * sign, base[1], np.array(k, np.int32)])
    result = partition_and_verify(conditional_module(n), n, inputs_list=inputs_list)
    conds = calls_of(result.module, "conditional")
    assert len(conds) == 2
    for c in conds:  # branch index / predicate is replicated: a plain scalar
        assert c.operands[0].shape.rank == 0


# Issue 20 item 5: the branches build gather / scatter indices from an iota sharded on the
# partition dim outside the conditional. The partitioned iota adds a partition-id offset
# in the entry, and that value is captured by the branches next to an entry parameter:
# XLA rejected the program ("PartitionId instruction is not supported for SPMD
# partitioning") until every captured value said it is manual.
def iota_indices_conditional_module(n: int, dtype: str = "f32") -> str:
    rows = f"{{devices=[{n},1]<=[{n}]}}"
    return f"""
HloModule iota_indices_in_branches

%sum (a: {dtype}[], b: {dtype}[]) -> {dtype}[] {{
  %a = {dtype}[] parameter(0)
  %b = {dtype}[] parameter(1)
  ROOT %c = {dtype}[] add(%a, %b)
}}

%pick (p: ({dtype}[16,6], s32[16,1])) -> {dtype}[16,6] {{
  %p = ({dtype}[16,6], s32[16,1]) parameter(0), sharding={{{R}, {rows}}}
  %table = {dtype}[16,6] get-tuple-element(%p), index=0, sharding={R}
  %pos = s32[16,1] get-tuple-element(%p), index=1, sharding={rows}
  %last = s32[] constant(15), sharding={R}
  %lasts = s32[16,1] broadcast(%last), dimensions={{}}, sharding={rows}
  %rev = s32[16,1] subtract(%lasts, %pos), sharding={rows}
  %g = {dtype}[16,6] gather(%table, %rev), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,6}}, sharding={rows}
  ROOT %out = {dtype}[16,6] copy(%g), sharding={R}
}}

%place (q: ({dtype}[16,6], s32[16,1])) -> {dtype}[16,6] {{
  %q = ({dtype}[16,6], s32[16,1]) parameter(0), sharding={{{R}, {rows}}}
  %upd = {dtype}[16,6] get-tuple-element(%q), index=0, sharding={R}
  %pos = s32[16,1] get-tuple-element(%q), index=1, sharding={rows}
  %two = s32[] constant(2), sharding={R}
  %twos = s32[16,1] broadcast(%two), dimensions={{}}, sharding={rows}
  %half = s32[16,1] divide(%pos, %twos), sharding={rows}
  %zero = {dtype}[] constant(0), sharding={R}
  %base = {dtype}[16,6] broadcast(%zero), dimensions={{}}, sharding={R}
  %s = {dtype}[16,6] scatter(%base, %half, %upd), update_window_dims={{1}}, inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply=%sum, sharding={R}
  ROOT %out = {dtype}[16,6] copy(%s), sharding={R}
}}

ENTRY %main (x: {dtype}[16,6], k: pred[]) -> {dtype}[16,6] {{
  %x = {dtype}[16,6] parameter(0), sharding={R}
  %k = pred[] parameter(1), sharding={R}
  %pos = s32[16,1] iota(), iota_dimension=0, sharding={rows}
  %t = ({dtype}[16,6], s32[16,1]) tuple(%x, %pos), sharding={{{R}, {rows}}}
  ROOT %c = {dtype}[16,6] conditional(%k, %t, %t), true_computation=%pick, false_computation=%place, sharding={R}
}}
"""


@pytest.mark.parametrize("n,dtype", [(2, "f32"), (4, "bf16"), (8, "f32")])
def test_conditional_gather_scatter_indices_from_iota_sharded_outside(n, dtype):
    x = random_inputs([((16, 6), np.float32)], seed=n)[0]
    if dtype == "bf16":
        import ml_dtypes

        x = x.astype(ml_dtypes.bfloat16)
    inputs_list = [[x, np.array(True)], [x, np.array(False)]]
    partition_and_verify(iota_indices_conditional_module(n, dtype), n, inputs_list=inputs_list)


# -- call -------------------------------------------------------------------------------------
def call_module(n: int) -> str:
    rows = f"{{devices=[{n},1]<=[{n}]}}"
    cols = f"{{devices=[1,{n}]<=[{n}]}}"
    return f"""
HloModule calls

%callee (u: f32[10,6], v: f32[10,6]) -> f32[10,6] {{
  %u = f32[10,6]{{1,0}} parameter(0), sharding={rows}
  %v = f32[10,6]{{1,0}} parameter(1), sharding={rows}
  %m = f32[10,6]{{1,0}} multiply(%u, %v), sharding={rows}
  ROOT %o = f32[10,6]{{1,0}} add(%m, %u), sharding={rows}
}}

ENTRY %main (x: f32[10,6], y: f32[10,6]) -> (f32[10,6], f32[10,6], f32[10,6]) {{
  %x = f32[10,6]{{1,0}} parameter(0), sharding={rows}
  %y = f32[10,6]{{1,0}} parameter(1), sharding={cols}
  %c1 = f32[10,6]{{1,0}} call(%x, %y), to_apply=%callee, sharding={rows}
  %c2 = f32[10,6]{{1,0}} call(%c1, %y), to_apply=%callee, sharding={rows}
  %c3 = f32[10,6]{{1,0}} call(%y, %x), to_apply=%callee, sharding={cols}
  ROOT %r = (f32[10,6]{{1,0}}, f32[10,6]{{1,0}}, f32[10,6]{{1,0}}) tuple(%c1, %c2, %c3), sharding={{{rows}, {rows}, {cols}}}
}}
"""


@pytest.mark.parametrize("n", [2, 4, 8])
def test_call_one_copy_per_sharding_signature(n):
    result = partition_and_verify(call_module(n), n)
    calls = calls_of(result.module, "call")
    assert len(calls) == 3
    callees = {id(c.called_computations[0]) for c in calls}
    # c1 and c2 share (rows, cols) -> rows; c3 is (cols, rows) -> cols
    assert len(callees) == 2
    assert calls[0].called_computations[0] is calls[1].called_computations[0]


# -- fixtures -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["while_loop", "conditional"])
def test_fixture_partitions_and_verifies(name):
    path = FIXTURES / f"{name}.pb"
    original = path.read_bytes()
    result = partition_in_place(load_module(path), 8, complete=False)
    report = verify(original, module_bytes(result.module), 8, poison_padding=True)
    assert report.ok, str(report)
    assert calls_of(result.module, "while" if name == "while_loop" else "conditional")

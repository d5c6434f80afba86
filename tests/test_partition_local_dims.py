"""reduce-window / sort / topk stay local when their operating dims are unsharded, and
fall back (correctly) when they are not. Every case runs on XLA with poisoned padding."""
from __future__ import annotations

import pytest

pytest.importorskip("jax")

from hlo_spmd.ir.io import module_bytes  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.runtime import verify  # noqa: E402

COLLECTIVES = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"}

ADD = """
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
"""

LT = """
%lt (a: f32[], b: f32[]) -> pred[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = pred[] compare(%a, %b), direction=LT
}
"""


def cumsum(rows, cols, window_dim, sharding):
    size = "1x%d" % cols if window_dim == 1 else "%dx1" % rows
    pad = "0_0x%d_0" % (cols - 1) if window_dim == 1 else "%d_0x0_0" % (rows - 1)
    return f"""HloModule m
{ADD}
ENTRY %main (x: f32[{rows},{cols}]) -> f32[{rows},{cols}] {{
  %x = f32[{rows},{cols}] parameter(0), sharding={sharding}
  %z = f32[] constant(0)
  ROOT %r = f32[{rows},{cols}] reduce-window(%x, %z), window={{size={size} pad={pad}}}, to_apply=%add, sharding={sharding}
}}
"""


def sort(rows, cols, sharding):
    return f"""HloModule m
{LT}
ENTRY %main (x: f32[{rows},{cols}]) -> f32[{rows},{cols}] {{
  %x = f32[{rows},{cols}] parameter(0), sharding={sharding}
  ROOT %s = f32[{rows},{cols}] sort(%x), dimensions={{1}}, to_apply=%lt, sharding={sharding}
}}
"""


def topk(rows, cols, sharding):
    return f"""HloModule m
ENTRY %main (x: f32[{rows},{cols}]) -> (f32[{rows},3], s32[{rows},3]) {{
  %x = f32[{rows},{cols}] parameter(0), sharding={sharding}
  ROOT %t = (f32[{rows},3], s32[{rows},3]) topk(%x), k=3, largest=true, sharding={{{sharding}, {sharding}}}
}}
"""


def run(text, n):
    module = parse_module(text)
    original = module_bytes(module)
    out = partition_in_place(module, n, complete=True).module
    report = verify(original, module_bytes(out), n, poison_padding=True)
    assert report.ok, str(report)
    return {i.opcode for i in out.instructions()} & COLLECTIVES


@pytest.mark.parametrize("rows,n", [(16, 8), (13, 4), (6, 4)])
def test_cumsum_along_unsharded_dim_is_local(rows, n):
    assert run(cumsum(rows, 8, 1, f"{{devices=[{n},1]<=[{n}]}}"), n) == set()


@pytest.mark.parametrize("rows,n", [(16, 8), (13, 4)])
def test_cumsum_along_sharded_dim_is_correct(rows, n):
    run(cumsum(rows, 8, 0, f"{{devices=[{n},1]<=[{n}]}}"), n)


@pytest.mark.parametrize("rows,n", [(16, 8), (10, 4)])
def test_sort_along_unsharded_dim_is_local(rows, n):
    assert run(sort(rows, 12, f"{{devices=[{n},1]<=[{n}]}}"), n) == set()


def test_sort_along_sharded_dim_is_correct():
    run(sort(8, 12, "{devices=[1,4]<=[4]}"), 4)


@pytest.mark.parametrize("rows,n", [(16, 8), (7, 2)])
def test_topk_with_rows_sharded_is_local(rows, n):
    assert run(topk(rows, 10, f"{{devices=[{n},1]<=[{n}]}}"), n) == set()


def test_topk_over_sharded_last_dim_is_correct():
    run(topk(8, 12, "{devices=[1,4]<=[4]}"), 4)

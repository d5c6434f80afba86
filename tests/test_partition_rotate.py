"""Pipeline buffer moves on a sharded stage dim: a rotation (concatenate of two slices) and
a shift (slice of a pad), alone and inside a while loop, become collective-permutes (one
when the move is a multiple of the tile or less than one tile, else two), never gathers. Runs on
XLA's CPU runtime with poisoned padding; bytes per device compared with XLA's."""
from __future__ import annotations

import pytest

pytest.importorskip("jax")

from hlo_spmd.ir.io import load_module_bytes, module_bytes  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.runtime import verify  # noqa: E402
from hlo_spmd.runtime.xla_reference import xla_partitioned_module  # noqa: E402
from hlo_spmd.stats import module_stats  # noqa: E402

COLLECTIVES = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"}


def check(text, n):
    module = parse_module(text)
    original = module_bytes(module)
    out = partition_in_place(module, n, complete=True).module
    report = verify(original, module_bytes(out), n, poison_padding=True)
    assert report.ok, str(report)
    ours = module_stats(out, n).total_bytes_per_device
    xla = module_stats(load_module_bytes(xla_partitioned_module(original, n), "xla"), n)
    assert ours <= xla.total_bytes_per_device + 1e-6, (ours, xla.total_bytes_per_device)
    return [i.opcode for i in out.instructions() if i.opcode in COLLECTIVES]


def rotate(D, s, sh):
    return f"""HloModule m
ENTRY %main (x: f32[{D},4,16]) -> f32[{D},4,16] {{
  %x = f32[{D},4,16] parameter(0), sharding={sh}
  %a = f32[{D - s},4,16] slice(%x), slice={{[{s}:{D}],[0:4],[0:16]}}, sharding={sh}
  %b = f32[{s},4,16] slice(%x), slice={{[0:{s}],[0:4],[0:16]}}, sharding={sh}
  ROOT %c = f32[{D},4,16] concatenate(%a, %b), dimensions={{0}}, sharding={sh}
}}
"""


def shift(D, low, start, sh, value="0"):
    high = start + D - (D + low) if start + D > D + low else 0
    return f"""HloModule m
ENTRY %main (x: f32[{D},4,16]) -> f32[{D},4,16] {{
  %x = f32[{D},4,16] parameter(0), sharding={sh}
  %z = f32[] constant({value})
  %p = f32[{D + low + high},4,16] pad(%x, %z), padding={low}_{high}x0_0x0_0, sharding={sh}
  ROOT %s = f32[{D},4,16] slice(%p), slice={{[{start}:{start + D}],[0:4],[0:16]}}, sharding={sh}
}}
"""


S8 = "{devices=[4,2,1]<=[8]}"


@pytest.mark.parametrize("D,s,sh,n,permutes", [
    (8, 1, S8, 8, 1), (8, 7, S8, 8, 1), (8, 2, S8, 8, 1), (8, 3, S8, 8, 2),
    (16, 5, "{devices=[8,1,1]<=[8]}", 8, 2), (8, 1, "{devices=[2,1,1]<=[2]}", 2, 1),
    (8, 3, "{devices=[4,1,1]<=[4]}", 4, 2),
    (8, 1, "{devices=[4,1,1,2]<=[8] last_tile_dim_replicate}", 8, 1)])
def test_rotation_is_collective_permutes(D, s, sh, n, permutes):
    ops = check(rotate(D, s, sh), n)
    assert set(ops) == {"collective-permute"} and len(ops) == permutes


@pytest.mark.parametrize("D,low,start,sh,n,permutes", [
    (8, 1, 0, S8, 8, 1), (8, 0, 1, S8, 8, 1), (8, 2, 0, "{devices=[4,1,1]<=[4]}", 4, 1),
    (8, 1, 0, "{devices=[2,1,1]<=[2]}", 2, 1), (16, 3, 0, "{devices=[8,1,1]<=[8]}", 8, 2)])
@pytest.mark.parametrize("value", ["0", "-2.5"])
def test_shift_is_collective_permutes(D, low, start, sh, n, permutes, value):
    ops = check(shift(D, low, start, sh, value), n)
    assert ops == ["collective-permute"] * permutes


def test_rotation_inside_a_while_loop():
    S = S8
    text = f"""HloModule m
%body (t: (s32[], f32[8,4,16])) -> (s32[], f32[8,4,16]) {{
  %t = (s32[], f32[8,4,16]) parameter(0), sharding={{{{replicated}}, {S}}}
  %i = s32[] get-tuple-element(%t), index=0, sharding={{replicated}}
  %x = f32[8,4,16] get-tuple-element(%t), index=1, sharding={S}
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  %a = f32[7,4,16] slice(%x), slice={{[1:8],[0:4],[0:16]}}, sharding={S}
  %b = f32[1,4,16] slice(%x), slice={{[0:1],[0:4],[0:16]}}, sharding={S}
  %c = f32[8,4,16] concatenate(%a, %b), dimensions={{0}}, sharding={S}
  %y = f32[8,4,16] tanh(%c), sharding={S}
  ROOT %r = (s32[], f32[8,4,16]) tuple(%j, %y), sharding={{{{replicated}}, {S}}}
}}
%cond (t: (s32[], f32[8,4,16])) -> pred[] {{
  %t = (s32[], f32[8,4,16]) parameter(0), sharding={{{{replicated}}, {S}}}
  %i = s32[] get-tuple-element(%t), index=0, sharding={{replicated}}
  %n = s32[] constant(5)
  ROOT %p = pred[] compare(%i, %n), direction=LT
}}
ENTRY %main (x: f32[8,4,16]) -> f32[8,4,16] {{
  %x = f32[8,4,16] parameter(0), sharding={S}
  %zero = s32[] constant(0)
  %t = (s32[], f32[8,4,16]) tuple(%zero, %x), sharding={{{{replicated}}, {S}}}
  %w = (s32[], f32[8,4,16]) while(%t), condition=%cond, body=%body, sharding={{{{replicated}}, {S}}}
  ROOT %o = f32[8,4,16] get-tuple-element(%w), index=1, sharding={S}
}}
"""
    assert check(text, 8) == ["collective-permute"]

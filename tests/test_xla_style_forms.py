"""Modules in the style of XLA's own partitioner tests (spmd_partitioner_test.cc) for the
sharding forms of issue 9 -- named mesh-axis shardings, unreduced values, manual and
partially manual regions -- written here by hand. Each one is partitioned and run on 8 CPU
devices through jaxlib against the unpartitioned module (or XLA's own partitioner where
only a partitioned run exists)."""
from __future__ import annotations

import pytest

from hlo_spmd.runtime import ensure_host_devices

ensure_host_devices(8)
pytest.importorskip("jax")

from hlo_spmd.ir.io import module_bytes  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.partition import partition  # noqa: E402
from hlo_spmd.runtime import verify  # noqa: E402
from hlo_spmd.runtime.module_io import strip_shardings  # noqa: E402
from hlo_spmd.stats import module_stats  # noqa: E402

ADD = """
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = f32[] add(%a, %b)
}
"""

CASES = {
    # A dot of named shardings: batch on x, contraction on y (partial sums all-reduced).
    "named_dot_contracting": ("""
HloModule named_dot
ENTRY %main (l: f32[8,32], r: f32[32,16]) -> f32[8,16] {
  %l = f32[8,32]{1,0} parameter(0), sharding={mesh['x'=2,'y'=4], [{'x'}, {'y'}]}
  %r = f32[32,16]{1,0} parameter(1), sharding={mesh['x'=2,'y'=4], [{'y'}, {}]}
  ROOT %d = f32[8,16]{1,0} dot(%l, %r), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={mesh['x'=2,'y'=4], [{'x'}, {}]}
}""", {"all-reduce"}),
    # Sub-axes on a permuted mesh: rows on y's major half then x.
    "named_sub_axes_permuted_mesh": ("""
HloModule named_sub
ENTRY %main (p: f32[16,8]) -> f32[16,8] {
  %p = f32[16,8]{1,0} parameter(0), sharding={mesh['x'=2,'y'=4], device_ids=([4,2]T(1,0)), [{'y':(2)2, 'x'}, {'y':(1)2}]}
  %e = f32[16,8]{1,0} exponential(%p)
  ROOT %t = f32[16,8]{1,0} transpose(%e), dimensions={0,1}, sharding={mesh['x'=2,'y'=4], [{'x'}, {'y'}]}
}""", None),
    # A dot annotated unreduced over its contracting axis keeps partial sums; an
    # elementwise nonlinear user forces the all-reduce.
    "unreduced_dot_then_tanh": ("""
HloModule unreduced
ENTRY %main (l: f32[8,32], r: f32[32,16]) -> f32[8,16] {
  %l = f32[8,32]{1,0} parameter(0), sharding={devices=[1,8]<=[8]}
  %r = f32[32,16]{1,0} parameter(1), sharding={devices=[8,1]<=[8]}
  %d = f32[8,16]{1,0} dot(%l, %r), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={unreduced}
  %n = f32[8,16]{1,0} negate(%d), sharding={unreduced}
  ROOT %t = f32[8,16]{1,0} tanh(%n), sharding={devices=[8,1]<=[8]}
}""", {"reduce-scatter"}),
    # Unreduced over the y subgroup, named: reduced to a y-tiled result (reduce-scatter).
    "named_unreduced_to_tiled": ("""
HloModule named_unreduced
ENTRY %main (l: f32[8,32], r: f32[32,16]) -> f32[8,16] {
  %l = f32[8,32]{1,0} parameter(0), sharding={mesh['x'=2,'y'=4], [{'x'}, {'y'}]}
  %r = f32[32,16]{1,0} parameter(1), sharding={mesh['x'=2,'y'=4], [{'y'}, {}]}
  %d = f32[8,16]{1,0} dot(%l, %r), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={mesh['x'=2,'y'=4], [{'x'}, {}], unreduced={'y'}}
  ROOT %c = f32[8,16]{1,0} copy(%d), sharding={mesh['x'=2,'y'=4], [{'x'}, {'y'}]}
}""", None),
    # Partially manual (named manual axis) region with a user all-reduce over the manual axis.
    "named_partial_manual_all_reduce": ("""
HloModule named_manual
""" + ADD + """
ENTRY %main (x: f32[8,16]) -> f32[8,16] {
  %x = f32[8,16]{1,0} parameter(0), sharding={mesh['x'=2,'y'=4], [{'x'}, {'y'}]}
  %s = f32[8,16]{1,0} custom-call(%x), custom_call_target="Sharding", sharding={mesh['x'=2,'y'=4], [{'x'}, {'y'}]}
  %m = f32[8,4]{1,0} custom-call(%s), custom_call_target="SPMDFullToShardShape", sharding={mesh['x'=2,'y'=4], [{'x'}, {}], manual={'y'}}
  %ar = f32[8,4]{1,0} all-reduce(%m), channel_id=1, replica_groups=mesh['x'=2,'y'=4] {'y'}, use_global_device_ids=true, to_apply=%add, sharding={mesh['x'=2,'y'=4], [{'x'}, {}], manual={'y'}}
  %e = f32[8,4]{1,0} exponential(%ar), sharding={mesh['x'=2,'y'=4], [{'x'}, {}], manual={'y'}}
  %t2 = f32[8,4]{1,0} custom-call(%e), custom_call_target="Sharding", sharding={mesh['x'=2,'y'=4], [{'x'}, {}], manual={'y'}}
  ROOT %f = f32[8,16]{1,0} custom-call(%t2), custom_call_target="SPMDShardToFullShape", sharding={mesh['x'=2,'y'=4], [{'x'}, {'y'}]}
}""", {"all-reduce"}),
    # Fully manual region fed by a tiled value, a collective-permute inside.
    "manual_region_permute": ("""
HloModule manual_permute
ENTRY %main (x: f32[16,4]) -> f32[16,4] {
  %x = f32[16,4]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  %s = f32[16,4]{1,0} custom-call(%x), custom_call_target="Sharding", sharding={devices=[8,1]<=[8]}
  %m = f32[2,4]{1,0} custom-call(%s), custom_call_target="SPMDFullToShardShape", sharding={manual}
  %cp = f32[2,4]{1,0} collective-permute(%m), channel_id=1, source_target_pairs={{0,1},{1,2},{2,3},{3,4},{4,5},{5,6},{6,7},{7,0}}, sharding={manual}
  %t2 = f32[2,4]{1,0} custom-call(%cp), custom_call_target="Sharding", sharding={manual}
  ROOT %f = f32[16,4]{1,0} custom-call(%t2), custom_call_target="SPMDShardToFullShape", sharding={devices=[8,1]<=[8]}
}""", {"collective-permute"}),
    # An unreduced value entering a fully manual region (the form Shardy's export writes
    # for a reduce-scatter in a shard_map): each device's partial sum is its manual value,
    # and the body reduces it with a collective of its own.
    "unreduced_into_manual_region": ("""
HloModule unreduced_manual
""" + ADD + """
ENTRY %main (l: f32[8,32], r: f32[32,8]) -> f32[8,8] {
  %l = f32[8,32]{1,0} parameter(0), sharding={devices=[1,8]<=[8]}
  %r = f32[32,8]{1,0} parameter(1), sharding={devices=[8,1]<=[8]}
  %d = f32[8,8]{1,0} dot(%l, %r), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={unreduced}
  %c = f32[8,8]{1,0} copy(%d), sharding={unreduced}
  %m = f32[8,8]{1,0} custom-call(%c), custom_call_target="SPMDFullToShardShape", sharding={manual}
  %rs = f32[1,8]{1,0} reduce-scatter(%m), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, dimensions={0}, to_apply=%add, sharding={manual}
  %t2 = f32[1,8]{1,0} custom-call(%rs), custom_call_target="Sharding", sharding={manual}
  ROOT %f = f32[8,8]{1,0} custom-call(%t2), custom_call_target="SPMDShardToFullShape", sharding={devices=[8,1]<=[8]}
}""", {"reduce-scatter"}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_xla_style_module_partitions_and_matches(name):
    text, kinds = CASES[name]
    module = parse_module(text, name)
    raw = module_bytes(module)
    manual = "SPMDFullToShardShape" in text
    original = raw if manual else strip_shardings(raw)
    out = partition(module, 8).module
    report = verify(original, module_bytes(out), 8, poison_padding=True)
    assert report.ok, str(report)
    if kinds is not None:
        stats = module_stats(out, 8)
        assert kinds <= {k for k, v in stats.collectives.items() if v.count}, stats.collectives

"""Modules whose reference is XLA's own partitioned program (issue 20, items 2-4):
manual values entering as parameters (tuples mixing manual and tiled leaves),
collectives written outside manual regions, unreduced parameters through layout
constraints. Each is partitioned by hlo-spmd and by XLA's partitioner and both run on
the same per-device inputs on N CPU devices (tests/_xla_compare.py)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jax")

from _xla_compare import compare_with_xla  # noqa: E402
from hlo_spmd.ir.io import load_module_bytes, module_bytes  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.runtime import shard_pieces, verify  # noqa: E402
from hlo_spmd.runtime.slicing import assemble  # noqa: E402

SUM = """
sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT add = f32[] add(a, b)
}
"""


def _opcodes(result) -> list[str]:
    return [i.opcode for i in result.module.instructions()]


# XLA's AllReduceNoSharding (spmd_partitioner_test.cc): refused before ("has no meaning in
# a single logical program"); XLA gathers the operand and all-reduces the copies.
ALL_REDUCE_NO_SHARDING = """HloModule module
""" + SUM + """
ENTRY entry {
  param = f32[2,2] parameter(0), sharding={devices=[2,2]<=[4]}
  ROOT all-reduce = f32[2,2]{1,0} all-reduce(param), to_apply=sum,
    replica_groups={{0,1,2,3}}, use_global_device_ids=true, channel_id=1
}
"""


def test_all_reduce_outside_manual_region_matches_xla():
    result = compare_with_xla(ALL_REDUCE_NO_SHARDING, 4)
    assert _opcodes(result).count("all-reduce") == 1


@pytest.mark.parametrize("op", [
    # cross-partition, groups of two
    "all-reduce(param), to_apply=sum, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, "
    "channel_id=1, sharding={replicated}",
    # channel without global ids: every partition of the (single) replica
    "all-reduce(param), to_apply=sum, replica_groups={}, channel_id=1, sharding={replicated}",
    "all-gather(param), replica_groups={{0,2},{1,3}}, dimensions={0}, use_global_device_ids=true, "
    "channel_id=1, sharding={devices=[2,2]<=[4]}",
    # the copies disagree afterwards: compared device by device
    "all-to-all(param), replica_groups={{0,1,2,3}}, dimensions={1}, channel_id=1",
    # the permute moves the tiles of its own sharding
    "collective-permute(param), channel_id=1, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}, "
    "sharding={devices=[2,2]<=[4]}",
    "collective-permute(param), channel_id=1, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}, "
    "sharding={replicated}",
])
def test_collectives_outside_manual_regions_match_xla(op):
    shape = "f32[8,8]" if "all-gather" in op else "f32[4,8]"
    text = "HloModule m\n" + SUM + f"""
ENTRY entry {{
  param = f32[4,8] parameter(0), sharding={{devices=[2,2]<=[4]}}
  ROOT r = {shape} {op}
}}
"""
    compare_with_xla(text, 4)


# Issue 20 item 4: a tuple parameter mixing a tiled and a manual leaf; the tiled leaf
# enters the manual region, meets the manual leaf, leaves, and enters again (refused
# before: "cannot reshard between manual and non-manual").
TUPLE_MANUAL_LEAF = """HloModule m

ENTRY entry {
  param = (f32[8,4], f32[4,4]) parameter(0), sharding={{devices=[2,1]<=[2]},{manual}}
  gte0 = f32[8,4] get-tuple-element(param), index=0, sharding={devices=[2,1]<=[2]}
  gte1 = f32[4,4] get-tuple-element(param), index=1, sharding={manual}
  to_shard = f32[4,4] custom-call(gte0), custom_call_target="SPMDFullToShardShape", sharding={manual}
  add = f32[4,4] add(to_shard, gte1), sharding={manual}
  to_full = f32[8,4] custom-call(add), custom_call_target="SPMDShardToFullShape", sharding={devices=[2,1]<=[2]}
  mul = f32[8,4] multiply(to_full, gte0), sharding={devices=[2,1]<=[2]}
  to_shard2 = f32[4,4] custom-call(mul), custom_call_target="SPMDFullToShardShape", sharding={manual}
  ROOT tuple = (f32[4,4]) tuple(to_shard2), sharding={{manual}}
}
"""


def test_tuple_parameter_with_manual_and_tiled_leaves_matches_xla():
    result = compare_with_xla(TUPLE_MANUAL_LEAF, 2)
    # Entering and leaving the region is local: no communication at all.
    assert not {"all-reduce", "all-gather", "all-to-all", "collective-permute"} & \
        set(_opcodes(result))


# XLA's TupleWithSubgroupManual: a partially manual leaf read out of a tuple parameter.
TUPLE_SUBGROUP_MANUAL = """HloModule module

ENTRY entry {
  constant = f32[6,3]{1,0} constant({{1,3,7},{5,1,4},{1,2,8},{2,3,7},{5,2,4},{2,2,8}}), sharding={replicated}
  param = (f32[6,3]{1,0}, f32[]) parameter(0), sharding={{devices=[2,1,2]<=[4] last_tile_dims={manual}},{replicated}}
  gte = f32[6,3]{1,0} get-tuple-element(param), index=0, sharding={devices=[2,1,2]<=[4] last_tile_dims={manual}}
  ROOT tuple = (f32[6,3]{1,0}, f32[6,3]{1,0}) tuple(constant, gte), sharding={{replicated},{devices=[2,1,2]<=[4] last_tile_dims={manual}}}
}
"""


def test_tuple_with_subgroup_manual_leaf_matches_xla():
    compare_with_xla(TUPLE_SUBGROUP_MANUAL, 4)


# Issue 20 item 2: an unreduced parameter resharded to tiled through a layout constraint.
LAYOUT_CONSTRAINT = """HloModule item2

ENTRY %main {
  %param = f32[8,128]{1,0} parameter(0), sharding=PARAM
  ROOT %cc = f32[8,128]{0,1} custom-call(%param), custom_call_target="LayoutConstraint", operand_layout_constraints={f32[8,128]{0,1}}, sharding=ROOT
}
"""


@pytest.mark.parametrize("n, param, root, collective", [
    (2, "{unreduced}", "{devices=[2,1]0,1}", "reduce-scatter"),
    (2, "{unreduced}", "{unreduced}", None),
    (4, "{devices=[2,1,2]<=[4] last_tile_dims={unreduced}}", "{devices=[4,1]<=[4]}",
     "reduce-scatter"),
    (4, "{devices=[1,4]<=[4]}", "{devices=[4,1]<=[4]}", "all-to-all"),
])
def test_unreduced_through_layout_constraint(n, param, root, collective):
    text = LAYOUT_CONSTRAINT.replace("PARAM", param).replace("sharding=ROOT",
                                                             f"sharding={root}")
    original = load_module_bytes(text.encode())
    result = partition_in_place(load_module_bytes(text.encode()), n)
    report = verify(module_bytes(original), module_bytes(result.module), n,
                    poison_padding=True)
    assert report.ok, str(report)
    ops = _opcodes(result)
    comm = [o for o in ops if o in ("all-reduce", "reduce-scatter", "all-gather", "all-to-all",
                                    "collective-permute")]
    assert comm == ([collective] if collective else [])
    # The constraint runs on the local tile and states the local shape.
    cc = next(i for i in result.module.instructions() if i.opcode == "custom-call")
    assert list(cc.attrs.operand_shapes_with_layout[0].dimensions) == \
        list(cc.operands[0].shape.dims)
    assert not result.report.replicated_fallbacks


@pytest.mark.parametrize("text, n", [
    ("{unreduced}", 4),
    ("{devices=[2,1,2]<=[4] last_tile_dims={unreduced}}", 4),
    ("{devices=[1,2,2]<=[4] last_tile_dims={unreduced}}", 4),
])
def test_unreduced_inputs_are_fed_as_partial_sums(text, n):
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    pieces = shard_pieces(x, text, n)
    # The members of a group hold different partial sums (a program reading one piece
    # as the value fails), which add up to the tile.
    assert not np.allclose(pieces[0], pieces[1]) and not np.allclose(pieces[0], pieces[3])
    np.testing.assert_allclose(assemble(pieces, text, x.shape), x, rtol=1e-6, atol=1e-6)
    ints = shard_pieces(x.astype(np.int32), text, n)
    np.testing.assert_array_equal(assemble(ints, text, x.shape), x.astype(np.int32))


# XLA's CustomCallManualSharding: a custom-call without a partitioning rule inside a fully
# manual region is the user's per-device code (it was reported as a replicated fallback).
# Its target ("dummy") does not exist on CPU, so only the program's structure is checked.
CUSTOM_CALL_MANUAL = """HloModule pjit_xmap_dummy.5

ENTRY %main.21 (Arg_0.1: f32[4,4,8], Arg_1.2: f32[4,8]) -> (f32[4,4,8], f32[4]) {
  %Arg_0.1 = f32[4,4,8]{2,1,0} parameter(0), sharding={devices=[4,1,1]<=[4]}
  %copy.3 = f32[4,4,8]{2,1,0} copy(f32[4,4,8]{2,1,0} %Arg_0.1), sharding={devices=[4,1,1]<=[4]}
  %custom-call.4 = f32[1,4,8]{2,1,0} custom-call(f32[4,4,8]{2,1,0} %copy.3), custom_call_target="SPMDFullToShardShape", sharding={manual}
  %reshape.7 = f32[4,8]{1,0} reshape(f32[1,4,8]{2,1,0} %custom-call.4), sharding={manual}
  %Arg_1.2 = f32[4,8]{1,0} parameter(1), sharding={replicated}
  %copy.2 = f32[4,8]{1,0} copy(f32[4,8]{1,0} %Arg_1.2), sharding={replicated}
  %custom-call.6 = f32[4,8]{1,0} custom-call(f32[4,8]{1,0} %copy.2), custom_call_target="SPMDFullToShardShape", sharding={manual}
  %custom-call.8 = (f32[4,8]{1,0}, f32[1]{0}) custom-call(f32[4,8]{1,0} %reshape.7, f32[4,8]{1,0} %custom-call.6), custom_call_target="dummy", operand_layout_constraints={f32[4,8]{1,0}, f32[4,8]{1,0}}, api_version=API_VERSION_STATUS_RETURNING, sharding={{manual}, {manual}}
  %get-tuple-element.9 = f32[4,8]{1,0} get-tuple-element((f32[4,8]{1,0}, f32[1]{0}) %custom-call.8), index=0, sharding={manual}
  %reshape.11 = f32[1,4,8]{2,1,0} reshape(f32[4,8]{1,0} %get-tuple-element.9), sharding={manual}
  %copy.1 = f32[1,4,8]{2,1,0} copy(f32[1,4,8]{2,1,0} %reshape.11), sharding={manual}
  %custom-call.14 = f32[4,4,8]{2,1,0} custom-call(f32[1,4,8]{2,1,0} %copy.1), custom_call_target="SPMDShardToFullShape", sharding={devices=[4,1,1]<=[4]}
  %reshape.18 = f32[4,4,8]{2,1,0} reshape(f32[4,4,8]{2,1,0} %custom-call.14), sharding={devices=[4,1,1]<=[4]}
  %get-tuple-element.10 = f32[1]{0} get-tuple-element((f32[4,8]{1,0}, f32[1]{0}) %custom-call.8), index=1, sharding={manual}
  %reshape.12 = f32[1,1]{1,0} reshape(f32[1]{0} %get-tuple-element.10), sharding={manual}
  %copy = f32[1,1]{1,0} copy(f32[1,1]{1,0} %reshape.12), sharding={manual}
  %custom-call.16 = f32[4,1]{1,0} custom-call(f32[1,1]{1,0} %copy), custom_call_target="SPMDShardToFullShape", sharding={devices=[4,1]<=[4]}
  %reshape.17 = f32[4]{0} reshape(f32[4,1]{1,0} %custom-call.16), sharding={devices=[4]<=[4]}
  %reshape.19 = f32[4]{0} reshape(f32[4]{0} %reshape.17), sharding={devices=[4]<=[4]}
  ROOT %tuple.20 = (f32[4,4,8]{2,1,0}, f32[4]{0}) tuple(f32[4,4,8]{2,1,0} %reshape.18, f32[4]{0} %reshape.19), sharding={{replicated}, {replicated}}
}
"""


def test_custom_call_in_manual_region_runs_as_written():
    result = partition_in_place(load_module_bytes(CUSTOM_CALL_MANUAL.encode()), 4)
    assert not result.report.replicated_fallbacks
    assert not result.report.unknown_custom_calls
    dummy = next(i for i in result.module.instructions() if i.custom_call_target == "dummy")
    # On the local [1,4,8] -> [4,8] tile and the replicated [4,8] operand, as written.
    assert [list(o.shape.dims) for o in dummy.operands] == [[4, 8], [4, 8]]
    assert [i.opcode for i in result.module.instructions()].count("all-gather") == 2

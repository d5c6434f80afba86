"""Shardy tuple arguments / results and nested manual computations (shard_map in
shard_map), partitioned and checked on 8 CPU devices through jaxlib."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from hlo_spmd.runtime import ensure_host_devices

ensure_host_devices(8)
pytest.importorskip("jax")

from hlo_spmd.ir.io import load_module, module_bytes  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.runtime import verify  # noqa: E402
from hlo_spmd.runtime.module_io import strip_shardings  # noqa: E402

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "hlo"

TUPLE_PARAM = r"""
HloModule shardy_tuple_param, entry_computation_layout={((f32[8,16]{1,0}, f32[16,8]{1,0}), f32[8]{0})->(f32[8,8]{1,0}, f32[8,16]{1,0})}, num_partitions=8, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["x"=2, "y"=4]>}}

ENTRY %main (args: (f32[8,16], f32[16,8]), b: f32[8]) -> (f32[8,8], f32[8,16]) {
  %args = (f32[8,16]{1,0}, f32[16,8]{1,0}) parameter(0), frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{\"x\"}, {\"y\"}]>, <@mesh, [{\"y\"}, {}]>]>"}
  %b = f32[8]{0} parameter(1), frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\"x\"}]>"}
  %a = f32[8,16]{1,0} get-tuple-element(%args), index=0
  %w = f32[16,8]{1,0} get-tuple-element(%args), index=1
  %d = f32[8,8]{1,0} dot(%a, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %bb = f32[8,8]{1,0} broadcast(%b), dimensions={0}
  %e = f32[8,8]{1,0} add(%d, %bb)
  %s = f32[8,16]{1,0} sine(%a)
  %t = (f32[8,8]{1,0}, f32[8,16]{1,0}) tuple(%e, %s)
  ROOT %r = (f32[8,8]{1,0}, f32[8,16]{1,0}) custom-call(%t), custom_call_target="xla.sdy.FuncResultSharding", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{\"x\"}, {}]>, <@mesh, [{}, {\"y\"}]>]>"}
}
"""


def test_tuple_parameter_with_per_value_shardy_sharding():
    """xla.sdy.sharding on a tuple-shaped parameter: one sharding per leaf, each leaf
    partitioned by its own; the results by FuncResultSharding's per-value list."""
    result = partition_in_place(parse_module(TUPLE_PARAM, "t"), 8)
    args = result.module.entry.parameters[0]
    assert [list(s.dims) for s in args.shape.tuple_shapes] == [[4, 4], [4, 8]]
    # XLA's import refuses frontend attributes on a tuple parameter it flattens, so the
    # reference is the same program without the Shardy attributes.
    plain = re.sub(r', frontend_attributes=\{xla\.sdy\.sharding="(?:\\.|[^"\\])*"\}', "",
                   TUPLE_PARAM)
    plain = plain.replace(', custom_call_has_side_effect=true', '')
    original = strip_shardings(module_bytes(parse_module(plain, "plain")))
    report = verify(original, module_bytes(result.module), 8, poison_padding=True)
    assert report.ok, str(report)


def test_tuple_args_attribute_partitions_each_element():
    path = FIX / "handwritten" / "shardy_tuple_args.hlo"
    out = partition_in_place(load_module(str(path)), 8).module
    args = out.entry.parameters[0]
    assert [list(s.dims) for s in args.shape.tuple_shapes] == [[4, 4], [4, 8]]
    report = verify(module_bytes(load_module(str(path))), module_bytes(out), 8,
                    poison_padding=True)
    assert report.ok, str(report)


@pytest.mark.parametrize("name", ["nested_shard_map", "shardy_nested_shard_map"])
def test_nested_manual_computations_match_the_classic_twin(name):
    """shard_map over x inside shard_map over y: the inner psum runs over x groups inside
    each y group, and the Shardy export computes what the classic one does."""
    out = partition_in_place(load_module(str(FIX / f"{name}.pb")), 8).module
    reference = (FIX / "nested_shard_map.pb").read_bytes()
    report = verify(reference, module_bytes(out), 8, poison_padding=True)
    assert report.ok, str(report)
    from hlo_spmd.ir.shape_inference import replica_groups

    (ar,) = [i for i in out.instructions() if i.opcode == "all-reduce"]
    groups = sorted(sorted(int(d) for d in g) for g in replica_groups(ar.attrs))
    assert groups == [[0, 4], [1, 5], [2, 6], [3, 7]]     # over x, within each y position

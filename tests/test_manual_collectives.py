"""Manual values: user collectives XLA rejects get one-line errors; partition-id in callees.

The modules that run (fully and partially manual values through while, conditional,
call, tuple and get-tuple-element) are hand-written fixtures, partitioned and run on
their device counts by ``test_partition_fixtures``.
"""
from __future__ import annotations

import pytest

from hlo_spmd.errors import HloSpmdError
from hlo_spmd.ir.io import load_module_bytes
from hlo_spmd.passes.partition import partition_in_place

_ADD = """%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
"""

_PARTIAL = """HloModule m, num_partitions=8

""" + _ADD + """
ENTRY %e (x: f32[8,16]) -> f32[8,16] {
  %x = f32[8,16] parameter(0), sharding={devices=[2,4]<=[8]}
  %l = f32[8,4] custom-call(%x), custom_call_target="SPMDFullToShardShape", sharding={devices=[2,1,4]<=[8] last_tile_dims={manual}}
  %r = f32[8,4] OP, sharding={devices=[2,1,4]<=[8] last_tile_dims={manual}}
  ROOT %f = f32[8,16] custom-call(%r), custom_call_target="SPMDShardToFullShape", sharding={devices=[2,4]<=[8]}
}
"""


def _partition(text: str, n: int):
    return partition_in_place(load_module_bytes(text.encode()), n)


@pytest.mark.parametrize("op, fragment", [
    ("all-reduce(%l), channel_id=1, replica_groups={{0,4},{1,5},{2,6},{3,7}}, "
     "use_global_device_ids=true, to_apply=%add", "cross the manual subgroups"),
    ("all-reduce(%l), channel_id=1, replica_groups={}, to_apply=%add",
     "cross the manual subgroups"),
    ("collective-permute(%l), channel_id=1, source_target_pairs={{0,4}}",
     "crosses manual subgroups"),
])
def test_collectives_across_manual_subgroups_are_rejected(op, fragment):
    with pytest.raises(HloSpmdError) as e:
        _partition(_PARTIAL.replace("OP", op), 8)
    assert fragment in str(e.value) and "instruction r" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("op", [
    "all-reduce(%l), channel_id=1, replica_groups=[2,4]<=[8], use_global_device_ids=true, "
    "to_apply=%add",
    "all-reduce(%l), channel_id=1, replica_groups=mesh['x'=2,'y'=4] {'y'}, "
    "use_global_device_ids=true, to_apply=%add",
    "collective-permute(%l), channel_id=1, source_target_pairs={{0,1},{1,2},{2,3},{3,0},"
    "{4,5},{5,6},{6,7},{7,4}}",
])
def test_collectives_within_manual_subgroups_are_kept(op):
    out = _partition(_PARTIAL.replace("OP", op), 8).module
    kept = [i for i in out.instructions() if i.opcode in ("all-reduce", "collective-permute")]
    assert len(kept) == 1
    # Mesh-axis groups come out as device groups (jaxlib's import drops a mesh's order).
    assert kept[0].attrs.WhichOneof("replica_group_list") != "mesh_axes_replica_group_list"


def test_tiled_collective_outside_manual_region_is_rejected():
    # XLA gives a cross-partition all-reduce outside manual regions a meaning only when it
    # is replicated (run across the devices' whole copies): tests/test_manual_xla_reference.py.
    text = """HloModule m, num_partitions=4

""" + _ADD + """
ENTRY %e (x: f32[8]) -> f32[8] {
  %x = f32[8] parameter(0), sharding={devices=[4]<=[4]}
  ROOT %r = f32[8] all-reduce(%x), channel_id=1, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=%add, sharding={devices=[4]<=[4]}
}
"""
    with pytest.raises(HloSpmdError, match="must be replicated") as e:
        _partition(text, 4)
    assert "instruction r" in str(e.value) and "\n" not in str(e.value)

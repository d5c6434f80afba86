"""partition-id in a partially manual region: XLA (jaxlib 0.10.2) refuses it as
ambiguous (HandlePartitionId keeps only a fully manual one), so hlo-spmd refuses it with
a one-line error too; JAX's own form of axis_index there (a fully manual call leaving
through SPMDShardToFullShape, fixtures shard_map_axis_index_partial and its Shardy twin)
partitions and matches (tests/test_partition_fixtures.py)."""
from __future__ import annotations

import pytest

from hlo_spmd.runtime import ensure_host_devices

ensure_host_devices(8)

from hlo_spmd.errors import HloSpmdError  # noqa: E402
from hlo_spmd.ir.io import module_bytes  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402

# Manual over y (4), x (2) automatic; the partition-id carries the region's sharding.
PARTIAL = r"""
HloModule pid_partial_manual, entry_computation_layout={(f32[8,16]{1,0})->f32[8,16]{1,0}}, num_partitions=8

ENTRY %main (a: f32[8,16]) -> f32[8,16] {
  %a = f32[8,16]{1,0} parameter(0), sharding={devices=[2,4]<=[8]}
  %ann = f32[8,16]{1,0} custom-call(%a), custom_call_target="Sharding", sharding={devices=[2,4]<=[8]}
  %local = f32[8,4]{1,0} custom-call(%ann), custom_call_target="SPMDFullToShardShape", sharding={devices=[2,1,4]<=[8] last_tile_dims={manual}}
  %pid = u32[] partition-id()PID_SHARDING
  %f = f32[] convert(%pid), sharding={devices=[4,2]<=[2,4]T(1,0) last_tile_dims={manual, replicated}}
  %fb = f32[8,4]{1,0} broadcast(%f), dimensions={}, sharding={devices=[2,1,4]<=[8] last_tile_dims={manual}}
  %s = f32[8,4]{1,0} add(%local, %fb), sharding={devices=[2,1,4]<=[8] last_tile_dims={manual}}
  %ann2 = f32[8,4]{1,0} custom-call(%s), custom_call_target="Sharding", sharding={devices=[2,1,4]<=[8] last_tile_dims={manual}}
  ROOT %full = f32[8,16]{1,0} custom-call(%ann2), custom_call_target="SPMDShardToFullShape", sharding={devices=[2,4]<=[8]}
}
"""
SUBGROUP = ", sharding={devices=[4,2]<=[2,4]T(1,0) last_tile_dims={manual, replicated}}"


@pytest.mark.parametrize("pid_sharding,where", [(SUBGROUP, "partially manual region"),
                                                ("", "outside a manual region")])
def test_partially_manual_partition_id_is_refused(pid_sharding, where):
    """Annotated with the region's manual subgroup, or left unannotated (a scalar: no
    manual subgroup reaches it, it is replicated): a one-line error naming it."""
    module = parse_module(PARTIAL.replace("PID_SHARDING", pid_sharding), "m")
    with pytest.raises(HloSpmdError) as e:
        partition_in_place(module, 8)
    msg = str(e.value)
    assert "instruction pid" in msg and where in msg and "\n" not in msg


@pytest.mark.parametrize("pid_sharding", [SUBGROUP, ""])
def test_xla_refuses_it_too(pid_sharding):
    pytest.importorskip("jax")
    from hlo_spmd.runtime.xla_reference import xla_partitioned_module

    module = parse_module(PARTIAL.replace("PID_SHARDING", pid_sharding), "m")
    with pytest.raises(Exception) as e:
        xla_partitioned_module(module_bytes(module), 8)
    assert "PartitionId instruction is not supported" in str(e.value)

"""Issue 21 items 5-7 in XLA's test style: small HLO modules partitioned by hlo-spmd, run on
N CPU devices against the 1-device run (poisoned padding), and the bytes per device of our
program compared with XLA's own partitioned program for the same module (both counted by
hlo_spmd.stats)."""
from __future__ import annotations

import pytest

from hlo_spmd.ir.io import load_module_bytes, module_bytes
from hlo_spmd.stats import module_stats

from test_partition_shapes import check, module  # shared helpers (same directory)

pytest.importorskip("jax")

from hlo_spmd.runtime.xla_reference import xla_partitioned_module  # noqa: E402


def kinds(result, n: int) -> list[str]:
    return [r.kind for r in module_stats(result.module, n).records]


def ours_and_xla(text: str, result, n: int) -> tuple[float, float]:
    """(our bytes per device, XLA's bytes per device) for ``text`` on ``n`` devices."""
    proto = module_bytes(load_module_bytes(text.encode()))
    xla = load_module_bytes(xla_partitioned_module(proto, n), "xla")
    return (module_stats(result.module, n).total_bytes_per_device,
            module_stats(xla, n).total_bytes_per_device)


# -- item 7: a stage buffer's last stage read by every stage ----------------------------------
def test_last_stage_to_every_stage_is_one_masked_all_reduce():
    # The pipelined loop's state[-1]: a [1,8,16] slice of a 4-way stage-sharded buffer has
    # data in one of the 4 tiles. Gathering the 4 tiles moves 3 tiles (768 B); the holder's
    # tile summed with zeros moves 2*(3/4) of one tile (384 B), as XLA's program does.
    text = module("""
  p = f32[4,8,16] parameter(0), sharding={devices=[4,2,1]<=[8]}
  s = f32[1,8,16] slice(p), slice={[3:4], [0:8], [0:16]}, sharding={devices=[4,2,1]<=[8]}
  ROOT r = f32[8,16] reshape(s), sharding={devices=[2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}""")
    result = check(text, 8)
    assert "all-gather" not in kinds(result, 8)
    assert "all-reduce" in kinds(result, 8)
    ours, xla = ours_and_xla(text, result, 8)
    assert ours <= xla, (ours, xla)


def test_three_of_eight_tiles_hold_data_masked_sum_places_each():
    # 3 rows in 8 tiles of 1 row: tiles 0..2 hold data, 3..7 are padding; the sum places
    # each at its offset (2*(7/8)*3 rows against the gather's 7 rows).
    text = module("""
  p = f32[3,6] parameter(0), sharding={devices=[8,1]<=[8]}
  ROOT r = f32[3,6] copy(p), sharding={replicated}""")
    result = check(text, 8)
    assert kinds(result, 8) == ["all-reduce"]
    ours, xla = ours_and_xla(text, result, 8)
    assert ours <= xla, (ours, xla)

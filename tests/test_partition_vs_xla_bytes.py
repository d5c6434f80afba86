"""Issue 21 items 5-7 in XLA's test style: small HLO modules partitioned by hlo-spmd, run on
N CPU devices against the 1-device run (poisoned padding), and the bytes per device of our
program compared with XLA's own partitioned program for the same module (both counted by
hlo_spmd.stats)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from hlo_spmd.ir.io import load_module_bytes, module_bytes
from hlo_spmd.stats import module_stats

from test_partition_shapes import check, module  # shared helpers (same directory)

pytest.importorskip("jax")

from hlo_spmd.runtime.xla_reference import xla_partitioned_module  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


# -- item 5: values on one device ({maximal device=k}) ----------------------------------------
MINMAX = """
minmax {
  lv = f32[] parameter(0)
  rv = f32[] parameter(2)
  c = pred[] compare(lv, rv), direction=GT
  v = f32[] select(c, lv, rv)
  li = s32[] parameter(1)
  ri = s32[] parameter(3)
  i = s32[] select(c, li, ri)
  ROOT t = (f32[], s32[]) tuple(v, i)
}
"""


def test_maximal_tuple_reduce_runs_on_its_device():
    # XLA's DeviceMaximalTupleReduce on 8 devices, owner 5: the reduce runs where its
    # operands are; nothing moves (XLA's program all-reduces its results: 406 B).
    text = "HloModule m\n" + MINMAX + """
ENTRY main {
  p0 = f32[28,10] parameter(0), sharding={maximal device=5}
  p1 = s32[28,10] parameter(1), sharding={maximal device=5}
  i0 = f32[] parameter(2), sharding={maximal device=5}
  i1 = s32[] parameter(3), sharding={maximal device=5}
  ROOT r = (f32[28], s32[28]) reduce(p0, p1, i0, i1), dimensions={1}, to_apply=minmax,
    sharding={{maximal device=5}, {maximal device=5}}
}
"""
    result = check(text, 8)
    assert kinds(result, 8) == []
    ours, xla = ours_and_xla(text, result, 8)
    assert ours == 0.0 and xla > 0.0, (ours, xla)


def test_maximal_tuple_sort_runs_on_its_device():
    # XLA's DeviceMaximalTupleSort: a sort on device 0, not the replicated fallback.
    text = module("""
  p = f32[3] parameter(0), sharding={maximal device=0}
  i = s32[3] iota(), iota_dimension=0, sharding={maximal device=0}
  ROOT s = (f32[3], s32[3]) sort(p, i), dimensions={0}, to_apply=ge,
    sharding={{maximal device=0}, {maximal device=0}}""").replace("ENTRY", """ge {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = s32[] parameter(2)
  d = s32[] parameter(3)
  ROOT g = pred[] compare(a, b), direction=GT
}

ENTRY""")
    result = check(text, 2)
    assert kinds(result, 2) == []


def test_maximal_to_another_device_is_one_permute():
    # One transfer owner -> new owner (8192 B), where select + all-reduce moves 2*(7/8)
    # of the value from every device (XLA: 14336 B).
    text = module("""
  p = f32[64,32] parameter(0), sharding={maximal device=2}
  ROOT c = f32[64,32] copy(p), sharding={maximal device=5}""")
    result = check(text, 8)
    (rec,) = module_stats(result.module, 8).records
    assert rec.kind == "collective-permute" and rec.bytes_per_device == 64 * 32 * 4
    ours, xla = ours_and_xla(text, result, 8)
    assert ours < xla, (ours, xla)


def test_ops_on_one_device_take_operands_there_and_move_once():
    # A multiply, reduce and tuple on device 3 (one operand tiled: gathered whole once),
    # read by a negate on device 6: the only moves are the tiled operand and one permute
    # of the [64] result.
    text = module("""
  p = f32[64,32] parameter(0), sharding={maximal device=3}
  q = f32[64,32] parameter(1), sharding={devices=[4,2]<=[8]}
  m = f32[64,32] multiply(p, q), sharding={maximal device=3}
  z = f32[] constant(0), sharding={maximal device=3}
  r = f32[64] reduce(m, z), dimensions={1}, to_apply=add, sharding={maximal device=3}
  t = (f32[64], f32[64,32]) tuple(r, m), sharding={{maximal device=3}, {maximal device=3}}
  g = f32[64] get-tuple-element(t), index=0, sharding={maximal device=3}
  ROOT o = f32[64] negate(g), sharding={maximal device=6}""").replace("ENTRY", """add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY""")
    result = check(text, 8)
    assert kinds(result, 8) == ["all-gather", "all-gather", "collective-permute"]
    assert module_stats(result.module, 8).records[-1].bytes_per_device == 64 * 4
    ours, xla = ours_and_xla(text, result, 8)
    assert ours <= xla, (ours, xla)


@pytest.mark.parametrize("et", ["f32", "pred", "s32"])
@pytest.mark.parametrize("dims,target,want", [
    # 2-D tiling over every device: one reduce-scatter of 7/8 of the (padded) value.
    ("64,32", "{devices=[4,2]<=[8]}", ["reduce-scatter"]),
    ("13,7", "{devices=[4,2]<=[8]}", ["reduce-scatter"]),
    # Partially replicated: reduce-scatter to (tile, holder) chunks, gather each tile.
    ("64,32", "{devices=[2,2,2]<=[8] last_tile_dim_replicate}", ["reduce-scatter", "all-gather"]),
    ("6,5", "{devices=[1,2,4]<=[8] last_tile_dim_replicate}", ["reduce-scatter", "all-gather"]),
    # Tiny and uneven: padding makes the scatter dearer, select + all-reduce stays.
    ("3", "{devices=[8]<=[8]}", ["all-reduce"]),
])
def test_maximal_to_tiled_scatters_the_owners_value(et, dims, target, want):
    text = module(f"""
  p = {et}[{dims}] parameter(0), sharding={{maximal device=6}}
  ROOT c = {et}[{dims}] copy(p), sharding={target}""")
    result = check(text, 8)
    assert kinds(result, 8) == want
    ours, xla = ours_and_xla(text, result, 8)
    assert ours <= xla, (ours, xla)
    if want[0] == "reduce-scatter" and "64" in dims:
        assert ours < xla, (ours, xla)


# -- item 6: reshapes merging / splitting a sharded dim with halo exchange -------------------
@pytest.mark.parametrize("n,src,dst,want", [
    # XLA's ReshapeMergeDimsWithHaloExchange: [7,10] rows split 4+3; each local [4,10]
    # is 8 result rows of 5, and device 1 needs result row 7 from device 0 (120 B), where
    # gathering the operand moves 960 B.
    (2, "s32[2,3,7,10] parameter(0), sharding={devices=[1,1,2,1]0,1}",
     "s32[3,2,1,14,5] reshape(p), sharding={devices=[1,1,1,2,1]0,1}", ["collective-permute"]),
    # ... partially replicated (PartialReplicateReshapeMergeDimsWithHaloExchange).
    (4, "s32[2,3,7,10] parameter(0), sharding={devices=[1,1,2,1,2]<=[4] last_tile_dim_replicate}",
     "s32[3,2,1,14,5] reshape(p), sharding={devices=[1,1,1,2,1,2]<=[4] last_tile_dim_replicate}",
     ["collective-permute"]),
    # ReshapePartialHaloExchange on 8 devices: [14] -> [2,7] split 4 ways is cut on the
    # operand (windows of 7 rows from tiles of 4) before the local reshape.
    (8, "f32[4,14,4] parameter(0), sharding={devices=[2,4,1]<=[8]}",
     "f32[2,2,2,7,2,2] reshape(p), sharding={devices=[2,1,4,1,1,1]<=[8]}",
     ["collective-permute", "collective-permute"]),
    # Uneven on both sides but every tile maps onto its result tile: no traffic.
    (8, "s32[2,3,7,10] parameter(0), sharding={devices=[1,1,8,1]<=[8]}",
     "s32[3,2,1,14,5] reshape(p), sharding={devices=[1,1,1,8,1]<=[8]}", []),
    (8, "f32[6,5] parameter(0), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}",
     "f32[3,10] reshape(p), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}", []),
    # [5,9,3] -> [15,9]: tiles of 2 x 27 elements are 6 result rows; result tiles are 4.
    (8, "f32[5,9,3] parameter(0), sharding={devices=[4,1,1,2]<=[8] last_tile_dim_replicate}",
     "f32[15,9] reshape(p), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}",
     ["collective-permute"]),
])
def test_reshape_uneven_sharded_dim_exchanges_halos(n, src, dst, want):
    text = module(f"""
  p = {src}
  ROOT r = {dst}""")
    result = check(text, n)
    assert kinds(result, n) == want
    ours, xla = ours_and_xla(text, result, n)
    assert ours <= xla, (ours, xla)


@pytest.mark.parametrize("src,dst", [
    # ReshapeWithReshard3 on 8 devices: [10,8] tiled 2 x 4 merged into [80] tiled 8: the
    # minor dim's tiling is gathered within groups of 4, the major one kept,
    # the reshaped tiles then cut locally, where the whole operand used to be gathered.
    ("bf16[10,8,2,2] parameter(0), sharding={devices=[2,4,1,1]<=[8]}",
     "bf16[80,4] reshape(p), sharding={devices=[8,1]<=[8]}"),
    ("f32[6,8,3] parameter(0), sharding={devices=[2,2,2]<=[8]}",
     "f32[48,3] reshape(p), sharding={devices=[4,2]<=[8]}"),
])
def test_reshape_gathers_only_the_minor_dims_of_a_merge(src, dst):
    text = module(f"""
  p = {src}
  ROOT r = {dst}""")
    result = check(text, 8)
    assert kinds(result, 8) == ["all-gather"]
    ours, xla = ours_and_xla(text, result, 8)
    assert ours <= xla, (ours, xla)


# -- item 2 leftover: a wide gather window on a sharded indexed dim ---------------------------
@pytest.mark.parametrize("table,sharding,indices,isharding,sizes,out_sharding,starts", [
    # Windows of 4 rows of a row-sharded table: each shard also holds the 3 rows after it
    # (one permute of 3 rows, 768 B), the shard holding a window's start row reads it, the
    # rest are masked and summed (3584 B); gathering the table moves 229376 B (XLA).
    ("f32[1024,64]", "{devices=[8,1]<=[8]}", "s32[2,1]", "{replicated}", (4, 64),
     "{replicated}", [126, 2000]),
    # Uneven rows (1001 over 8, shards of 126), indices and result sharded on batch;
    # windows crossing a shard boundary, clamped at both ends.
    ("f32[1001,16]", "{devices=[8,1]<=[8]}", "s32[4,1]",
     "{devices=[2,1,4]<=[8] last_tile_dim_replicate}", (7, 16),
     "{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}", [123, -3, 998, 630]),
])
def test_wide_gather_window_on_sharded_indexed_dim_is_a_windowed_read(
        table, sharding, indices, isharding, sizes, out_sharding, starts):
    et = table.split("[")[0]
    batch = indices.split("[")[1].split(",")[0]
    rows, cols = (int(v) for v in table.split("[")[1].rstrip("]").split(","))
    values = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    inputs = [[values, np.array(starts, np.int32).reshape(-1, 1)]]
    text = module(f"""
  p = {table} parameter(0), sharding={sharding}
  i = {indices} parameter(1), sharding={isharding}
  ROOT g = {et}[{batch},{sizes[0]},{sizes[1]}] gather(p, i), offset_dims={{1,2}},
    collapsed_slice_dims={{}}, start_index_map={{0}}, index_vector_dim=1,
    slice_sizes={{{sizes[0]},{sizes[1]}}}, sharding={out_sharding}""")
    result = check(text, 8, inputs=inputs)
    assert "collective-permute" in kinds(result, 8) and "all-reduce" in kinds(result, 8)
    ours, xla = ours_and_xla(text, result, 8)
    assert ours * 10 < xla, (ours, xla)


def test_op_on_one_device_from_whole_operands_is_whole_everywhere():
    # The handwritten maximal_sharding fixture: a reduce and a broadcast "on device 1" of a
    # replicated x; every device computes the same value, so the replicated subtract reads
    # it without a move (main: an all-reduce of the scalar; XLA: nothing).
    text = open(os.path.join(ROOT, "fixtures", "hlo", "handwritten", "maximal_sharding.hlo")).read()
    result = check(text, 8)
    assert kinds(result, 8) == []
    ours, xla = ours_and_xla(text, result, 8)
    assert ours <= xla, (ours, xla)


# -- item 6: one all-to-all moving several dims ----------------------------------------------
def test_two_dims_move_in_one_all_to_all_keeping_device_order():
    # XLA's MultipleSourceTargetDimsInOneAllToAll1 at a smaller size: dim 1's 4 tiles go
    # whole to dim 3 and dim 2's 2 to dim 0; every device keeps its coordinates, so one
    # all-to-all does it (splitting dim 1's factor between dims 0 and 3 needed a permute
    # after it: twice the bytes).
    text = module("""
  p = s32[8,8,8,8] parameter(0), sharding={devices=[1,4,2,1]<=[8]}
  ROOT c = s32[8,8,8,8] copy(p), sharding={devices=[2,1,1,4]<=[4,2]T(1,0)}""")
    result = check(text, 8)
    assert kinds(result, 8) == ["all-to-all"]
    ours, xla = ours_and_xla(text, result, 8)
    assert ours <= xla, (ours, xla)

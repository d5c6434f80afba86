"""What the slice / pad / concatenate handlers communicate: the collectives they choose
(bytes per device as collectives/cost.py counts them) between exchanging windows per
tiled dim and computing with the moved dim's tiling on another dim (all-to-all there and
back), and that the chosen programs run correctly (poisoned padding, on XLA)."""
from __future__ import annotations

import numpy as np
import pytest

from hlo_spmd.passes.partition.handlers.slicing import move_tiling, plan_window
from hlo_spmd.sharding import HloSharding
from hlo_spmd.stats import module_stats

from test_partition_shapes import check, module  # shared helpers (same directory)

pytest.importorskip("jax")


def comm(result, n: int) -> list[tuple[str, int, float]]:
    """(kind, operand bytes, bytes per device) of every collective, in program order."""
    return [(r.kind, r.operand_bytes, r.bytes_per_device)
            for r in module_stats(result.module, n).records]


def total(result, n: int) -> float:
    return module_stats(result.module, n).total_bytes_per_device


# -- concatenate on a sharded dim --------------------------------------------------------------
def test_concat_sharded_dim_moves_tiling_with_all_to_all():
    # Windows would cost four collective-permutes of a whole f32[4,2] shard (128 B);
    # moving the 4-way tiling of dim 1 onto dim 0 costs 3/4 of each operand shard (24 B
    # each) plus 3/4 of the result shard (48 B): 96 B.
    text = module("""
  a = f32[8,8] parameter(0), sharding={devices=[2,4]<=[8]}
  b = f32[8,8] parameter(1), sharding={devices=[2,4]<=[8]}
  ROOT c = f32[8,16] concatenate(a, b), dimensions={1}, sharding={devices=[2,4]<=[8]}""")
    result = check(text, 8)
    assert comm(result, 8) == [("all-to-all", 32, 24.0), ("all-to-all", 32, 24.0),
                               ("all-to-all", 64, 48.0)]


def test_concat_sharded_dim_1d_tiling_moves_to_other_dim():
    text = module("""
  a = f32[16,4] parameter(0), sharding={devices=[4,1]<=[4]}
  b = f32[16,4] parameter(1), sharding={devices=[4,1]<=[4]}
  ROOT c = f32[32,4] concatenate(a, b), dimensions={0}, sharding={devices=[4,1]<=[4]}""")
    result = check(text, 4)
    assert comm(result, 4) == [("all-to-all", 64, 48.0), ("all-to-all", 64, 48.0),
                               ("all-to-all", 128, 96.0)]


def test_concat_small_shift_keeps_window_exchange():
    # Prepending two rows shifts every tile by two: three permutes of half a shard (96 B)
    # beat the all-to-all route (about 240 B).
    text = module("""
  a = f32[16,8] parameter(0), sharding={devices=[4,1]<=[4]}
  b = f32[2,8] parameter(1), sharding={devices=[4,1]<=[4]}
  ROOT c = f32[18,8] concatenate(b, a), dimensions={0}, sharding={devices=[4,1]<=[4]}""")
    result = check(text, 4)
    assert [k for k, _, _ in comm(result, 4)] == ["collective-permute"] * 3
    assert total(result, 4) == 96.0


# -- pad / slice on a sharded dim: only the halo travels --------------------------------------
def test_pad_sharded_dim_sends_only_the_halo():
    # Tile 1 of the result is operand rows [3, 8): one row from tile 0 (8 B), where one
    # all-gather of the dim would move a whole f32[4,2] shard (32 B).
    text = module("""
  x = f32[8,2] parameter(0), sharding={devices=[2,1]<=[2]}
  c = f32[] constant(1)
  ROOT p = f32[10,2] pad(x, c), padding=2_0x0_0, sharding={devices=[2,1]<=[2]}""")
    result = check(text, 2)
    assert comm(result, 2) == [("collective-permute", 8, 8.0)]


def test_pad_then_slice_sharded_dim_sends_one_row():
    # The fixture elementwise_broadcast_reduce's pad + slice: the pad is local (every
    # window lies in the own shard), the slice needs one row of its left neighbour.
    text = module("""
  x = f32[8,8] parameter(0), sharding={devices=[2,4]<=[8]}
  c = f32[] constant(1)
  p = f32[10,8] pad(x, c), padding=1_1x0_0, sharding={devices=[2,4]<=[8]}
  ROOT s = f32[8,8] slice(p), slice={[0:8], [0:8]}, sharding={devices=[2,4]<=[8]}""")
    result = check(text, 8)
    assert comm(result, 8) == [("collective-permute", 8, 8.0)]


def test_slice_senders_cut_what_their_receiver_needs():
    # Tiles 2 and 3 need columns [2, 4) of tile 1 and [0, 2) of tile 2: one permute in
    # which every sender cuts its receiver's half shard at its own offset (32 B, not 64).
    text = module("""
  x = f32[4,16] parameter(0), sharding={devices=[1,4]<=[4]}
  ROOT s = f32[4,8] slice(x), slice={[0:4], [2:10]}, sharding={devices=[1,4]<=[4]}""")
    rng = np.random.default_rng(0)
    result = check(text, 4, inputs=[[rng.normal(size=(4, 16)).astype(np.float32)]])
    assert comm(result, 4) == [("collective-permute", 32, 32.0)]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_pad_interior_and_negative_edges_run(n):
    text = module(f"""
  x = f32[13,6] parameter(0), sharding={{devices=[{n},1]<=[{n}]}}
  c = f32[] constant(-2)
  ROOT p = f32[26,6] pad(x, c), padding=-3_4_1x0_0, sharding={{devices=[{n},1]<=[{n}]}}""")
    check(text, n)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_concat_three_operands_2d_runs(n):
    h = max(n // 2, 1)
    text = module(f"""
  a = f32[6,5] parameter(0), sharding={{devices=[2,{h}]<=[{n}]}}
  b = f32[6,3] parameter(1), sharding={{devices=[2,{h}]<=[{n}]}}
  d = f32[6,7] parameter(2), sharding={{devices=[{h},2]<=[{n}]}}
  ROOT c = f32[6,15] concatenate(a, b, d), dimensions={{1}}, sharding={{devices=[2,{h}]<=[{n}]}}""")
    check(text, n)


# -- the planner's pieces ----------------------------------------------------------------------
def test_plan_window_halo_instead_of_all_gather():
    # Two tiles of 4; windows [-2, 3) and [3, 8): tile 1 needs one element of tile 0.
    plan = plan_window(2, 2, 4, 8, np.array([-2, 3]), 5)
    assert plan.kind == "pieces" and plan.rows == 1 and plan.collectives == 1


def test_plan_window_all_gather_when_every_tile_needs_everything():
    plan = plan_window(4, 4, 4, 16, np.zeros(4, np.int64), 16)
    assert plan.kind == "gather" and plan.rows == 12 and plan.collectives == 1


def test_plan_window_per_sender_offsets():
    # Tiles 2 and 3 need [2, 4) of shard 1 and [0, 2) of shard 2: one round of width 2.
    plan = plan_window(4, 4, 4, 16, np.array([2, 4, 6, 8]), 2)
    assert plan.kind == "pieces" and plan.rows == 2
    (piece,) = plan.pieces
    (rnd,) = piece.rounds
    assert rnd.width == 2 and sorted(rnd.pairs) == [(1, 2), (2, 3)]
    assert rnd.send[1] == 2 and rnd.send[2] == 0


def test_plan_window_remembers_plans_and_freezes_their_tables():
    # The same window asked again (a numpy array or a list of the same numbers) is the
    # same plan; a shared plan's tables cannot be written into by a caller.
    plan = plan_window(4, 4, 4, 16, np.array([2, 4, 6, 8]), 2)
    assert plan_window(4, 4, 4, 16, [2, 4, 6, 8], 2) is plan
    assert plan_window(4, 4, 4, 16, np.array([2, 4, 6, 9]), 2) is not plan
    (piece,) = plan.pieces
    for table in (plan.starts, plan.real, piece.src, piece.nlo, piece.rounds[0].send):
        with pytest.raises(ValueError):
            table[0] = 7


def test_plan_window_needed_width_limits_what_travels():
    # Tile 0's window [2, 6) reaches two elements into tile 1; when only its first two
    # positions matter (the rest is the result's padding), nothing travels.
    full = plan_window(2, 2, 4, 8, np.array([2, 6]), 4)
    cut = plan_window(2, 2, 4, 8, np.array([2, 6]), 4, need=np.array([2, 4]))
    assert full.rows == 2 and cut.rows == 0 and cut.collectives == 0


def test_move_tiling_device_order():
    s = HloSharding.from_string("{devices=[2,4]<=[8]}")
    assert move_tiling(s, 1, 0) == HloSharding.from_string("{devices=[8,1]<=[8]}")
    moved = move_tiling(s, 0, 1)
    assert moved.tile_assignment.array().ravel().tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    partial = HloSharding.from_string("{devices=[2,2,2]<=[8] last_tile_dim_replicate}")
    out = move_tiling(partial, 0, 1)
    assert out.replicate_on_last_tile_dim and out.tile_dims_for_data() == (1, 4)

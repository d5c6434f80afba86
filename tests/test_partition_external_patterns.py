"""Patterns of XLA's own partitioner tests (written here, not copied) where hlo-spmd moved
more bytes than XLA: each module runs partitioned on 8 CPU devices against the one-device
run, and its bytes per device are compared with XLA's partitioned module
(benchmarks/external_suite.py measures the whole external suite)."""
from __future__ import annotations

import pytest

pytest.importorskip("jax")

from test_partition_gather_scatter import ADD, check  # noqa: E402


# -- gather / scatter: the operand sharded on an indexed dim and on a passthrough dim, the
# indices sharded on batch over the same devices as the passthrough dim ---------------------
def test_scatter_keeps_row_sharding_and_takes_batch_from_indices():
    # Operand rows on d % 4 and columns on d // 4; the indices' batch also on d // 4. Keeping
    # the rows (trivially sliced) and the indices' batch means gathering only the columns
    # (2-way) and one all-reduce of a [2,16] partial over the batch devices, not the whole
    # operand gathered.
    text = f"""HloModule m
{ADD}
ENTRY %main (x: f32[8,16], i: s32[4,16,1], u: f32[4,16,16]) -> f32[8,16] {{
  %x = f32[8,16] parameter(0), sharding={{devices=[4,2]<=[2,4]T(1,0)}}
  %i = s32[4,16,1] parameter(1), sharding={{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}}
  %u = f32[4,16,16] parameter(2), sharding={{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}}
  ROOT %s = f32[8,16] scatter(%x, %i, %u), update_window_dims={{2}}, inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=2, to_apply=%add, sharding={{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}}
}}
"""
    out, ours = check(text, 8)
    # all-gather of the columns: 2x16x4 B - 64 B = 64 B; all-reduce of [2,16] f32 over 2
    # devices: 2 * (1/2) * 128 B = 128 B.
    assert ours == 64 + 128, ours


def test_gather_keeps_row_sharding_and_takes_batch_from_indices():
    text = """HloModule m
ENTRY %main (x: f32[8,16], i: s32[4,16,1]) -> f32[4,16,16] {
  %x = f32[8,16] parameter(0), sharding={devices=[4,2]<=[2,4]T(1,0)}
  %i = s32[4,16,1] parameter(1), sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}
  ROOT %g = f32[4,16,16] gather(%x, %i), offset_dims={2}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=2, slice_sizes={1,16}, sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}
}
"""
    check(text, 8)


def test_text_without_module_header_loads():
    # XLA's parser takes a module that starts at its ENTRY computation; so does hlo_spmd.
    import hlo_spmd

    text = """ENTRY main {
  p = f32[8,4] parameter(0), sharding={devices=[8,1]<=[8]}
  ROOT n = f32[8,4] negate(p), sharding={devices=[8,1]<=[8]}
}
"""
    r = hlo_spmd.partition(text, 8)
    assert [tuple(i.shape.dims) for i in r.module.entry.parameters] == [(1, 4)]


# -- an indexed dim sliced whole (slice size = dim size) is pass-through ----------------------
def test_gather_indexed_dim_sliced_whole_stays_sharded():
    # Dim 1 is in start_index_map but sliced whole: the gather clamps its start to 0, so
    # its sharding passes through to the result with no communication.
    text = """HloModule m
ENTRY %main (x: f32[6,16], i: s32[10,2]) -> f32[10,16] {
  %x = f32[6,16] parameter(0), sharding={devices=[1,8]<=[8]}
  %i = s32[10,2] parameter(1), sharding={replicated}
  ROOT %g = f32[10,16] gather(%x, %i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,16}, sharding={devices=[1,8]<=[8]}
}
"""
    out, ours = check(text, 8)
    assert ours == 0


@pytest.mark.parametrize("fn", ["add", "set"])
def test_scatter_indexed_dim_with_whole_window_stays_sharded(fn):
    # Only start 0 is in bounds on the whole-window dim: every other index drops its window,
    # on every shard as globally. %i holds both: its dim-1 index is 0 where the random
    # value is at most 8, else the value (9..18, out of bounds).
    text = f"""HloModule m
{ADD}
ENTRY %main (x: f32[6,16], r: s32[10,2], u: f32[10,16]) -> f32[6,16] {{
  %x = f32[6,16] parameter(0), sharding={{devices=[1,4,2]<=[8] last_tile_dim_replicate}}
  %r = s32[10,2] parameter(1), sharding={{replicated}}
  %eight = s32[10,2] constant({{{{0,8}},{{0,8}},{{0,8}},{{0,8}},{{0,8}},{{0,8}},{{0,8}},{{0,8}},{{0,8}},{{0,8}}}})
  %zero = s32[10,2] constant({{{{0,0}},{{0,0}},{{0,0}},{{0,0}},{{0,0}},{{0,0}},{{0,0}},{{0,0}},{{0,0}},{{0,0}}}})
  %far = pred[10,2] compare(%r, %eight), direction=GT
  %i = s32[10,2] select(%far, %r, %zero), sharding={{replicated}}
  %u = f32[10,16] parameter(2), sharding={{devices=[1,4,2]<=[8] last_tile_dim_replicate}}
  ROOT %s = f32[6,16] scatter(%x, %i, %u), update_window_dims={{1}}, inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0,1}}, index_vector_dim=1, to_apply=%{fn}, sharding={{devices=[1,4,2]<=[8] last_tile_dim_replicate}}
}}
"""
    out, ours = check(text, 8)
    assert ours == 0


# -- implicit batching dims: an iota in the indices indexes an operand dim -------------------
@pytest.mark.parametrize("rows", [8, 6])
def test_gather_with_iota_indices_is_index_parallel(rows):
    # Index component 0 is an iota along indices dim 1, indexing operand dim 0 (split 4
    # ways like indices dim 1): each device's indices name its own rows; component 1 is
    # data over operand dim 1, which stays whole. No communication, as XLA.
    # rows=6: uneven shards (2, 2, 2, 0 rows), padded indices.
    text = f"""HloModule m
ENTRY %main (x: f32[{rows},6,3], r: s32[1,{rows},5]) -> f32[{rows},5,3] {{
  %x = f32[{rows},6,3] parameter(0), sharding={{devices=[4,1,1,2]<=[8] last_tile_dim_replicate}}
  %r = s32[1,{rows},5] parameter(1), sharding={{devices=[1,4,1,2]<=[8] last_tile_dim_replicate}}
  %io = s32[1,{rows},5] iota(), iota_dimension=1, sharding={{devices=[1,4,1,2]<=[8] last_tile_dim_replicate}}
  %i = s32[2,{rows},5] concatenate(%io, %r), dimensions={{0}}, sharding={{devices=[1,4,1,2]<=[8] last_tile_dim_replicate}}
  ROOT %g = f32[{rows},5,3] gather(%x, %i), offset_dims={{2}}, collapsed_slice_dims={{0,1}}, start_index_map={{0,1}}, index_vector_dim=0, slice_sizes={{1,1,3}}, sharding={{devices=[4,1,1,2]<=[8] last_tile_dim_replicate}}
}}
"""
    out, ours = check(text, 8)
    assert ours == 0


@pytest.mark.parametrize("rows", [8, 6])
@pytest.mark.parametrize("fn", ["add", "set"])
def test_scatter_with_iota_indices_is_index_parallel(fn, rows):
    text = f"""HloModule m
{ADD}
ENTRY %main (x: f32[{rows},6,3], r: s32[{rows},5,1], u: f32[{rows},5,3]) -> f32[{rows},6,3] {{
  %x = f32[{rows},6,3] parameter(0), sharding={{devices=[4,1,2]<=[8]}}
  %r = s32[{rows},5,1] parameter(1), sharding={{devices=[4,1,1,2]<=[8] last_tile_dim_replicate}}
  %io = s32[{rows},5,1] iota(), iota_dimension=0, sharding={{devices=[4,1,1,2]<=[8] last_tile_dim_replicate}}
  %i = s32[{rows},5,2] concatenate(%io, %r), dimensions={{2}}, sharding={{devices=[4,1,1,2]<=[8] last_tile_dim_replicate}}
  %u = f32[{rows},5,3] parameter(2), sharding={{devices=[4,1,2]<=[8]}}
  ROOT %s = f32[{rows},6,3] scatter(%x, %i, %u), update_window_dims={{2}}, inserted_window_dims={{0,1}}, scatter_dims_to_operand_dims={{0,1}}, index_vector_dim=2, to_apply=%{fn}, sharding={{devices=[4,1,2]<=[8]}}
}}
"""
    out, ours = check(text, 8)
    assert ours == 0


# -- cholesky / triangular-solve: independent across the batch dims ---------------------------
_SPD = """  %xt = f32[10,8,8] dot(%x, %x), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={2}, sharding={devices=[2,2,2]<=[8]}
  %r = s32[10,8,8] iota(), iota_dimension=1
  %c = s32[10,8,8] iota(), iota_dimension=2
  %eye = pred[10,8,8] compare(%r, %c), direction=EQ
  %k8 = f32[] constant(8)
  %k0 = f32[] constant(0)
  %eight = f32[10,8,8] broadcast(%k8), dimensions={}
  %zero = f32[10,8,8] broadcast(%k0), dimensions={}
  %diag = f32[10,8,8] select(%eye, %eight, %zero)
  %a = f32[10,8,8] add(%xt, %diag), sharding={devices=[2,2,2]<=[8]}
"""


def test_cholesky_keeps_batch_sharding():
    # A symmetric positive definite batch (x x^T + 8 I), sharded on batch and on both
    # matrix dims: only the matrix dims are gathered (XLA does the same).
    text = f"""HloModule m
ENTRY %main (x: f32[10,8,8]) -> f32[10,8,8] {{
  %x = f32[10,8,8] parameter(0), sharding={{devices=[2,2,2]<=[8]}}
{_SPD}  ROOT %l = f32[10,8,8] cholesky(%a), lower=true, sharding={{devices=[2,2,2]<=[8]}}
}}
"""
    out, _ = check(text, 8)
    assert not [f for f in _fallbacks(text) if f[1] == "cholesky"]


@pytest.mark.parametrize("left", ["true", "false"])
def test_triangular_solve_keeps_batch_sharding(left):
    b_shape = "f32[10,8,6]" if left == "true" else "f32[10,6,8]"
    text = f"""HloModule m
ENTRY %main (x: f32[10,8,8], b: {b_shape}) -> {b_shape} {{
  %x = f32[10,8,8] parameter(0), sharding={{devices=[2,2,2]<=[8]}}
{_SPD}  %b = {b_shape} parameter(1), sharding={{devices=[2,2,2]<=[8]}}
  ROOT %s = {b_shape} triangular-solve(%a, %b), left_side={left}, lower=true, transpose_a=NO_TRANSPOSE, sharding={{devices=[2,2,2]<=[8]}}
}}
"""
    check(text, 8)
    assert not [f for f in _fallbacks(text) if f[1] == "triangular-solve"]


def _fallbacks(text):
    from hlo_spmd.ir.text_parser import parse_module
    from hlo_spmd.passes.partition import partition_in_place

    return partition_in_place(parse_module(text), 8, complete=True).report.replicated_fallbacks


# -- reverse of an unevenly tiled dim whose operand is already in mirrored order --------------
@pytest.mark.parametrize("n,shape,dims,op_s,out_s", [
    (2, "f32[3]", "0", "{devices=[2]0,1}", "{devices=[2]1,0}"),
    (4, "f32[10]", "0", "{devices=[4]<=[4]}", "{devices=[4]3,2,1,0}"),
    (8, "f32[10,5]", "0,1", "{devices=[4,2]<=[8]}", "{devices=[4,2]7,6,5,4,3,2,1,0}"),
    (8, "f32[10,6]", "0", "{devices=[4,1,2]<=[8] last_tile_dim_replicate}",
     "{devices=[4,1,2]6,7,4,5,2,3,0,1 last_tile_dim_replicate}"),
])
def test_uneven_reverse_from_mirrored_operand_shifts_by_the_padding(n, shape, dims, op_s,
                                                                     out_s):
    # Reversing each device's piece locally gives the reverse of the padded array: the
    # result shifted by the padding, one halo from a neighbour (XLA moves the same).
    text = f"""HloModule m
ENTRY %main (p: {shape}) -> {shape} {{
  %p = {shape} parameter(0), sharding={op_s}
  ROOT %r = {shape} reverse(%p), dimensions={{{dims}}}, sharding={out_s}
}}
"""
    check(text, n)


def test_non_tuple_sharding_on_a_variadic_scatter_applies_to_every_result():
    # XLA reads a non-tuple sharding on a tuple-shaped instruction as one per leaf; the
    # verifier accepted it only on tuples of the same leaf before.
    text = """HloModule m
%add2 (a0: f32[], a1: f32[], b0: f32[], b1: f32[]) -> (f32[], f32[]) {
  %a0 = f32[] parameter(0)
  %a1 = f32[] parameter(1)
  %b0 = f32[] parameter(2)
  %b1 = f32[] parameter(3)
  %r0 = f32[] add(%a0, %b0)
  %r1 = f32[] add(%a1, %b1)
  ROOT %t = (f32[], f32[]) tuple(%r0, %r1)
}
ENTRY %main (xa: f32[8,16], xb: f32[8,16], i: s32[6], ua: f32[6,16], ub: f32[6,16]) -> (f32[8,16], f32[8,16]) {
  %xa = f32[8,16] parameter(0), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  %xb = f32[8,16] parameter(1), sharding={devices=[1,2,4]<=[8] last_tile_dim_replicate}
  %i = s32[6] parameter(2), sharding={replicated}
  %ua = f32[6,16] parameter(3), sharding={devices=[1,8]<=[8]}
  %ub = f32[6,16] parameter(4), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  ROOT %s = (f32[8,16], f32[8,16]) scatter(%xa, %xb, %i, %ua, %ub), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add2, sharding={devices=[1,8]<=[8]}
}
"""
    import hlo_spmd

    hlo_spmd.load(text)  # the structural verifier accepts it
    out, _ = check(text, 8)
    root = out.entry.root
    assert [tuple(s.dims) for s in root.shape.tuple_shapes] == [(8, 2), (8, 2)]


# -- partially replicated -> tiled where the new tiles straddle the old ones (uneven
# re-tiling): the missing edge rows come from a neighbour tile's holder by
# collective-permute (reshard_routes.HaloSlice), not by gathering the dim whole ----------
@pytest.mark.parametrize("shape, src, dst, n, expect", [
    # 5 rows per tile -> 2: right halos only (up to 3 rows of 4 floats: rows 5-7).
    ("f32[10,4]", "{devices=[2,1,4]<=[8] last_tile_dim_replicate}", "{devices=[8,1]<=[8]}",
     8, 3 * 4 * 4),
    # 3 rows per tile -> 2, both tilings partially replicated: one device needs a row
    # from below, one a row from above (two permutes of 1x5 floats).
    ("f32[6,5]", "{devices=[2,1,3]<=[6] last_tile_dim_replicate}",
     "{devices=[3,1,2]<=[6] last_tile_dim_replicate}", 6, 2 * 5 * 4),
    # 3 rows per tile -> 5: pairs of tiles joined by all-gather hold rows 0-5 and 6-11
    # (not a sharding's tiles), the second half's holders then take row 5 from below:
    # the gather (half of 6x3 floats) and one permute of 1x3 floats.
    ("f32[10,3]", "{devices=[4,1,2]<=[8] last_tile_dim_replicate}",
     "{devices=[2,1,4]<=[8] last_tile_dim_replicate}", 8, 3 * 3 * 4 + 3 * 4),
])
def test_partial_replicate_to_straddling_tiles_exchanges_halos(shape, src, dst, n, expect):
    text = f"""HloModule m
ENTRY %main (x: {shape}) -> {shape} {{
  %x = {shape} parameter(0), sharding={src}
  ROOT %c = {shape} copy(%x), sharding={dst}
}}
"""
    out, ours = check(text, n)
    assert ours == expect, ours
# -- a small slice / transpose of a constant or iota is re-made where it is needed ---------
def test_rearranged_constant_is_remade_not_moved():
    # The slice lives in one device's tile of the sharded constant and the transpose of the
    # sharded iota is needed replicated: both are re-made from the literal / iota on every
    # device (0 bytes), not all-reduced or gathered.
    text = """HloModule m
ENTRY %main (p: f32[4,4]) -> (f32[], f32[4,4]) {
  %p = f32[4,4] parameter(0), sharding={replicated}
  %c = f32[2,8] constant({{0,1,2,3,4,5,6,7},{8,9,10,11,12,13,14,15}}), sharding={devices=[1,8]<=[8]}
  %s = f32[1,1] slice(%c), slice={[1:2], [3:4]}, sharding={devices=[1,8]<=[8]}
  %r = f32[] reshape(%s), sharding={replicated}
  %i = f32[4,4] iota(), iota_dimension=0, sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
  %t = f32[4,4] transpose(%i), dimensions={1,0}, sharding={devices=[1,4,2]<=[8] last_tile_dim_replicate}
  %a = f32[4,4] add(%t, %p), sharding={replicated}
  ROOT %o = (f32[], f32[4,4]) tuple(%r, %a), sharding={{replicated}, {replicated}}
}
"""
    _, ours = check(text, 8)
    assert ours == 0, ours


def test_constant_and_iota_on_one_device_are_remade_on_another():
    # A literal and an iota placed on device 0 and used on device 2 are made there (every
    # device can make them); the parameter's negation on device 0 still moves to device 2.
    text = """HloModule m
ENTRY %main (p: f32[3,5]) -> f32[3,5] {
  %p = f32[3,5] parameter(0), sharding={maximal device=0}
  %n = f32[3,5] negate(%p), sharding={maximal device=0}
  %c = f32[5,3] constant({{1,2,3},{4,5,6},{7,8,9},{10,11,12},{13,14,15}}), sharding={maximal device=0}
  %t = f32[3,5] transpose(%c), dimensions={1,0}, sharding={maximal device=0}
  %i = f32[3,5] iota(), iota_dimension=1, sharding={maximal device=0}
  %m = f32[3,5] multiply(%t, %i), sharding={maximal device=2}
  ROOT %a = f32[3,5] add(%m, %n), sharding={maximal device=2}
}
"""
    _, ours = check(text, 4)
    # only %n moves: one collective-permute of its 60 B from device 0 to device 2
    assert ours == 60, ours




def test_remade_values_inside_manual_subgroups_move_nothing():
    # Within each manual group (4 groups over the columns) the iota and the broadcast
    # constant are the same data whatever their tiling: made again in the user's
    # group-replicated tiling, not gathered; the elementwise op prices its operands by
    # what they would cost to move.
    text = """HloModule m
ENTRY %main (x: f32[8,16]) -> (f32[8,16], f32[8,16]) {
  %x = f32[8,16] parameter(0), sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  %i = f32[8,4] iota(), iota_dimension=0, sharding={devices=[2,1,4]<=[8] last_tile_dims={manual}}
  %c = f32[] constant(3), sharding={devices=[2,4]<=[8] last_tile_dims={replicated, manual}}
  %b = f32[8,4] broadcast(%c), dimensions={}, sharding={devices=[2,1,4]<=[8] last_tile_dims={manual}}
  %m = f32[8,4] multiply(%i, %b), sharding={devices=[2,1,4]<=[8] last_tile_dims={manual}}
  %a = f32[8,4] add(%m, %i), sharding={devices=[1,1,2,4]<=[8] last_tile_dims={replicated, manual}}
  %s = f32[8,4] custom-call(%a), custom_call_target="Sharding", sharding={devices=[1,1,2,4]<=[8] last_tile_dims={replicated, manual}}
  %o = f32[8,16] custom-call(%s), custom_call_target="SPMDShardToFullShape", sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  ROOT %t = (f32[8,16], f32[8,16]) tuple(%o, %x), sharding={{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}, {devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}}
}
"""
    _, ours = check(text, 8)
    assert ours == 0, ours


def test_transpose_and_reshape_of_a_broadcast_are_remade_in_the_users_tiling():
    # The broadcast's operand is whole on every device, so its transpose and reshape are
    # made again in the tiling their users ask for (device order reversed), not permuted
    # (8192 elements: more than a small value re-made whole and cut).
    text = """HloModule m
ENTRY %main (p: f32[16,8]) -> (f32[8,64,16], f32[64,4,4,8]) {
  %p = f32[16,8] parameter(0), sharding={replicated}
  %b = f32[64,16,8] broadcast(%p), dimensions={1,2}, sharding={devices=[2,2,2]<=[8]}
  %t = f32[8,64,16] transpose(%b), dimensions={2,0,1}, sharding={devices=[2,2,2]<=[8]}
  %r = f32[64,4,4,8] reshape(%b), sharding={devices=[2,2,1,2]<=[8]}
  %ct = f32[8,64,16] copy(%t), sharding={devices=[2,2,2]7,6,5,4,3,2,1,0}
  %cr = f32[64,4,4,8] copy(%r), sharding={devices=[2,2,1,2]7,6,5,4,3,2,1,0}
  ROOT %o = (f32[8,64,16], f32[64,4,4,8]) tuple(%ct, %cr), sharding={{devices=[2,2,2]7,6,5,4,3,2,1,0}, {devices=[2,2,1,2]7,6,5,4,3,2,1,0}}
}
"""
    _, ours = check(text, 8)
    assert ours == 0, ours


def test_value_held_in_its_first_tile_is_all_reduced_from_that_device():
    # Size-1 dims tiled 2 and 4 ways: only the first tile's devices hold data, so the
    # value is one device's (one all-reduce), not gathered once per tiled dim.
    text = """HloModule m
ENTRY %main (p: f32[1,1,6]) -> f32[1,1,6] {
  %p = f32[1,1,6] parameter(0), sharding={devices=[2,4,1]<=[8]}
  %n = f32[1,1,6] negate(%p), sharding={devices=[2,4,1]<=[8]}
  ROOT %c = f32[1,1,6] copy(%n), sharding={replicated}
}
"""
    _, ours = check(text, 8)
    # one all-reduce of 24 B over 8 devices: 2 * 7/8 * 24 = 42 B (an all-gather per tiled
    # dim costs more)
    assert ours == 42, ours
# -- a slice of a pad read through copies is still a shift: one collective-permute ----------
@pytest.mark.parametrize("fill", ["0", "3.5"])
def test_shift_through_copies_is_one_permute(fill):
    # y[i] = x[i - 2] (the fill for i < 2); the copies between the pad and the slice are
    # the identity, so the slice is the shift of x by 2 rows: each device receives its
    # left neighbour's 2 rows x 8 columns (64 B), not the pad's halo plus the slice's move.
    text = f"""HloModule m
ENTRY %main (x: f32[16,8]) -> f32[16,8] {{
  %x = f32[16,8] parameter(0), sharding={{devices=[8,1]<=[8]}}
  %v = f32[] constant({fill})
  %p = f32[19,8] pad(%x, %v), padding=2_1x0_0, sharding={{devices=[8,1]<=[8]}}
  %c = f32[19,8] copy(%p), sharding={{devices=[8,1]<=[8]}}
  %c1 = f32[19,8] copy(%c), sharding={{devices=[8,1]<=[8]}}
  ROOT %s = f32[16,8] slice(%c1), slice={{[0:16], [0:8]}}, sharding={{devices=[8,1]<=[8]}}
}}
"""
    out, ours = check(text, 8)
    assert ours == 2 * 8 * 4, ours


# -- a rotation over padded tiles that moves whole tiles: one collective-permute among the
# tiles holding data --------------------------------------------------------------------------
@pytest.mark.parametrize("s", [4, 8])
def test_rotation_of_whole_padded_tiles_is_one_permute(s):
    # 12 rows on 8 devices: tiles of 2 rows, 6 of them hold data and 2 are padding. Rotating
    # by a multiple of 2 rows moves whole tiles among the 6: each sends its 2 x 4 (32 B).
    text = f"""HloModule m
ENTRY %main (x: f32[12,4]) -> f32[12,4] {{
  %x = f32[12,4] parameter(0), sharding={{devices=[8,1]<=[8]}}
  %a = f32[{12 - s},4] slice(%x), slice={{[{s}:12], [0:4]}}, sharding={{devices=[8,1]<=[8]}}
  %b = f32[{s},4] slice(%x), slice={{[0:{s}], [0:4]}}, sharding={{devices=[8,1]<=[8]}}
  ROOT %r = f32[12,4] concatenate(%a, %b), dimensions={{0}}, sharding={{devices=[8,1]<=[8]}}
}}
"""
    out, ours = check(text, 8)
    assert ours == 2 * 4 * 4, ours


# -- any other rotation over padded tiles: two shifts chosen by the row's global index -------
@pytest.mark.parametrize("rows,s", [(13, 5), (13, 9), (13, 1), (10, 6), (15, 4)])
def test_rotation_over_padded_tiles_is_two_shifts(rows, s):
    # rows [0, D-s) of the result are x shifted by s, rows [D-s, D) x shifted by s-D; each
    # shift is at most two collective-permutes, and the slices feeding the concatenate
    # (with their own moves) are gone. Checked against the one-device run with the padding
    # poisoned, and against XLA's bytes.
    text = f"""HloModule m
ENTRY %main (x: f32[{rows},2]) -> f32[{rows},2] {{
  %x = f32[{rows},2] parameter(0), sharding={{devices=[8,1]<=[8]}}
  %a = f32[{rows - s},2] slice(%x), slice={{[{s}:{rows}], [0:2]}}, sharding={{devices=[8,1]<=[8]}}
  %b = f32[{s},2] slice(%x), slice={{[0:{s}], [0:2]}}, sharding={{devices=[8,1]<=[8]}}
  ROOT %r = f32[{rows},2] concatenate(%a, %b), dimensions={{0}}, sharding={{devices=[8,1]<=[8]}}
}}
"""
    out, ours = check(text, 8)
    assert sum(i.opcode == "collective-permute" for c in out.computations
               for i in c.instructions) <= 4, out


# -- uneven partially replicated <-> tiled: one all-to-all, not the replicated value ---------
def test_partial_replicate_to_tile_uneven_moves_the_tiled_dim_by_all_to_all():
    # Columns in 2 halves (3 copies each) -> rows in 2 and columns in 3 (8 -> 3,3,2): the
    # column halves move to rows in one all-to-all, the 3 column tiles are cut locally.
    text = """HloModule m
ENTRY e {
  p = f32[8,8] parameter(0), sharding={devices=[1,2,3]<=[6] last_tile_dim_replicate}
  ROOT c = f32[8,8] copy(p), sharding={devices=[2,3]<=[6]}
}
"""
    out, ours = check(text, 6)
    # all-to-all of the [8,4] f32 tile within pairs: (1/2) * 128 B.
    assert ours == 64, ours
    assert [i.opcode for i in out.instructions()].count("all-to-all") == 1


def test_tile_to_partial_replicate_uneven_gathers_then_all_to_all():
    # Rows in 2, columns in 3 -> columns in 2 (3 copies): the uneven column tiles are
    # gathered (padded 9 -> 8), then the row halves move to columns in one all-to-all.
    text = """HloModule m
ENTRY e {
  p = f32[8,8] parameter(0), sharding={devices=[2,3]<=[6]}
  ROOT c = f32[8,8] copy(p), sharding={devices=[1,2,3]<=[6] last_tile_dim_replicate}
}
"""
    out, ours = check(text, 6)
    # all-gather [4,3] -> [4,9] over 3: (2/3) * 144 B = 96 B; all-to-all of [4,8] over 2:
    # (1/2) * 128 B = 64 B.
    assert ours == 96 + 64, ours


def test_uneven_all_to_all_realigns_tiles_by_halo_exchange():
    # [5,5] on 2 x 4 (tiles of 3 x 2) -> 4 x 2 (tiles of 2 x 3): the column factor moves to
    # the rows in one all-to-all; the row tiles of 3 are first re-cut to 4 (one row from
    # the next tile) and the joined column tiles of 4 after it to 3 (one column from the
    # previous tile), as XLA pads an uneven all-to-all; not two all-gathers.
    text = """HloModule m
ENTRY e {
  p = f32[5,5] parameter(0), sharding={devices=[4,2]<=[8]}
  a = f32[5,5] add(p, p), sharding={devices=[4,2]<=[8]}
  t = f32[5,5]{0,1} transpose(a), dimensions={1,0}, sharding={devices=[2,4]<=[4,2]T(1,0)}
  ROOT r = f32[5,5] add(a, t), sharding={devices=[4,2]<=[8]}
}
"""
    out, ours = check(text, 8)
    ops = [i.opcode for i in out.instructions()]
    assert "all-gather" not in ops and ops.count("all-to-all") == 1, ops
    # halo row 1x2 (8 B) + all-to-all of the [4,2] padded tile over 2 (16 B) + halo column
    # 2x1 (8 B) + the device-order permute of the [2,3] tile (24 B).
    assert ours == 8 + 16 + 8 + 24, ours


def test_uneven_gather_to_partial_replicate_permutes_pieces_then_reduces_in_groups():
    # Rows of 2 on 8 devices (only devices 0 and 1 hold a row) -> 2 row tiles, 4 copies
    # each: device 1's row goes to device 4 (the first of its tile's holders), then each
    # group of 4 sums its one data piece; not an all-reduce of both rows over all 8.
    text = """HloModule m
ENTRY e {
  p = f32[2,123] parameter(0), sharding={devices=[8,1]<=[8]}
  ROOT r = f32[2,1,123] reshape(p), sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}
}
"""
    out, ours = check(text, 8)
    # permute of a [1,123] f32 row (492 B) + all-reduce of it over 4: 2 * 3/4 * 492 B.
    assert ours == 492 + 738, ours
# -- concatenate read whole by a dynamic-slice (jnp.roll with a dynamic shift) ---------------
@pytest.mark.parametrize("second", ["%p", "%q"])
def test_concatenate_read_whole_by_dynamic_slice_is_built_whole(second):
    # XLA's DoNotPartitionConcatenate: the dynamic-slice reads the concatenate whole, so
    # it is built from the gathered operands (an operand listed twice gathered once) and
    # the dynamic-slice reuses that whole value; no halo for a tiled concatenate that is
    # gathered again right after (was 2.5 KiB on 4 devices, 3.3x XLA's bytes).
    text = f"""HloModule m
ENTRY %main (p: f32[256], i: s32[], q: f32[256]) -> f32[256] {{
  %p = f32[256] parameter(0), sharding={{devices=[8]<=[8]}}
  %i = s32[] parameter(1), sharding={{replicated}}
  %q = f32[256] parameter(2), sharding={{devices=[8]<=[8]}}
  %c = f32[512] concatenate(%p, {second}), dimensions={{0}}, sharding={{devices=[8]<=[8]}}
  ROOT %d = f32[256] dynamic-slice(%c, %i), dynamic_slice_sizes={{256}}, sharding={{devices=[8]<=[8]}}
}}
"""
    out, ours = check(text, 8)
    gathers = 1 if second == "%p" else 2
    assert ours == gathers * 7 * 256 * 4 / 8, ours

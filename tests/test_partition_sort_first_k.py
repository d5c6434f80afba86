"""A sort read only through slices [0:k] of its sharded sort dim is a top-k: each shard
sorts its part and keeps k, the k candidates per shard are all-gathered, sorted again and
cut to k. A top-k whose indices nobody reads gathers and ranks its values alone, and an
unread result is never moved. Each module runs partitioned on 8 CPU devices against the
one-device run (with few distinct values, so ties and their order are checked too); its
bytes per device must equal the figure derived from the shapes and not exceed XLA's."""
from __future__ import annotations

import pytest

pytest.importorskip("jax")

from hlo_spmd.stats import module_stats  # noqa: E402

from test_partition_sort import CMP, check  # noqa: E402

N = 8

# GT on the values, ties broken by the lower index (the comparator JAX's top_k lowers to).
GT_IDX = """
%gt_idx (a: f32[], b: f32[], c: s32[], d: s32[]) -> pred[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %c = s32[] parameter(2)
  %d = s32[] parameter(3)
  %gt = pred[] compare(%a, %b), direction=GT
  %lt = pred[] compare(%b, %a), direction=GT
  %eq = pred[] compare(%gt, %lt), direction=EQ
  %first = pred[] compare(%c, %d), direction=LT
  ROOT %r = pred[] select(%eq, %first, %gt)
}
"""


def gathered(rows, k, t, itemsize=4):
    """Bytes per device of all-gathering [rows, k] pieces from t devices."""
    return (t - 1) / t * rows * k * t * itemsize


def sort_then_slice(shape, s, k, *, cmp="lt2", stable=True, out_s="{replicated}",
                    k_idx=None):
    dims = ",".join(map(str, shape))
    last = len(shape) - 1
    kv = ",".join(map(str, shape[:-1] + (k,)))
    ki = ",".join(map(str, shape[:-1] + (k_idx or k,)))
    sl = lambda kk: ", ".join([f"[0:{d}]" for d in shape[:-1]] + [f"[0:{kk}]"])
    return f"""HloModule m
{CMP}
{GT_IDX}
ENTRY %main (x: f32[{dims}]) -> (f32[{kv}], s32[{ki}]) {{
  %x = f32[{dims}] parameter(0), sharding={s}
  %i = s32[{dims}] iota(), iota_dimension={last}, sharding={s}
  %s = (f32[{dims}], s32[{dims}]) sort(%x, %i), dimensions={{{last}}}, is_stable={'true' if stable else 'false'}, to_apply=%{cmp}, sharding={{{s}, {s}}}
  %v = f32[{dims}] get-tuple-element(%s), index=0, sharding={s}
  %vk = f32[{kv}] slice(%v), slice={{{sl(k)}}}, sharding={out_s}
  %j = s32[{dims}] get-tuple-element(%s), index=1, sharding={s}
  %jk = s32[{ki}] slice(%j), slice={{{sl(k_idx or k)}}}, sharding={out_s}
  ROOT %r = (f32[{kv}], s32[{ki}]) tuple(%vk, %jk), sharding={{{out_s}, {out_s}}}
}}
"""


def ops(out):
    return [i.opcode for i in out.instructions()]


@pytest.mark.parametrize("cmp,stable", [("lt2", True), ("gt_idx", False)])
@pytest.mark.parametrize("ties", [False, True])
def test_sort_of_values_and_iota_cut_to_k_is_two_stage(cmp, stable, ties):
    out = check(sort_then_slice((4, 64), "{devices=[1,8]<=[8]}", 3, cmp=cmp, stable=stable),
                N, ties=ties)
    # The whole [4,64] sort never exists: two sorts of [4,8] and [4,24] pieces.
    assert [tuple(i.shape.tuple_shapes[0].dims) for i in out.instructions()
            if i.opcode == "sort"] == [(4, 8), (4, 24)]
    ours = module_stats(out, N).total_bytes_per_device
    assert ours == pytest.approx(2 * gathered(4, 3, 8)), ours


@pytest.mark.parametrize("ties", [False, True])
def test_sort_cut_to_k_with_a_sharded_non_sort_dim(ties):
    # Dim 0 on 2 devices, the sort dim on 4: candidates gathered over the 4 only, then
    # the [4,8,2] results made whole over dim 0 (the root is replicated).
    out = check(sort_then_slice((4, 8, 64), "{devices=[2,1,4]<=[8]}", 2, cmp="gt_idx"),
                N, ties=ties)
    ours = module_stats(out, N).total_bytes_per_device
    per_output = gathered(16, 2, 4) + 0.5 * 4 * 8 * 2 * 4
    assert ours == pytest.approx(2 * per_output), ours


@pytest.mark.parametrize("cols,k", [(60, 3), (57, 5)])
@pytest.mark.parametrize("cmp,stable", [("lt2", True), ("gt_idx", False)])
def test_sort_cut_to_k_over_an_uneven_sort_dim(cols, k, cmp, stable):
    # 60 = 8 x 8 - 4 and 57 = 8 x 8 - 7 (the last shard holds 4 and 1 real elements, fewer
    # than k for 57): the padding is ranked last by a validity flag sorted along, whatever
    # the comparator, and the flags (1 byte each) travel with the candidates.
    out = check(sort_then_slice((4, cols), "{devices=[1,8]<=[8]}", k, cmp=cmp,
                                stable=stable), N, ties=True)
    ours = module_stats(out, N).total_bytes_per_device
    assert ours == pytest.approx(2 * gathered(4, k, 8) + gathered(4, k, 8, itemsize=1)), ours


def test_sort_cut_to_different_k_per_result():
    # Values cut to 4 and indices to 2: every shard keeps the larger k.
    out = check(sort_then_slice((4, 64), "{devices=[1,8]<=[8]}", 4, k_idx=2), N, ties=True)
    ours = module_stats(out, N).total_bytes_per_device
    assert ours == pytest.approx(2 * gathered(4, 4, 8)), ours


def test_one_operand_sort_cut_to_k():
    text = f"""HloModule m
{CMP}
ENTRY %main (x: f32[4,64]) -> f32[4,5] {{
  %x = f32[4,64] parameter(0), sharding={{devices=[1,8]<=[8]}}
  %s = f32[4,64] sort(%x), dimensions={{1}}, is_stable=true, to_apply=%lt, sharding={{devices=[1,8]<=[8]}}
  ROOT %k = f32[4,5] slice(%s), slice={{[0:4], [0:5]}}, sharding={{replicated}}
}}
"""
    out = check(text, N, ties=True)
    ours = module_stats(out, N).total_bytes_per_device
    assert ours == pytest.approx(gathered(4, 5, 8)), ours


def test_sort_also_read_whole_is_not_cut():
    # The sorted values are also returned whole: the full sort is needed, so no first-k.
    text = sort_then_slice((4, 64), "{devices=[1,8]<=[8]}", 3).replace(
        "ROOT %r = (f32[4,3], s32[4,3]) tuple(%vk, %jk), sharding={{replicated}, {replicated}}",
        "ROOT %r = (f32[4,3], s32[4,3], f32[4,64]) tuple(%vk, %jk, %v), "
        "sharding={{replicated}, {replicated}, {devices=[1,8]<=[8]}}").replace(
        "-> (f32[4,3], s32[4,3])", "-> (f32[4,3], s32[4,3], f32[4,64])")
    out = check(text, N, ties=True, vs_xla=False)  # (the whole sort's own plan: not here)
    assert [tuple(i.shape.tuple_shapes[0].dims) for i in out.instructions()
            if i.opcode == "sort"] == [(1, 64)]


def topk_values_only(shape, k, s, *, op="custom-call", largest=True):
    dims = ",".join(map(str, shape))
    kd = ",".join(map(str, shape[:-1] + (k,)))
    call = (f"topk(%x), k={k}, largest={'true' if largest else 'false'}" if op == "topk"
            else 'custom-call(%x), custom_call_target="TopK"')
    return f"""HloModule m
ENTRY %main (x: f32[{dims}]) -> f32[{kd}] {{
  %x = f32[{dims}] parameter(0), sharding={s}
  %t = (f32[{kd}], s32[{kd}]) {call}, sharding={{{{replicated}}, {{replicated}}}}
  ROOT %v = f32[{kd}] get-tuple-element(%t), index=0, sharding={{replicated}}
}}
"""


@pytest.mark.parametrize("op,largest", [("custom-call", True), ("topk", True),
                                        ("topk", False)])
def test_topk_with_unread_indices_over_sharded_dim_moves_values_only(op, largest):
    out = check(topk_values_only((4, 512), 5, "{devices=[1,8]<=[8]}", op=op,
                                 largest=largest), N, ties=True)
    assert not [i for i in out.instructions() if i.opcode == "all-gather"
                and i.shape.element_type.name == "S32"]
    ours = module_stats(out, N).total_bytes_per_device
    assert ours == pytest.approx(gathered(4, 5, 8)), ours


def test_topk_with_unread_indices_over_sharded_rows_moves_values_only():
    # Rows on 8 devices: local top-k of each row block; only the [16,5] values are made
    # whole, the unread indices stay where they are made.
    out = check(topk_values_only((16, 64), 5, "{devices=[8,1]<=[8]}"), N, ties=True)
    ours = module_stats(out, N).total_bytes_per_device
    assert ours == pytest.approx(7 / 8 * 16 * 5 * 4), ours


def test_whole_sort_with_unread_indices_moves_values_back_only():
    # The sort dim's tiling goes to dim 0 (all-to-all), the sort runs, and only the values
    # come back: the unread index result stays where it is made.
    text = f"""HloModule m
{CMP}
ENTRY %main (x: f32[16,64]) -> f32[16,64] {{
  %x = f32[16,64] parameter(0), sharding={{devices=[1,8]<=[8]}}
  %i = s32[16,64] iota(), iota_dimension=1, sharding={{devices=[1,8]<=[8]}}
  %s = (f32[16,64], s32[16,64]) sort(%x, %i), dimensions={{1}}, is_stable=true, to_apply=%lt2, sharding={{{{devices=[1,8]<=[8]}}, {{devices=[1,8]<=[8]}}}}
  ROOT %v = f32[16,64] get-tuple-element(%s), index=0, sharding={{devices=[1,8]<=[8]}}
}}
"""
    out = check(text, N, ties=True)
    a2a = [i for i in out.instructions() if i.opcode == "all-to-all"]
    assert all(i.shape.element_type.name == "F32" for i in a2a), a2a
    ours = module_stats(out, N).total_bytes_per_device
    assert ours == pytest.approx(2 * 7 / 8 * 2 * 64 * 4), ours

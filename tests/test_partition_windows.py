"""Convolution, reduce-window and select-and-scatter partitioned with halo exchange: every
case runs partitioned on XLA (poisoned padding) against the unpartitioned module, and the
collectives used are checked where they are the point (batch-partitioned conv moves
nothing; a 3-wide window over a sharded dim is two collective-permutes)."""
from __future__ import annotations

import pytest

pytest.importorskip("jax")

from hlo_spmd.collectives.cost import bytes_per_device  # noqa: E402
from hlo_spmd.ir.io import load_module_bytes, module_bytes  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.dot_conv_dims import WindowDim  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.runtime import verify  # noqa: E402
from hlo_spmd.runtime.xla_reference import xla_partitioned_module  # noqa: E402
from hlo_spmd.stats import module_stats  # noqa: E402

COLLECTIVES = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"}

ADD = """
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
"""
MAX = """
%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] maximum(%a, %b)
}
"""
GE = """
%ge (a: f32[], b: f32[]) -> pred[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = pred[] compare(%a, %b), direction=GE
}
"""


def run(text: str, n: int) -> dict[str, int]:
    module = parse_module(text)
    original = module_bytes(module)
    result = partition_in_place(module, n, complete=True)
    report = verify(original, module_bytes(result.module), n, poison_padding=True)
    assert report.ok, str(report)
    counts: dict[str, int] = {}
    for i in result.module.instructions():
        if i.opcode in COLLECTIVES:
            counts[i.opcode] = counts.get(i.opcode, 0) + 1
    return counts


def conv(lhs, rhs, out, window, labels, ls, rs, os, extra=""):
    return f"""HloModule m
ENTRY %main (x: f32[{lhs}], k: f32[{rhs}]) -> f32[{out}] {{
  %x = f32[{lhs}] parameter(0), sharding={ls}
  %k = f32[{rhs}] parameter(1), sharding={rs}
  ROOT %c = f32[{out}] convolution(%x, %k), window={{{window}}}, dim_labels={labels}{extra}, sharding={os}
}}
"""


R = "{replicated}"


# -- convolution -------------------------------------------------------------------------------
def test_batch_partitioned_conv_moves_nothing():
    text = conv("8,16,16,4", "3,3,4,8", "8,16,16,8", "size=3x3 pad=1_1x1_1", "b01f_01io->b01f",
                "{devices=[8,1,1,1]<=[8]}", R, "{devices=[8,1,1,1]<=[8]}")
    assert run(text, 8) == {}


def test_output_feature_partitioned_conv_moves_nothing():
    text = conv("2,16,16,4", "3,3,4,8", "2,16,16,8", "size=3x3 pad=1_1x1_1", "b01f_01io->b01f",
                R, "{devices=[1,1,1,4]<=[4]}", "{devices=[1,1,1,4]<=[4]}")
    assert run(text, 4) == {}


def test_input_feature_partitioned_conv_is_partial_sums():
    text = conv("2,8,8,8", "3,3,8,4", "2,8,8,4", "size=3x3 pad=1_1x1_1", "b01f_01io->b01f",
                "{devices=[1,1,1,4]<=[4]}", "{devices=[1,1,4,1]<=[4]}", R)
    assert set(run(text, 4)) == {"all-reduce"}


def test_batch_and_height_2d_conv():
    text = conv("4,16,8,4", "3,3,4,8", "4,16,8,8", "size=3x3 pad=1_1x1_1", "b01f_01io->b01f",
                "{devices=[2,4,1,1]<=[8]}", R, "{devices=[2,4,1,1]<=[8]}")
    assert run(text, 8) == {"collective-permute": 2}


@pytest.mark.parametrize("window,h,oh,n", [
    ("size=3x1 pad=1_1x0_0", 32, 32, 8),                 # SAME
    ("size=3x1 stride=2x1 pad=1_1x0_0", 32, 16, 8),      # strided
    ("size=3x1 stride=2x1 pad=0_1x0_0", 31, 15, 4),      # uneven, high padding only
    ("size=5x1 pad=2_2x0_0", 13, 13, 4),                 # uneven shards
    ("size=3x1 pad=-1_2x0_0", 16, 15, 4),                # negative low padding
    ("size=3x1 rhs_dilate=3x1 pad=3_3x0_0", 16, 16, 8),  # atrous: halo of 3 > 2-row shards
    ("size=7x1 pad=3_3x0_0", 16, 16, 8),                 # halo wider than a shard
    ("size=2x1 stride=3x1", 17, 6, 4),                   # stride > window (gaps)
])
def test_spatial_halo_conv(window, h, oh, n):
    s = f"{{devices=[1,{n},1,1]<=[{n}]}}"
    text = conv(f"2,{h},3,4", "%s,1,4,8" % window.split("x")[0].split("=")[1], f"2,{oh},3,8",
                window, "b01f_01io->b01f", s, R, s)
    assert "all-gather" not in run(text, n)


def test_spatial_conv_result_replicated_input_sharded():
    text = conv("2,16,4,4", "3,3,4,8", "2,16,4,8", "size=3x3 pad=1_1x1_1", "b01f_01io->b01f",
                "{devices=[1,4,1,1]<=[4]}", R, R)
    run(text, 4)


@pytest.mark.parametrize("pad", ["1_1", "2_0", "0_2", "3_3"])
def test_windows_of_a_whole_operand_are_cut_before_padding(pad):
    """Input whole on H, result tiled on H: each device's window (its rows plus the
    halo) is cut from the input and padded on its own -- the padded input is never
    built, so nothing is larger than the input; numbers checked on XLA."""
    lo, hi = (int(v) for v in pad.split("_"))
    h, kh = 16, lo + hi + 1
    text = conv(f"2,{h},3,4", f"{kh},1,4,8", f"2,{h},3,8", f"size={kh}x1 pad={pad}x0_0",
                "b01f_01io->b01f", R, R, "{devices=[1,4,1,1]<=[4]}")
    run(text, 4)
    out = partition_in_place(parse_module(text), 4, complete=True).module
    assert module_stats(out, 4).largest_array.bytes <= 2 * h * 3 * 8 * 4
    pads = [i for i in out.instructions() if i.opcode == "pad"]
    assert all(p.shape.dims[1] < h + lo + hi for p in pads), [str(p.shape) for p in pads]


def test_kernel_sharded_on_spatial_dim_is_correct():
    text = conv("2,16,4,4", "4,3,4,8", "2,16,4,8", "size=4x3 pad=1_2x1_1", "b01f_01io->b01f",
                "{devices=[1,4,1,1]<=[4]}", "{devices=[4,1,1,1]<=[4]}",
                "{devices=[1,4,1,1]<=[4]}")
    run(text, 4)


@pytest.mark.parametrize("h,window,oh,n", [
    (8, "size=3x3 pad=1_2x1_1 lhs_dilate=2x1", 16, 4),           # transposed conv, stride 2
    (8, "size=3x3 pad=2_2x1_1 lhs_dilate=3x1", 24, 8),           # dilation 3, per 3
    (8, "size=3x3 stride=2x1 pad=1_1x1_1 lhs_dilate=2x1", 8, 4),  # stride 2 x 2 rows
])
def test_lhs_dilated_conv_case_one_is_halo_only(h, window, oh, n):
    """Base dilation d where output rows per tile x stride is a multiple of d: one static
    per-tile window, halos only."""
    s = f"{{devices=[1,{n},1,1]<=[{n}]}}"
    ks = window.split("size=")[1].split(" ")[0].replace("x", ",")
    text = conv(f"2,{h},4,4", f"{ks},4,8", f"2,{oh},4,8", window, "b01f_01io->b01f", s, R, s)
    assert "all-gather" not in run(text, n)


def _transposed(h, k, s, lo, hi, d, n, w=4):
    """A transposed convolution (base dilation ``d``) over ``h`` rows sharded ``n`` ways,
    with the bytes an all-gather of its input's rows would send per device."""
    wd = WindowDim(k, s, lo, hi, 1, d)
    oh = wd.output_size(h)
    sh = f"{{devices=[1,{n},1,1]<=[{n}]}}"
    window = f"size={k}x3 stride={s}x1 pad={lo}_{hi}x1_1 lhs_dilate={d}x1"
    text = conv(f"2,{h},{w},4", f"{k},3,4,8", f"2,{oh},{w},8", window, "b01f_01io->b01f",
                sh, R, sh)
    rows = -(-h // n)
    gather = bytes_per_device("all-gather", rows * 2 * w * 4 * 4, n * rows * 2 * w * 4 * 4, n)
    return text, wd, oh, gather


def run_bytes(text: str, n: int) -> tuple[dict[str, int], float, float]:
    """``run``, the bytes per device the partitioned module sends, and those XLA's own
    partitioned module sends."""
    module = parse_module(text)
    original = module_bytes(module)
    result = partition_in_place(module, n, complete=True)
    report = verify(original, module_bytes(result.module), n, poison_padding=True)
    assert report.ok, str(report)
    stats = module_stats(result.module, n)
    xla = module_stats(load_module_bytes(xla_partitioned_module(original, n), "xla"), n)
    return {k: v.count for k, v in stats.collectives.items() if v.count}, \
        stats.total_bytes_per_device, xla.total_bytes_per_device


@pytest.mark.parametrize("h,k,s,lo,hi,d,n", [
    # stride 1: output rows per tile not a multiple of d (XLA's second case)
    (8, 3, 1, 2, 2, 2, 4),     # 3x3 "SAME" transposed conv x2: 17 rows over 4
    (9, 4, 1, 3, 3, 2, 8),     # uneven input shards (9 rows over 8)
    (10, 3, 1, 0, 2, 4, 2),    # dilation 4, no low padding
    (12, 5, 1, 4, 4, 3, 4),    # dilation 3, wide window
    (6, 2, 1, 3, -1, 2, 4),    # negative high padding
    # non-unit stride: output rows per tile x stride not a multiple of d (third case)
    (12, 3, 2, -1, 1, 3, 8),   # negative low padding, 8 devices
    (9, 5, 2, 1, 4, 3, 4),     # uneven shards
    (11, 4, 3, 2, 1, 4, 2),    # stride 3, dilation 4
    (10, 5, 3, 1, 0, 4, 4),
    (13, 2, 2, -1, 4, 3, 4),   # uneven, window smaller than the dilation
    (12, 4, 2, 1, 4, 4, 8),    # dilation 4 over 8 devices
])
def test_lhs_dilated_conv_other_cases_use_halos(h, k, s, lo, hi, d, n):
    """Base dilation d where output rows per tile x stride is not a multiple of d: tiles
    compute a few extra rows with one static window and cut theirs out; halos only, well
    below an all-gather of the input's rows, and no more than XLA sends."""
    text, wd, oh, gather = _transposed(h, k, s, lo, hi, d, n)
    per = -(-oh // n)
    assert (per * s) % d != 0                   # not the first (static padding) case
    counts, sent, xla = run_bytes(text, n)
    assert "all-gather" not in counts, counts
    assert sent < gather, (sent, gather)
    assert sent <= xla + 1e-6, (sent, xla)


def test_lhs_dilated_conv_two_sharded_spatial_dims():
    # Both spatial dims dilated and sharded 2 x 2, each with tiles out of phase.
    text = conv("2,8,6,4", "3,4,4,8", "2,17,9,8",
                "size=3x4 stride=1x2 pad=2_2x2_3 lhs_dilate=2x3", "b01f_01io->b01f",
                "{devices=[1,2,2,1]<=[4]}", R, "{devices=[1,2,2,1]<=[4]}")
    counts, sent, xla = run_bytes(text, 4)
    assert "all-gather" not in counts, counts
    assert sent <= xla + 1e-6, (sent, xla)


@pytest.mark.parametrize("ls,os,n", [
    ("{devices=[2,4,1,1]<=[8]}", "{devices=[2,4,1,1]<=[8]}", 8),      # batch x rows
    ("{devices=[1,2,1,1,2]<=[4] last_tile_dim_replicate}",
     "{devices=[1,2,1,1,2]<=[4] last_tile_dim_replicate}", 4),         # partially replicated
    ("{devices=[1,4,1,1]<=[4]}", R, 4),        # result whole: gather the smaller input
    ("{devices=[1,4,1,1]<=[4]}", "{devices=[1,1,1,4]<=[4]}", 4),       # result by feature
    (R, "{devices=[1,4,1,1]<=[4]}", 4),        # input whole: windows cut locally
])
@pytest.mark.parametrize("window,h,oh", [
    ("size=3x3 pad=2_2x1_1 lhs_dilate=2x1", 8, 17),                   # stride 1
    ("size=5x3 stride=2x1 pad=1_4x1_1 lhs_dilate=3x1", 9, 13),        # stride 2, d 3
])
def test_lhs_dilated_conv_other_shardings(ls, os, n, window, h, oh):
    k = window.split("=")[1][0]
    text = conv(f"2,{h},4,4", f"{k},3,4,8", f"2,{oh},4,8", window, "b01f_01io->b01f",
                ls, R, os)
    _, sent, xla = run_bytes(text, n)
    assert sent <= xla + 1e-6, (sent, xla)


def test_lhs_dilated_conv_on_sharded_dim_is_correct():
    text = conv("2,8,4,4", "3,3,4,8", "2,17,4,8", "size=3x3 pad=2_2x1_1 lhs_dilate=2x1",
                "b01f_01io->b01f", "{devices=[1,4,1,1]<=[4]}", R, "{devices=[1,4,1,1]<=[4]}")
    run(text, 4)


@pytest.mark.parametrize("feature_sharding,n", [(4, 4), (8, 8), (3, 3)])
def test_depthwise_conv_feature_sharded(feature_sharding, n):
    s = f"{{devices=[1,1,1,{feature_sharding}]<=[{n}]}}"
    ks = f"{{devices=[1,1,1,{feature_sharding}]<=[{n}]}}"
    text = conv("2,8,8,24", "3,3,1,48", "2,8,8,48", "size=3x3 pad=1_1x1_1",
                "b01f_01io->b01f", s, ks, s, extra=", feature_group_count=24")
    assert run(text, n) == {}


def test_depthwise_conv_feature_sharding_not_dividing_groups():
    # 6 groups over 4 devices: the grouped dim is gathered, the rest stays correct.
    s = "{devices=[1,1,1,4]<=[4]}"
    text = conv("2,8,8,6", "3,3,1,6", "2,8,8,6", "size=3x3 pad=1_1x1_1",
                "b01f_01io->b01f", s, s, s, extra=", feature_group_count=6")
    run(text, 4)


def test_depthwise_filter_gradient_batch_group_count():
    # The kernel gradient of a depthwise conv: batch_group_count = features.
    text = conv("8,8,8,2", "8,8,2,8", "3,3,1,8", "size=8x8 pad=1_1x1_1",
                "01bf_01io->01bf", "{devices=[1,1,4,1]<=[4]}", "{devices=[1,1,1,4]<=[4]}",
                "{devices=[1,1,1,4]<=[4]}", extra=", batch_group_count=8")
    run(text, 4)


def test_filter_gradient_conv_batch_sharded_is_one_all_reduce():
    # jax.grad's kernel gradient: images' batch dim is the contracting feature dim.
    text = conv("8,16,16,4", "8,16,16,8", "3,3,4,8", "size=16x16 pad=1_1x1_1",
                "f01b_i01o->01bf", "{devices=[8,1,1,1]<=[8]}", "{devices=[8,1,1,1]<=[8]}", R)
    assert run(text, 8) == {"all-reduce": 1}


# Issue 20 item 1: a convolution read as an einsum whose window spans a whole size-2 dim
# (a contracting-like spatial dim), both operands tiled on it, so the planner groups the
# devices by it: the per-group problem's window must still span the (now size-1) dim.
# Wrong everywhere before (the per-group output dim had size 0).
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("rhs_devices", ["<=[2,2,2]T(2,1,0)", "0,4,2,6,1,5,3,7"])
def test_conv_einsum_whole_window_dim_grouped(dtype, rhs_devices):
    text = f"""HloModule conv_einsum, num_partitions=8
ENTRY %e (lhs: {dtype}[8,16,2,24], rhs: {dtype}[2,24,16,1]) -> {dtype}[8,16,16,1] {{
  %lhs = {dtype}[8,16,2,24] parameter(0)
  %lhs.copy = {dtype}[8,16,2,24] copy(%lhs), sharding={{devices=[4,1,2,1]<=[8]}}
  %rhs = {dtype}[2,24,16,1] parameter(1)
  %rhs.copy = {dtype}[2,24,16,1] copy(%rhs), sharding={{devices=[2,1,2,1,2]{rhs_devices} last_tile_dim_replicate}}
  ROOT %convolution = {dtype}[8,16,16,1] convolution(%lhs.copy, %rhs.copy), window={{size=1x2}}, dim_labels=0b1f_1io0->0bf1, sharding={{devices=[4,1,2,1]<=[8]}}
}}
"""
    run(text, 8)


# -- reduce-window / select-and-scatter --------------------------------------------------------
def reduce_window(shape, out, window, s, reducer="add", init="0"):
    comp = ADD if reducer == "add" else MAX
    return f"""HloModule m
{comp}
ENTRY %main (x: f32[{shape}]) -> f32[{out}] {{
  %x = f32[{shape}] parameter(0), sharding={s}
  %z = f32[] constant({init})
  ROOT %r = f32[{out}] reduce-window(%x, %z), window={{{window}}}, to_apply=%{reducer}, sharding={s}
}}
"""


@pytest.mark.parametrize("shape,out,window,n", [
    ("2,32,8", "2,16,8", "size=1x2x1 stride=1x2x1", 8),                 # 2x2 max pool
    ("2,32,8", "2,32,8", "size=1x3x1 pad=0_0x1_1x0_0", 8),              # 3 SAME
    ("2,30,8", "2,15,8", "size=1x3x1 stride=1x2x1 pad=0_0x1_1x0_0", 4),  # uneven, strided
    ("2,16,8", "2,16,8", "size=1x5x1 rhs_dilate=1x2x1 pad=0_0x4_4x0_0", 8),  # dilated, wide
    ("2,16,8", "2,12,8", "size=1x3x1 pad=0_0x-1_-1x0_0", 4),            # negative padding
])
@pytest.mark.parametrize("reducer,init", [("add", "0"), ("max", "-inf")])
def test_reduce_window_halo(shape, out, window, n, reducer, init):
    s = f"{{devices=[1,{n},1]<=[{n}]}}"
    run(reduce_window(shape, out, window, s, reducer, init), n)


def test_aligned_max_pool_moves_nothing():
    s = "{devices=[1,8,1]<=[8]}"
    assert run(reduce_window("2,32,8", "2,16,8", "size=1x2x1 stride=1x2x1", s, "max", "-inf"),
               8) == {}


def test_cumsum_over_sharded_dim_moves_the_tiling():
    s = "{devices=[8,1]<=[8]}"
    text = reduce_window("16,8", "16,8", "size=16x1 pad=15_0x0_0", s)
    assert run(text, 8) == {"all-to-all": 2}


def test_lhs_dilated_reduce_window_is_correct():
    s = "{devices=[1,4,1]<=[4]}"
    run(reduce_window("2,8,8", "2,14,8", "size=1x2x1 pad=0_0x0_0x0_0 lhs_dilate=1x2x1", s), 4)


def select_and_scatter(shape, src, window, s, direction="GE"):
    ge = GE.replace("GE", direction)
    return f"""HloModule m
{ADD}
{ge}
ENTRY %main (x: f32[{shape}], g: f32[{src}]) -> f32[{shape}] {{
  %x = f32[{shape}] parameter(0), sharding={s}
  %g = f32[{src}] parameter(1), sharding={s}
  %z = f32[] constant(0)
  ROOT %r = f32[{shape}] select-and-scatter(%x, %g, %z), window={{{window}}}, select=%ge, scatter=%add, sharding={s}
}}
"""


@pytest.mark.parametrize("shape,src,window,n", [
    ("2,32,8", "2,16,8", "size=1x2x1 stride=1x2x1", 8),
    ("2,32,8", "2,16,8", "size=1x3x1 stride=1x2x1 pad=0_0x1_1x0_0", 8),
    ("2,30,8", "2,15,8", "size=1x3x1 stride=1x2x1 pad=0_0x1_1x0_0", 4),
    ("2,16,8", "2,16,8", "size=1x3x1 pad=0_0x1_1x0_0", 8),
    ("2,17,8", "2,5,8", "size=1x2x1 stride=1x4x1 pad=0_0x1_1x0_0", 4),
])
@pytest.mark.parametrize("direction", ["GE", "LT"])
def test_select_and_scatter_halo(shape, src, window, n, direction):
    s = f"{{devices=[1,{n},1]<=[{n}]}}"
    counts = run(select_and_scatter(shape, src, window, s, direction), n)
    assert "all-gather" not in counts


def _rw_out(h, k, s, lo, hi, d):
    return ((h - 1) * d + 1 + lo + hi - k) // s + 1


@pytest.mark.parametrize("h,k,s,lo,hi,d,n", [
    (5, 5, 1, 4, 4, 3, 4),      # InceptionV3's dilated average pool (uneven: 5 rows over 4)
    (8, 3, 1, 2, 2, 2, 4),      # stride 1, tiles out of phase
    (12, 3, 2, -1, 1, 3, 8),    # strided, negative low padding
    (9, 4, 3, 2, 1, 4, 2),
    (16, 2, 2, 0, 0, 2, 8),     # phases aligned: halo only
])
@pytest.mark.parametrize("reducer,init", [("add", "0"), ("max", "-inf")])
def test_base_dilated_reduce_window_on_tiled_dim_uses_halos(h, k, s, lo, hi, d, n, reducer,
                                                            init):
    """Base dilation on a tiled dim (issue 21 item 7; was: the dim gathered whole, 3x
    XLA's bytes on InceptionV3): one static window per tile, the rows a tile computes
    ahead of its own dropped, halos only; no more bytes than XLA."""
    out = _rw_out(h, k, s, lo, hi, d)
    sh = f"{{devices=[1,{n},1]<=[{n}]}}"
    text = reduce_window(f"2,{h},3", f"2,{out},3",
                         f"size=1x{k}x1 stride=1x{s}x1 pad=0_0x{lo}_{hi}x0_0 "
                         f"lhs_dilate=1x{d}x1", sh, reducer, init)
    counts, sent, xla = run_bytes(text, n)
    assert "all-gather" not in counts, counts
    assert sent <= xla + 1e-6, (sent, xla)


@pytest.mark.parametrize("shape,src,window,sh,n", [
    # XLA's SelectAndScatterNoOverlapReshard: operand tiled on the other dim (was: gathered
    # whole, 3.6x XLA's bytes; now one all-to-all as XLA)
    ("11,4", "4,2", "size=3x2 stride=3x2 pad=0_1x0_0", "{devices=[1,4]<=[4]}", 4),
    ("16,8", "8,4", "size=2x2 stride=2x2", "{devices=[1,4]<=[4]}", 4),
    ("16,8", "7,4", "size=4x2 stride=2x2", "{devices=[1,2]<=[2]}", 2),   # overlapping
])
# (the last: gathering the operand is as cheap as moving it, and not more than XLA)
def test_select_and_scatter_operand_tiled_elsewhere_moves_its_tiles(shape, src, window, sh,
                                                                   n):
    text = f"""HloModule m
{GE}
{ADD}
ENTRY %main (x: f32[{shape}], y: f32[{src}]) -> f32[{shape}] {{
  %x = f32[{shape}] parameter(0)
  %xc = f32[{shape}] copy(%x), sharding={sh}
  %y = f32[{src}] parameter(1)
  %yc = f32[{src}] copy(%y), sharding={{devices=[{n},1]<=[{n}]}}
  %z = f32[] constant(0)
  ROOT %r = f32[{shape}] select-and-scatter(%xc, %yc, %z), window={{{window}}}, select=%ge, scatter=%add, sharding={{devices=[{n},1]<=[{n}]}}
}}
"""
    counts, sent, xla = run_bytes(text, n)
    if n == 4:
        assert "all-gather" not in counts, counts
    assert sent <= xla + 1e-6, (sent, xla)

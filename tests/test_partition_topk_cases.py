"""top-k (the ``topk`` op and the ``TopK`` custom-call) and sort for every sharding a
program gives them, in the style of XLA's spmd_partitioner_test.cc: batch-partitioned
dims, the top-k dim sharded (even and uneven), both at once (an MoE router's logits),
partially replicated operands, values and indices wanted in different layouts, sort along
a sharded and along an unsharded dim. Each runs on 8 CPU devices against the 1-device run
with inputs full of ties: values match and indices are exactly equal (the merge keeps
equal values in global index order, as the original op does). Bytes per device are never
more than XLA's partitioned program, and top-k never makes its operand whole."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jax")

from hlo_spmd.ir.io import load_module_bytes, module_bytes  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.runtime import run_partitioned, run_unpartitioned  # noqa: E402
from hlo_spmd.runtime.xla_reference import xla_partitioned_module  # noqa: E402
from hlo_spmd.stats import module_stats  # noqa: E402

N = 8


def _topk_text(shape, k, x_s, out_s, *, op="topk", largest=True, idx_s=None):
    rows = ",".join(str(d) for d in shape[:-1])
    out = f"{rows},{k}" if rows else f"{k}"
    call = (f"topk(%x), k={k}, largest={'true' if largest else 'false'}" if op == "topk"
            else 'custom-call(%x), custom_call_target="TopK"')
    dims = ",".join(str(d) for d in shape)
    return f"""HloModule m
ENTRY %main (x: f32[{dims}]) -> (f32[{out}], s32[{out}]) {{
  %x = f32[{dims}] parameter(0), sharding={x_s}
  %t = (f32[{out}], s32[{out}]) {call}, sharding={{{out_s}, {idx_s or out_s}}}
  %v = f32[{out}] get-tuple-element(%t), index=0, sharding={out_s}
  %i = s32[{out}] get-tuple-element(%t), index=1, sharding={idx_s or out_s}
  ROOT %r = (f32[{out}], s32[{out}]) tuple(%v, %i), sharding={{{out_s}, {idx_s or out_s}}}
}}
"""


def _ties(module):
    rng = np.random.RandomState(7)
    out = []
    for p in module.entry.parameters:
        dims = p.shape.dims
        if p.shape.element_type.name.startswith("F"):
            out.append(rng.randint(0, 4, size=dims).astype(np.float32))
        else:
            out.append(np.broadcast_to(np.arange(dims[-1], dtype=np.int32), dims).copy())
    return out


def run_case(text, *, vs_xla=True):
    module = parse_module(text)
    original = module_bytes(module)
    result = partition_in_place(module, N, complete=True)
    assert not [f for f in result.report.replicated_fallbacks
                if f[1] in ("sort", "topk", "custom-call")], result.report.replicated_fallbacks
    out = result.module
    inputs = _ties(module)
    want = run_unpartitioned(original, inputs)
    got = run_partitioned(module_bytes(out), inputs, N, poison_padding=True)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert w.shape == g.shape and w.dtype == g.dtype
        # Exact: top-k / sort copy elements, and the indices must agree tie for tie.
        assert np.array_equal(w, g), (w, g)
    ours = module_stats(out, N).total_bytes_per_device
    xla = None
    if vs_xla:
        xla = module_stats(load_module_bytes(xla_partitioned_module(original, N), "xla"),
                           N).total_bytes_per_device
        assert ours <= xla + 1e-6, (ours, xla)
    return out, ours, xla


def _topk_operands(out):
    return [i.operands[0] for i in out.instructions()
            if i.opcode == "topk" or (i.opcode == "custom-call"
                                       and i.custom_call_target == "TopK")]


def _whole(out, shape):
    return [o for o in _topk_operands(out) if tuple(o.shape.dims) == tuple(shape)]


@pytest.mark.parametrize("op", ["topk", "custom-call"])
def test_batch_partitioned_dims_gather_only_the_k_results(op):
    # XLA's PartitionCustomCall_BatchPartitionedDims: operand [8,4096] on rows, results
    # wanted replicated: local top-k per row block, then the [8,2] results gathered.
    out, ours, _ = run_case(_topk_text((8, 4096), 2, "{devices=[8,1]<=[8]}", "{replicated}",
                                       op=op))
    assert not _whole(out, (8, 4096))
    assert ours == 2 * 8 * 2 * 4 * 7 / 8       # values and indices, f32 / s32 [8,2]


@pytest.mark.parametrize("op", ["topk", "custom-call"])
@pytest.mark.parametrize("cols", [4096, 4001])   # even, and uneven (padding masked)
def test_topk_dim_sharded_is_two_stage(op, cols):
    out, _, _ = run_case(_topk_text((4, cols), 5, "{devices=[1,8]<=[8]}", "{replicated}",
                                    op=op))
    assert not _whole(out, (4, cols))
    assert [i.opcode for i in out.instructions()].count("all-gather") == 2


def test_smallest_topk_uneven_sharded_dim():
    run_case(_topk_text((4, 3001), 3, "{devices=[1,8]<=[8]}", "{replicated}", largest=False))


@pytest.mark.parametrize("op", ["topk", "custom-call"])
def test_two_partitioned_dims_moe_router(op):
    # Logits [tokens, experts] on data x model; results on tokens (replicated on model).
    out, _, _ = run_case(_topk_text(
        (64, 512), 2, "{devices=[2,4]<=[8]}",
        "{devices=[2,1,4]<=[8] last_tile_dim_replicate}", op=op))
    assert not _whole(out, (64, 512))


def test_partially_replicated_operand():
    out, _, _ = run_case(_topk_text(
        (16, 2048), 4, "{devices=[1,4,2]<=[8] last_tile_dim_replicate}", "{replicated}"))
    assert not _whole(out, (16, 2048))


def test_values_and_indices_in_different_layouts():
    # XLA's TopKCustomCallNonTopKDimSharded: values wanted on the k dim, indices on rows.
    out, _, _ = run_case(_topk_text((64, 1024), 8, "{devices=[8,1]<=[8]}",
                                    "{devices=[1,8]<=[8]}", op="custom-call",
                                    idx_s="{devices=[8,1]<=[8]}"))
    assert not _whole(out, (64, 1024))


CMP = """
%gt (a: f32[], b: f32[], c: s32[], d: s32[]) -> pred[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %c = s32[] parameter(2)
  %d = s32[] parameter(3)
  ROOT %r = pred[] compare(%a, %b), direction=GT
}
"""


def _sort_text(shape, dim, s):
    dims = ",".join(str(d) for d in shape)
    return f"""HloModule m
{CMP}
ENTRY %main (x: f32[{dims}], i: s32[{dims}]) -> (f32[{dims}], s32[{dims}]) {{
  %x = f32[{dims}] parameter(0), sharding={s}
  %i = s32[{dims}] parameter(1), sharding={s}
  ROOT %s = (f32[{dims}], s32[{dims}]) sort(%x, %i), dimensions={{{dim}}}, is_stable=true, to_apply=%gt, sharding={{{s}, {s}}}
}}
"""


def test_sort_along_unsharded_dim_is_local():
    out, ours, _ = run_case(_sort_text((16, 64), 1, "{devices=[8,1]<=[8]}"))
    assert ours == 0


@pytest.mark.parametrize("shape,s", [((16, 64), "{devices=[1,8]<=[8]}"),
                                     ((48, 400), "{devices=[2,4]<=[8]}"),
                                     ((8, 64), "{devices=[1,4,2]<=[8] last_tile_dim_replicate}")])
def test_sort_along_sharded_dim_moves_the_tiling(shape, s):
    out, _, _ = run_case(_sort_text(shape, 1, s))
    assert "all-to-all" in {i.opcode for i in out.instructions()}

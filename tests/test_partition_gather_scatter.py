"""gather / scatter partitioned without replication: every strategy (index-parallel with
explicit batching dims, operand passthrough, trivially sliced operand, index passthrough),
every scatter combiner (add, max, min, overwrite with duplicate indices) and variadic
scatter. Each hand-written module runs on XLA's CPU runtime with random indices that
include out-of-range values and duplicates, with poisoned padding, and its bytes per device
are compared with XLA's own partitioned module."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jax")

from hlo_spmd.ir.io import load_module_bytes, module_bytes  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.runtime import verify  # noqa: E402
from hlo_spmd.runtime.xla_reference import xla_partitioned_module  # noqa: E402
from hlo_spmd.stats import module_stats  # noqa: E402

ADD = """
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] maximum(%a, %b)
}
%min (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] minimum(%a, %b)
}
%set (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  ROOT %b = f32[] parameter(1)
}
%pair (a0: f32[], a1: s32[], b0: f32[], b1: s32[]) -> (f32[], s32[]) {
  %a0 = f32[] parameter(0)
  %a1 = s32[] parameter(1)
  %b0 = f32[] parameter(2)
  %b1 = s32[] parameter(3)
  %p0 = f32[] add(%a0, %b0)
  %p1 = s32[] maximum(%a1, %b1)
  ROOT %t = (f32[], s32[]) tuple(%p0, %p1)
}
"""


def inputs_for(module, seed=0):
    """Floats from a normal; integer indices in [-3, bound + 3) (bound = the largest dim of
    any float parameter) so some are out of range and many repeat."""
    rng = np.random.RandomState(seed)
    params = module.entry.parameters
    bound = max(max(p.shape.dims) for p in params if p.shape.element_type.name.startswith("F"))
    out = []
    for p in params:
        dims = tuple(p.shape.dims)
        if p.shape.element_type.name.startswith("F"):
            out.append(rng.randn(*dims).astype(np.float32))
        else:
            out.append(rng.randint(-3, bound + 3, size=dims).astype(np.int32))
    return out


def check(text, n, *, vs_xla=True, replicated_ok=False):
    module = parse_module(text)
    original = module_bytes(module)
    inputs = inputs_for(module)
    result = partition_in_place(module, n, complete=True)
    out = result.module
    if not replicated_ok:
        assert not [f for f in result.report.replicated_fallbacks
                    if f[1] in ("gather", "scatter")], result.report.replicated_fallbacks
    report = verify(original, module_bytes(out), n, inputs=inputs, poison_padding=True)
    assert report.ok, str(report)
    ours = module_stats(out, n).total_bytes_per_device
    if vs_xla:
        xla = module_stats(load_module_bytes(xla_partitioned_module(original, n), "xla"), n)
        assert ours <= xla.total_bytes_per_device + 1e-6, (ours, xla.total_bytes_per_device)
    return out, ours


def embedding(vocab, n, table_s, ids_s, out_s, ids3_s=None):
    """``ids3_s``: the sharding of the [4,8,1] index array (default: ``ids_s`` with an
    untiled trailing dim, for plain tilings)."""
    if ids3_s is None:
        ids3_s = ids_s.replace("]<=", ",1]<=") if "devices" in ids_s else ids_s
    return f"""HloModule m
ENTRY %main (t: f32[{vocab},16], ids: s32[4,8]) -> f32[4,8,16] {{
  %t = f32[{vocab},16] parameter(0), sharding={table_s}
  %ids = s32[4,8] parameter(1), sharding={ids_s}
  %b = s32[4,8,1] reshape(%ids), sharding={ids3_s}
  ROOT %g = f32[4,8,16] gather(%t, %b), offset_dims={{2}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=2, slice_sizes={{1,16}}, sharding={out_s}
}}
"""


@pytest.mark.parametrize("vocab,n", [(64, 8), (60, 8), (64, 4), (200, 2)])
def test_vocab_sharded_table_gathers_locally_then_all_reduces(vocab, n):
    out, _ = check(embedding(vocab, n, f"{{devices=[{n},1]<=[{n}]}}", "{replicated}",
                             "{replicated}"), n)
    ops = [i.opcode for i in out.instructions()]
    assert "all-gather" not in ops and ops.count("all-reduce") == 1


def test_vocab_sharded_table_with_sharded_result():
    check(embedding(64, 8, "{devices=[8,1]<=[8]}", "{replicated}", "{devices=[4,1,2]<=[8]}"), 8)


def test_operand_passthrough_is_local():
    out, ours = check(embedding(64, 8, "{devices=[1,8]<=[8]}", "{replicated}",
                                "{devices=[1,1,8]<=[8]}"), 8)
    assert ours == 0


def test_index_passthrough_is_local():
    out, ours = check(embedding(64, 4, "{replicated}", "{devices=[4,1]<=[4]}",
                                "{devices=[4,1,1]<=[4]}"), 4)
    assert ours == 0


def test_table_sharded_two_ways_and_indices_sharded():
    check(embedding(64, 8, "{devices=[4,2]<=[8]}", "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
                    "{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}",
                    "{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}"), 8)


def test_indices_batch_sharding_combines_with_vocab_sharding():
    # Vocab on devices d % 4, indices' batch on d // 4: independent, so one grid holds
    # both; the result is reduced over the vocab devices only.
    out, _ = check(embedding(64, 8, "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}",
                             "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
                             "{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}",
                             "{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}"), 8)
    assert "all-gather" not in {i.opcode for i in out.instructions()}


def test_scatter_add_of_batch_sharded_updates_into_vocab_sharded_table():
    # The embedding gradient: updates sharded on batch (d // 4), table on vocab (d % 4):
    # each device scatters its share into its rows, then a sum over the batch devices.
    out, _ = check(scatter(64, 8, "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}",
                           "{devices=[2,4]<=[8] last_tile_dim_replicate}",
                           "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
                           "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}", "add", k=64), 8)
    assert "all-gather" not in {i.opcode for i in out.instructions()}


def test_explicit_batching_dims_are_index_parallel():
    text = """HloModule m
ENTRY %main (x: f32[8,16,4], i: s32[8,5,1]) -> f32[8,5,4] {
  %x = f32[8,16,4] parameter(0), sharding={devices=[8,1,1]<=[8]}
  %i = s32[8,5,1] parameter(1), sharding={devices=[8,1,1]<=[8]}
  ROOT %g = f32[8,5,4] gather(%x, %i), offset_dims={2}, collapsed_slice_dims={1}, start_index_map={1}, operand_batching_dims={0}, start_indices_batching_dims={0}, index_vector_dim=2, slice_sizes={1,1,4}, sharding={devices=[8,1,1]<=[8]}
}
"""
    out, ours = check(text, 8)
    assert ours == 0


def test_two_indexed_dims_both_sharded():
    text = """HloModule m
ENTRY %main (x: f32[16,12], i: s32[10,2]) -> f32[10] {
  %x = f32[16,12] parameter(0), sharding={devices=[2,4]<=[8]}
  %i = s32[10,2] parameter(1), sharding={replicated}
  ROOT %g = f32[10] gather(%x, %i), offset_dims={}, collapsed_slice_dims={0,1}, start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,1}, sharding={replicated}
}
"""
    check(text, 8)


def test_wide_slice_on_sharded_indexed_dim_is_correct():
    text = """HloModule m
ENTRY %main (t: f32[32,8], i: s32[6,1]) -> f32[6,3,8] {
  %t = f32[32,8] parameter(0), sharding={devices=[8,1]<=[8]}
  %i = s32[6,1] parameter(1), sharding={replicated}
  ROOT %g = f32[6,3,8] gather(%t, %i), offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={0}, index_vector_dim=1, slice_sizes={3,8}, sharding={replicated}
}
"""
    check(text, 8, vs_xla=False, replicated_ok=True)


# -- scatter ------------------------------------------------------------------------------------
def scatter(rows, n, base_s, idx_s, upd_s, out_s, fn="add", k=12):
    return f"""HloModule m
{ADD}
ENTRY %main (base: f32[{rows},16], idx: s32[{k}], upd: f32[{k},16]) -> f32[{rows},16] {{
  %base = f32[{rows},16] parameter(0), sharding={base_s}
  %idx = s32[{k}] parameter(1), sharding={idx_s}
  %upd = f32[{k},16] parameter(2), sharding={upd_s}
  ROOT %s = f32[{rows},16] scatter(%base, %idx, %upd), update_window_dims={{1}}, inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply=%{fn}, sharding={out_s}
}}
"""


@pytest.mark.parametrize("fn", ["add", "max", "min", "set"])
@pytest.mark.parametrize("rows,n", [(32, 8), (30, 8), (32, 4), (10, 2)])
def test_scatter_into_row_sharded_table_updates_local_rows(fn, rows, n):
    s = f"{{devices=[{n},1]<=[{n}]}}"
    out, _ = check(scatter(rows, n, s, "{replicated}", "{replicated}", s, fn, k=24), n)
    assert not {i.opcode for i in out.instructions()} & {"all-gather", "all-reduce"}


@pytest.mark.parametrize("fn", ["add", "max", "min"])
def test_scatter_with_sharded_updates_combines_partials(fn):
    # Many more updates than rows: combining per-device partial results beats gathering
    # the updates.
    out, _ = check(scatter(32, 8, "{replicated}", "{devices=[8]<=[8]}", "{devices=[8,1]<=[8]}",
                           "{replicated}", fn, k=96), 8)
    assert "all-gather" not in {i.opcode for i in out.instructions()}


def test_scatter_window_passthrough_is_local():
    out, ours = check(scatter(32, 8, "{devices=[1,8]<=[8]}", "{replicated}",
                              "{devices=[1,8]<=[8]}", "{devices=[1,8]<=[8]}", "set"), 8)
    assert ours == 0


def test_scatter_with_batching_dims():
    text = f"""HloModule m
{ADD}
ENTRY %main (x: f32[8,16,4], i: s32[8,5,1], u: f32[8,5,4]) -> f32[8,16,4] {{
  %x = f32[8,16,4] parameter(0), sharding={{devices=[4,1,1,2]<=[8] last_tile_dim_replicate}}
  %i = s32[8,5,1] parameter(1), sharding={{devices=[4,1,1,2]<=[8] last_tile_dim_replicate}}
  %u = f32[8,5,4] parameter(2), sharding={{devices=[4,1,1,2]<=[8] last_tile_dim_replicate}}
  ROOT %s = f32[8,16,4] scatter(%x, %i, %u), update_window_dims={{2}}, inserted_window_dims={{1}}, scatter_dims_to_operand_dims={{1}}, input_batching_dims={{0}}, scatter_indices_batching_dims={{0}}, index_vector_dim=2, to_apply=%add, sharding={{devices=[4,1,1,2]<=[8] last_tile_dim_replicate}}
}}
"""
    out, ours = check(text, 8)
    assert ours == 0


def test_variadic_scatter_into_sharded_operands():
    text = f"""HloModule m
{ADD}
ENTRY %main (a: f32[32,4], b: s32[32,4], i: s32[10,1], u: f32[10,4], v: s32[10,4]) -> (f32[32,4], s32[32,4]) {{
  %a = f32[32,4] parameter(0), sharding={{devices=[8,1]<=[8]}}
  %b = s32[32,4] parameter(1), sharding={{devices=[8,1]<=[8]}}
  %i = s32[10,1] parameter(2), sharding={{replicated}}
  %u = f32[10,4] parameter(3), sharding={{replicated}}
  %v = s32[10,4] parameter(4), sharding={{replicated}}
  ROOT %s = (f32[32,4], s32[32,4]) scatter(%a, %b, %i, %u, %v), update_window_dims={{1}}, inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply=%pair, sharding={{{{devices=[8,1]<=[8]}}, {{devices=[8,1]<=[8]}}}}
}}
"""
    out, ours = check(text, 8)
    assert ours == 0

"""dynamic-slice with a data-dependent start along a sharded dim: a short window is summed
from the tiles (all-reduce of the window) instead of gathering the operand, whenever that
moves fewer bytes. Runs on XLA's CPU runtime with poisoned padding and starts that are out
of range (clamped like the unpartitioned op); bytes compared with XLA's."""
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


def module(rows, s, x_s, out_s, dtype="f32"):
    return f"""HloModule m
ENTRY %main (x: {dtype}[{rows},6], i: s32[], j: s32[]) -> {dtype}[{s},3] {{
  %x = {dtype}[{rows},6] parameter(0), sharding={x_s}
  %i = s32[] parameter(1), sharding={{replicated}}
  %j = s32[] parameter(2), sharding={{replicated}}
  ROOT %d = {dtype}[{s},3] dynamic-slice(%x, %i, %j), dynamic_slice_sizes={{{s},3}}, sharding={out_s}
}}
"""


@pytest.mark.parametrize("rows,s,n", [(64, 1, 8), (64, 5, 8), (60, 9, 8), (30, 4, 4),
                                      (16, 3, 2)])
@pytest.mark.parametrize("start", [-4, 0, 7, 29, 1000])
def test_short_window_is_summed_from_tiles(rows, s, n, start):
    text = module(rows, s, f"{{devices=[{n},1]<=[{n}]}}", "{replicated}")
    m = parse_module(text)
    original = module_bytes(m)
    out = partition_in_place(m, n, complete=True).module
    rng = np.random.RandomState(0)
    inputs = [rng.randn(rows, 6).astype(np.float32), np.int32(start), np.int32(start % 5 - 1)]
    report = verify(original, module_bytes(out), n, inputs=inputs, poison_padding=True)
    assert report.ok, str(report)
    ops = {i.opcode for i in out.instructions()}
    assert "all-gather" not in ops and "all-reduce" in ops
    ours = module_stats(out, n).total_bytes_per_device
    xla = module_stats(load_module_bytes(xla_partitioned_module(original, n), "xla"), n)
    assert ours <= xla.total_bytes_per_device


def test_two_dim_sharding_and_sharded_result():
    text = module(32, 4, "{devices=[4,2]<=[8]}", "{devices=[1,1,8]<=[8] last_tile_dim_replicate}")
    m = parse_module(text)
    original = module_bytes(m)
    out = partition_in_place(m, 8, complete=True).module
    report = verify(original, module_bytes(out), 8, poison_padding=True)
    assert report.ok, str(report)


def test_long_window_still_gathers_when_cheaper():
    text = module(16, 14, "{devices=[8,1]<=[8]}", "{replicated}")
    m = parse_module(text)
    original = module_bytes(m)
    out = partition_in_place(m, 8, complete=True).module
    assert verify(original, module_bytes(out), 8, poison_padding=True).ok
    assert "all-gather" in {i.opcode for i in out.instructions()}

"""The post-partition tidy rewrites (passes/partition/tidy.py): all-reduce + own-part
dynamic-slice -> reduce-scatter (also through a transpose), all-reduce reassociation, and
all-gather + own-part slice -> the shard. Every program is run on XLA (poisoned padding)
against the unpartitioned module, and the collectives are counted."""
from __future__ import annotations

import pytest

from hlo_spmd.stats import module_stats

from test_partition_shapes import check, collectives_in  # shared helpers

ADD = """add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
"""


def module(body: str, reducers: bool = False) -> str:
    return f"HloModule m\n\n{ADD if reducers else ''}\nENTRY main {{\n{body}\n}}\n"

pytest.importorskip("jax")


def test_reduction_over_sharded_dim_wanted_sharded_is_reduce_scatter():
    text = module("""
  p = f32[16,8] parameter(0), sharding={devices=[4,1]<=[4]}
  z = f32[] constant(0)
  ROOT r = f32[8] reduce(p, z), dimensions={0}, to_apply=add, sharding={devices=[4]<=[4]}""",
                  reducers=True)
    result = check(text, 4)
    assert collectives_in(result.module) == ["reduce-scatter"]
    # Half an all-reduce: (g-1)/g of the 32-byte partial sums.
    assert module_stats(result.module, 4).total_bytes_per_device == pytest.approx(24.0)


def test_gradient_transposed_then_cut_is_reduce_scatter():
    # dW = x^T dy contracted over the (sharded) batch, transposed, wanted row-sharded.
    text = module("""
  x = f32[16,8] parameter(0), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  dy = f32[16,12] parameter(1), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  g = f32[12,8] dot(dy, x), lhs_contracting_dims={0}, rhs_contracting_dims={0}, sharding={replicated}
  ROOT t = f32[8,12] transpose(g), dimensions={1,0}, sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}""")
    result = check(text, 4)
    assert collectives_in(result.module) == ["reduce-scatter"]


def test_sum_of_two_all_reduces_is_one():
    text = module("""
  a = f32[8,16] parameter(0), sharding={devices=[1,4]<=[4]}
  b = f32[16,8] parameter(1), sharding={devices=[4,1]<=[4]}
  c = f32[8,16] parameter(2), sharding={devices=[1,4]<=[4]}
  d = f32[16,8] parameter(3), sharding={devices=[4,1]<=[4]}
  ab = f32[8,8] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
  cd = f32[8,8] dot(c, d), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
  ROOT s = f32[8,8] add(ab, cd), sharding={replicated}""")
    result = check(text, 4)
    assert collectives_in(result.module) == ["all-reduce"]


def test_all_reduce_with_another_user_is_kept():
    # ab is also returned whole: the partial sums must still be reduced on their own.
    text = module("""
  a = f32[8,16] parameter(0), sharding={devices=[1,4]<=[4]}
  b = f32[16,8] parameter(1), sharding={devices=[4,1]<=[4]}
  c = f32[8,16] parameter(2), sharding={devices=[1,4]<=[4]}
  d = f32[16,8] parameter(3), sharding={devices=[4,1]<=[4]}
  ab = f32[8,8] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
  cd = f32[8,8] dot(c, d), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
  s = f32[8,8] add(ab, cd), sharding={replicated}
  ROOT t = (f32[8,8], f32[8,8]) tuple(s, ab), sharding={{replicated}, {replicated}}""")
    result = check(text, 4)
    assert collectives_in(result.module) == ["all-reduce", "all-reduce"]


def test_all_gather_cut_back_to_own_tile_is_the_shard():
    from hlo_spmd.ir.builder import Builder
    from hlo_spmd.ir.computation import Computation
    from hlo_spmd.ir.module import Module
    from hlo_spmd.ir.primitive_types import PrimitiveType
    from hlo_spmd.ir.shape import Shape
    from hlo_spmd.passes.partition.tidy import tidy_module
    import numpy as np

    m = Module("fold")
    comp = Computation("main")
    m.add_computation(comp)
    m.entry = comp
    b = Builder(comp)
    x = b.parameter(0, Shape.array(PrimitiveType.F32, (4, 8)), name="x")
    ag = b.all_gather(x, 0, np.arange(4).reshape(1, 4))
    table = b.constant(np.asarray([0, 4, 8, 12], np.int64), PrimitiveType.S32)
    off = b.reshape(b.dynamic_slice(table, [b.partition_id()], [1]), [])
    ds = b.dynamic_slice(ag, [off, b.constant(np.int64(0), PrimitiveType.S32)], [4, 8])
    b.set_root(b.negate(ds))
    tidy_module(m, 4)
    assert not any(i.opcode == "all-gather" for i in comp.instructions)
    assert comp.root.operands[0] is x
    # Another device order in the table: not this device's own tile, kept.
    m2 = Module("keep")
    comp2 = Computation("main")
    m2.add_computation(comp2)
    m2.entry = comp2
    b = Builder(comp2)
    x = b.parameter(0, Shape.array(PrimitiveType.F32, (4, 8)), name="x")
    ag = b.all_gather(x, 0, np.arange(4).reshape(1, 4))
    table = b.constant(np.asarray([4, 0, 8, 12], np.int64), PrimitiveType.S32)
    off = b.reshape(b.dynamic_slice(table, [b.partition_id()], [1]), [])
    ds = b.dynamic_slice(ag, [off, b.constant(np.int64(0), PrimitiveType.S32)], [4, 8])
    b.set_root(b.negate(ds))
    tidy_module(m2, 4)
    assert any(i.opcode == "all-gather" for i in comp2.instructions)

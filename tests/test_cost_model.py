"""One cost model: ``reshard.reshard_cost`` prices a reshard at exactly the bytes per
device that ``stats`` (collectives/cost.py) reads off the program ``reshard`` emits, for
every kind of pair (plain tiled, partially replicated, uneven, maximal, replicated), and
the dot planner's estimate of a whole dot is the figure ``stats`` reports for it."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from hlo_spmd.ir.text_parser import parse_module
from hlo_spmd.passes.partition import partition_in_place
from hlo_spmd.passes.partition.reshard import reshard_cost
from hlo_spmd.sharding import HloSharding, parse_sharding
from hlo_spmd.stats import module_stats

from test_reshard_routes import build, cases  # shared builders and strategies


def emitted_bytes(dims, src, dst, n) -> float:
    out = partition_in_place(build(dims, src, dst), n, complete=True).module
    return module_stats(out, n).total_bytes_per_device


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases(max_rank=3, max_dim=12))
def test_reshard_cost_is_what_stats_reports(case):
    dims, src, dst, n = case
    assert reshard_cost(dims, 4.0, src, dst, n) == pytest.approx(emitted_bytes(dims, src, dst, n))


@pytest.mark.parametrize("dims,src,dst", [
    ([8, 6], "{maximal device=2}", "{replicated}"),
    ([8, 6], "{maximal device=1}", "{devices=[4,1]<=[4]}"),
    ([7, 5], "{devices=[2,2]<=[4]}", "{maximal device=3}"),
    ([7, 5], "{devices=[4,1]<=[4]}", "{devices=[1,2,2]<=[4] last_tile_dim_replicate}"),
    ([9, 3], "{devices=[2,2]<=[4]}", "{devices=[2,2]3,1,2,0}"),
])
def test_reshard_cost_special_pairs(dims, src, dst):
    src, dst = parse_sharding(src), parse_sharding(dst)
    assert reshard_cost(dims, 4.0, src, dst, 4) == pytest.approx(emitted_bytes(dims, src, dst, 4))


def test_manual_pairs():
    m, r = HloSharding.manual(), HloSharding.replicate()
    assert reshard_cost([4], 4.0, m, m, 4) == 0
    assert reshard_cost([4], 4.0, r, m, 4) == 0
    assert reshard_cost([4], 4.0, m, r, 4) == float("inf")


@pytest.mark.parametrize("lhs,rhs,out", [
    ("{devices=[4,1]<=[4]}", "{replicated}", "{devices=[4,1]<=[4]}"),          # local
    ("{devices=[1,4]<=[4]}", "{devices=[4,1]<=[4]}", "{replicated}"),          # all-reduce
    ("{devices=[1,4]<=[4]}", "{devices=[4,1]<=[4]}", "{devices=[4,1]<=[4]}"),  # reduce-scatter
    ("{devices=[2,2]<=[4]}", "{devices=[2,2]<=[4]}", "{devices=[2,2]<=[4]}"),  # 2-D
    ("{devices=[4,1]<=[4]}", "{devices=[1,4]<=[4]}", "{devices=[1,4]<=[4]}"),  # a gather
])
def test_dot_planner_cost_is_what_stats_reports(lhs, rhs, out):
    from hlo_spmd.passes.partition.support.dot_dims import DotDims
    from hlo_spmd.passes.partition.support.dot_plan import Planner, Problem

    text = f"""HloModule m, num_partitions=4

ENTRY main {{
  a = f32[32,24] parameter(0), sharding={lhs}
  b = f32[24,16] parameter(1), sharding={rhs}
  ROOT d = f32[32,16] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={out}
}}
"""
    module = parse_module(text)
    dot = module.entry.root
    problem = Problem(DotDims.of(dot), (32, 24), (24, 16), parse_sharding(lhs),
                      parse_sharding(rhs), parse_sharding(out), 4, (4, 4, 4))
    planned = Planner().plan(problem).cost.bytes
    result = partition_in_place(module, 4, complete=True)
    assert planned == pytest.approx(module_stats(result.module, 4).total_bytes_per_device)


def test_maximal_to_one_tiled_dim_is_one_reduce_scatter():
    from test_reshard_routes import run_case

    assert run_case([8, 6], "{maximal device=1}", "{devices=[4,1]3,1,0,2}", 4) == \
        {"reduce-scatter": 1}


@pytest.mark.parametrize("et,ebytes", [("s4", 0.5), ("u8", 1.0), ("bf16", 2.0), ("f32", 4.0)])
@pytest.mark.parametrize("lhs,rhs,out", [
    ("{devices=[1,4]<=[4]}", "{devices=[4,1]<=[4]}", "{replicated}"),          # all-reduce
    ("{devices=[4,1]<=[4]}", "{devices=[1,4]<=[4]}", "{devices=[1,4]<=[4]}"),  # a gather
])
def test_dot_price_and_stats_agree_on_element_size(et, ebytes, lhs, rhs, out):
    """4-, 8-, 16- and 32-bit types: the dot handler's element size (packed, as
    ``Shape.byte_size``) prices the dot at the bytes ``stats`` counts in the program."""
    from hlo_spmd.ir.primitive_types import element_bytes
    from hlo_spmd.passes.partition.handlers.dot import _ebytes
    from hlo_spmd.passes.partition.support.dot_dims import DotDims
    from hlo_spmd.passes.partition.support.dot_plan import Planner, Problem

    text = f"""HloModule m, num_partitions=4

ENTRY main {{
  a = {et}[32,24] parameter(0), sharding={lhs}
  b = {et}[24,16] parameter(1), sharding={rhs}
  ROOT d = {et}[32,16] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={out}
}}
"""
    module = parse_module(text)
    dot = module.entry.root
    assert _ebytes(dot.operands[0]) == element_bytes(dot.shape.element_type) == ebytes
    sizes = (_ebytes(dot.operands[0]), _ebytes(dot.operands[1]), _ebytes(dot))
    problem = Problem(DotDims.of(dot), (32, 24), (24, 16), parse_sharding(lhs),
                      parse_sharding(rhs), parse_sharding(out), 4, sizes)
    planned = Planner().plan(problem).cost.bytes
    result = partition_in_place(module, 4, complete=True)
    emitted = module_stats(result.module, 4).total_bytes_per_device
    assert emitted > 0
    assert planned == pytest.approx(emitted)


@pytest.mark.parametrize("et", ["s4", "u8", "bf16", "f32"])
def test_reshard_price_uses_packed_element_size(et):
    from hlo_spmd.ir.shape_inference import array_shape
    from hlo_spmd.ir.primitive_types import from_text
    from hlo_spmd.passes.partition.handlers.slicing import itemsize

    shape = array_shape(from_text(et), (8, 6))
    src, dst = parse_sharding("{devices=[4,1]<=[4]}"), parse_sharding("{replicated}")
    price = reshard_cost(shape.dims, itemsize(shape), src, dst, 4)
    assert price == pytest.approx(shape.byte_size() * 3 / 4)

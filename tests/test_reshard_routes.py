"""Resharding routes run on XLA: random (shape, source, target, device count) pairs.

Every case is a module ``parameter (source sharding) -> Sharding custom-call (target)``
partitioned by the real driver and run on N host CPU devices with poisoned padding; the
reassembled output must equal the input exactly. Canonical cases also pin which
collectives the chosen route uses, and the planner is checked on its own (no XLA) on
larger meshes. The deeper randomized variant is ``@pytest.mark.slow`` (``-m slow``).
"""
from __future__ import annotations

import collections
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hlo_spmd.runtime import ensure_host_devices

ensure_host_devices(8)
pytest.importorskip("jax")

from hlo_spmd import runtime as rt  # noqa: E402
from hlo_spmd.collectives.factory import CollectiveFactory  # noqa: E402
from hlo_spmd.passes.partition.causes import CauseLog
from hlo_spmd.collectives.groups import DeviceGrouping  # noqa: E402
from hlo_spmd.ir.builder import Builder  # noqa: E402
from hlo_spmd.ir.computation import Computation  # noqa: E402
from hlo_spmd.ir.io import load_module_bytes, module_bytes, module_text  # noqa: E402
from hlo_spmd.ir.module import Module  # noqa: E402
from hlo_spmd.ir.primitive_types import PrimitiveType, numpy_dtype  # noqa: E402
from hlo_spmd.ir.shape import Shape  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.passes.partition.context import PartitionContext  # noqa: E402
from hlo_spmd.passes.partition.state import ModuleState, PartitionReport  # noqa: E402
from hlo_spmd.passes.partition.pvalue import PValue  # noqa: E402
from hlo_spmd.passes.partition.reshard import reshard  # noqa: E402
from hlo_spmd.passes.partition.reshard_routes import (AllToAll, HaloSlice,  # noqa: E402
                                                      layout_of, plan_reshard)
from hlo_spmd.proto import hlo_pb2  # noqa: E402
from hlo_spmd.sharding import HloSharding, parse_sharding, tile_shape  # noqa: E402

COLLECTIVES = ("all-gather", "all-to-all", "collective-permute", "all-reduce",
               "reduce-scatter")


# -- building and running ---------------------------------------------------------------------
def build(dims, src: HloSharding, dst: HloSharding, et=PrimitiveType.F32) -> Module:
    """``p = parameter(0), sharding=src; ROOT Sharding(p), sharding=dst``."""
    m = Module("reshard")
    comp = Computation("main")
    m.add_computation(comp)
    m.entry = comp
    b = Builder(comp)
    p = b.parameter(0, Shape.array(et, dims), name="p")
    p.sharding = src
    root = b.custom_call("Sharding", [p], p.shape, name="target")
    root.sharding = dst
    b.set_root(root)
    return load_module_bytes(module_bytes(m))  # as a loaded module (attrs and all)


def collective_counts(module: Module) -> dict[str, int]:
    return dict(collections.Counter(i.opcode for i in module.instructions()
                                    if i.opcode in COLLECTIVES))


def inputs_for(dims, et, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if et == PrimitiveType.PRED:
        return rng.random(dims) < 0.5
    if et in (PrimitiveType.S32, PrimitiveType.U8):
        return rng.integers(0, 100, size=dims).astype(numpy_dtype(et))
    return rng.standard_normal(dims).astype(numpy_dtype(et))


def run_case(dims, src, dst, n, et=PrimitiveType.F32):
    """Partition and run; returns the collective counts of the partitioned module."""
    src = parse_sharding(src) if isinstance(src, str) else src
    dst = parse_sharding(dst) if isinstance(dst, str) else dst
    module = build(dims, src, dst, et)
    result = partition_in_place(module, n, complete=True)
    counts = collective_counts(result.module)
    x = inputs_for(dims, et)
    out = rt.run_partitioned(module_bytes(result.module), [x], n, poison_padding=True,
                             output_shapes=[list(dims)])
    assert out[0].shape == x.shape
    if not np.array_equal(out[0], x):
        bad = np.argwhere(out[0] != x)
        raise AssertionError(f"{list(dims)} {src} -> {dst} on {n} devices via {counts}: "
                             f"{len(bad)} wrong elements, first at {bad[0].tolist()}")
    return counts


# -- random shardings ----------------------------------------------------------------------------
@st.composite
def device_orders(draw, n: int) -> np.ndarray:
    kind = draw(st.sampled_from(["iota", "transposed", "random"]))
    if kind == "iota" or n == 1:
        return np.arange(n)
    if kind == "transposed":
        k = int(math.log2(n))
        perm = draw(st.permutations(range(k)))
        return np.arange(n).reshape([2] * k).transpose(perm).reshape(-1)
    return np.asarray(draw(st.permutations(range(n))))


@st.composite
def shardings(draw, n: int, rank: int) -> HloSharding:
    """Tiled, partially replicated or replicated over n (a power of 2) devices."""
    if draw(st.integers(0, 9)) == 0:
        return HloSharding.replicate()
    tiles = [1] * (rank + 1)  # the last one is replication
    for _ in range(int(math.log2(n))):
        tiles[draw(st.integers(0, rank))] *= 2
    arr = draw(device_orders(n)).reshape(tiles)
    if tiles[-1] > 1:
        return HloSharding.partial_tile(arr)
    return HloSharding.tile(arr.reshape(tiles[:-1]))


@st.composite
def cases(draw, max_rank: int = 3, max_dim: int = 9):
    n = draw(st.sampled_from([1, 2, 4, 8]))
    rank = draw(st.integers(1, max_rank))
    dims = draw(st.lists(st.integers(1, max_dim), min_size=rank, max_size=rank))
    return dims, draw(shardings(n, rank)), draw(shardings(n, rank)), n


# -- property tests --------------------------------------------------------------------------
@settings(max_examples=400, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases())
def test_random_reshards_preserve_the_value(case):
    dims, src, dst, n = case
    run_case(dims, src, dst, n)


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases(max_rank=2), st.sampled_from([PrimitiveType.S32, PrimitiveType.PRED,
                                           PrimitiveType.BF16]))
def test_random_reshards_other_element_types(case, et):
    dims, src, dst, n = case
    run_case(dims, src, dst, n, et)


@st.composite
def shardings_2x3(draw, rank: int) -> HloSharding:
    """Tiled or partially replicated over 6 devices: a factor 2 and a factor 3, each on a
    data dim or the replication dim, so uneven dims meet 3-way tilings."""
    tiles = [1] * (rank + 1)
    for f in (2, 3):
        tiles[draw(st.integers(0, rank))] *= f
    order = draw(st.sampled_from(["iota", "random"]))
    devices = np.arange(6) if order == "iota" else np.asarray(draw(st.permutations(range(6))))
    arr = devices.reshape(tiles)
    if tiles[-1] > 1:
        return HloSharding.partial_tile(arr)
    return HloSharding.tile(arr.reshape(tiles[:-1]))


@st.composite
def cases_2x3(draw):
    rank = draw(st.integers(1, 3))
    dims = draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank))
    return dims, draw(shardings_2x3(rank)), draw(shardings_2x3(rank)), 6


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases_2x3())
def test_random_reshards_on_six_devices_preserve_the_value(case):
    """2 x 3 meshes: tiles of uneven sizes (8 -> 3,3,2) on both sides of the reshard."""
    dims, src, dst, n = case
    run_case(dims, src, dst, n)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases(max_rank=4, max_dim=12))
def test_random_reshards_deep(case):
    dims, src, dst, n = case
    run_case(dims, src, dst, n)


@st.composite
def large_cases(draw):
    n = draw(st.sampled_from([16, 32, 64, 256]))
    rank = draw(st.integers(1, 4))
    dims = draw(st.lists(st.integers(1, 300), min_size=rank, max_size=rank))
    return dims, draw(shardings(n, rank)), draw(shardings(n, rank)), n


def check_plan_well_formed(plan, src_layout, dims):
    """Every step applies to the layout before it, with well-formed device groups."""
    from hlo_spmd.passes.partition.reshard_routes import AllGather, AllToAll, Permute

    lay = src_layout
    n = lay.num_devices
    for step, after in zip(plan.steps, plan.layouts[1:]):
        assert after.balanced()
        if isinstance(step, (AllGather, AllToAll)):
            groups = step.groups(lay)
            assert groups is not None
            assert sorted(groups.reshape(-1).tolist()) == list(range(n))
        if isinstance(step, Permute):
            pairs = step.pairs(lay)
            assert sorted(pairs[:, 0].tolist()) == list(range(n))
            assert sorted(pairs[:, 1].tolist()) == list(range(n))
            # Every device receives the tile it must hold.
            assert np.array_equal(lay.tile_ids()[pairs[:, 0]], after.tile_ids()[pairs[:, 1]])
        assert step.apply(lay, tuple(dims)).same_as(after)
        lay = after


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(cases(max_rank=4, max_dim=12), large_cases()))
def test_plans_are_well_formed(case):
    """The planner alone (no XLA), also on meshes of up to 256 devices: the plan ends on
    the target through valid steps, and ``route`` only takes it when it is cheaper than
    going through the replicated value."""
    dims, src, dst, n = case
    a, b = layout_of(src, n, len(dims)), layout_of(dst, n, len(dims))
    best, fallback = plan_reshard(a, b, dims)
    assert fallback.layouts[-1].same_as(b)
    check_plan_well_formed(fallback, a, dims)
    if a.same_as(b):
        assert best.steps == [] and best.cost == 0
    if best is None:
        return
    assert best.layouts[-1].same_as(b)
    check_plan_well_formed(best, a, dims)
    # A halo slice: a join and a permute per side; a realigning all-to-all: a permute per
    # side of its halo before and after.
    assert best.cost >= 0 and best.collectives <= sum(
        3 if isinstance(s, HaloSlice) else 5 if isinstance(s, AllToAll) and s.realign
        else 2 if getattr(s, "realign", False) else 1
        for s in best.steps)


# -- which collectives the canonical cases use ---------------------------------------------
CANONICAL = [
    # (dims, source, target, devices, expected collective counts)
    ([8, 8], "{devices=[4,1]<=[4]}", "{devices=[1,4]<=[4]}", 4, {"all-to-all": 1}),
    ([6, 5], "{devices=[4,1]<=[4]}", "{devices=[1,4]<=[4]}", 4, {"all-to-all": 1}),
    ([7, 9, 3], "{devices=[1,8,1]<=[8]}", "{devices=[1,1,8]<=[8]}", 8, {"all-to-all": 1}),
    # Two dims move at once: one all-to-all.
    ([4, 4, 4, 4], "{devices=[2,2,1,1]<=[4]}", "{devices=[1,1,2,2]<=[4]}", 4,
     {"all-to-all": 1}),
    ([8, 4, 4], "{devices=[4,1,1]<=[4]}", "{devices=[1,2,2]<=[4]}", 4, {"all-to-all": 1}),
    # Part of a dim's tiling moves.
    ([8, 8], "{devices=[4,1]<=[4]}", "{devices=[2,2]<=[4]}", 4, {"all-to-all": 1}),
    # Device permutations.
    ([8, 8], "{devices=[4,1]<=[4]}", "{devices=[4,1]0,2,1,3}", 4, {"collective-permute": 1}),
    ([5, 3], "{devices=[2,4]<=[8]}", "{devices=[2,4]<=[4,2]T(1,0)}", 8,
     {"collective-permute": 1}),
    ([6, 6], "{devices=[2,1,2]<=[4] last_tile_dim_replicate}",
     "{devices=[2,1,2]<=[2,2]T(1,0) last_tile_dim_replicate}", 4, {"collective-permute": 1}),
    # Replicated / partially replicated -> finer: a local dynamic-slice.
    ([8, 8], "{replicated}", "{devices=[2,4]<=[8]}", 8, {}),
    ([7, 5], "{replicated}", "{devices=[4,2]<=[2,4]T(1,0)}", 8, {}),
    ([8, 8], "{devices=[2,1,2]<=[4] last_tile_dim_replicate}", "{devices=[2,2]<=[4]}", 4, {}),
    ([7, 8], "{devices=[1,2,4]<=[8] last_tile_dim_replicate}",
     "{devices=[1,4,2]<=[8] last_tile_dim_replicate}", 8, {}),
    ([9, 6], "{devices=[2,1,4]<=[8] last_tile_dim_replicate}", "{devices=[2,4]<=[8]}", 8, {}),
    # Fewer tiles: all-gather within the groups that lose tiles, nothing more.
    ([8, 8], "{devices=[2,2]<=[4]}", "{devices=[2,1,2]<=[4] last_tile_dim_replicate}", 4,
     {"all-gather": 1}),
    ([7, 5], "{devices=[2,4]<=[8]}", "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}",
     8, {"all-gather": 1}),
    ([8, 8], "{devices=[2,4]<=[8]}", "{replicated}", 8, {"all-gather": 2}),
    # Partially replicated, the tiled dim changes: one all-to-all.
    ([8, 8], "{devices=[2,1,2]<=[4] last_tile_dim_replicate}",
     "{devices=[1,2,2]<=[4] last_tile_dim_replicate}", 4, {"all-to-all": 1}),
    # Combinations.
    ([8, 8], "{devices=[4,1]<=[4]}", "{devices=[1,4]0,2,1,3}", 4,
     {"all-to-all": 1, "collective-permute": 1}),
    ([8, 8], "{devices=[2,1,2]<=[4] last_tile_dim_replicate}", "{devices=[1,4]<=[4]}", 4,
     {"all-to-all": 1}),
    # Uneven: a dim gives its tiling away and is cut 3-way after; a dim's uneven 3-way
    # tiling is gathered before it takes the other dim's.
    ([8, 8], "{devices=[1,2,3]<=[6] last_tile_dim_replicate}", "{devices=[2,3]<=[6]}", 6,
     {"all-to-all": 1}),
    ([8, 8], "{devices=[2,3]<=[6]}", "{devices=[1,2,3]<=[6] last_tile_dim_replicate}", 6,
     {"all-gather": 1, "all-to-all": 1}),
    # Uneven all-to-all: the receiving dim's tiles of 3 re-cut to 4 by a halo before it,
    # the giving dim's joined tiles of 4 re-cut to 3 after it, then the device order.
    ([5, 5], "{devices=[2,4]<=[4,2]T(1,0)}", "{devices=[4,2]<=[8]}", 8,
     {"all-to-all": 1, "collective-permute": 3}),
    # Uneven gather: 8 tiles of 1 row of 2 joined in fours; each group's row arrives at
    # one member by a permute, then the group sums its one data piece.
    ([2, 6], "{devices=[8,1]<=[8]}", "{devices=[2,1,4]<=[8] last_tile_dim_replicate}", 8,
     {"collective-permute": 1, "all-reduce": 1}),
]


@pytest.mark.parametrize("dims,src,dst,n,expected", CANONICAL,
                         ids=[f"{c[1]}->{c[2]}" for c in CANONICAL])
def test_canonical_routes(dims, src, dst, n, expected):
    assert run_case(dims, src, dst, n) == expected


def test_same_placement_is_free():
    """Another spelling of the same placement (explicit devices vs iota) moves nothing."""
    assert run_case([8, 6], "{devices=[2,2]<=[4]}", "{devices=[2,2]0,1,2,3}", 4) == {}
    assert run_case([8, 6], "{devices=[2,1,2]<=[2,2]T(1,0) last_tile_dim_replicate}",
                    "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}", 4) == {}


def test_all_to_all_is_cheaper_than_the_replicated_route():
    s = parse_sharding("{devices=[8,1]<=[8]}")
    t = parse_sharding("{devices=[1,8]<=[8]}")
    best, fallback = plan_reshard(layout_of(s, 8, 2), layout_of(t, 8, 2), [64, 64])
    assert best.describe() == "AllToAll"
    # (g-1)/g of the 8x64 local f32 block vs gathering 7 more blocks.
    assert best.cost == pytest.approx(7 / 8 * 8 * 64 * 4)
    assert fallback.cost == pytest.approx(7 * 8 * 64 * 4)


def test_permute_is_placed_where_the_buffer_is_smallest():
    """Gathering to a differently ordered partial replication: permuting the small source
    shards first beats permuting the gathered ones."""
    s = parse_sharding("{devices=[8]<=[8]}")
    t = parse_sharding("{devices=[2,4]<=[4,2]T(1,0) last_tile_dim_replicate}")
    best, _ = plan_reshard(layout_of(s, 8, 1), layout_of(t, 8, 1), [64])
    assert best.describe() == "Permute -> AllGather"
    assert run_case([64], s, t, 8) == {"collective-permute": 1, "all-gather": 1}


# -- inside a device group -------------------------------------------------------------------
def _logical_array(s: HloSharding, m: int, rank: int) -> np.ndarray:
    """The tile array with a trailing replication dim (size 1 if none)."""
    if s.is_replicated:
        return np.arange(m).reshape((1,) * rank + (m,))
    arr = s.tile_assignment.array()
    return arr if s.replicate_on_last_tile_dim else arr.reshape(arr.shape + (1,))


def _global(s: HloSharding, groups: np.ndarray, rank: int) -> HloSharding:
    """The global sharding of a value sharded ``s`` within every group of ``groups``."""
    arr = _logical_array(s, groups.shape[1], rank)
    phys = groups[:, arr]                                  # [G, tiles..., R]
    phys = np.moveaxis(phys, 0, -1)                        # [tiles..., R, G]
    phys = phys.reshape(phys.shape[:-2] + (-1,))
    return HloSharding.partial_tile(phys)


def run_grouped(dims, src, dst, groups: np.ndarray):
    """Reshard inside ``DeviceGrouping(groups)`` and run on all devices."""
    n = groups.size
    m = groups.shape[1]
    out = Module("grouped")
    out.attrs = hlo_pb2.HloModuleProto()
    comp = Computation("main")
    out.add_computation(comp)
    out.entry = comp
    b = Builder(comp)
    state = ModuleState(out, out, n, PartitionReport())
    ctx = PartitionContext(state, b, CollectiveFactory(b, DeviceGrouping(groups), CauseLog()))
    assert not ctx.grouping.is_flat and ctx.num_devices == m
    base = Shape.array(PrimitiveType.F32, dims)
    param = b.parameter(0, base.with_dims(tile_shape(src, dims)) if src.is_tiled else base,
                        name="p")
    res = reshard(ctx, PValue(param, base, src), dst).hlo
    if res is param:
        res = b.op("copy", [res], declared=res.shape)
    b.set_root(res)
    param.sharding = HloSharding.manual()
    res.sharding = HloSharding.manual()
    counts = collective_counts(out)
    gsrc, gdst = _global(src, groups, len(dims)), _global(dst, groups, len(dims))
    proto = rt.with_spmd_shardings(module_bytes(out), [gsrc], gdst)
    x = inputs_for(dims, PrimitiveType.F32)
    got = rt.run_partitioned(proto, [x], n, poison_padding=True, output_shapes=[list(dims)])
    np.testing.assert_array_equal(got[0], x)
    return counts


GROUPINGS = [np.array([[0, 2, 4, 6], [1, 3, 5, 7]]), np.array([[7, 1, 4, 2], [0, 6, 3, 5]]),
             np.array([[0, 1], [2, 3], [4, 5], [6, 7]]),
             np.array([[5, 0], [3, 6], [1, 7], [2, 4]])]


@pytest.mark.parametrize("groups", GROUPINGS, ids=lambda g: str(g.tolist()))
def test_grouped_canonical(groups):
    m = groups.shape[1]
    tiled0 = HloSharding.tile(np.arange(m).reshape(m, 1))
    tiled1 = HloSharding.tile(np.arange(m).reshape(1, m))
    assert run_grouped([8, 6], tiled0, tiled1, groups) == {"all-to-all": 1}
    rev = HloSharding.tile(np.arange(m)[::-1].reshape(m, 1))
    assert run_grouped([7, 6], tiled0, rev, groups) == {"collective-permute": 1}
    assert run_grouped([7, 6], HloSharding.replicate(), tiled1, groups) == {}
    assert run_grouped([7, 6], tiled0, HloSharding.replicate(), groups) == {"all-gather": 1}


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_grouped_random(data):
    """Random shardings within random groupings of the 8 devices (2x4, 4x2, any order)."""
    shape = data.draw(st.sampled_from([(2, 4), (4, 2)]))
    groups = np.array(data.draw(st.permutations(range(8)))).reshape(shape)
    m = groups.shape[1]
    rank = data.draw(st.integers(1, 3))
    dims = data.draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank))
    src = data.draw(shardings(m, rank))
    dst = data.draw(shardings(m, rank))
    run_grouped(dims, src, dst, groups)


# -- chains of reshards: one all-to-all feeding the next ----------------------------------------
# XLA's CPU pipeline cuts every array all-to-all into a tuple all-to-all of slices, whose
# operands must agree in shape AND layout, and its layout-blind algebraic simplifier may
# then forward one slice to an earlier value of the same dims. An all-to-all that read a
# transpose (a permuted layout in XLA) passed that layout on to its result; a second
# all-to-all fed with one forwarded piece of it and one fresh slice was refused:
# "all-to-all has operands with different shapes: f32[1,1,2,1] vs f32[1,1,2,1]".
TWO_ALL_TO_ALLS = """
HloModule two_all_to_alls

ENTRY main {
  p0 = f32[1,2,1] parameter(0), sharding={devices=[2,1,1]0,1}
  c1 = f32[1,2,1] copy(p0), sharding={devices=[1,1,2]0,1}
  ROOT c2 = f32[1,2,1] copy(c1), sharding={devices=[2,1,1]0,1}
}
"""


def verify_partitioned(module: Module, n: int) -> Module:
    """Partition ``module`` (every instruction annotated) and check it on XLA against the
    unpartitioned module with poisoned padding; returns the partitioned module."""
    original = module_bytes(module)
    result = partition_in_place(module, n, complete=True)
    report = rt.verify(original, module_bytes(result.module), n, poison_padding=True)
    assert report.ok, f"{report}\n{module_text(result.module)}"
    return result.module


def check_all_to_all_operands(module: Module) -> None:
    """Every all-to-all reads a reshape that changes the rank (a default-layout value in
    XLA, never a transpose or a reshape an importer folds away)."""
    for inst in module.instructions():
        if inst.opcode != "all-to-all":
            continue
        (x,) = inst.operands
        assert x.opcode == "reshape", module_text(module)
        assert x.operands[0].shape.rank != x.shape.rank, module_text(module)


def test_two_all_to_alls_in_a_row_compile_and_run():
    module = verify_partitioned(parse_module(TWO_ALL_TO_ALLS), 2)
    assert collective_counts(module) == {"all-to-all": 2}
    check_all_to_all_operands(module)


def chain_module(dims, shardings: list[str], n: int, transpose_at: int | None = None,
                 perm=None) -> Module:
    """``p (shardings[0]) -> copy (shardings[1]) -> ...``, every value annotated; a
    transpose by ``perm`` replaces the copy at position ``transpose_at``."""
    m = Module("chain")
    m.attrs = hlo_pb2.HloModuleProto()
    comp = Computation("main")
    m.add_computation(comp)
    m.entry = comp
    b = Builder(comp)
    x = b.parameter(0, Shape.array(PrimitiveType.F32, dims), name="p")
    x.sharding = parse_sharding(shardings[0])
    for i, s in enumerate(shardings[1:], start=1):
        x = b.transpose(x, perm) if i == transpose_at else b.unary("copy", x)
        x.sharding = parse_sharding(s)
    b.set_root(x)
    return m


CHAINS = [
    # (dims, shardings along the chain, devices, all-to-alls expected)
    ([1, 2, 1], ["{devices=[2,1,1]0,1}", "{devices=[1,1,2]0,1}", "{devices=[2,1,1]0,1}",
                 "{devices=[1,1,2]0,1}"], 2, 3),
    ([3, 5], ["{devices=[2,1]0,1}", "{devices=[1,2]0,1}", "{devices=[2,1]0,1}"], 2, 2),
    # (The first step is a halo cut, HaloSlice: device 0 takes the one column it lacks,
    # 8 bytes, where the padded all-to-all moves 12.)
    ([1, 3, 2], ["{devices=[1,2,1]<=[2]}", "{devices=[2,1,1]<=[2]}",
                 "{devices=[1,1,2]<=[2]}", "{devices=[1,2,1]<=[2]}"], 2, 2),
    # Two moves in one all-to-all, there and back.
    ([4, 4, 4], ["{devices=[2,2,1]<=[4]}", "{devices=[1,1,4]<=[4]}",
                 "{devices=[2,2,1]<=[4]}"], 4, 2),
    ([3, 1, 5], ["{devices=[4,1,1]<=[4]}", "{devices=[1,2,2]<=[4]}",
                 "{devices=[4,1,1]<=[4]}"], 4, 2),
    ([8, 6], ["{devices=[8,1]<=[8]}", "{devices=[1,8]<=[8]}", "{devices=[2,4]<=[8]}",
              "{devices=[8,1]<=[8]}"], 8, 3),
]


@pytest.mark.parametrize("dims,chain,n,a2a", CHAINS, ids=[" ".join(c[1]) for c in CHAINS])
def test_chained_all_to_alls(dims, chain, n, a2a):
    module = verify_partitioned(chain_module(dims, chain, n), n)
    assert collective_counts(module).get("all-to-all", 0) == a2a
    check_all_to_all_operands(module)


def test_all_to_all_after_a_transpose():
    """A user transpose (a permuted layout in XLA) between two all-to-alls."""
    module = verify_partitioned(chain_module(
        [2, 3, 1], ["{devices=[2,1,1]0,1}", "{devices=[1,1,2]0,1}", "{devices=[1,2,1]0,1}",
                    "{devices=[2,1,1]0,1}"], 2, transpose_at=2, perm=[2, 1, 0]), 2)
    check_all_to_all_operands(module)


@st.composite
def chains(draw, max_dim: int = 5):
    n = draw(st.sampled_from([2, 4, 8]))
    rank = draw(st.integers(1, 3))
    dims = draw(st.lists(st.integers(1, max_dim), min_size=rank, max_size=rank))
    a, b = draw(shardings(n, rank)), draw(shardings(n, rank))
    length = draw(st.integers(2, 4))
    return dims, [str(a if i % 2 == 0 else b) for i in range(length + 1)], n


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(chains())
def test_random_reshard_chains(case):
    """Back and forth between two random shardings: each reshard reads the last one's
    output (all-to-all after all-to-all, with and without uneven padding)."""
    dims, chain, n = case
    check_all_to_all_operands(verify_partitioned(chain_module(dims, chain, n), n))


@pytest.mark.slow
@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(chains(max_dim=9))
def test_random_reshard_chains_deep(case):
    dims, chain, n = case
    check_all_to_all_operands(verify_partitioned(chain_module(dims, chain, n), n))

"""The dot handler (GSPMD sections 3.2 and 4.4): strategies, recursive grouping, cost-based
choice, uneven dims.

Every module is annotated on every instruction, partitioned with
``partition_in_place(module, n, complete=True)`` and run on n host CPU devices against the
unpartitioned original with poisoned padding (``verify``). Canonical cases also pin the
collectives the strategy needs; the geometry helpers and the planner are tested directly.
"""
from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hlo_spmd.runtime import ensure_host_devices

ensure_host_devices(8)  # before jax creates its backends

from hlo_spmd.ir.io import load_module, module_bytes  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.ir.text_printer import print_instruction  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.passes.partition.support import dot_dims as dd  # noqa: E402
from hlo_spmd.passes.partition.support.dot_plan import Planner, Problem  # noqa: E402
from hlo_spmd.sharding import (HloSharding, group_by_dims, parse_sharding,  # noqa: E402
                               shard_bounds, ungroup)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hlo"
COLLECTIVES = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all",
               "collective-permute"}
MM = "lhs_contracting_dims={1}, rhs_contracting_dims={0}"
BMM = ("lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, "
       "rhs_contracting_dims={1}")


# -- helpers -------------------------------------------------------------------------------
def dot_text(lhs: str, rhs: str, out: str, ls: str, rs: str, os_: str, dnums: str = MM,
             et: str = "f32", out_et: str | None = None) -> str:
    return f"""HloModule m
ENTRY e {{
  a = {et}[{lhs}] parameter(0), sharding={ls}
  b = {et}[{rhs}] parameter(1), sharding={rs}
  ROOT d = {out_et or et}[{out}] dot(a, b), {dnums}, sharding={os_}
}}
"""


def collectives(module) -> Counter:
    return Counter(i.opcode for c in module.computations for i in c.instructions
                   if i.opcode in COLLECTIVES)


def run(text: str, n: int, check: bool = True):
    """Partition (complete=True) and verify on n devices; returns the PartitionedModule."""
    from hlo_spmd.runtime import verify

    module = parse_module(text)
    original = module_bytes(module)
    result = partition_in_place(module, n, complete=True)
    if check:
        report = verify(original, module_bytes(result.module), n, poison_padding=True)
        assert report.ok, f"{report}\nplans: {getattr(result.report, 'dot_plans', None)}"
    return result


def plans(result) -> dict:
    return getattr(result.report, "dot_plans", {})


# -- canonical cases: result + the collectives they need -----------------------------------
R8 = "{devices=[8,1]<=[8]}"
C8 = "{devices=[1,8]<=[8]}"
REP = "{replicated}"

CANONICAL = [
    # (id, text, n, expected collectives)
    ("batch-matched", dot_text("8,16,32", "8,32,16", "8,16,16", "{devices=[8,1,1]<=[8]}",
                               "{devices=[8,1,1]<=[8]}", "{devices=[8,1,1]<=[8]}", BMM),
     8, {}),
    ("batch-matched-partial-replication",
     dot_text("8,16,32", "8,32,16", "8,16,16", "{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}",
              "{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}",
              "{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}", BMM), 8, {}),
    ("contracting-allreduce", dot_text("16,32", "32,24", "16,24", C8, R8, REP), 8,
     {"all-reduce": 1}),
    ("contracting-reducescatter", dot_text("16,32", "32,24", "16,24", C8, R8, R8), 8,
     {"reduce-scatter": 1}),
    ("contracting-reducescatter-cols", dot_text("16,32", "32,24", "16,24", C8, R8, C8), 8,
     {"reduce-scatter": 1}),
    ("lhs-noncontracting", dot_text("16,32", "32,24", "16,24", R8, REP, R8), 8, {}),
    ("rhs-noncontracting", dot_text("16,32", "32,24", "16,24", REP, C8, C8), 8, {}),
    ("both-noncontracting-2d", dot_text("16,32", "32,24", "16,24",
                                        "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
                                        "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}",
                                        "{devices=[2,4]<=[8]}"), 8, {}),
    ("gather-for-replicated-output", dot_text("16,32", "32,24", "16,24", R8, REP, REP), 8,
     {"all-gather": 1}),
    ("replicated-operands-sharded-output",
     dot_text("16,32", "32,24", "16,24", REP, REP,
              "{devices=[2,2,2]<=[8] last_tile_dim_replicate}"), 8, {}),
    # weight-update sharding (paper 3.2): data-parallel x, weight sharded like the data;
    # forward all-gathers the weight on demand, the weight gradient reduce-scatters.
    ("wus-forward", dot_text("256,32", "32,24", "256,24", R8, R8, R8), 8, {"all-gather": 1}),
    ("wus-gradient", dot_text("256,32", "256,24", "32,24", R8, R8, R8,
                              "lhs_contracting_dims={0}, rhs_contracting_dims={0}"), 8,
     {"reduce-scatter": 1}),
    # partially replicated operands (dot_variants): contracting on a 4-axis, replicated on 2
    ("partial-replication-contracting",
     dot_text("16,32", "32,24", "16,24", "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}",
              "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}", REP), 8,
     {"all-reduce": 1}),
    ("batch-and-contracting-2d",
     dot_text("8,16,32", "8,32,16", "8,16,16", "{devices=[2,1,4]<=[8]}", "{devices=[2,4,1]<=[8]}",
              "{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}", BMM), 8, {"all-reduce": 1}),
    ("batch-and-contracting-2d-scatter",
     dot_text("8,16,32", "8,32,16", "8,16,16", "{devices=[2,1,4]<=[8]}", "{devices=[2,4,1]<=[8]}",
              "{devices=[2,4,1]<=[8]}", BMM), 8, {"reduce-scatter": 1}),
    # uneven: 13 rows on 8 devices (padding rows only), contracting 10 over 4 (masked)
    ("uneven-rows-13-on-8", dot_text("13,32", "32,24", "13,24", R8, REP, R8), 8, {}),
    ("uneven-contracting-10-on-4", dot_text("4,10", "10,4", "4,4", "{devices=[1,4]<=[4]}",
                                            "{devices=[4,1]<=[4]}", REP), 4, {"all-reduce": 1}),
    ("uneven-contracting-13-on-8", dot_text("4,13", "13,4", "4,4", C8, R8, REP), 8,
     {"all-reduce": 1}),
    ("uneven-contracting-scatter", dot_text("16,10", "10,4", "16,4", "{devices=[1,4]<=[4]}",
                                            "{devices=[4,1]<=[4]}", "{devices=[4,1]<=[4]}"), 4,
     {"reduce-scatter": 1}),
    ("uneven-batch-and-contracting",
     dot_text("3,5,10", "3,10,7", "3,5,7", "{devices=[2,1,4]<=[8]}", "{devices=[2,4,1]<=[8]}",
              "{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}", BMM), 8, {"all-reduce": 1}),
]


@pytest.mark.parametrize("name,text,n,expected", CANONICAL, ids=[c[0] for c in CANONICAL])
def test_canonical_collectives(name, text, n, expected):
    result = run(text, n)
    assert dict(collectives(result.module)) == expected, plans(result)


def test_uneven_contracting_masks_padding():
    text = dot_text("4,10", "10,4", "4,4", "{devices=[1,4]<=[4]}", "{devices=[4,1]<=[4]}", REP)
    result = run(text, 4)
    ops = Counter(i.opcode for i in result.module.entry.instructions)
    assert ops["select"] >= 1 or ops["multiply"] >= 1, "padding of the contracting dim not masked"


def test_matched_batch_uses_grouping_and_no_collectives():
    result = run(CANONICAL[0][1], 8)
    assert plans(result)["d"].startswith("group(batch")
    assert not collectives(result.module)


def test_grouped_collectives_act_within_groups():
    """Batch x2 grouping, contracting x4 inside: the all-reduce runs in 2 groups of 4."""
    text = dot_text("8,16,32", "8,32,16", "8,16,16", "{devices=[2,1,4]<=[8]}",
                    "{devices=[2,4,1]<=[8]}", "{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}",
                    BMM)
    result = run(text, 8)
    assert "group(batch x2)" in plans(result)["d"]
    (ar,) = [i for i in result.module.entry.instructions if i.opcode == "all-reduce"]
    text = print_instruction(ar)
    assert "replica_groups=[2,4]<=[8]" in text or "{0,1,2,3},{4,5,6,7}" in text, text


def test_transposed_mesh_groups():
    """Groups taken from a transposed device order: replica groups follow the devices."""
    text = dot_text("8,16,32", "8,32,16", "8,16,16", "{devices=[2,1,4]<=[4,2]T(1,0)}",
                    "{devices=[2,4,1]<=[4,2]T(1,0)}",
                    "{devices=[2,1,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}", BMM)
    result = run(text, 8)
    assert dict(collectives(result.module)) == {"all-reduce": 1}


# -- Megatron MLP on a 2x4 mesh ------------------------------------------------------------
MEGATRON = """HloModule megatron
ENTRY e {
  x = f32[16,32] parameter(0), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  w1 = f32[32,64] parameter(1), sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  h = f32[16,64] dot(x, w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[2,4]<=[8]}
  t = f32[16,64] tanh(h), sharding={devices=[2,4]<=[8]}
  w2 = f32[64,32] parameter(2), sharding={devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  ROOT y = f32[16,32] dot(t, w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
}
"""


def test_megatron_mlp_one_allreduce():
    result = run(MEGATRON, 8)
    assert dict(collectives(result.module)) == {"all-reduce": 1}, plans(result)
    (ar,) = [i for i in result.module.entry.instructions if i.opcode == "all-reduce"]
    assert "replica_groups=[2,4]<=[8]" in print_instruction(ar)


def test_megatron_mlp_scattered_output():
    """Output tiled 2x4 instead of replicated on the 4-axis: reduce-scatter, not all-reduce."""
    text = MEGATRON.replace(
        "ROOT y = f32[16,32] dot(t, w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, "
        "sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}",
        "ROOT y = f32[16,32] dot(t, w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, "
        "sharding={devices=[2,4]<=[8]}")
    result = run(text, 8)
    assert dict(collectives(result.module)) == {"reduce-scatter": 1}, plans(result)


# -- more configurations (correctness) -----------------------------------------------------
MORE = [
    ("multi-batch-multi-contracting",
     dot_text("2,4,6,8", "4,2,8,6,5", "2,4,5",
              "{devices=[2,2,1,2]<=[8]}", "{devices=[2,2,1,2,1]<=[8]}",
              "{devices=[2,2,1,2]<=[8] last_tile_dim_replicate}",
              "lhs_batch_dims={0,1}, rhs_batch_dims={1,0}, lhs_contracting_dims={2,3}, "
              "rhs_contracting_dims={3,2}"), 8),
    ("contracting-first-dims", dot_text("32,16", "24,32", "16,24", R8, C8,
                                        "{devices=[4,2]<=[8]}",
                                        "lhs_contracting_dims={0}, rhs_contracting_dims={1}"), 8),
    ("mismatched-everything", dot_text("16,32", "32,24", "16,24",
                                       "{devices=[1,2,4]<=[8] last_tile_dim_replicate}", C8,
                                       "{devices=[4,2]<=[8]}"), 8),
    ("random-device-order",
     dot_text("16,32", "32,24", "16,24", "{devices=[2,4]3,1,6,0,2,7,5,4}",
              "{devices=[4,2]7,2,0,3,1,6,4,5}",
              "{devices=[2,2,2]5,1,2,7,0,3,4,6 last_tile_dim_replicate}"), 8),
    ("maximal-output", dot_text("16,32", "32,24", "16,24", R8, REP, "{maximal device=3}"), 8),
    ("maximal-operand", dot_text("16,32", "32,24", "16,24", "{maximal device=1}", C8, C8), 8),
    ("vector-dot", dot_text("40", "40", "", "{devices=[8]<=[8]}", "{devices=[8]<=[8]}", REP,
                            "lhs_contracting_dims={0}, rhs_contracting_dims={0}"), 8),
    ("outer-product", dot_text("12", "10", "12,10", "{devices=[4]<=[4]}", "{devices=[4]<=[4]}",
                               "{devices=[2,2]<=[4]}", "lhs_contracting_dims={}, "
                               "rhs_contracting_dims={}"), 4),
    ("int32", dot_text("16,12", "12,8", "16,8", "{devices=[1,2]<=[2]}", "{devices=[2,1]<=[2]}",
                       "{devices=[2,1]<=[2]}", et="s32"), 2),
    ("bf16-to-f32", dot_text("16,32", "32,8", "16,8", C8, R8, REP, et="bf16", out_et="f32"), 8),
    ("single-device", dot_text("5,7", "7,3", "5,3", REP, REP, REP), 1),
]


@pytest.mark.parametrize("name,text,n", MORE, ids=[c[0] for c in MORE])
def test_more_configurations(name, text, n):
    run(text, n)


def test_same_operand_twice():
    text = """HloModule m
ENTRY e {
  a = f32[16,12] parameter(0), sharding={devices=[4,2]<=[8]}
  ROOT d = f32[12,12] dot(a, a), lhs_contracting_dims={0}, rhs_contracting_dims={0}, sharding={devices=[2,4]<=[8]}
}
"""
    run(text, 8)


def test_fully_and_partially_manual():
    full = """HloModule m
ENTRY e {
  x = f32[8,16] parameter(0), sharding={devices=[1,8]<=[8]}
  m = f32[8,2] custom-call(x), custom_call_target="SPMDFullToShardShape", sharding={manual}
  w = f32[8,24] parameter(1), sharding={devices=[1,8]<=[8]}
  wm = f32[8,3] custom-call(w), custom_call_target="SPMDFullToShardShape", sharding={manual}
  d = f32[2,3] dot(m, wm), lhs_contracting_dims={0}, rhs_contracting_dims={0}, sharding={manual}
  ROOT r = f32[16,3] custom-call(d), custom_call_target="SPMDShardToFullShape", sharding={devices=[8,1]<=[8]}
}
"""
    run(full, 8)
    sub = "{devices=[1,1,4,2]<=[2,4]T(1,0) last_tile_dims={manual, replicated}}"
    partial = f"""HloModule m
ENTRY e {{
  x = f32[8,16] parameter(0), sharding={{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}}
  m = f32[8,4] custom-call(x), custom_call_target="SPMDFullToShardShape", sharding={sub}
  w = f32[8,24] parameter(1), sharding={{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}}
  wm = f32[8,6] custom-call(w), custom_call_target="SPMDFullToShardShape", sharding={sub}
  d = f32[4,6] dot(m, wm), lhs_contracting_dims={{0}}, rhs_contracting_dims={{0}}, sharding={sub}
  ROOT r = f32[16,6] custom-call(d), custom_call_target="SPMDShardToFullShape", sharding={{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}}
}}
"""
    result = run(partial, 8)
    assert not collectives(result.module)


# -- random shardings (hypothesis) ---------------------------------------------------------
def _random_sharding(draw, rank: int, n: int) -> str:
    if n == 1 or draw(st.integers(0, 6)) == 0:
        return REP
    counts = [1] * (rank + 1)
    for _ in range(n.bit_length() - 1):
        counts[draw(st.integers(0, rank))] *= 2
    if draw(st.booleans()):
        devices = np.asarray(draw(st.permutations(list(range(n)))))
    else:
        devices = np.arange(n)
    arr = devices.reshape(counts)
    if counts[-1] == 1:
        return str(HloSharding.tile(arr.reshape(counts[:-1]))) if rank else REP
    return str(HloSharding.partial_tile(arr))


@st.composite
def random_dots(draw):
    n = draw(st.sampled_from([1, 2, 4, 8]))
    size = st.sampled_from([1, 2, 3, 4, 5, 8, 10, 13, 16])
    counts = {k: draw(st.integers(0, hi)) for k, hi in (("b", 1), ("l", 2), ("r", 1), ("c", 2))}
    sizes = {k: [draw(size) for _ in range(c)] for k, c in counts.items()}
    lhs_items = [(k, i) for k in "blc" for i in range(counts[k])]
    rhs_items = [(k, i) for k in "brc" for i in range(counts[k])]
    lhs_items = draw(st.permutations(lhs_items))
    rhs_items = draw(st.permutations(rhs_items))
    ls = [sizes[k][i] for k, i in lhs_items]
    rs = [sizes[k][i] for k, i in rhs_items]

    def pos(items, kind):
        return [items.index((kind, i)) for i in range(counts[kind])]

    os_ = sizes["b"] + [ls[d] for d, (k, _) in enumerate(lhs_items) if k == "l"] + \
        [rs[d] for d, (k, _) in enumerate(rhs_items) if k == "r"]

    def j(xs):
        return ",".join(map(str, xs))

    dnums = (f"lhs_batch_dims={{{j(pos(lhs_items, 'b'))}}}, "
             f"rhs_batch_dims={{{j(pos(rhs_items, 'b'))}}}, "
             f"lhs_contracting_dims={{{j(pos(lhs_items, 'c'))}}}, "
             f"rhs_contracting_dims={{{j(pos(rhs_items, 'c'))}}}")
    text = dot_text(j(ls), j(rs), j(os_), _random_sharding(draw, len(ls), n),
                    _random_sharding(draw, len(rs), n), _random_sharding(draw, len(os_), n),
                    dnums)
    return text, n


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(random_dots())
def test_random_shardings(case):
    text, n = case
    run(text, n)


# -- the program does not grow with the device count ---------------------------------------
def _scaling_cases(n: int, x: int, y: int) -> list[str]:
    two_d = f"{{devices=[{x},{y}]<=[{n}]}}"
    rows_rep = f"{{devices=[{x},1,{y}]<=[{n}] last_tile_dim_replicate}}"
    return [
        dot_text("64,32,32", "64,32,32", "64,32,32", f"{{devices=[{n},1,1]<=[{n}]}}",
                 f"{{devices=[{n},1,1]<=[{n}]}}", f"{{devices=[{n},1,1]<=[{n}]}}", BMM),
        dot_text("128,256", "256,128", "128,128", f"{{devices=[1,{n}]<=[{n}]}}",
                 f"{{devices=[{n},1]<=[{n}]}}", REP),
        dot_text("128,256", "256,128", "128,128", f"{{devices=[1,{n}]<=[{n}]}}",
                 f"{{devices=[{n},1]<=[{n}]}}", f"{{devices=[{n},1]<=[{n}]}}"),
        dot_text("128,64", "64,256", "128,256", rows_rep,
                 f"{{devices=[1,{y},{x}]<=[{x},{y}]T(1,0) last_tile_dim_replicate}}", two_d),
        dot_text("128,256", "256,64", "128,64", two_d,
                 f"{{devices=[{y},1,{x}]<=[{x},{y}]T(1,0) last_tile_dim_replicate}}", rows_rep),
        dot_text("1024,64", "64,32", "1024,32", f"{{devices=[{n},1]<=[{n}]}}", REP, REP),
        dot_text("100,60", "60,32", "100,32", f"{{devices=[1,{n}]<=[{n}]}}",
                 f"{{devices=[{n},1]<=[{n}]}}", REP),
    ]


@pytest.mark.parametrize("index", range(7))
def test_instruction_count_independent_of_device_count(index):
    small = partition_in_place(parse_module(_scaling_cases(8, 2, 4)[index]), 8, complete=True)
    large = partition_in_place(parse_module(_scaling_cases(64, 8, 8)[index]), 64, complete=True)
    n_small = len(small.module.entry.instructions)
    n_large = len(large.module.entry.instructions)
    assert n_large == n_small, (plans(small), plans(large))
    assert sum(collectives(large.module).values()) == sum(collectives(small.module).values())


# -- fixtures (completion by sharding propagation) -----------------------------------------
@pytest.mark.parametrize("name", ["dot_variants", "mlp_2d_megatron", "mlp_dp"])
def test_fixtures(name):
    from hlo_spmd.runtime import verify

    path = FIXTURES / f"{name}.pb"
    module = load_module(path)
    original = module_bytes(module)
    result = partition_in_place(load_module(path), complete=False)
    assert result.num_partitions == 8
    report = verify(original, module_bytes(result.module), 8, poison_padding=True)
    assert report.ok, f"{report}\nplans: {plans(result)}"


# -- geometry and planner, without running -------------------------------------------------
def _dims(text: str) -> dd.DotDims:
    module = parse_module(text)
    return dd.DotDims.of(module.entry.root)


def test_dot_dims_classification():
    d = _dims(dot_text("2,4,6,8", "4,2,8,6,5", "2,4,5", REP, REP, REP,
                       "lhs_batch_dims={0,1}, rhs_batch_dims={1,0}, lhs_contracting_dims={2,3}, "
                       "rhs_contracting_dims={3,2}"))
    assert [(x.lhs, x.rhs, x.output) for x in d.batch] == [(0, 1, 0), (1, 0, 1)]
    assert [(x.lhs, x.rhs) for x in d.contracting] == [(2, 3), (3, 2)]
    assert d.lhs_non_contracting == () and [x.rhs for x in d.rhs_non_contracting] == [4]
    assert d.out_rank == 3 and d.iter_rank == 5
    assert d.lhs_iter == (0, 1, 3, 4) and d.rhs_iter == (1, 0, 4, 3, 2)
    assert d.iter_sizes((2, 4, 6, 8), (4, 2, 8, 6, 5)) == (2, 4, 5, 6, 8)


def test_lift_project_roundtrip():
    d = _dims(dot_text("8,16,32", "8,32,16", "8,16,16", REP, REP, REP, BMM))
    s = parse_sharding("{devices=[2,1,4]<=[8]}")
    t = dd.lift(s, d.lhs_iter, d.iter_rank, 8)
    assert t.tile_dims_for_data() == (2, 1, 1, 4)
    assert dd.project(t, d.lhs_iter, d.iter_rank) == s
    # rhs sees the lhs tiling on batch / contracting, output replicates the contracting tiles
    assert dd.project(t, d.rhs_iter, d.iter_rank) == parse_sharding("{devices=[2,4,1]<=[8]}")
    assert dd.project(t, d.out_iter, d.iter_rank) == parse_sharding(
        "{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}")
    groups = dd.reduction_groups(t, d.iter_rank, d.kind_iter(dd.CONTRACTING))
    assert groups.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    rs = dd.scattered(t, d.iter_rank, d.out_rank, d.kind_iter(dd.CONTRACTING), 1)
    assert rs == parse_sharding("{devices=[2,4,1]<=[8]}")


@pytest.mark.parametrize("text,dims", [
    ("{devices=[2,4]<=[8]}", [0]),
    ("{devices=[2,4]<=[8]}", [1]),
    ("{devices=[2,2,2]<=[2,2,2]T(2,0,1)}", [2]),
    ("{devices=[2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}", [0]),
    ("{devices=[4,2]3,1,6,0,2,7,5,4}", [0]),
])
def test_regroup_matches_group_by_dims(text, dims):
    s = parse_sharding(text)
    rank = s.tiled_data_rank
    g = group_by_dims(s, dims)
    groups = np.asarray(g.device_groups)
    sizes = [s.tile_dims_for_data()[d] for d in dims]
    inner = dd.regroup(s, rank, groups, dims, sizes)
    assert inner is not None
    assert dd.ungroup_to(groups, rank, dims, sizes, inner) == s
    assert ungroup(g.with_sharding(inner)) == s
    # a tensor without the grouped dims is grouped only when equal in every group
    assert dd.regroup(s, rank, groups, None, sizes) is None


def test_regroup_replicated_across_groups():
    s = parse_sharding("{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}")
    groups = np.asarray([[0, 1, 2, 3], [4, 5, 6, 7]])
    inner = dd.regroup(s, 2, groups, None, [2])
    assert inner == parse_sharding("{devices=[1,4]<=[4]}")
    assert dd.ungroup_to(groups, 2, None, [2], inner) == s


def test_reshard_cost_model():
    from hlo_spmd.passes.partition.reshard import reshard_cost

    rows = parse_sharding(R8)
    cost = reshard_cost((16, 32), 4, rows, HloSharding.replicate(), 8)
    assert cost == pytest.approx(16 * 32 * 4 * 7 / 8)
    assert reshard_cost((16, 32), 4, HloSharding.replicate(), rows, 8) == 0
    assert reshard_cost((16, 32), 4, rows, rows, 8) == 0


def test_planner_prefers_fewer_bytes():
    """Tiny weight: gather it (WUS); tiny activations: move them and reduce-scatter."""
    d = _dims(dot_text("256,32", "32,24", "256,24", REP, REP, REP))
    rows = parse_sharding(R8)

    def best(lhs_shape, rhs_shape):
        return Planner().plan(Problem(d, lhs_shape, rhs_shape, rows, rows, rows, 8, (4, 4, 4)))

    big_batch = best((256, 32), (32, 24))
    assert big_batch.cost.bytes == pytest.approx(32 * 24 * 4 * 7 / 8)
    small_batch = best((8, 512), (512, 512))
    assert small_batch.cost.bytes < 512 * 512 * 4 * 7 / 8


def test_shard_bounds_sanity_for_uneven_groups():
    """Per-group shapes use the padded shard size on grouped dims."""
    assert dd.per_group_dims((13, 32), (0,), (8,)) == (2, 32)
    assert dd.per_group_dims((13, 32), None, (8,)) == (13, 32)
    b = shard_bounds(parse_sharding(R8), (13, 32), 8)
    assert b[7, 0].tolist() == [13, 13]  # the last shard is all padding


def test_random_geometry_roundtrips():
    rng = random.Random(0)
    for _ in range(50):
        rank = rng.randint(1, 3)
        counts = [1] * (rank + 1)
        for _ in range(3):
            counts[rng.randint(0, rank)] *= 2
        devices = list(range(8))
        rng.shuffle(devices)
        s = HloSharding.partial_tile(np.asarray(devices).reshape(counts))
        if not s.is_tiled:
            continue
        tiles = s.tile_dims_for_data()
        dims = [d for d in range(rank) if tiles[d] > 1][:1]
        if not dims:
            continue
        g = group_by_dims(s, dims)
        groups = np.asarray(g.device_groups)
        inner = dd.regroup(s, rank, groups, dims, [tiles[dims[0]]])
        assert inner is not None
        assert dd.ungroup_to(groups, rank, dims, [tiles[dims[0]]], inner) == s

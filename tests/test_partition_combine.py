"""Combining independent collectives (passes/partition/combine.py): several all-reduces /
all-gathers / reduce-scatters of one kind and device grouping become one collective on
one buffer -- fewer collectives, exactly the same bytes per device (stats), the same
causes in the report, never a higher peak-live estimate or a larger array -- and every
program still computes the unpartitioned numbers on XLA (poisoned padding)."""
from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("jax")

from hlo_spmd.ir.io import load_module, module_bytes  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.partition import PartitionOptions, partition_in_place  # noqa: E402
from hlo_spmd.report import build_report  # noqa: E402
from hlo_spmd.runtime import verify  # noqa: E402
from hlo_spmd.stats import module_stats  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OFF = PartitionOptions(combine_threshold_mib=0)
# A big replicated value whose exponential is the program's peak, so the collectives'
# part of the program is not where the peak is (combining may not raise it).
BIG = """
  big = f32[128,128] parameter({k}), sharding={{replicated}}
  e = f32[128,128] exponential(big), sharding={{replicated}}"""


def run(text: str, n: int, options: PartitionOptions | None = None):
    module = parse_module(text)
    original = module_bytes(module)
    result = partition_in_place(module, n, complete=True, options=options)
    report = verify(original, module_bytes(result.module), n, poison_padding=True)
    assert report.ok, str(report)
    return result


def count(module, opcode: str) -> int:
    return sum(1 for i in module.instructions() if i.opcode == opcode)


def compare(text: str, n: int, opcode: str):
    """Partition with and without combining; both verified on XLA."""
    on = run(text, n)
    off = run(text, n, OFF)
    a, b = module_stats(on.module, n), module_stats(off.module, n)
    assert a.total_bytes_per_device == pytest.approx(b.total_bytes_per_device)
    assert a.peak_live_bytes <= b.peak_live_bytes
    assert a.largest_array.bytes <= b.largest_array.bytes
    return on, off, count(on.module, opcode), count(off.module, opcode)


def partial_sums(out_sharding: str, m: int = 3) -> str:
    """``m`` dots contracting a sharded dim (partial sums), results wanted as given."""
    params = "\n".join(
        f"  x{i} = f32[8,16] parameter({2 * i}), sharding={{devices=[1,4]<=[4]}}\n"
        f"  w{i} = f32[16,8] parameter({2 * i + 1}), sharding={{devices=[4,1]<=[4]}}\n"
        f"  d{i} = f32[8,8] dot(x{i}, w{i}), lhs_contracting_dims={{1}}, "
        f"rhs_contracting_dims={{0}}, sharding={out_sharding}" for i in range(m))
    outs = ", ".join(f"d{i}" for i in range(m))
    shapes = ", ".join(["f32[8,8]"] * m + ["f32[128,128]"])
    return (f"HloModule m\n\nENTRY main {{\n{params}{BIG.format(k=2 * m)}\n"
            f"  ROOT t = ({shapes}) tuple({outs}, e)\n}}\n")


def test_independent_all_reduces_become_one():
    on, off, combined, separate = compare(partial_sums("{replicated}"), 4, "all-reduce")
    assert (combined, separate) == (1, 3)


@pytest.mark.parametrize("sharding", ["{devices=[4,1]<=[4]}", "{devices=[1,4]<=[4]}"])
def test_independent_reduce_scatters_become_one(sharding):
    _, _, combined, separate = compare(partial_sums(sharding), 4, "reduce-scatter")
    assert (combined, separate) == (1, 3)


@pytest.mark.parametrize("tiles", ["[4,1]", "[1,4]", "[2,2]"])
def test_independent_all_gathers_become_one(tiles):
    # Three tiled values wanted whole (copies into replicated results).
    params = "\n".join(
        f"  a{i} = f32[8,12] parameter({i}), sharding={{devices={tiles}<=[4]}}\n"
        f"  c{i} = f32[8,12] copy(a{i}), sharding={{replicated}}" for i in range(3))
    text = (f"HloModule m\n\nENTRY main {{\n{params}{BIG.format(k=3)}\n"
            "  ROOT t = (f32[8,12], f32[8,12], f32[8,12], f32[128,128]) tuple(c0, c1, c2, e)\n}\n")
    _, _, combined, separate = compare(text, 4, "all-gather")
    assert combined < separate


def test_threshold_bounds_the_combined_size():
    text = partial_sums("{replicated}")
    tiny = run(text, 4, PartitionOptions(combine_threshold_mib=300 / 2 ** 20))  # < 2 results
    assert count(tiny.module, "all-reduce") == 3


def test_dependent_all_reduces_stay_apart():
    # The second reduction reads the first one's result: they cannot be one collective.
    text = """HloModule m

ENTRY main {
  x = f32[8,16] parameter(0), sharding={devices=[1,4]<=[4]}
  w = f32[16,16] parameter(1), sharding={devices=[4,1]<=[4]}
  v = f32[16,8] parameter(2), sharding={devices=[4,1]<=[4]}
  d = f32[8,16] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
  s = f32[8,16] sine(d), sharding={replicated}
  ROOT r = f32[8,8] dot(s, v), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
}
"""
    result = run(text, 4)
    assert count(result.module, "all-reduce") == 2


def test_report_keeps_causes_and_bytes():
    text = partial_sums("{replicated}")
    on = partition_in_place(parse_module(text), 4, complete=True)
    off = partition_in_place(parse_module(text), 4, complete=True, options=OFF)
    a = build_report(on.module, on.report.causes, 4)
    b = build_report(off.module, off.report.causes, 4)
    assert {c: v["bytes_per_device"] for c, v in a["summary"]["by_cause"].items()} == \
        pytest.approx({c: v["bytes_per_device"] for c, v in b["summary"]["by_cause"].items()})
    assert [e["cause"] for e in a["collectives"]] == ["contraction"]
    assert a["summary"]["total_count"] < b["summary"]["total_count"]


def test_combining_never_raises_the_peak_of_a_fixture():
    # Two weight all-gathers used one after the other: together they would double the
    # peak, so they stay apart.
    path = os.path.join(ROOT, "fixtures", "hlo", "mlp_windowed_weights.pb")
    n = json.load(open(path[:-3] + ".json"))["num_partitions"]
    on = partition_in_place(load_module(path), n).module
    off = partition_in_place(load_module(path), n, options=OFF).module
    assert module_stats(on, n).peak_live_bytes == module_stats(off, n).peak_live_bytes
    assert count(on, "all-gather") == count(off, "all-gather") == 2


def test_cli_combine_threshold(tmp_path):
    from click.testing import CliRunner
    from hlo_spmd_cli.main import _register, cli

    _register()
    src = tmp_path / "in.hlo"
    src.write_text(partial_sums("{replicated}"))
    texts = {}
    for value in ("30", "0"):
        out = tmp_path / f"out{value}.hlo"
        res = CliRunner().invoke(cli, ["partition", str(src), "-o", str(out), "-n", "4",
                                       "--combine-threshold", value])
        assert res.exit_code == 0, res.output
        texts[value] = out.read_text()
    assert texts["30"].count(" all-reduce(") == 1 and texts["0"].count(" all-reduce(") == 3
    bad = CliRunner().invoke(cli, ["partition", str(src), "-o", str(tmp_path / "x.hlo"),
                                   "--combine-threshold", "-1"])
    assert bad.exit_code == 2 and not (tmp_path / "x.hlo").exists()


def test_groups_that_would_wait_on_each_other_are_not_both_combined():
    # A1 / A2 share groups, B1 / B2 share other groups; each pair is independent, but
    # A2 reads B2 and B1 reads A1: combining both pairs would make a cycle.
    from hlo_spmd.ir.verifier import verify_module
    from hlo_spmd.passes.partition.causes import CauseLog
    from hlo_spmd.passes.partition.combine import combine_collectives

    text = """HloModule m

add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}

ENTRY main {
  a0 = f32[8] parameter(0)
  b0 = f32[8] parameter(1)
  A1 = f32[8] all-reduce(a0), channel_id=1, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=add
  B2 = f32[8] all-reduce(b0), channel_id=2, replica_groups={{0,2},{1,3}}, use_global_device_ids=true, to_apply=add
  B1 = f32[8] all-reduce(A1), channel_id=3, replica_groups={{0,2},{1,3}}, use_global_device_ids=true, to_apply=add
  A2 = f32[8] all-reduce(B2), channel_id=4, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=add
  ROOT t = (f32[8], f32[8]) tuple(B1, A2)
}
"""
    module = parse_module(text)
    log = CauseLog()
    for inst in module.entry.instructions:
        if inst.opcode == "all-reduce":
            log.note(inst)  # as if the partitioner had made them
    assert combine_collectives(module.entry, 2 ** 20, log)
    module.entry.remove_dead()
    verify_module(module)
    seen: set[int] = set()
    for inst in module.entry.instructions:  # operands before users: no cycle
        assert all(id(o) in seen for o in inst.operands), inst.name
        seen.add(id(inst))
    assert count(module, "all-reduce") == 3

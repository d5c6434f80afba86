"""Windowed einsum (support/dot_windowed.py, ``partition --windowed-einsum-threshold``):
a dot whose plan all-gathers an operand becomes a loop of collective-permutes with a
partial dot per step, unidirectional and bidirectional; so does a dot whose plan ends in
a reduce-scatter of its partial sums (the accumulator of one output piece travels the
ring). The programs run on XLA and match the unpartitioned module; no device holds the
gathered operand or the whole unreduced result, and the peak-live estimate falls."""
from __future__ import annotations

import json
import os

import pytest

from hlo_spmd.ir.io import load_module, module_bytes
from hlo_spmd.ir.text_parser import parse_module
from hlo_spmd.passes.partition import PartitionOptions, partition_in_place
from hlo_spmd.runtime import verify
from hlo_spmd.runtime.inputs import sidecar_inputs
from hlo_spmd.stats import module_stats

pytest.importorskip("jax")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "fixtures", "hlo", "mlp_windowed_weights.pb")


def _opcodes(module) -> list[str]:
    return [i.opcode for i in module.instructions()]


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_fixture_windowed_matches_and_lowers_peak(bidirectional):
    meta = json.load(open(FIXTURE[:-3] + ".json"))
    n = meta["num_partitions"]
    original = open(FIXTURE, "rb").read()
    plain = partition_in_place(load_module(FIXTURE), n).module
    opts = PartitionOptions(windowed_einsum_threshold_mib=0.1,
                            windowed_einsum_bidirectional=bidirectional)
    windowed = partition_in_place(load_module(FIXTURE), n, options=opts).module
    ops = _opcodes(windowed)
    assert "all-gather" not in ops and ops.count("while") == 2
    report = verify(original, module_bytes(windowed), n, inputs=sidecar_inputs(meta),
                    poison_padding=True)
    assert report.ok, str(report)
    a, b = module_stats(windowed, n), module_stats(plain, n)
    if not bidirectional:
        # (Bidirectional holds two pieces and two partial results per step: on this
        # fixture its estimate ties the all-gather program's.)
        assert a.peak_live_bytes < b.peak_live_bytes
    # No value as large as a gathered weight.
    assert a.largest_array.bytes < b.largest_array.bytes
    # The same bytes as the all-gathers: n - 1 pieces per weight (the loop runs
    # n - 1 or n / 2 - 1 times; one forward piece is moved before it when bidirectional).
    piece = 256 * 256 * 4 // n
    trips = n // 2 - 1 if bidirectional else n - 1
    per_iteration = a.collectives["collective-permute"].bytes_in_loops
    outside = a.collectives["collective-permute"].bytes_per_device - per_iteration
    assert per_iteration * trips + outside == pytest.approx(2 * (n - 1) * piece)
    assert b.total_bytes_per_device == pytest.approx(2 * (n - 1) * piece)


TEXT = """HloModule m, num_partitions=8

ENTRY main {
  x = f32[64,32] parameter(0), sharding={devices=[8,1]<=[8]}
  w = f32[32,64] parameter(1), sharding={devices=[1,8]<=[8]}
  ROOT h = f32[64,64] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[8,1]<=[8]}
}
"""


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("text", [TEXT, TEXT.replace("{devices=[1,8]<=[8]}", "{devices=[8,1]<=[8]}")],
                         ids=["window-on-output-dim", "window-on-contracting-dim"])
def test_windowed_dot_runs(text, bidirectional):
    original = module_bytes(parse_module(text))
    opts = PartitionOptions(windowed_einsum_threshold_mib=0.0,
                            windowed_einsum_bidirectional=bidirectional)
    out = partition_in_place(parse_module(text), 8, options=opts).module
    ops = _opcodes(out)
    assert "while" in ops and "all-gather" not in ops
    report = verify(original, module_bytes(out), 8, poison_padding=True)
    assert report.ok, str(report)


def test_threshold_above_the_gather_keeps_the_all_gather():
    opts = PartitionOptions(windowed_einsum_threshold_mib=1.0)  # the gather is 8 KiB
    out = partition_in_place(parse_module(TEXT), 8, options=opts).module
    assert "while" not in _opcodes(out) and "all-gather" in _opcodes(out)


def test_cli_option(tmp_path):
    from click.testing import CliRunner

    from hlo_spmd_cli.main import _register, cli

    _register()

    src = tmp_path / "m.hlo"
    src.write_text(TEXT)
    out = tmp_path / "out.hlo"
    res = CliRunner().invoke(cli, ["partition", str(src), "-o", str(out),
                                   "--windowed-einsum-threshold", "0", "--bidirectional"])
    assert res.exit_code == 0, res.output
    assert "collective-permute" in out.read_text() and "all-gather" not in out.read_text()
    bad = CliRunner().invoke(cli, ["partition", str(src), "-o", str(tmp_path / "x.hlo"),
                                   "--windowed-einsum-threshold", "-1"])
    assert bad.exit_code == 2 and not (tmp_path / "x.hlo").exists()


# -- the reduce-scatter form ----------------------------------------------------------------
def _rs_text(m: int, k: int, n: int, out: str = "{devices=[8,1]<=[8]}",
             dev: str = "<=[8]") -> str:
    return f"""HloModule m, num_partitions=8

ENTRY main {{
  x = s32[{m},{k}] parameter(0), sharding={{devices=[1,8]{dev}}}
  w = s32[{k},{n}] parameter(1), sharding={{devices=[8,1]{dev}}}
  ROOT h = s32[{m},{n}] dot(x, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={out}
}}
"""


RS_CASES = {
    "scatter-lhs-dim": _rs_text(64, 256, 48),
    "scatter-rhs-dim": _rs_text(64, 256, 48, out="{devices=[1,8]<=[8]}"),
    "permuted-devices": _rs_text(64, 256, 48, dev="<=[2,4]T(1,0)"),
    "uneven-contracting": _rs_text(64, 250, 48),
    "uneven-scatter-dim": _rs_text(60, 256, 44),
    "uneven-both": _rs_text(60, 250, 44, out="{devices=[1,8]<=[8]}"),
    "two-contracting-dims": """HloModule m, num_partitions=8

ENTRY main {
  x = s32[32,16,8] parameter(0), sharding={devices=[1,4,2]<=[8]}
  w = s32[16,8,24] parameter(1), sharding={devices=[4,2,1]<=[8]}
  ROOT h = s32[32,24] dot(x, w), lhs_contracting_dims={1,2}, rhs_contracting_dims={0,1}, sharding={devices=[8,1]<=[8]}
}
""",
    # Planned as batch groups of 4 with a reduce-scatter inside each: the loop runs in
    # every group at once.
    "inside-batch-groups": """HloModule m, num_partitions=8

ENTRY main {
  x = s32[2,32,64] parameter(0), sharding={devices=[2,1,4]<=[8]}
  w = s32[2,64,16] parameter(1), sharding={devices=[2,4,1]<=[8]}
  ROOT h = s32[2,32,16] dot(x, w), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={1}, sharding={devices=[2,4,1]<=[8]}
}
""",
}


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("name", sorted(RS_CASES))
def test_reduce_scatter_form_runs(name, bidirectional):
    text = RS_CASES[name]
    plain = partition_in_place(parse_module(text), 8)
    assert "reduce-scatter" in plain.report.dot_plans["h"]  # the route under test
    assert "reduce-scatter" in _opcodes(plain.module)
    opts = PartitionOptions(windowed_einsum_threshold_mib=0.0,
                            windowed_einsum_bidirectional=bidirectional)
    res = partition_in_place(parse_module(text), 8, options=opts)
    ops = _opcodes(res.module)
    assert "while" in ops and "reduce-scatter" not in ops and "all-reduce" not in ops
    # The loop's permutes (the permuted-devices case also has a final reshard's).
    permutes = [i for i in res.module.instructions() if i.opcode == "collective-permute"
                and i.parent.name.endswith("windowed_rs_body")]
    assert len(permutes) == (2 if bidirectional else 1)
    assert all(res.report.causes.lookup(i).cause == "contraction" for i in permutes)
    report = verify(module_bytes(parse_module(text)), module_bytes(res.module), 8,
                    poison_padding=True)
    assert report.ok, str(report)


def test_reduce_scatter_form_honours_the_threshold():
    text = RS_CASES["scatter-lhs-dim"]  # unreduced local result: 64 * 48 * 4 B = 12 KiB
    below = partition_in_place(parse_module(text), 8,
                               options=PartitionOptions(windowed_einsum_threshold_mib=0.01)).module
    above = partition_in_place(parse_module(text), 8,
                               options=PartitionOptions(windowed_einsum_threshold_mib=0.02)).module
    assert "while" in _opcodes(below) and "reduce-scatter" not in _opcodes(below)
    assert "while" not in _opcodes(above) and "reduce-scatter" in _opcodes(above)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_reduce_scatter_form_lowers_peak_with_the_same_bytes(bidirectional):
    text = _rs_text(512, 512, 512)  # unreduced local result 1 MiB, operands 128 KiB each
    plain = partition_in_place(parse_module(text), 8).module
    opts = PartitionOptions(windowed_einsum_threshold_mib=0.5,
                            windowed_einsum_bidirectional=bidirectional)
    windowed = partition_in_place(parse_module(text), 8, options=opts).module
    a, b = module_stats(windowed, 8), module_stats(plain, 8)
    assert a.peak_live_bytes < b.peak_live_bytes
    unreduced = 512 * 512 * 4
    assert b.largest_array.bytes == unreduced and a.largest_array.bytes < unreduced
    # n - 1 permutes of one output piece (in halves when bidirectional): the bytes of
    # the reduce-scatter it replaces.
    cp = a.collectives["collective-permute"]
    assert cp.bytes_per_device == cp.bytes_in_loops  # all of it inside the loop
    assert cp.bytes_in_loops * 7 == pytest.approx(
        b.collectives["reduce-scatter"].bytes_per_device)
    assert b.collectives["reduce-scatter"].bytes_per_device == pytest.approx(7 * unreduced / 8)
    report = verify(module_bytes(parse_module(text)), module_bytes(windowed), 8)
    assert report.ok, str(report)


def test_cli_option_reduce_scatter_form(tmp_path):
    from click.testing import CliRunner

    from hlo_spmd_cli.main import _register, cli

    _register()
    src = tmp_path / "m.hlo"
    src.write_text(RS_CASES["scatter-lhs-dim"])
    for extra in ([], ["--bidirectional"]):
        out = tmp_path / "out.hlo"
        res = CliRunner().invoke(cli, ["partition", str(src), "-o", str(out),
                                       "--windowed-einsum-threshold", "0"] + extra)
        assert res.exit_code == 0, res.output
        text = out.read_text()
        assert "collective-permute" in text and "while" in text
        assert "reduce-scatter" not in text

"""Windowed einsum (handlers/dot_windowed.py, ``partition --windowed-einsum-threshold``):
a dot whose plan all-gathers an operand becomes a loop of collective-permutes with a
partial dot per step, unidirectional and bidirectional; the programs run on XLA and
match the unpartitioned module; no device holds the gathered operand, and the peak-live
estimate falls."""
from __future__ import annotations

import json
import os

import pytest

from hlo_spmd.ir.io import load_module, module_bytes
from hlo_spmd.ir.text_parser import parse_module
from hlo_spmd.passes.partition import PartitionOptions, partition
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
    plain = partition(load_module(FIXTURE), n).module
    opts = PartitionOptions(windowed_einsum_threshold_mib=0.1,
                            windowed_einsum_bidirectional=bidirectional)
    windowed = partition(load_module(FIXTURE), n, options=opts).module
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
    out = partition(parse_module(text), 8, options=opts).module
    ops = _opcodes(out)
    assert "while" in ops and "all-gather" not in ops
    report = verify(original, module_bytes(out), 8, poison_padding=True)
    assert report.ok, str(report)


def test_threshold_above_the_gather_keeps_the_all_gather():
    opts = PartitionOptions(windowed_einsum_threshold_mib=1.0)  # the gather is 8 KiB
    out = partition(parse_module(TEXT), 8, options=opts).module
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

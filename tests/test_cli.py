"""The command line: convert and show work; bad input is one line, exit 2, no output file."""
from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
from click.testing import CliRunner

from hlo_spmd.proto import hlo_pb2
from hlo_spmd_cli.main import _register, cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "fixtures", "hlo")
MLP = os.path.join(FIX, "mlp_2d_megatron.pb")

_register()


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _proto(path) -> hlo_pb2.HloModuleProto:
    with open(path, "rb") as f:
        return hlo_pb2.HloModuleProto.FromString(f.read())


def _canonical(msg: hlo_pb2.HloModuleProto) -> list:
    """Per instruction: what the text form carries (ids and metadata aside)."""
    out = []
    for c in msg.computations:
        for i in c.instructions:
            out.append((c.name, i.name, i.opcode, i.shape.SerializeToString(deterministic=True),
                        i.sharding.SerializeToString(deterministic=True)))
    return sorted(out)


def test_convert_pb_to_text_to_pb(tmp_path):
    hlo = tmp_path / "m.hlo"
    pb = tmp_path / "m.pb"
    r = run("convert", MLP, "-o", str(hlo))
    assert r.exit_code == 0, r.output
    assert hlo.read_text().startswith("HloModule ")
    r = run("convert", str(hlo), "-o", str(pb))
    assert r.exit_code == 0, r.output
    a, b = _proto(MLP), _proto(pb)
    assert [c.name for c in a.computations] == [c.name for c in b.computations]
    names = lambda m: {(c.name, i.name, i.opcode) for c in m.computations for i in c.instructions}
    assert names(a) == names(b)
    from hlo_spmd.ir.io import load_module
    from hlo_spmd.ir.proto_io import module_to_proto

    ma, mb = load_module(MLP), load_module(pb)
    sa = {i.name: (i.shape.without_layout(), i.sharding) for i in ma.instructions()}
    sb = {i.name: (i.shape.without_layout(), i.sharding) for i in mb.instructions()}
    assert sa == sb


def test_convert_format_is_detected_not_guessed(tmp_path):
    # A text module saved under a .pb name and a proto under .hlo still load.
    text_as_pb = tmp_path / "text.pb"
    assert run("convert", MLP, "-o", str(tmp_path / "t.hlo")).exit_code == 0
    text_as_pb.write_bytes((tmp_path / "t.hlo").read_bytes())
    proto_as_hlo = tmp_path / "proto.hlo"
    proto_as_hlo.write_bytes(open(MLP, "rb").read())
    assert run("convert", str(text_as_pb), "-o", str(tmp_path / "a.pb")).exit_code == 0
    assert run("convert", str(proto_as_hlo), "-o", str(tmp_path / "b.hlo"), "--format", "text").exit_code == 0
    assert (tmp_path / "b.hlo").read_text().startswith("HloModule")


def test_show_variants():
    r = run("show", MLP, "--no-color")
    assert r.exit_code == 0 and "ENTRY" in r.output and "sharding={" in r.output
    full_lines = r.output.count(" = ")
    r = run("show", MLP, "--annotated-only", "--no-color")
    assert r.exit_code == 0
    lines = [l for l in r.output.splitlines() if " = " in l and not l.startswith("HloModule")]
    assert lines and all("sharding=" in l for l in lines)
    assert len(lines) < full_lines
    r = run("show", MLP, "-i", "tanh.1", "--no-color")
    assert r.exit_code == 0
    assert "// operands:" in r.output and "// users:" in r.output and "tanh(" in r.output
    comp = _proto(MLP).computations[0].name
    r = run("show", MLP, "-c", comp, "--no-color")
    assert r.exit_code == 0 and f"{comp} " in r.output


def test_show_unknown_instruction_is_one_line():
    r = run("show", MLP, "-i", "nope")
    assert r.exit_code == 2
    assert r.output.strip().count("\n") == 0 and "nope" in r.output


GOOD = """HloModule m, entry_computation_layout={(f32[8,4]{1,0})->f32[8,4]{1,0}}

ENTRY %main (p: f32[8,4]) -> f32[8,4] {
  %p = f32[8,4]{1,0} parameter(0), sharding={devices=[2,1]<=[2]}
  ROOT %t = f32[8,4]{1,0} tanh(%p)
}
"""

BAD_TEXT = {
    "syntax": (GOOD.replace("tanh(%p)", "tanh(%p"), ":6:1: expected ')'"),
    "unknown_opcode": (GOOD.replace("tanh(%p)", "frobnicate(%p)"), "frobnicate"),
    "undefined_operand": (GOOD.replace("tanh(%p)", "tanh(%q)"), "q"),
    "inconsistent_shape": (GOOD.replace("ROOT %t = f32[8,4]{1,0}", "ROOT %t = f32[8,5]{1,0}"), "t"),
    "tile_count": (GOOD.replace("devices=[2,1]<=[2]", "devices=[2,2]0,1,2"), "sharding"),
    "duplicate_devices": (GOOD.replace("devices=[2,1]<=[2]", "devices=[2,1]0,0"), "duplicate"),
    "rank_mismatch": (GOOD.replace("devices=[2,1]<=[2]", "devices=[2,1,1]<=[2]"), "rank"),
}


@pytest.mark.parametrize("case", sorted(BAD_TEXT))
def test_bad_text_input(tmp_path, case):
    text, needle = BAD_TEXT[case]
    src = tmp_path / "bad.hlo"
    src.write_text(text)
    out = tmp_path / "out.pb"
    r = run("convert", str(src), "-o", str(out))
    assert r.exit_code == 2, r.output
    msg = r.output.strip()
    assert "\n" not in msg and "Traceback" not in msg
    assert needle.lower() in msg.lower(), msg
    assert str(src) in msg
    assert not out.exists()
    assert run("convert", str(tmp_path / "ok.hlo"), "-o", str(out)).exit_code == 2


@pytest.mark.parametrize("case", ["missing", "empty", "random", "truncated", "directory"])
def test_bad_binary_input(tmp_path, case):
    src = tmp_path / "in.pb"
    data = open(MLP, "rb").read()
    if case == "empty":
        src.write_bytes(b"")
    elif case == "random":
        src.write_bytes(bytes(random.Random(1).randrange(256) for _ in range(2000)))
    elif case == "truncated":
        src.write_bytes(data[: len(data) * 2 // 3])
    elif case == "directory":
        src.mkdir()
    out = tmp_path / "out.hlo"
    r = run("convert", str(src), "-o", str(out))
    assert r.exit_code == 2, r.output
    assert r.output.strip().count("\n") == 0 and "Traceback" not in r.output
    assert str(src) in r.output
    assert not out.exists()


def test_real_entry_point_exit_code_and_stderr(tmp_path):
    """Through the installed console script: one stderr line, exit 2, nothing written."""
    out = tmp_path / "o.pb"
    p = subprocess.run([sys.executable, "-m", "hlo_spmd_cli", "convert",
                        str(tmp_path / "missing.pb"), "-o", str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stdout == ""
    assert p.stderr.count("\n") == 1 and "no such file" in p.stderr
    assert not out.exists()


def test_partition_then_verify(tmp_path):
    out = tmp_path / "p.pb"
    r = run("partition", os.path.join(FIX, "mlp_dp.pb"), "-o", str(out))
    assert r.exit_code == 0, r.output
    msg = _proto(out)
    assert len(msg.spmd_parameters_shardings) == 5 and msg.HasField("spmd_output_sharding")
    r = run("verify", os.path.join(FIX, "mlp_dp.pb"), str(out))
    assert r.exit_code == 0, r.output
    assert "OK" in r.output


def test_partition_names_unknown_custom_calls(tmp_path):
    src = tmp_path / "m.hlo"
    src.write_text("""HloModule m
ENTRY %main (x: f32[8,4]) -> f32[8,4] {
  %x = f32[8,4] parameter(0), sharding={devices=[8,1]<=[8]}
  ROOT %mystery = f32[8,4] custom-call(%x), custom_call_target="my_kernel", sharding={devices=[8,1]<=[8]}
}
""")
    out = tmp_path / "p.hlo"
    r = run("partition", str(src), "-o", str(out), "--complete")
    assert r.exit_code == 0, r.output
    assert "1 ops replicated" in r.output
    assert "custom-call mystery (target 'my_kernel'" in r.output


def test_partition_device_count_mismatch(tmp_path):
    out = tmp_path / "p.pb"
    r = run("partition", os.path.join(FIX, "mlp_dp.pb"), "-o", str(out), "-n", "4")
    assert r.exit_code == 2
    assert "8 devices" in r.output and "4" in r.output and "\n" not in r.output.strip()
    assert not out.exists()


def test_verify_catches_a_wrong_program(tmp_path):
    """A partitioned module with one dot's result corrupted must fail verification."""
    from hlo_spmd.ir.builder import Builder
    from hlo_spmd.ir.io import load_module, save_module

    out = tmp_path / "p.pb"
    assert run("partition", os.path.join(FIX, "mlp_dp.pb"), "-o", str(out)).exit_code == 0
    m = load_module(out)
    g = next(i for i in m.entry.instructions if i.opcode == "dot")
    comp = g.parent
    users = [u for u in comp.instructions if g in u.operands]
    wrong = Builder(comp).add(g, g)  # doubles the activations
    comp.instructions.remove(wrong)
    comp.instructions.insert(comp.instructions.index(g) + 1, wrong)
    for u in users:
        u.replace_operand(g, wrong)
    bad = tmp_path / "bad.pb"
    save_module(m, bad)
    r = run("verify", os.path.join(FIX, "mlp_dp.pb"), str(bad))
    assert r.exit_code == 1, r.output
    assert r.output.splitlines()[-1].strip() != "OK"


def test_propagate_explain_diff(tmp_path):
    out = tmp_path / "p.pb"
    r = run("propagate", MLP, "-o", str(out))
    assert r.exit_code == 0, r.output
    from hlo_spmd.ir.io import load_module

    before, after = load_module(MLP), load_module(out)
    assert all(i.sharding is not None for i in after.instructions()
               if i.shape.is_array and i.parent is after.entry)
    # user annotations unchanged
    for i in before.instructions():
        if i.sharding is not None:
            assert after.find(i.name).sharding == i.sharding
    r = run("diff", MLP, str(out))
    assert r.exit_code == 0
    changed = [i.name for i in after.instructions()
               if before.find(i.name).sharding != i.sharding]
    assert changed and all(n in r.output for n in changed)
    r = run("diff", MLP, MLP)
    assert "no sharding differences" in r.output
    r = run("explain", MLP, "tanh.1")
    assert r.exit_code == 0, r.output
    assert "tanh.1" in r.output and str(after.find("tanh.1").sharding)[:12] in r.output
    r = run("explain", MLP, "nope")
    assert r.exit_code == 2 and "nope" in r.output


def test_stats_and_compare(tmp_path):
    out = tmp_path / "p.pb"
    assert run("partition", MLP, "-o", str(out)).exit_code == 0
    r = run("stats", str(out))
    assert r.exit_code == 0, r.output
    for word in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                 "collective-permute", "largest array", "peak live"):
        assert word in r.output
    r = run("stats", str(out), "--compare", str(out))
    assert r.exit_code == 0 and "all-reduce" in r.output


def test_num_partitions_from_text_header(tmp_path):
    src = tmp_path / "m.hlo"
    src.write_text(GOOD.replace("entry_computation_layout={(f32[8,4]{1,0})->f32[8,4]{1,0}}",
                                "entry_computation_layout={(f32[8,4]{1,0})->f32[8,4]{1,0}}, "
                                "num_partitions=2"))
    out = tmp_path / "p.pb"
    r = run("partition", str(src), "-o", str(out))
    assert r.exit_code == 0, r.output
    assert "2 partitions" in r.output


ALL_FIXTURES = sorted(p for p in __import__("glob").glob(os.path.join(FIX, "*.pb")))


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: os.path.basename(p)[:-3])
def test_explain_and_diff_on_every_fixture(tmp_path, path):
    from hlo_spmd.ir.io import load_module

    out = tmp_path / "p.pb"
    assert run("propagate", path, "-o", str(out)).exit_code == 0
    before, after = load_module(path), load_module(out)
    r = run("diff", path, str(out))
    assert r.exit_code == 0
    changed = sum(1 for i in after.instructions()
                  if before.find(i.name) is not None and before.find(i.name).sharding != i.sharding)
    assert (f"{changed} instruction(s) differ" in r.output) if changed else \
        "no sharding differences" in r.output
    # explain the entry root and the first dot (or any non-parameter instruction)
    targets = [after.entry.root.name]
    dots = [i.name for i in after.entry.instructions if i.opcode in ("dot", "convolution")]
    targets += dots[:1]
    for name in targets:
        r = run("explain", path, name)
        assert r.exit_code == 0, r.output
        assert name in r.output

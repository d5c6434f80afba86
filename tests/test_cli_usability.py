"""The CLI as a user runs it: annotations from the command line, JSON output, '-' for
stdin/stdout, --quiet, the progress line, tables that never break a sharding string,
show --grid, and verify without XLA's log lines."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from hlo_spmd.ir.io import load_module, save_module
from hlo_spmd_cli.main import _register, cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "fixtures", "hlo")
MLP = os.path.join(FIX, "mlp_2d_megatron.pb")

_register()


def run(*args: str, input=None, env=None):
    return CliRunner().invoke(cli, list(args), input=input, env=env, catch_exceptions=False)


# -- 2. annotations from the command line ---------------------------------------------------
# Fixtures whose annotations are all on entry parameters and the result, with the specs
# that give them back (written by hand from the fixtures' shardings).
GIVEN_BACK = {
    "mlp_dp": ("data=8", ["#0=data,_", "#1=_,_", "#2=_", "#3=_,_", "#4=_", "out=data,_"]),
    "mlp_dp_4": ("data=4", ["#0=data,_", "#1=_,_", "#2=_", "#3=_,_", "#4=_", "out=data,_"]),
    "conv_spatial": ("data=2,model=4",
                     ["#0=_,data+model,_,_", "#1=_,_,_,_", "#2=_", "out=_,data+model,_,_"]),
}


@pytest.mark.parametrize("name", sorted(GIVEN_BACK))
def test_stripped_shardings_given_back_partition_identically(tmp_path, name):
    src = os.path.join(FIX, f"{name}.pb")
    module = load_module(src)
    ps = {id(p) for p in module.entry.parameters}
    assert all(i.sharding is None for i in module.instructions()
               if id(i) not in ps and i is not module.entry.root)
    for i in module.instructions():
        i.sharding = None
    stripped = tmp_path / "stripped.pb"
    save_module(module, stripped)
    a, b = tmp_path / "a.pb", tmp_path / "b.pb"
    assert run("partition", src, "-o", str(a), "-q").exit_code == 0
    mesh, shards = GIVEN_BACK[name]
    args = ["partition", str(stripped), "-o", str(b), "--mesh", mesh]
    for s in shards:
        args += ["--shard", s]
    r = run(*args)
    assert r.exit_code == 0, r.stderr
    assert a.read_bytes() == b.read_bytes()
    # and the same through propagate: every instruction ends up with the same sharding
    pa, pb = tmp_path / "pa.hlo", tmp_path / "pb.hlo"
    assert run("propagate", src, "-o", str(pa), "-q").exit_code == 0
    assert run(*(["propagate", str(stripped), "-o", str(pb), "-q"] + args[4:])).exit_code == 0
    d = run("diff", str(pa), str(pb), "--json")
    assert json.loads(d.stdout)["differences"] == []


def test_shard_targets_names_and_tuple_elements(tmp_path):
    src = tmp_path / "m.hlo"
    src.write_text("""HloModule m

ENTRY e {
  x = f32[8,16] parameter(0)
  w = f32[16,4] parameter(1)
  d = f32[8,4] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  n = f32[8,4] negate(d)
  ROOT t = (f32[8,4], f32[8,16]) tuple(n, x)
}
""")
    out = tmp_path / "o.hlo"
    r = run("propagate", str(src), "-o", str(out), "--mesh", "a=2,b=2", "--shard", "#0=a,b",
            "--shard", "w=b,_", "--shard", "out#0=a,_", "--shard", "out#1=a,b", "-q")
    assert r.exit_code == 0, r.stderr
    m = load_module(out)
    assert str(m.find("x").sharding) == "{devices=[2,2]<=[4]}"
    assert str(m.find("w").sharding) == "{devices=[2,1,2]<=[2,2]T(1,0) last_tile_dim_replicate}"
    root = m.entry.root.sharding
    assert [str(e) for e in root.tuple_elements] == [
        "{devices=[2,1,2]<=[4] last_tile_dim_replicate}", "{devices=[2,2]<=[4]}"]
    # a tuple result needs every element
    r = run("propagate", str(src), "-o", str(out), "--mesh", "a=2", "--shard", "out#0=a,_")
    assert r.exit_code == 2 and "out#1" in r.stderr


@pytest.mark.parametrize("args, needle", [
    (["--mesh", "data"], "NAME=SIZE"),
    (["--mesh", "data=0"], "size >= 1"),
    (["--mesh", "data=2,data=4"], "twice"),
    (["--mesh", "data=8", "--shard", "#0"], "TARGET=SPEC"),
    (["--mesh", "data=8", "--shard", "#0=data"], "rank-2"),
    (["--mesh", "data=8", "--shard", "#0=model,_"], "unknown mesh axis"),
    (["--mesh", "data=8", "--shard", "#0=da-ta,_"], "not an axis name"),
    (["--mesh", "data=8", "--shard", "#7=data,_"], "no parameter 7"),
    (["--mesh", "data=8", "--shard", "nope=data"], "no instruction named"),
    (["--mesh", "data=8", "--shard", "out#3=data,_"], "no tuple element 3"),
    (["--shard", "#0=data,_"], "needs --mesh"),
    (["--mesh", "data=4", "--shard", "#0=data,_"], "devices"),
])
def test_bad_specs_are_one_line_exit_2(tmp_path, args, needle):
    out = tmp_path / "o.pb"
    for cmd in ("partition", "propagate"):
        r = run(cmd, os.path.join(FIX, "mlp_dp.pb"), "-o", str(out), *args)
        assert r.exit_code == 2, (cmd, args, r.stderr)
        assert r.stderr.strip().count("\n") == 0 and needle in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and not out.exists()


def test_mesh_forms_in_show_explain_diff(tmp_path):
    # Shardy fixture: the mesh comes from xla.sdy.meshes, nothing given
    r = run("show", os.path.join(FIX, "shardy_mlp_2d.pb"), "-a", "--no-metadata")
    assert r.exit_code == 0 and "/* mesh: " in r.stdout
    # GSPMD fixture with --mesh
    r = run("show", MLP, "-a", "--no-metadata", "--mesh", "data=2,model=4")
    lines = [l for l in r.stdout.splitlines() if l.lstrip().startswith("%x.1")]
    assert lines and lines[0].endswith("/* mesh: data,_ */"), lines
    r = run("explain", MLP, "dot_general.3", "--mesh", "data=2,model=4")
    assert r.exit_code == 0 and "mesh" in r.stdout
    r = run("explain", MLP, "dot_general.3", "--mesh", "data=2,model=4", "--json")
    j = json.loads(r.stdout)
    assert j["instruction"] == "dot_general.3" and j["chain"] and "mesh" in j["chain"][0]
    prop = tmp_path / "p.hlo"
    run("propagate", MLP, "-o", str(prop), "-q")
    r = run("diff", MLP, str(prop), "--mesh", "data=2,model=4")
    assert r.exit_code == 0 and "A (mesh)" in r.stdout
    r = run("diff", MLP, str(prop), "--mesh", "data=2,model=4", "--json")
    rows = json.loads(r.stdout)["differences"]
    assert rows and all("b_mesh" in x for x in rows)
    assert any(x["b_mesh"] not in (None,) for x in rows)


def test_mesh_form_round_trips():
    from hlo_spmd.annotations.cli_spec import mesh_form, parse_mesh
    from hlo_spmd.sharding.mesh import named_split

    mesh = parse_mesh("a=2,b=3,c=2")
    for spec in (["a", None], [None, ("b", "a")], ["c", "b"], [("a", "b", "c"), None],
                 [None, None], ["b", None]):
        s = named_split(2, mesh, spec)
        form = mesh_form(s, 2, mesh)
        back = [None if e == "_" else tuple(e.split("+")) if "+" in e else e
                for e in form.split(",")]
        assert named_split(2, mesh, back) == s, (spec, form)


# -- 3. output that reads well everywhere ----------------------------------------------------
def _shardings_whole(text: str, expected: list[str]) -> None:
    for s in expected:
        assert s in text, s  # on one line: the text has no line break inside it


def test_plain_tables_off_terminal_never_break_shardings(tmp_path):
    prop = tmp_path / "p.hlo"
    run("propagate", os.path.join(FIX, "transformer_layer_fwd.pb"), "-o", str(prop), "-q")
    m = load_module(prop)
    r = run("diff", os.path.join(FIX, "transformer_layer_fwd.pb"), str(prop))
    assert "\x1b[" not in r.stdout and "│" not in r.stdout  # plain text, no box drawing
    diffs = json.loads(run("diff", os.path.join(FIX, "transformer_layer_fwd.pb"), str(prop),
                           "--json").stdout)["differences"]
    _shardings_whole(r.stdout, [d["b"] for d in diffs if d["b"]])
    name = max(diffs, key=lambda d: len(d["b"] or ""))["instruction"]
    r = run("explain", os.path.join(FIX, "transformer_layer_fwd.pb"), name)
    _shardings_whole(r.stdout, [str(m.find(name).sharding)])
    r = run("stats", os.path.join(FIX, "transformer_layer_fwd.pb"))
    assert "\x1b[" not in r.stdout and "│" not in r.stdout


def test_terminal_tables_never_break_shardings_at_80_columns():
    from rich.console import Console

    from hlo_spmd_cli.render import THEME, emit_table

    s1 = "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"
    s2 = "{devices=[1,4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    buf = io.StringIO()
    out = Console(file=buf, force_terminal=True, width=80, theme=THEME, color_system=None)
    emit_table("t", ["computation", "instruction", "opcode", "A", "B", "status"],
               [["main.24", "sharding_constraint.41", "custom-call", s1, s2, "changed"]], out)
    text = buf.getvalue()
    assert s1 in text and s2 in text and "│" in text


def test_stats_json_and_stdio(tmp_path):
    part = tmp_path / "p.pb"
    with open(MLP, "rb") as f:
        r = run("partition", "-", "-o", str(part), "-q", input=f.read())
    assert r.exit_code == 0 and r.stderr == ""
    j = json.loads(run("stats", str(part), "--json").stdout)
    assert j["collectives"]["all-reduce"]["count"] == 1 and j["total"]["count"] == 1
    # '-' as output: HLO text on stdout; then back in through stdin
    r = run("partition", MLP, "-o", "-", "-q")
    assert r.stdout.startswith("HloModule ") and r.stderr == ""
    r2 = run("stats", "-", "--json", input=r.stdout)
    assert json.loads(r2.stdout)["total"]["count"] == 1
    r = run("convert", MLP, "-o", "-", "--format", "proto", "-q")
    from hlo_spmd.proto import hlo_pb2

    assert hlo_pb2.HloModuleProto.FromString(r.stdout_bytes).computations
    r3 = run("show", "-", "-a", input=r.stdout_bytes)
    assert r3.exit_code == 0 and "sharding={" in r3.stdout
    j = json.loads(run("stats", str(part), "--compare", str(part), "--json").stdout)
    assert j["a"] == j["b"]


def test_propagate_json(tmp_path):
    r = run("propagate", MLP, "--json")
    assert r.exit_code == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["sharded"] == j["instructions_total"] == len(j["instructions"])
    assert all(x["sharding"] for x in j["instructions"])
    r = run("propagate", MLP)
    assert r.exit_code == 2 and "-o" in r.stderr


def test_quiet_and_progress_line(tmp_path):
    out = tmp_path / "o.pb"
    r = run("partition", MLP, "-o", str(out))
    assert "wrote" in r.stderr and "done in" not in r.stderr
    assert not re.search(r"\.\.\. \(\d", r.stderr)  # a fast run shows no progress line
    r = run("partition", MLP, "-o", str(out), env={"HLO_SPMD_PROGRESS_AFTER": "0"})
    assert re.search(r"hlo-spmd: .*\.\.\. \(\d+\.\d s\)", r.stderr) and "done in" in r.stderr
    r = run("partition", MLP, "-o", str(out), "-q", env={"HLO_SPMD_PROGRESS_AFTER": "0"})
    assert r.stderr == ""


def test_show_grid_1d_2d_partial(tmp_path):
    src = tmp_path / "m.hlo"
    src.write_text("""HloModule m, num_partitions=8

ENTRY e {
  a = f32[16] parameter(0), sharding={devices=[8]<=[8]}
  b = f32[8,12] parameter(1), sharding={devices=[2,4]<=[8]}
  c = f32[8,12] parameter(2), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  d = f32[8,12] parameter(3), sharding={replicated}
  ROOT t = (f32[16], f32[8,12], f32[8,12], f32[8,12]) tuple(a, b, c, d)
}
""")
    r = run("show", str(src), "--grid", "a")
    assert "[0:2)" in r.stdout and "[14:16)" in r.stdout
    assert re.search(r"\[14:16\)\s+7$", r.stdout, re.M)
    r = run("show", str(src), "--grid", "b")
    # row tile 1 of dim 0, column tile 2 of dim 1: device 1*4+2 = 6
    row = [l for l in r.stdout.splitlines() if l.startswith("[4:8)")][0]
    assert row.split()[1:] == ["4", "5", "6", "7"]
    assert "[6:9)" in r.stdout
    r = run("show", str(src), "--grid", "c")
    assert "partially replicated: each tile on 4 devices" in r.stdout
    assert re.search(r"^\[0:4\)\s+0,1,2,3$", r.stdout, re.M)
    assert re.search(r"^\[4:8\)\s+4,5,6,7$", r.stdout, re.M)
    r = run("show", str(src), "--grid", "d")
    assert "every device holds the whole value" in r.stdout
    r = run("show", str(src), "--grid", "t")
    assert r.exit_code == 2 and "tuple" in r.stderr
    r = run("show", str(src), "--grid", "zz")
    assert r.exit_code == 2 and "zz" in r.stderr


def test_verify_shows_only_its_own_output(tmp_path):
    pytest.importorskip("jax")
    part = tmp_path / "p.pb"
    assert run("partition", MLP, "-o", str(part), "-q").exit_code == 0
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    cmd = [sys.executable, "-m", "hlo_spmd_cli", "verify", MLP, str(part)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stderr == "" and p.stdout.strip().splitlines()[-1].startswith("OK (worst: ")
    p = subprocess.run(cmd + ["--xla-logs"], capture_output=True, text=True, env=env)
    assert p.returncode == 0
    assert re.search(r"^[WIE]\d{4} .*\.cc:\d+\]", p.stderr, re.M), p.stderr

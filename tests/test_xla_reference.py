"""XLA's own GSPMD results (hlo_spmd.runtime.xla_reference): dumps, completed shardings,
the partitioned module, the on-disk cache, and the agreement machinery.

The dumps are cached on disk (default ~/.cache/hlo-spmd/xla-reference, or
HLO_SPMD_XLA_CACHE), so reruns do not recompile unchanged fixtures; the cache tests use
their own temporary directories.
"""
from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hlo_spmd.runtime import ensure_host_devices

ensure_host_devices(8)  # before jax creates its backends
jax = pytest.importorskip("jax")

from hlo_spmd.errors import HloSpmdError  # noqa: E402
from hlo_spmd.ir.io import load_module_bytes  # noqa: E402
from hlo_spmd.runtime import xla_reference as xr  # noqa: E402
from hlo_spmd.sharding import HloSharding, OpMetadata, parse_sharding  # noqa: E402

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hlo"
CASES = {c.name: c for c in xr.fixture_cases(FIXTURES)}
# Computations XLA applies per element: their scalar instructions get no sharding.
APPLIED_BY = {"reduce", "reduce-window", "scatter", "sort", "all-reduce", "reduce-scatter",
              "select-and-scatter", "map"}
DUMPED = ("dot_variants", "while_loop", "transformer_layer_fwd",
          "handwritten/while_tuple_carry")


def case(name: str) -> xr.FixtureCase:
    return CASES[name]


def dumps(name: str, **kw) -> xr.XlaDumps:
    c = case(name)
    return xr.xla_pass_dumps(c.proto_bytes(), c.num_partitions, **kw)


def _instruction_names_in_text(text: str) -> set[str]:
    return set(re.findall(r"^\s*(?:ROOT )?%([^\s=]+) = ", text, flags=re.M))


def _applied_computations(module) -> set[str]:
    out = set()
    for inst in module.instructions():
        if inst.opcode in APPLIED_BY:
            out.update(c.name for c in inst.called_computations)
    return out


# ------------------------------------------------------------------- fixture discovery
def test_fixture_cases_cover_pb_and_handwritten():
    names = set(CASES)
    assert {"dot_variants", "shardy_mlp_2d", "handwritten/row_sharded_matmul"} <= names
    pbs = {p.stem for p in FIXTURES.glob("*.pb")}
    assert pbs == {n for n in names if "/" not in n}
    hand = {p.stem for p in (FIXTURES / "handwritten").glob("*.hlo")}
    assert hand == {n.split("/", 1)[1] for n in names if n.startswith("handwritten/")}
    assert case("handwritten/row_sharded_matmul").num_partitions == 4
    assert case("handwritten/row_sharded_matmul").path.suffix == ".hlo"
    assert case("dot_variants").path.suffix == ".pb"
    assert case("shardy_uneven").form == "shardy"


# ------------------------------------------------------------------------------- dumps
@pytest.mark.parametrize("name", DUMPED)
def test_dumps_exist(name):
    d = dumps(name)
    assert not d.shardy and d.error is None
    assert set(d.after) == set(xr.DEFAULT_PASSES)
    assert d.input is not None and d.input.label == "before_sharding-propagation"
    for dump in (d.input, d.propagated, d.partitioned):
        assert dump.text.lstrip().startswith("HloModule")
        m = dump.module()  # the proto loads with our IR
        assert m.instruction_count() > 0
        assert _instruction_names_in_text(dump.text) == {i.name for i in m.instructions()}
    import jaxlib

    assert d.jaxlib_version == jaxlib.__version__


@pytest.mark.parametrize("name", DUMPED)
def test_completed_shardings_cover_every_instruction(name):
    c = case(name)
    d = dumps(name)
    module = d.propagated.module()
    completed = xr.xla_completed_shardings(c.proto_bytes(), c.num_partitions)
    # every instruction of every computation, and nothing else
    assert set(completed) == {i.name for i in module.instructions()}
    assert set(completed) == _instruction_names_in_text(d.propagated.text)
    applied = _applied_computations(module)
    for inst in module.instructions():
        text = completed[inst.name]
        if text:
            assert parse_sharding(text) == inst.sharding
            continue
        # XLA leaves only per-element reducer bodies and scalar reduce init values bare
        feeds_only_reduces = inst.opcode == "constant" and inst.shape.dims == () and all(
            u.opcode in ("reduce", "reduce-window")
            for u in module.instructions() if inst in u.operands)
        assert inst.parent.name in applied or feeds_only_reduces, \
            f"{inst.name} ({inst.opcode}) in {inst.parent.name} is unsharded"
    if name == "dot_variants":
        assert all(completed.values())


@pytest.mark.parametrize("name", DUMPED + ("shard_map_partial_manual", "mlp_2d_megatron"))
def test_user_annotations_unchanged(name):
    """Every sharding the fixture carries is in XLA's completion unchanged (for the
    Sharding custom-calls XLA turns into copies: on the copy)."""
    c = case(name)
    ours = load_module_bytes(c.proto_bytes())
    xla = xr.xla_completed_module(c.proto_bytes(), c.num_partitions)
    aliases = xr._align_names(ours, xla)
    by_name = {i.name: i for i in xla.instructions()}
    checked = 0
    for inst in ours.instructions():
        if inst.sharding is None:
            continue
        other = by_name.get(aliases.get(inst.name, inst.name))
        if other is None:
            continue  # XLA's import renamed it (handwritten text) or inlined a call
        assert other.sharding == inst.sharding, inst.name
        checked += 1
    assert checked >= 3


def test_sharding_custom_calls_become_copies_and_are_aligned():
    c = case("mlp_2d_megatron")
    ours = load_module_bytes(c.proto_bytes())
    xla = xr.xla_completed_module(c.proto_bytes(), c.num_partitions)
    aliases = xr._align_names(ours, xla)
    customs = {i.name for i in ours.instructions()
               if i.opcode == "custom-call" and i.custom_call_target == "Sharding"}
    assert customs and set(aliases) == customs
    by_name = {i.name: i for i in xla.instructions()}
    assert all(by_name[aliases[n]].opcode == "copy" for n in customs)
    rep = xr.compare_modules(ours, xla)
    assert not rep.only_ours and not rep.only_xla


@pytest.mark.parametrize("name,collective", [
    ("dot_variants", "all-reduce"),
    ("mlp_2d_megatron", "all-reduce"),
    ("moe_einsum", "all-to-all"),
    ("conv_spatial", "collective-permute"),
    ("cumsum", "all-gather"),
])
def test_partitioned_module_has_collectives(name, collective):
    c = case(name)
    proto = xr.xla_partitioned_module(c.proto_bytes(), c.num_partitions)
    m = load_module_bytes(proto)
    assert collective in {i.opcode for i in m.instructions()}
    from hlo_spmd.runtime.module_io import read_spmd_shardings

    params, output = read_spmd_shardings(proto)
    assert params is not None and output is not None


def test_partitioned_parameters_are_per_device_shapes():
    c = case("dot_variants")  # a: f32[8,16,32] on {devices=[2,1,1,4]<=[8] last_tile_dim_replicate}
    m = load_module_bytes(xr.xla_partitioned_module(c.proto_bytes(), c.num_partitions))
    shapes = sorted(tuple(p.shape.dims) for p in m.entry.parameters)
    assert (4, 16, 32) in shapes and (8, 16, 32) not in shapes


def test_xla_partitioned_module_runs_per_device():
    """XLA's partitioned module is a per-device program our runtime executes, and it
    computes what the unpartitioned module computes."""
    from hlo_spmd import runtime as rt

    c = case("mlp_2d_megatron")
    proto = c.proto_bytes()
    partitioned = xr.xla_partitioned_module(proto, c.num_partitions)
    inputs = rt.random_inputs(rt.entry_signature(proto).parameters, seed=0)
    expected = rt.run_unpartitioned(proto, inputs)
    got = rt.run_partitioned(_manual_boundaries(partitioned), inputs, c.num_partitions)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)


def _manual_boundaries(proto: bytes) -> bytes:
    """XLA's partitioned program with manual entry parameters and root, so that compiling
    it again does not partition it a second time."""
    from hlo_spmd.proto import hlo_pb2, xla_data_pb2

    m = hlo_pb2.HloModuleProto()
    m.ParseFromString(proto)
    entry = next(c for c in m.computations if c.id == m.entry_computation_id)
    manual = xla_data_pb2.OpSharding(type=xla_data_pb2.OpSharding.MANUAL)
    for inst in entry.instructions:
        if inst.opcode == "parameter":
            inst.sharding.CopyFrom(manual)
        elif inst.id == entry.root_id:
            if inst.shape.tuple_shapes:
                inst.sharding.CopyFrom(xla_data_pb2.OpSharding(
                    type=xla_data_pb2.OpSharding.TUPLE,
                    tuple_shardings=[manual] * len(inst.shape.tuple_shapes)))
            else:
                inst.sharding.CopyFrom(manual)
    return m.SerializeToString()


# ----------------------------------------------------------------------------- shardy
def test_shardy_module_gspmd_completion_despite_partitioner_refusal():
    c = case("shardy_mlp_2d")
    assert xr.is_shardy_module(c.proto_bytes())
    assert not xr.is_shardy_module(case("mlp_2d_megatron").proto_bytes())
    d = xr.xla_pass_dumps(c.proto_bytes(), c.num_partitions, shardy=False)
    assert d.completion_pass == "sharding-propagation"
    assert d.error and "xla.sdy" in d.error
    assert "spmd-partitioning" not in d.after
    with pytest.raises(HloSpmdError, match="no partitioned module"):
        d.partitioned
    # the classic twin gets the same completion
    twin = case("mlp_2d_megatron")
    a = {i.opcode + str(i.shape): i.sharding for i in d.propagated.module().instructions()
         if i.opcode in ("dot", "tanh")}
    b = {i.opcode + str(i.shape): i.sharding for i in
         xr.xla_completed_module(twin.proto_bytes(), twin.num_partitions).instructions()
         if i.opcode in ("dot", "tanh")}
    assert a == b and len(a) == 3


def test_shardy_module_partitioned_with_shardy():
    c = case("shardy_mlp_2d")
    d = xr.xla_pass_dumps(c.proto_bytes(), c.num_partitions)  # auto: shardy
    assert d.shardy and d.error is None
    assert d.completion_pass == "shardy-xla"
    assert "all-reduce" in {i.opcode for i in d.partitioned.module().instructions()}
    assert all(i.sharding is not None for i in d.propagated.module().entry.instructions)


# ------------------------------------------------------------------------------ cache
def test_cache_hit_and_key(tmp_path):
    c = case("dot_variants")
    proto = c.proto_bytes()
    t0 = time.perf_counter()
    first = xr.xla_pass_dumps(proto, c.num_partitions, cache=tmp_path)
    t1 = time.perf_counter()
    second = xr.xla_pass_dumps(proto, c.num_partitions, cache=tmp_path)
    t2 = time.perf_counter()
    assert not first.cached and second.cached
    assert first.cache_path == second.cache_path and second.cache_path.parent == tmp_path
    assert first.cache_path.name.startswith(hashlib.sha256(proto).hexdigest()[:40])
    for p in xr.DEFAULT_PASSES:
        assert first.after[p].text == second.after[p].text
        assert first.after[p].proto == second.after[p].proto
    assert first.input.proto == second.input.proto
    assert second.seconds == pytest.approx(first.seconds)  # the compile time is kept
    print(f"\ndot_variants: compile+dump {t1 - t0:.3f} s, cached {t2 - t1:.4f} s")
    # another module / partition count / shardy flag is another entry
    replicated = case("handwritten/maximal_sharding")  # valid on 2, 4 and 8 devices
    for n in (2, 4):
        xr.xla_pass_dumps(replicated.proto_bytes(), n, cache=tmp_path)
    forced = xr.xla_pass_dumps(proto, c.num_partitions, shardy=True, cache=tmp_path)
    assert not forced.shardy  # XLA fell back to GSPMD: no Shardy markers
    assert forced.propagated.text == first.propagated.text
    assert len([p for p in tmp_path.iterdir() if not p.name.startswith(".")]) == 4
    # a failed compile is not cached
    with pytest.raises(HloSpmdError):
        xr.xla_pass_dumps(proto, 4, cache=tmp_path)
    assert xr.clear_cache(tmp_path) == 4
    assert not any(tmp_path.iterdir())


def test_cache_off(tmp_path, monkeypatch):
    monkeypatch.setenv("HLO_SPMD_XLA_CACHE", "off")
    assert xr.cache_dir() is None
    d = xr.xla_pass_dumps(case("mlp_dp_4").proto_bytes(), 4)
    assert not d.cached and d.cache_path is None
    monkeypatch.setenv("HLO_SPMD_XLA_CACHE", str(tmp_path / "c"))
    assert xr.cache_dir() == tmp_path / "c"
    d = xr.xla_pass_dumps(case("mlp_dp_4").proto_bytes(), 4)
    assert d.cache_path is not None and d.cache_path.parent == tmp_path / "c"
    d = xr.xla_pass_dumps(case("mlp_dp_4").proto_bytes(), 4, cache=False)
    assert not d.cached
    monkeypatch.delenv("HLO_SPMD_XLA_CACHE")
    assert xr.cache_dir() == Path.home() / ".cache" / "hlo-spmd" / "xla-reference"


def test_cache_ignores_the_module_id(tmp_path):
    """jaxlib numbers the modules it parses from text; the same text must hit the cache."""
    c = case("handwritten/row_sharded_matmul")
    a, b = c.proto_bytes(), c.proto_bytes()
    first = xr.xla_pass_dumps(a, c.num_partitions, cache=tmp_path)
    second = xr.xla_pass_dumps(b, c.num_partitions, cache=tmp_path)
    assert second.cached and second.cache_path == first.cache_path


def test_corrupt_cache_entry_is_recomputed(tmp_path):
    c = case("mlp_dp_4")
    first = xr.xla_pass_dumps(c.proto_bytes(), 4, cache=tmp_path)
    (first.cache_path / "meta.json").write_text("{not json")
    again = xr.xla_pass_dumps(c.proto_bytes(), 4, cache=tmp_path)
    assert not again.cached
    # the proto differs only in the module id (a process-wide counter in XLA)
    assert again.propagated.text == first.propagated.text


def test_subprocess_mode_matches_in_process():
    c = case("dot_variants")
    sub = xr.xla_pass_dumps(c.proto_bytes(), c.num_partitions, cache=False,
                            mode="subprocess")
    here = xr.xla_pass_dumps(c.proto_bytes(), c.num_partitions, cache=False,
                             mode="inprocess")
    assert sub.mode == "subprocess" and here.mode == "inprocess"
    assert xr.module_shardings(sub.propagated.module()) == \
        xr.module_shardings(here.propagated.module())
    assert set(sub.after) == set(here.after)


def test_errors():
    c = case("dot_variants")
    with pytest.raises(HloSpmdError, match="num_partitions"):
        xr.xla_pass_dumps(c.proto_bytes(), 0)
    with pytest.raises(HloSpmdError, match="num_partitions must be >= 2"):
        xr.xla_pass_dumps(c.proto_bytes(), 1)
    with pytest.raises(HloSpmdError, match="mode"):
        xr.xla_pass_dumps(c.proto_bytes(), 8, mode="elsewhere")
    with pytest.raises(HloSpmdError):  # shardings for 8 devices compiled on 4
        xr.xla_pass_dumps(c.proto_bytes(), 4, cache=False)


def test_text_parser_reads_completion_dumps_like_the_proto():
    for name in DUMPED:
        d = dumps(name)
        assert xr.module_shardings(d.propagated.module(from_text=True)) == \
            xr.module_shardings(d.propagated.module())


# -------------------------------------------------------------------------- agreement
S = parse_sharding


def test_semantic_equality():
    eq = xr.semantically_equal
    assert eq(S("{devices=[2,4]<=[8]}"), S("{devices=[2,4]0,1,2,3,4,5,6,7}"))
    assert eq(S("{devices=[4,2]<=[2,4]T(1,0)}"), S("{devices=[4,2]0,4,1,5,2,6,3,7}"))
    assert not eq(S("{devices=[2,4]<=[8]}"), S("{devices=[4,2]<=[8]}"))
    assert not eq(S("{devices=[2,4]<=[8]}"), S("{devices=[2,4]<=[4,2]T(1,0)}"))
    assert eq(S("{replicated}"), S("{devices=[1,1,8]<=[8] last_tile_dim_replicate}"))
    one = HloSharding.tile(np.array([[0]]))  # {devices=[1,1]0}
    assert one != HloSharding.replicate() and eq(one, HloSharding.replicate())
    assert eq(S("{replicated}"), S("{{replicated}, {replicated}}"))
    assert not eq(S("{replicated}"), S("{{replicated}, {devices=[2]0,1}}"))
    assert eq(S("{{devices=[2]0,1}, {replicated}}"), S("{{devices=[2]<=[2]}, {replicated}}"))
    assert not eq(S("{maximal device=0}"), S("{replicated}"))
    assert eq(S("{maximal device=0}"), S("{replicated}"), num_devices=1)
    assert not eq(S("{manual}"), S("{replicated}"))
    md = HloSharding.replicate([OpMetadata(op_name="x")])
    assert eq(md, S("{replicated}"))
    assert eq(None, None) and not eq(None, S("{replicated}"))


def test_compare_shardings_counts_and_table():
    xla = {"a": S("{devices=[2]0,1}"), "b": S("{replicated}"), "c": None,
           "copy": S("{devices=[2]0,1}"), "xla_only": S("{replicated}")}
    ours = {"a": S("{devices=[2]<=[2]}"), "b": S("{devices=[2]0,1}"),
            "c": S("{replicated}"), "sc": S("{replicated}"), "ours_only": None}
    rep = xr.compare_shardings(ours, xla, aliases={"sc": "copy"},
                               opcodes={"b": "add", "sc": "custom-call"}, label="t")
    assert (rep.compared, rep.agreed) == (4, 2)
    assert rep.percent == pytest.approx(50.0)
    assert [(d.name, d.opcode, d.ours, d.xla, d.xla_name) for d in rep.disagreements] == [
        ("b", "add", "{devices=[2]0,1}", "{replicated}", ""),
        ("sc", "custom-call", "{replicated}", "{devices=[2]0,1}", "copy")]
    assert rep.only_ours == ["ours_only"] and rep.only_xla == ["xla_only"]
    table = rep.table()
    assert table.startswith("t: 2/4 agree (50.0%)") and "sc~copy" in table
    # XLA's unsharded reads as replicated only when asked; our hole is always reported
    strict = xr.compare_shardings(ours, xla, aliases={"sc": "copy"},
                                  xla_unsharded_is_replicated=False)
    assert strict.agreed == 1
    holes = xr.compare_shardings({"a": None}, {"a": S("{replicated}")})
    assert holes.agreed == 0 and holes.disagreements[0].ours == "<none>"


def test_compare_modules_name_clashes_and_no_reference():
    """Same name, different instruction: not compared. xla.sdy custom-calls: no reference."""
    from hlo_spmd.ir.text_parser import parse_module

    def module(body: str):
        return parse_module("HloModule m\nENTRY e {\n" + body + "}\n")

    xla = module("""  p = f32[8] parameter(0), sharding={devices=[2]0,1}
  n = f32[8] negate(p), sharding={devices=[2]0,1}
  c = f32[8] custom-call(n), custom_call_target="xla.sdy.FuncResultSharding"
  ROOT t = (f32[8]) tuple(c), sharding={{devices=[2]0,1}}
""")
    ours = module("""  p = f32[8] parameter(0), sharding={devices=[2]0,1}
  n = f32[8] exponential(p), sharding={replicated}
  c = f32[8] custom-call(n), custom_call_target="xla.sdy.FuncResultSharding",
      sharding={devices=[2]0,1}
  ROOT t = (f32[8]) tuple(c), sharding={{devices=[2]0,1}}
""")
    rep = xr.compare_modules(ours, xla)
    assert rep.name_clashes == ["n"] and "n" in rep.only_ours and "n" in rep.only_xla
    assert rep.no_reference == ["c"]
    assert (rep.compared, rep.agreed) == (2, 2)
    strict = xr.compare_modules(ours, xla, skip_no_reference=False)
    assert strict.compared == 3 and [d.name for d in strict.disagreements] == ["c"]


def test_format_agreement_table():
    rep = xr.compare_shardings({"a": S("{replicated}")}, {"a": S("{replicated}")})
    text = xr.format_agreement_table([("x", rep), ("y", "skipped: because")])
    assert "x" in text and "100.0" in text and "skipped: because" in text
    assert text.splitlines()[-1].startswith("TOTAL")


def test_cli_xla_only():
    # The agreement table is a script (benchmarks/), run as a user runs it.
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "xla_agreement.py"
    proc = subprocess.run([sys.executable, str(script), "--agreement", str(FIXTURES),
                           "--xla-only"], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "dot_variants" in out and "handwritten/while_tuple_carry" in out
    total = out.strip().splitlines()[-1].split()
    assert total[0] == "TOTAL" and total[-1] == "100.0"

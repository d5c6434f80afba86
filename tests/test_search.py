"""``hlo-spmd search`` / ``hlo_spmd.search``: on JAX programs lowered without any
sharding, with the peak of a hand-written expert annotation as the memory budget, the
search's program fits the budget, moves no more bytes per device than the expert's, is
exactly what partitioning the annotated module gives, and runs right on 8 CPU devices
(compared with the unpartitioned module on one device)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

import _search_models as sm
import hlo_spmd
from hlo_spmd.ir.io import module_bytes
from hlo_spmd.runtime import run_partitioned
from hlo_spmd.runtime.run import run_unpartitioned
from hlo_spmd.search.pricing import price_of

# (transformer_step takes ~25 s here: `make test-slow`.)
MODELS = ["mlp", "moe", "embed_xent_step", "cnn_step",
          pytest.param("transformer_step", marks=pytest.mark.slow)]

_CASES: dict = {}


def _case(name):
    if name not in _CASES:
        _CASES[name] = sm.build(name)
    return _CASES[name]


@pytest.mark.parametrize("name", MODELS)
def test_search_matches_or_beats_the_expert_and_runs(name):
    case = _case(name)
    module = hlo_spmd.load(case.hlo)
    expert = price_of(hlo_spmd.partition(module, mesh=sm.MESH, shard=case.expert))
    got = hlo_spmd.search(module, mesh=sm.MESH, memory_limit=expert.peak)
    win = got.report["winner"]
    real = price_of(got.partition)
    # The reported figures are the real partitioned program's.
    assert (win["bytes_per_device"], win["collectives"], win["peak_bytes"]) == tuple(real)
    assert real.peak <= expert.peak
    assert real.bytes <= expert.bytes
    # The program is exactly what partitioning the annotated module gives.
    again = hlo_spmd.partition(hlo_spmd.load(module_bytes(got.annotated)))
    assert again.serialize() == got.partition.serialize()
    # Every entry parameter has a chosen spec in both forms.
    for p in got.report["parameters"]:
        assert p["hlo"] is not None and p["partition_spec"].startswith("PartitionSpec(")
    # It runs right on 8 devices.
    want = run_unpartitioned(case.hlo, case.inputs)
    outs = run_partitioned(got.partition.serialize(), case.inputs, 8, poison_padding=True)
    assert len(outs) == len(want)
    for a, b in zip(outs, want):
        np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3)
    if name.endswith("_step"):  # updated weights really moved (more than the tolerance)
        moved = [np.max(np.abs(o - i)) for o, i in zip(want[1:], case.inputs)
                 if o.shape == i.shape]
        assert moved and min(moved) > 1e-2


def test_constraints_are_kept_and_baselines_reported():
    case = _case("mlp")
    got = hlo_spmd.search(case.hlo, mesh=sm.MESH, memory_limit="1MiB",
                          shard={"#0": "model,_"})
    p0 = got.report["parameters"][0]
    assert p0["spec"] == "model,_" and p0["fixed"]
    assert p0["partition_spec"] == "PartitionSpec('model', None)"
    assert set(got.report["baselines"]) == {"data_parallel", "fsdp", "megatron", "megatron_fsdp"}
    meg = got.report["baselines"]["megatron"]["parameters"]
    assert meg == {"#1": "_,model", "#2": "model,_"}  # column, then row parallel
    # 2-D: Megatron's, with the weights' other dim over the first axis too
    two_d = got.report["baselines"]["megatron_fsdp"]["parameters"]
    assert two_d == {"#1": "data,model", "#2": "model,data"}
    # The kept annotation is in the annotated module.
    assert got.annotated.entry.parameters[0].sharding is not None


def test_module_annotations_are_a_baseline():
    case = _case("mlp")
    m = hlo_spmd.load(case.hlo)
    hlo_spmd.annotate(m, sm.MESH, {"#1": "_,model"})
    got = hlo_spmd.search(m, mesh=sm.MESH, memory_limit=None)
    assert "annotations" in got.report["baselines"]
    assert got.report["parameters"][1]["spec"] == "_,model"


def _stack(layers: int):
    import jax.numpy as jnp

    def f(x, *ws):
        for w in ws:
            x = jnp.tanh(x @ w)
        return x

    rng = np.random.default_rng(0)
    args = [rng.standard_normal((16, 32), dtype=np.float32)] + [
        (rng.standard_normal((32, 32)) * 0.2).astype(np.float32) for _ in range(layers)]
    return sm._lower(f, args), args


def test_repeated_layers_share_one_decision():
    from hlo_spmd.search.candidates import structural_groups

    hlo, args = _stack(6)
    m = hlo_spmd.load(hlo)
    groups = structural_groups(m, m.entry.parameters[1:])
    # The middle layers are one group: fewer decisions than weights.
    assert len(groups) < 6 and max(len(g) for g in groups) >= 3
    got = hlo_spmd.search(m, mesh=sm.MESH, memory_limit="64KiB")
    specs = {p["parameter"]: p["spec"] for p in got.report["parameters"]}
    for g in groups:
        assert len({specs[p.parameter_number] for p in g}) == 1
    outs = run_partitioned(got.partition.serialize(), args, 8)
    np.testing.assert_allclose(outs[0], run_unpartitioned(hlo, args)[0], rtol=1e-4, atol=1e-4)


def test_parse_size():
    from hlo_spmd.errors import HloSpmdError
    from hlo_spmd.units import parse_size

    assert parse_size("123456") == 123456
    assert parse_size("1.5MiB") == 1572864
    assert parse_size("2GB") == 2_000_000_000
    assert parse_size("16GiB") == 16 * 1024 ** 3
    assert parse_size("10 KB") == 10_000
    for bad in ("", "MiB", "1.5XB", "-3"):
        with pytest.raises(HloSpmdError):
            parse_size(bad)


def _cli(args):
    from hlo_spmd_cli.main import cli, _register

    _register()
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def test_cli_search_writes_annotated_partitioned_and_report(tmp_path):
    src = tmp_path / "mlp.pb"
    src.write_bytes(_case("mlp").hlo)
    ann, part, rep = tmp_path / "ann.hlo", tmp_path / "part.pb", tmp_path / "r.json"
    r = _cli(["search", str(src), "--mesh", sm.MESH, "--memory-limit", "22KiB",
              "-o", str(ann), "--partition", str(part), "--report", str(rep), "-q"])
    assert r.exit_code == 0, r.output
    assert "PartitionSpec('data', None)" in r.output and "megatron" in r.output
    report = json.loads(rep.read_text())
    assert report["winner"]["fits"] and report["winner"]["peak_bytes"] <= 22 * 1024
    again = tmp_path / "again.pb"
    r = _cli(["partition", str(ann), "-o", str(again), "-q"])
    assert r.exit_code == 0
    assert again.read_bytes() == part.read_bytes()
    r = _cli(["search", str(src), "--mesh", sm.MESH, "--memory-limit", "22KiB",
              "-o", str(tmp_path / "b.hlo"), "--json", "-q"])
    assert json.loads(r.output)["parameters"][1]["spec"] == "_,model"


def test_cli_search_impossible_budget_and_bad_size(tmp_path):
    src = tmp_path / "mlp.pb"
    src.write_bytes(_case("mlp").hlo)
    out = tmp_path / "ann.hlo"
    r = _cli(["search", str(src), "--mesh", sm.MESH, "--memory-limit", "1KiB",
              "-o", str(out), "-q"])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if "error" in ln]
    assert len(lines) == 1 and "smallest peak found is" in lines[0]
    assert not os.path.exists(out)
    r = _cli(["search", str(src), "--mesh", sm.MESH, "--memory-limit", "lots",
              "-o", str(out), "-q"])
    assert r.exit_code == 2 and "bad size" in r.output and not os.path.exists(out)


# Held-out models: fixtures annotated by their authors (JAX exports), stripped of every
# annotation and searched on their own mesh with their own program's peak as budget
# (figures for all of them: benchmarks/bench_search_heldout.py).
HELD_OUT = ["mlp_2d_megatron", "layernorm_batch_norm_train_step",
            pytest.param("moe_einsum", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", HELD_OUT)
def test_held_out_fixture_stripped_and_searched(name):
    from pathlib import Path

    from hlo_spmd.search.heldout import strip_annotations

    hlo_dir = Path(__file__).resolve().parent.parent / "fixtures" / "hlo"
    if not (hlo_dir / f"{name}.json").exists():
        hlo_dir = hlo_dir / "handwritten"
    meta = json.loads((hlo_dir / f"{name}.json").read_text())
    pb = hlo_dir / f"{name}.pb"
    src = pb.read_bytes() if pb.exists() else (hlo_dir / f"{name}.hlo").read_text()
    mesh = ",".join(f"{a}={n}" for a, n in meta["mesh"]["axes"].items())
    expert = price_of(hlo_spmd.partition(src))
    plain = strip_annotations(hlo_spmd.load(src))
    assert not any(i.sharding is not None for i in plain.instructions())
    got = hlo_spmd.search(plain, mesh=mesh, memory_limit=expert.peak)
    real = price_of(got.partition)
    assert real.peak <= expert.peak and real.bytes <= expert.bytes
    # The outputs are chosen too (every output has a sharding in the annotated module).
    assert got.annotated.entry.root.sharding is not None
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(i["shape"]).astype(np.float32) for i in meta["inputs"]]
    want = run_unpartitioned(module_bytes(plain), inputs)
    outs = run_partitioned(got.partition.serialize(), inputs, 8, poison_padding=True)
    for a, b in zip(outs, want):
        np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3)


def test_slice_pricing_of_a_layer_stack(monkeypatch):
    """Moves priced on slices (the path of modules too large to partition per move):
    the 6-layer stack, forced onto it, is searched with one slice per group, and the
    reported figures are still the real partitioned program's."""
    from hlo_spmd.search import driver

    monkeypatch.setattr(driver, "EXACT_WORK", 0)
    hlo, args = _stack(6)
    got = hlo_spmd.search(hlo, mesh=sm.MESH, memory_limit="48KiB")
    search = got.report["search"]
    assert search["pricing"] == "slices" and search["slice_partitions"] > 0
    real = price_of(got.partition)
    win = got.report["winner"]
    assert (win["bytes_per_device"], win["collectives"], win["peak_bytes"]) == tuple(real)
    assert real.peak <= 48 * 1024
    again = hlo_spmd.partition(hlo_spmd.load(module_bytes(got.annotated)))
    assert again.serialize() == got.partition.serialize()
    outs = run_partitioned(got.partition.serialize(), args, 8, poison_padding=True)
    np.testing.assert_allclose(outs[0], run_unpartitioned(hlo, args)[0], rtol=1e-4, atol=1e-4)


def test_layers_returned_in_a_tuple_still_share_one_decision():
    """The root tuple lists every layer's updated weight at its own position: that
    position must not split the layers into groups of one (it did: 28 layers gave 281
    groups)."""
    import jax.numpy as jnp

    from hlo_spmd.search.candidates import structural_groups

    def f(x, *ws):
        for w in ws:
            x = jnp.tanh(x @ w)
        return (x, *[w - 0.1 * jnp.sum(x) for w in ws])

    rng = np.random.default_rng(0)
    args = [rng.standard_normal((16, 32), dtype=np.float32)] + [
        rng.standard_normal((32, 32), dtype=np.float32) for _ in range(6)]
    m = hlo_spmd.load(sm._lower(f, args))
    groups = structural_groups(m, m.entry.parameters[1:])
    assert max(len(g) for g in groups) >= 3


@pytest.mark.slow  # (~1 min of search and ~40 s of running on 8 devices, loaded machine)
def test_layer_stack_training_step_meets_the_expert_with_its_constraints(tmp_path):
    """The 2-layer transformer training step of ``benchmarks/gen_train_step.py`` (Adam-like
    update, small dims): the expert annotation shards weights and optimizer states on
    data x model and constrains activations, gathered weights and gradients inside the
    program. Stripped of all of it, the search (slice pricing: the module is large for
    whole-module moves) fits the expert's peak, moves no more bytes, and runs right."""
    import sys
    from pathlib import Path

    import jax

    from hlo_spmd.search.heldout import strip_annotations

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import gen_train_step as gen

    old = jax.config.jax_use_shardy_partitioner
    try:
        src = gen.generate(2, tmp_path, small=True).read_bytes()
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)
    annotated = hlo_spmd.load(src)
    assert sum(i.custom_call_target == "Sharding" for i in annotated.entry.instructions
               if i.opcode == "custom-call") > 50  # the expert's constraints
    expert = price_of(hlo_spmd.partition(src))
    plain = strip_annotations(annotated)
    got = hlo_spmd.search(plain, mesh=sm.MESH, memory_limit=expert.peak)
    assert got.report["search"]["pricing"] == "slices"
    real = price_of(got.partition)
    assert real.peak <= expert.peak and real.bytes <= expert.bytes
    again = hlo_spmd.partition(hlo_spmd.load(module_bytes(got.annotated)))
    assert again.serialize() == got.partition.serialize()
    rng = np.random.default_rng(0)
    # (all positive: the second-moment states are under a square root)
    inputs = [np.abs(rng.standard_normal(p.shape.dims) * 0.3).astype(np.float32)
              for p in plain.entry.parameters]
    want = run_unpartitioned(module_bytes(plain), inputs)
    outs = run_partitioned(got.partition.serialize(), inputs, 8, poison_padding=True)
    assert len(outs) == len(want)
    for a, b in zip(outs, want):
        np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3)
    moved = [np.max(np.abs(o - i)) for o, i in zip(want, inputs) if o.shape == i.shape]
    assert moved and min(moved) > 5e-3


def test_a_normalized_input_is_data_in_the_baselines():
    """An input normalized before its first dot (a pre-LN layer's ``x``) is data: its
    batch dim goes over the data axis in the Megatron baselines (it was taken for a
    weight and left replicated)."""
    import jax.numpy as jnp

    from hlo_spmd.annotations.cli_spec import parse_mesh
    from hlo_spmd.search.baselines import baselines, classify

    def f(x, w):
        h = (x - jnp.mean(x, axis=-1, keepdims=True)) * 2.0
        return jnp.tanh(h @ w)

    rng = np.random.default_rng(0)
    args = [rng.standard_normal((16, 32), dtype=np.float32),
            rng.standard_normal((32, 64), dtype=np.float32)]
    m = hlo_spmd.load(sm._lower(f, args))
    data, uses = classify(m, m.entry.parameters)
    assert data == {0} and set(uses) == {1}
    named = baselines(m, m.entry.parameters, parse_mesh(sm.MESH))
    assert named["megatron"][0] == ("data", None)
    assert named["megatron_fsdp"] == {0: ("data", None), 1: ("data", "model")}


def _activation_heavy():
    """x @ w, then an elementwise chain on the (large) product, summed to a scalar; the
    module pins both parameters replicated (constraints the search keeps) and the scalar
    output has no layout: only a constraint on the product can shard the chain."""
    import jax.numpy as jnp

    def f(x, w, c):
        y = x @ w
        z = jnp.tanh(y) * y + jnp.exp(-y * y)
        return jnp.sum(z * z) + jnp.sum(c * c)  # (c: a free parameter, so moves to price)

    rng = np.random.default_rng(0)
    args = [rng.standard_normal((64, 16), dtype=np.float32),
            (rng.standard_normal((16, 512)) * 0.1).astype(np.float32),
            rng.standard_normal((8, 8), dtype=np.float32)]
    hlo = sm._lower(f, args)
    m = hlo_spmd.load(hlo)
    hlo_spmd.annotate(m, sm.MESH, {"#0": "_,_", "#1": "_,_"})
    return hlo, m, args


@pytest.mark.parametrize("pricing", ["whole module", "slices"])
def test_an_activation_constraint_pays_under_the_budget(pricing, monkeypatch):
    from hlo_spmd.search import driver

    if pricing == "slices":
        monkeypatch.setattr(driver, "EXACT_WORK", 0)
    hlo, m, args = _activation_heavy()
    bare = hlo_spmd.search(m, mesh=sm.MESH, memory_limit=None, constraint_sites=0)
    assert bare.report["constraints"] == []
    bare_peak = bare.report["winner"]["peak_bytes"]
    # Parameters and output alone cannot go under the replicated chain's peak.
    budget = bare_peak // 2
    with pytest.raises(hlo_spmd.search.SearchError):
        hlo_spmd.search(m, mesh=sm.MESH, memory_limit=budget, constraint_sites=0)
    got = hlo_spmd.search(m, mesh=sm.MESH, memory_limit=budget)
    assert got.report["search"]["pricing"] == pricing
    cons = got.report["constraints"]
    assert [c["name"] for c in cons] == [
        i.name for i in m.entry.instructions if i.opcode == "dot"]
    assert cons[0]["partition_spec"].startswith("PartitionSpec(") and cons[0]["hlo"] != "{replicated}"
    real = price_of(got.partition)
    assert real.peak <= budget
    assert got.report["winner"]["fits"]
    without = got.report["search"]["without_constraints"]
    assert without["peak_bytes"] > budget and not without["fits"]
    # Written as the instruction's own sharding: partitioning the annotated module
    # gives exactly the search's program.
    inst = {i.name: i for i in got.annotated.entry.instructions}[cons[0]["name"]]
    assert str(inst.sharding) == cons[0]["hlo"]
    again = hlo_spmd.partition(hlo_spmd.load(module_bytes(got.annotated)))
    assert again.serialize() == got.partition.serialize()
    want = run_unpartitioned(hlo, args)
    outs = run_partitioned(got.partition.serialize(), args, 8, poison_padding=True)
    np.testing.assert_allclose(outs[0], want[0], rtol=1e-4, atol=1e-3)


def test_the_constraint_round_keeps_the_mlp_figures():
    case = _case("mlp")
    module = hlo_spmd.load(case.hlo)
    expert = price_of(hlo_spmd.partition(module, mesh=sm.MESH, shard=case.expert))
    bare = hlo_spmd.search(module, mesh=sm.MESH, memory_limit=expert.peak,
                           constraint_sites=0).report["winner"]
    got = hlo_spmd.search(module, mesh=sm.MESH, memory_limit=expert.peak)
    win = got.report["winner"]
    assert got.report["search"]["constraint_sites_tried"] > 0
    key = lambda w: (w["bytes_per_device"], w["collectives"], w["peak_bytes"])  # noqa: E731
    assert key(win) <= key(bare)
    if not got.report["constraints"]:
        assert key(win) == key(bare)


def test_cli_search_writes_and_lists_a_constraint(tmp_path):
    _hlo, m, _args = _activation_heavy()
    src = tmp_path / "act.pb"
    src.write_bytes(module_bytes(m))
    ann, part, rep = tmp_path / "ann.hlo", tmp_path / "part.pb", tmp_path / "r.json"
    r = _cli(["search", str(src), "--mesh", sm.MESH, "--memory-limit", "256KiB",
              "-o", str(ann), "--partition", str(part), "--report", str(rep), "-q"])
    assert r.exit_code == 0, r.output
    report = json.loads(rep.read_text())
    (con,) = report["constraints"]
    # listed in the table with its mesh-axis and HLO forms, and the figures without it
    assert f"constraint  {con['name']}" in r.output and con["hlo"] in r.output
    assert "search without constraints" in r.output
    # written as the dot's own sharding attribute in the annotated text
    line = next(x for x in ann.read_text().splitlines() if f"%{con['name']} = " in x)
    assert f"sharding={con['hlo']}" in line
    again = tmp_path / "again.pb"
    r = _cli(["partition", str(ann), "-o", str(again), "-q"])
    assert r.exit_code == 0
    assert again.read_bytes() == part.read_bytes()


def test_constraint_sites_of_repeated_layers_are_one_decision():
    """The same activation of every middle layer of a stack is one site group (one
    decision, priced once), grouped like the parameters."""
    from hlo_spmd.search.candidates import constraint_sites

    hlo, _args = _stack(6)
    m = hlo_spmd.load(hlo)
    dots = [i for i in m.entry.instructions if i.opcode == "dot" and i is not m.entry.root]
    groups = constraint_sites(m, 10)
    assert sorted(i.name for g in groups for i in g) == sorted(i.name for i in dots)
    assert len(groups) < len(dots) and max(len(g) for g in groups) >= 3
    assert len(constraint_sites(m, 1)) == 1


def test_cli_search_with_every_parameter_fixed(tmp_path):
    """A module whose parameters are all annotated leaves nothing to decide: the search
    keeps them, and a budget below their peak is the one-line error, not a crash."""
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "fixtures", "hlo", "mlp_dp.pb")
    out = tmp_path / "ann.hlo"
    r = _cli(["search", src, "--mesh", sm.MESH, "--memory-limit", "10", "-o", str(out),
              "-q"])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if "error" in ln]
    assert len(lines) == 1 and "smallest peak found is 4000 bytes" in lines[0], r.output
    assert not os.path.exists(out)
    r = _cli(["search", src, "--mesh", sm.MESH, "--memory-limit", "1MiB", "-o", str(out),
              "-q"])
    assert r.exit_code == 0, r.output
    assert os.path.exists(out)

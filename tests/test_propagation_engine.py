"""The propagation driver: completeness on every fixture, determinism, fixed user
annotations, finer-only updates, control-flow fixpoints, provenance, options."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hlo_spmd.annotations import normalize_annotations
from hlo_spmd.ir.io import load_module
from hlo_spmd.ir.text_parser import parse_module
from hlo_spmd.passes.propagation import explain_chain, propagate
from hlo_spmd.passes.propagation import sharding_ops as ops
from hlo_spmd.sharding import is_finer

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hlo"
ALL_FIXTURES = sorted(FIXTURES.glob("*.pb")) + sorted((FIXTURES / "handwritten").glob("*.hlo"))


def _load(path: Path):
    return load_module(path)


def _num_devices(path: Path) -> int:
    return json.loads(path.with_suffix(".json").read_text())["num_partitions"]


def _shardings(module) -> dict[str, str]:
    return {i.name: str(i.sharding) for i in module.instructions()}


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: p.stem)
def test_every_fixture_gets_a_valid_sharding_everywhere(path):
    module = _load(path)
    result = propagate(module)
    n = _num_devices(path)
    for inst in module.instructions():
        if inst.shape.is_token:
            continue
        assert inst.sharding is not None, inst.name
        assert inst.sharding.is_tuple == inst.shape.is_tuple, inst.name
        inst.sharding.validate_for_shape(inst.shape, n)
        assert inst.name in result.decisions


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: p.stem)
def test_deterministic(path):
    a, b = _load(path), _load(path)
    ra, rb = propagate(a), propagate(b)
    assert _shardings(a) == _shardings(b)
    assert {k: (d.rule, d.sources) for k, d in ra.decisions.items()} == \
        {k: (d.rule, d.sources) for k, d in rb.decisions.items()}


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: p.stem)
def test_user_annotations_kept_and_open_dims_only_refined(path):
    module = _load(path)
    report = normalize_annotations(module)
    before = {i.name: i.sharding for i in module.instructions() if i.sharding is not None}
    propagate(module, annotations=report)
    for inst in module.instructions():
        if inst.name not in report.user_annotated or inst.name not in before:
            continue
        old = ops.normalize_tuple(before[inst.name], inst.shape)
        open_dims = report.unspecified_dims(inst.name)
        leaf_open = report[inst.name].leaf_unspecified_dims
        if inst.shape.is_tuple and leaf_open:
            # Per-value open dims (a Shardy manual computation's tuple entry / exit).
            for i, (o, n) in enumerate(zip(old.tuple_elements, inst.sharding.tuple_elements)):
                dims = leaf_open.get(i, ())
                if not dims:
                    assert n == o, (inst.name, i)
                elif o.is_tiled and n.is_tiled:
                    for d in range(o.tiled_data_rank):
                        if d not in dims:
                            assert n.tile_dims_for_data()[d] == o.tile_dims_for_data()[d]
            continue
        if not open_dims:
            if inst.opcode == "parameter" and inst.parent is not module.entry:
                continue  # XLA does not fix non-entry parameters
            assert inst.sharding == old, inst.name
            continue
        # Refined annotations keep their specified dims' tiling.
        new = inst.sharding
        if old.is_tiled and new.is_tiled:
            for d in range(old.tiled_data_rank):
                if d not in open_dims:
                    assert new.tile_dims_for_data()[d] == old.tile_dims_for_data()[d]


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: p.stem)
def test_shardings_only_get_finer(path):
    """Every forward/backward update of an array value is strictly more specific."""
    module = _load(path)
    result = propagate(module)
    shapes = {i.name: i.shape for i in module.instructions()}
    for name, d in result.decisions.items():
        if shapes[name].is_tuple:
            continue
        steps = [h for h in d.history + [d] if h.sharding is not None]
        for old, new in zip(steps, steps[1:]):
            if new.direction in ("forward", "backward"):
                assert is_finer(new.sharding, old.sharding), (name, old, new)


def test_while_body_condition_and_carry_agree():
    module = _load(FIXTURES / "while_loop.pb")
    propagate(module)
    w = next(i for i in module.instructions() if i.opcode == "while")
    body, cond = w.called_computations
    assert w.sharding == body.root.sharding == body.parameters[0].sharding \
        == cond.parameters[0].sharding
    assert str(w.sharding) == ("{{replicated}, {devices=[8,1]<=[8]}, {devices=[8]<=[8]}, "
                               "{replicated}}")


def test_conditional_branches_agree_with_operands_and_result():
    module = _load(FIXTURES / "conditional.pb")
    propagate(module)
    for c in (i for i in module.instructions() if i.opcode == "conditional"):
        for k, branch in enumerate(c.called_computations):
            assert branch.root.sharding == c.sharding
            assert branch.parameters[0].sharding == c.operands[k + 1].sharding


def test_explain_chain_leads_back_to_an_annotation():
    module = _load(FIXTURES / "mlp_dp.pb")
    result = propagate(module)
    chain = explain_chain(result, "add.15")
    assert chain[0].name == "add.15"
    assert chain[-1].direction == "user"
    assert [d.name for d in chain][-1] in ("x.1", "get-tuple-element.1")
    for d in chain[:-1]:
        assert d.sources and d.rule != "annotation"


TEXT = """HloModule m
ENTRY e {
  p0 = f32[16,32] parameter(0), sharding={devices=[8,1]<=[8]}
  p1 = f32[16,32] parameter(1)
  a = f32[16,32] add(p0, p1)
  ROOT n = f32[16,32] negate(a)
}"""


def test_root_and_parameters_are_fixed_by_default():
    module = parse_module(TEXT)
    propagate(module)
    names = {i.name: i for i in module.instructions()}
    # Unannotated entry parameters and root are not ours to choose: replicated.
    assert names["p1"].sharding.is_replicated and names["n"].sharding.is_replicated
    assert str(names["a"].sharding) == "{devices=[8,1]<=[8]}"


def test_propagate_to_output_and_parameters():
    module = parse_module(TEXT)
    result = propagate(module, propagate_to_output=True, propagate_to_parameters=True)
    names = {i.name: i for i in module.instructions()}
    assert str(names["n"].sharding) == "{devices=[8,1]<=[8]}"
    assert str(names["p1"].sharding) == "{devices=[8,1]<=[8]}"
    assert result.decisions["p1"].direction == "backward"


def test_uneven_output_is_replicated_when_propagated():
    module = parse_module("""HloModule m
ENTRY e {
  p0 = f32[10,32] parameter(0), sharding={devices=[4,1]<=[4]}
  ROOT n = f32[10,32] negate(p0)
}""")
    result = propagate(module, propagate_to_output=True)
    root = module.entry.root
    assert root.sharding.is_replicated
    assert result.decisions["n"].rule == "output.replicate_uneven"


def test_tokens_stay_unsharded_and_tuples_get_tuple_shardings():
    module = parse_module("""HloModule m
ENTRY e {
  p0 = f32[16] parameter(0), sharding={devices=[4]<=[4]}
  tok = token[] after-all()
  t = (f32[16], token[]) tuple(p0, tok)
  ROOT g = f32[16] get-tuple-element(t), index=0
}""")
    result = propagate(module)
    names = {i.name: i for i in module.instructions()}
    assert names["tok"].sharding is None and "tok" in result.unsharded
    assert names["t"].sharding.is_tuple and len(names["t"].sharding.tuple_elements) == 2


def test_manual_fixture_keeps_manual_region():
    module = _load(FIXTURES / "handwritten" / "manual_region.hlo")
    report = normalize_annotations(module)
    propagate(module, annotations=report)
    for region in report.manual_regions:
        comp = next(c for c in module.computations if c.name == region.computation)
        for name in region.instructions:
            inst = next(i for i in comp.instructions if i.name == name)
            s = inst.sharding
            assert s.is_manual or s.is_manual_subgroup or \
                all(e.is_manual for e in s.tuple_elements), (name, s)


def test_a_large_chain_propagates_end_to_end():
    """Smoke test of the worklist on a few thousand instructions (timing is not asserted)."""
    lines = ["HloModule big", "ENTRY e {", "  x = f32[64,128] parameter(0), "
             "sharding={devices=[8,1]<=[8]}"]
    prev = "x"
    for k in range(500):
        lines += [f"  w{k} = f32[128,128] parameter({k + 1})",
                  f"  d{k} = f32[64,128] dot({prev}, w{k}), lhs_contracting_dims={{1}}, "
                  "rhs_contracting_dims={0}",
                  f"  r{k} = f32[8,8,128] reshape(d{k})",
                  f"  t{k} = f32[8,128,8] transpose(r{k}), dimensions={{0,2,1}}",
                  f"  e{k} = f32[8,128,8] exponential(t{k})",
                  f"  back{k} = f32[8,8,128] transpose(e{k}), dimensions={{0,2,1}}",
                  f"  o{k} = f32[64,128] reshape(back{k})"]
        prev = f"o{k}"
    lines += [f"  ROOT out = (f32[64,128]) tuple({prev})", "}"]
    module = parse_module("\n".join(lines))
    result = propagate(module)
    last = {i.name: i for i in module.instructions()}["o499"]
    assert str(last.sharding) == "{devices=[8,1]<=[8]}"
    assert result.iterations < 20


def test_call_parameters_and_root_follow_the_call_site():
    module = parse_module("""HloModule m
body {
  a = f32[16,8] parameter(0)
  ROOT e = f32[16,8] exponential(a)
}
ENTRY e {
  p0 = f32[16,8] parameter(0), sharding={devices=[4,1]<=[4]}
  c = f32[16,8] call(p0), to_apply=body
  ROOT t = (f32[16,8]) tuple(c)
}""")
    result = propagate(module)
    names = {i.name: i for i in module.instructions()}
    for name in ("a", "e", "c"):
        assert str(names[name].sharding) == "{devices=[4,1]<=[4]}", name
    assert result.decisions["a"].rule in ("call.parameter", "computation.sync")


def test_shard_as_group_members_end_up_alike():
    module = parse_module("""HloModule m
ENTRY e {
  p0 = f32[16,32] parameter(0), sharding={devices=[8,1]<=[8]}
  p1 = f32[16,32] parameter(1)
  x = f32[16,32] exponential(p0)
  y = f32[16,32] log(p1)
  sx = f32[16,32] custom-call(x), custom_call_target="Sharding", sharding={unknown shard_as 0}
  sy = f32[16,32] custom-call(y), custom_call_target="Sharding", sharding={unknown shard_as 0}
  a = f32[16,32] add(sx, sy)
  ROOT t = (f32[16,32], f32[16,32]) tuple(a, sy)
}""")
    result = propagate(module)
    names = {i.name: i for i in module.instructions()}
    assert names["x"].sharding == names["y"].sharding
    assert str(names["y"].sharding) == "{devices=[8,1]<=[8]}"
    assert result.shard_groups == {0: ("y", "x")} or result.shard_groups == {0: ("x", "y")}
    # The group annotation itself is transparent: it carries its operand's sharding.
    assert names["sy"].sharding == names["y"].sharding


def test_propagation_leaves_no_reference_cycles():
    """A run's state (the fix point, its skip memo and dirty set, the rules' records)
    is freed when the result is dropped, not left for the cyclic garbage collector:
    with collection off, a collection afterwards finds nothing.  Every fixture, since
    control flow, manual regions, shard groups and priorities each keep state of their
    own."""
    import gc

    modules = [_load(p) for p in ALL_FIXTURES]
    gc.collect()
    gc.disable()
    try:
        found = {}
        for path, module in zip(ALL_FIXTURES, modules):
            propagate(module)
            n = gc.collect()
            if n:
                found[path.stem] = n
    finally:
        gc.enable()
    assert found == {}

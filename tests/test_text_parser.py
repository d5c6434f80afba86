"""HLO text parser: jaxlib's printed text -> parse_module -> proto must be the module
jaxlib started from (modulo ids), jaxlib must accept it and print it like its own text
round trip, printing is stable, the hand-written syntax XLA accepts parses, and errors
point at the offending token."""
from __future__ import annotations

import time

import pytest

from test_text_cases import (_CASE_NAMES, CORPUS, canon, fixture_id, fixture_protos,
                             fixture_texts, hlo_ext, jax_module, jax_print_proto,
                             jax_print_text, jax_text_to_proto, proto_differences)

from hlo_spmd.errors import ParseError
from hlo_spmd.ir.proto_io import module_to_proto
from hlo_spmd.ir.text_parser import XLA_OPCODES, parse_module, parse_module_with_config
from hlo_spmd.ir.text_printer import print_module
from hlo_spmd.proto import hlo_pb2


def _proto(pb: bytes) -> hlo_pb2.HloModuleProto:
    p = hlo_pb2.HloModuleProto()
    p.ParseFromString(pb)
    return p


def _check_structure(module) -> None:
    names = [i.name for i in module.instructions()]
    assert len(names) == len(set(names)), "instruction names are not module-unique"
    ids = [i.id for i in module.instructions()]
    assert len(ids) == len(set(ids)) and all(i > 0 for i in ids)
    assert len({c.id for c in module.computations}) == len(module.computations)
    assert module.entry is module.computations[-1] or module.entry in module.computations
    seen: set[int] = set()
    for comp in module.computations:  # callees before callers
        for inst in comp.instructions:
            for callee in inst.called_computations:
                assert id(callee) in seen, f"{callee.name} comes after its caller {comp.name}"
            assert all(op.parent is comp for op in inst.operands)
        seen.add(id(comp))
        params = sorted(p.parameter_number for p in comp.parameters)
        assert params == list(range(len(params)))


def _round_trip(text: str, reference_pb: bytes | None, source: str,
                stack_frames: bool = True, printed_input: bool = False) -> None:
    module, config = parse_module_with_config(text, source)
    assert module.config == config  # the header config travels with the module
    _check_structure(module)
    ours_pb = module_to_proto(module)
    if reference_pb is not None:
        assert proto_differences(_proto(reference_pb), ours_pb, stack_frames=stack_frames) == []
    # XLA's own text round trip is the reference for what survives text.
    xla_again = canon(jax_print_text(text))
    printed = print_module(module, config=config)
    assert canon(printed) == xla_again
    # jaxlib accepts our proto; it lacks the header config XLA keeps outside the proto.
    from_proto = jax_print_proto(ours_pb.SerializeToString())
    assert canon(from_proto) == canon(print_module(module, config={}))
    # printing is stable: after one text round trip (which fixes the instruction id order
    # XLA's computation order depends on) print(parse(text)) reproduces the text exactly.
    again = print_module(parse_module(printed), config=config)
    if printed_input:
        assert again == printed
    assert print_module(parse_module(again), config=config) == again


@pytest.mark.parametrize("name", _CASE_NAMES)
def test_jax_module_text_round_trip(name: str) -> None:
    hlo_ext()
    pb = jax_module(name)
    _round_trip(jax_print_proto(pb), pb, name, printed_input=True)


@pytest.mark.parametrize("path", fixture_protos(), ids=fixture_id)
def test_fixture_proto_text_round_trip(path) -> None:
    hlo_ext()
    pb = path.read_bytes()
    _round_trip(jax_print_proto(pb), pb, str(path), printed_input=True)


@pytest.mark.parametrize("path", fixture_texts(), ids=fixture_id)
def test_fixture_text_parses(path) -> None:
    hlo_ext()
    text = path.read_text()
    # jaxlib renumbers stack frames when it parses text; compare the tables via canon().
    _round_trip(text, jax_text_to_proto(text), str(path), stack_frames=False)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_round_trip(name: str) -> None:
    """Hand-written text covering every opcode / attribute: our proto equals jaxlib's."""
    hlo_ext()
    text = CORPUS[name]
    _round_trip(text, jax_text_to_proto(text), name, stack_frames=False)


_OPCODE_PROBE = r"""
import os, sys
os.environ.setdefault("JAX_PLATFORMS", "cpu")
from jaxlib import _hlo
for op in sys.argv[1:]:
    text = "HloModule m\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT r = f32[4] %s(p)\n}\n" % op
    try:
        _hlo.hlo_module_from_text(text)
        verdict = "ok"
    except Exception as e:  # jaxlib raises its own error type
        verdict = "unknown" if "Unknown opcode" in str(e) else "error"
    print(op, verdict, flush=True)
"""


def test_every_xla_opcode_is_known_to_jaxlib() -> None:
    """XLA_OPCODES lists jaxlib's opcode strings (an unknown one fails differently).

    Some bodies that are wrong for the opcode make jaxlib abort rather than report an
    error, so each probe runs in a subprocess that is restarted after a crash (a crash
    happens after the opcode was recognised, so it counts as known)."""
    import subprocess
    import sys

    hlo_ext()
    todo, verdicts = list(XLA_OPCODES), {}
    while todo:
        run = subprocess.run([sys.executable, "-c", _OPCODE_PROBE, *todo],
                             capture_output=True, text=True, timeout=300)
        for line in run.stdout.splitlines():
            op, verdict = line.split()
            verdicts[op] = verdict
        todo = [op for op in todo if op not in verdicts]
        if todo:  # the first unreported opcode crashed jaxlib
            assert run.returncode != 0, run.stderr[-2000:]
            verdicts[todo.pop(0)] = "crash"
    assert [op for op, v in verdicts.items() if v == "unknown"] == []


_ATTRIBUTE_PROBE = r"""
import json, os, sys
os.environ.setdefault("JAX_PLATFORMS", "cpu")
from jaxlib import _hlo
for op, n in json.loads(sys.argv[1]):
    params = "".join("  p%d = f32[4] parameter(%d)\n" % (i, i) for i in range(n))
    args = ", ".join("p%d" % i for i in range(n))
    text = "HloModule m\nENTRY e {\n%s  ROOT r = f32[4] %s(%s), bogus_attr=1\n}\n" % (
        params, op, args)
    try:
        _hlo.hlo_module_from_text(text)
        msg = ""
    except Exception as e:  # jaxlib raises its own error type
        msg = str(e)
    print(json.dumps([op, msg]), flush=True)
"""


# Attributes jaxlib 0.12's parser accepts that 0.10.2's does not: checked exactly against a
# jaxlib that has them, allowed as extras against an older one.
_NEWER_ATTRIBUTES = {
    "compare": {"order"},
    "dot": {"sparsity_config", "block_scaling_config"},
    "scaled-dot": {"sparsity_config", "block_scaling_config"},
    "convolution": {"block_scaling_config", "algorithm"},
    "topk": {"is_stable"},
    "collective-broadcast": {"has_dynamic_root"},
}


def test_allowed_attributes_match_jaxlib() -> None:
    """Per opcode, the attributes we accept are exactly those jaxlib's parser lists when it
    rejects an unknown one (subprocess, restarted if a bogus body crashes jaxlib)."""
    import json
    import re
    import subprocess
    import sys

    from hlo_spmd.ir import text_parser as tp

    hlo_ext()
    todo = [(op, n if n is not None else 1) for op, n in XLA_OPCODES.items()]
    messages: dict[str, str] = {}
    while todo:
        run = subprocess.run([sys.executable, "-c", _ATTRIBUTE_PROBE, json.dumps(todo)],
                             capture_output=True, text=True, timeout=300)
        for line in run.stdout.splitlines():
            op, msg = json.loads(line)
            messages[op] = msg
        todo = [t for t in todo if t[0] not in messages]
        if todo:
            messages[todo.pop(0)[0]] = ""
    compared, mismatches = 0, []
    for op, msg in messages.items():
        m = re.search(r"Allowed attributes: ([^\n]*)", msg)
        if m is None:  # e.g. async ops / constant fail earlier on the dummy body
            continue
        compared += 1
        theirs = {a.strip() for a in m.group(1).split(",")}
        ours = set(tp._ALLOWED.get(op, ())) | set(tp._GENERIC)
        if op in tp._RESULT_ACCURACY_OPS:
            ours.add("result_accuracy")
        extra_ok = _NEWER_ATTRIBUTES.get(op, set())  # ours may be newer than this jaxlib
        if theirs != ours and not (theirs <= ours and ours - theirs <= extra_ok):
            mismatches.append((op, sorted(theirs - ours), sorted(ours - theirs)))
    assert compared > 100
    assert mismatches == [], mismatches


# -- syntax variants ---------------------------------------------------------------------------------
HAND_WRITTEN = """
// XLA test style: no '%', no layouts, operand shapes, callee after caller
HloModule hand_written

ENTRY main {
  p0 = f32[2,3] parameter(0)
  p1 = f32[2,3] parameter(1)
  sum = f32[2,3] add(f32[2,3] p0, f32[2,3] %p1)  /* operand shapes */
  zero = f32[] constant(0)
  r = f32[2] reduce(sum, zero), dimensions={1}, to_apply=add_f32
  ROOT t = (f32[2], f32[2,3]) tuple(r, sum)
}

add_f32 {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
"""


def test_hand_written_syntax_matches_jaxlib() -> None:
    module = parse_module(HAND_WRITTEN)
    assert [c.name for c in module.computations] == ["add_f32", "main"]
    assert module.entry.name == "main"
    assert module.entry.root.name == "t"
    assert module.entry.find("r").called_computations[0].name == "add_f32"
    # jaxlib needs callees first; give it the reordered text and compare.
    reordered = HAND_WRITTEN.replace("ENTRY main", "XXX").split("add_f32 {")
    jax_text = reordered[0].split("XXX")[0] + "add_f32 {" + reordered[1] + "\nENTRY main" + \
        reordered[0].split("XXX")[1]
    hlo_ext()
    assert print_module(module) == jax_print_text(jax_text)
    assert proto_differences(_proto(jax_text_to_proto(jax_text)), module_to_proto(module),
                             stack_frames=False) == []


def test_no_header_last_computation_is_entry() -> None:
    text = """
    c1 {
      a = s32[] parameter(0)
      ROOT n = s32[] negate(a)
    }
    c2 {
      b = s32[] parameter(0)
      ROOT m = s32[] call(b), to_apply=c1
    }
    """
    module = parse_module(text)
    assert module.name == "module_c2" and module.entry.name == "c2"
    hlo_ext()
    assert print_module(module) == jax_print_text(text)


def test_duplicate_names_are_uniquified_like_xla() -> None:
    text = """HloModule dups
    f {
      x = f32[] parameter(0)
      ROOT y = f32[] negate(x)
    }
    g {
      x = f32[] parameter(0)
      y.1 = f32[] abs(x)
      ROOT y = f32[] negate(y.1)
    }
    ENTRY main {
      x = f32[] parameter(0)
      a = f32[] call(x), to_apply=f
      ROOT b = f32[] call(a), to_apply=g
    }
    """
    module = parse_module(text)
    names = sorted(i.name for i in module.instructions())
    hlo_ext()
    theirs = _proto(jax_text_to_proto(text))
    assert names == sorted(i.name for c in theirs.computations for i in c.instructions)
    assert print_module(module) == jax_print_text(text)


def test_ids_and_parameters() -> None:
    module = parse_module(CORPUS["reductions"])
    for comp in module.computations:
        for n, inst in enumerate(comp.instructions, start=1):
            assert inst.id == (comp.id << 32) | n
    main = module.entry
    # %argmax's parameter %a comes first in the text, so main's %a becomes a.1 (as in XLA).
    assert [p.name for p in main.parameters] == ["a.1", "ix", "src"]
    assert module.attrs.host_program_shape.parameter_names == ["p0", "p1", "p2"]


def test_scheduled_module_gets_a_schedule() -> None:
    module = parse_module(CORPUS["control_flow"])
    sched = module.attrs.schedule
    for comp in module.computations:
        assert list(sched.sequences[comp.id].instruction_ids) == [i.id for i in comp.instructions]


def test_header_config_is_returned() -> None:
    module, config = parse_module_with_config(CORPUS["collectives"])
    assert config == {"replica_count": 2, "num_partitions": 4}
    assert print_module(module, config=config).splitlines()[0].endswith(
        ", replica_count=2, num_partitions=4")


def test_sharding_values_round_trip() -> None:
    module = parse_module(CORPUS["sharding"])
    b = module.entry.find("b")
    assert b.sharding.is_tuple
    assert module.entry.find("d").sharding.device == 3
    assert "sharding={replicated metadata={op_name=\"x\"}}" in print_module(module)
    assert "sharding={replicated}" in print_module(module, print_metadata=False)


def test_negative_zero_and_nan_payloads_survive() -> None:
    text = ("HloModule m\nENTRY e {\n  ROOT c = (f32[3], c64[1]) constant(( {-0, nan(0x1), -nan}, "
            "{(-0, 1)} ))\n}\n")
    module = parse_module(text)
    printed = print_module(module)
    assert "constant(( {-0, nan(0x1), -nan}, {(-0, 1)} ))" in printed


# -- errors ------------------------------------------------------------------------------------------
BASE = """HloModule m

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %n = f32[4]{0} negate(%p)
  ROOT %r = f32[4]{0} add(%n, %p)
}
"""


def _error(text: str, source: str = "t.hlo") -> ParseError:
    with pytest.raises(ParseError) as e:
        parse_module(text, source)
    return e.value


def test_left_out_result_shape_is_inferred() -> None:
    # XLA's parser infers a result shape left out (its partitioner tests write tuples and
    # copies so); an opcode whose shape does not follow from its operands still needs one.
    text = BASE.replace("%n = f32[4]{0} negate(%p)", "%n = negate(%p)", 1)
    assert "%n = negate(%p)" in text
    m = parse_module(text)
    n = next(i for i in m.instructions() if i.name == "n")
    assert n.shape.to_text(False) == "f32[4]"


@pytest.mark.parametrize("old, new, message, at", [
    ("negate(%p)", "foo(%p)", "unknown opcode 'foo'", "foo("),
    ("add(%n, %p)", "add(%n, %q)", "undefined operand 'q'", "%q)"),
    ("add(%n, %p)\n", "add(%n, %p\n", "expected ')' after operands but found '}'", "}"),
    ("add(%n, %p)\n", "add(%n %p)\n", "expected ')' after operands but found '%'", "%p)"),
    ("%n = f32[4]{0} negate", "%n = f33[4]{0} negate", "unknown element type 'f33'", "f33"),
    ("%n = f32[4]{0} negate", "%n = f32[4]{1} negate", "is not a permutation", "{1}"),
    ("%n = f32[4]{0} negate", "%n = f32[4,]{0} negate", "expected dimension size", "]{0}"),
    ("%n = f32[4]{0} negate", "%n = f32[4]{0,1} negate", "2 minor_to_major entries", "{0,1}"),
    ("%n = f32[4]{0} negate(%p)", "%n = f32[4]{0} negate(%p), sharding={devices=[2,3]<=[8]}",
     "hold 6 devices but iota reshape dims [8] hold 8", "devices=[2,3]"),
    ("%n = f32[4]{0} negate(%p)", "%n = f32[4]{0} negate(%p), sharding={devices=[2,2]0,1,2}",
     "need 4 devices, got 3", "devices=[2,2]"),
    # the brace-balanced sharding text runs on to the computation's '}': the first bad token
    ("%n = f32[4]{0} negate(%p)", "%n = f32[4]{0} negate(%p), sharding={replicated",
     "bad sharding", "%r ="),
    ("%n = f32[4]{0} negate(%p)", "%p = f32[4]{0} negate(%p)", "'p' already exists", "%p = f32[4]{0} neg"),
    ("%n = f32[4]{0} negate(%p)", "%n = f32[4]{0} negate(%p), foo=1", "unknown attribute 'foo'",
     "foo="),
    ("%n = f32[4]{0} negate(%p)", "%n = f32[4]{0} negate(%p), dimensions={0}",
     "not allowed for opcode negate", "dimensions="),
    ("%n = f32[4]{0} negate(%p)", "%n = f32[4]{0} negate(%p, %p)", "expects 1 operands", "negate("),
    ("%n = f32[4]{0} negate(%p)", "%n = f32[4]{0} reduce(%p, %p)",
     "attribute to_apply is expected but not seen", "reduce("),
    ("%n = f32[4]{0} negate(%p)", "%n = f32[4]{0} call(%p), to_apply=%nope",
     "unknown computation 'nope'", "%nope"),
    ("%n = f32[4]{0} negate(%p)", "%n = iota(), iota_dimension=0",
     "cannot infer the result shape of 'n'", "iota("),
    ("%n = f32[4]{0} negate(%p)", "%n = f32[4]{0} negate(f32[5] %p)", "not compatible", "%p)"),
    ("%p = f32[4]{0} parameter(0)", "%p = f32[4]{0} parameter(1)", "parameter numbers", "%main"),
    ("%n = f32[4]{0} negate(%p)", "%f32 = f32[4]{0} negate(%p)", "illegal instruction name",
     "%f32"),
    ("%n = f32[4]{0} negate(%p)", "%n = f32[4]{0} negate(%p), metadata={op_name=1}",
     "expected string", "1}"),
    ("%n = f32[4]{0} negate(%p)", "%n = f32[4]{0} negate(%p), metadata={op_name=\"x\"",
     "expects metadata attribute name", "\n  ROOT"),
    ("%n = f32[4]{0} negate(%p)", "%n = f32[4]{0} constant({1, 2, 3})", "expects 4 elements",
     "})"),
    ("%n = f32[4]{0} negate(%p)", "%n = s8[2]{0} constant({1, 300})", "out of range", "300"),
    ("%n = f32[4]{0} negate(%p)", "%n = f32[4]{0} negate(%p), metadata={op_name=\"x\\q\"}",
     "bad escape", "\"x"),
])
def test_error_locations(old: str, new: str, message: str, at: str) -> None:
    """ParseError names the problem and the 1-based line:column of the offending token."""
    assert old in BASE
    text = BASE.replace(old, new, 1)
    pos = text.index(at, text.index(new) if at not in ("%main",) else 0)
    if at.startswith("\n"):
        pos += len(at) - len(at.lstrip("\n "))
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    err = _error(text)
    assert message in err.message
    assert " at character " not in err.message  # the sharding parser's offset became line:col
    assert (err.line, err.column) == (line, column), err
    assert str(err).startswith(f"t.hlo:{line}:{column}: ")


_CONV = """HloModule c
ENTRY e {
  x = f32[1,8,8,3] parameter(0)
  k = f32[3,3,3,4] parameter(1)
  ROOT cv = f32[1,8,8,4] convolution(x, k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, CONFIG
}
"""


@pytest.mark.parametrize("config, message, at", [
    ("sparsity_config={lhs={bogus=1}}", "expects sparsity, dimension, stride or idx", "bogus"),
    ("sparsity_config={mid={sparsity=1x2}}", "expects lhs= or rhs=", "mid"),
    ("sparsity_config={lhs={sparsity=12}}", "expects sparsity like 1x2", "12}"),
    ("sparsity_config={lhs={sparsity=1x2},rhs={}}", "expects lhs= or rhs=", ",rhs"),
    ("convolution_kind=sideways", "expects convolution kind but sees: sideways", "sideways"),
    ("conv_kind=fprop", "unknown attribute 'conv_kind'", "conv_kind"),
])
def test_convolution_attribute_errors(config: str, message: str, at: str) -> None:
    text = _CONV.replace("CONFIG", config)
    err = _error(text)
    pos = text.index(at)
    assert message in err.message
    assert (err.line, err.column) == (5, pos - text.rfind("\n", 0, pos)), err


def test_more_errors() -> None:
    assert "expected at least one computation" in _error("HloModule m\n").message
    err = _error(BASE + "\n%main (q: f32[]) -> f32[] {\n  ROOT %q = f32[] parameter(0)\n}\n")
    assert "computation 'main' already exists" in err.message and err.line == 9
    err = _error(BASE.replace("ROOT %r", "ROOT %r2 = f32[4]{0} copy(%p)\n  ROOT %r"))
    assert "only one ROOT" in err.message
    err = _error(BASE.replace("(p: f32[4]) -> f32[4]", "(p: f32[4]) -> f32[5]"))
    assert "not compatible with that of its root" in err.message
    err = _error(BASE.replace("ENTRY", "ENTRY") + "ENTRY %x () -> f32[] {\n"
                 "  ROOT %c = f32[] constant(1)\n}\n")
    assert "only one ENTRY" in err.message
    err = _error("HloModule m, bogus=1\nENTRY e {\n ROOT c = f32[] constant(1)\n}\n")
    assert "unexpected module attribute" in err.message and (err.line, err.column) == (1, 14)
    err = _error("HloModule m\nENTRY e {\n ROOT c = f32[] constant(1) /* unterminated\n}\n")
    assert "unterminated" in err.message


# -- speed ---------------------------------------------------------------------------------------------
def _big_module_text(n_layers: int) -> str:
    lines = ["HloModule big", "", "%add (x: f32[], y: f32[]) -> f32[] {",
             "  %x = f32[] parameter(0)", "  %y = f32[] parameter(1)",
             "  ROOT %s = f32[] add(%x, %y)", "}", "",
             "ENTRY %main (a: f32[8,64], w: f32[64,64]) -> f32[8] {",
             '  %a = f32[8,64]{1,0} parameter(0), metadata={op_name="a"}',
             '  %w = f32[64,64]{1,0} parameter(1), metadata={op_name="w"}',
             "  %one = f32[] constant(1)"]
    prev = "%a"
    for i in range(n_layers):
        lines += [
            f"  %dot.{i} = f32[8,64]{{1,0}} dot({prev}, %w), lhs_contracting_dims={{1}}, "
            f'rhs_contracting_dims={{0}}, metadata={{op_name="jit(f)/dot_general" stack_frame_id=3}}',
            f"  %b.{i} = f32[8,64]{{1,0}} broadcast(%one), dimensions={{}}",
            f'  %add.{i} = f32[8,64]{{1,0}} add(%dot.{i}, %b.{i}), metadata={{op_name="jit(f)/add"}}',
            f'  %tanh.{i} = f32[8,64]{{1,0}} tanh(%add.{i}), metadata={{op_name="jit(f)/tanh"}}',
            f"  %mul.{i} = f32[8,64]{{1,0}} multiply(%tanh.{i}, %add.{i}), "
            f"sharding={{devices=[2,1,4]<=[8] last_tile_dim_replicate}}"]
        prev = f"%mul.{i}"
    lines += [f"  ROOT %r = f32[8]{{0}} reduce({prev}, %one), dimensions={{1}}, to_apply=%add",
              "}", ""]
    return "\n".join(lines)


def test_parse_large_module() -> None:
    """A 10k-instruction module parses and re-parses; the rate is printed, never asserted
    (speed is measured in benchmarks/)."""
    text = _big_module_text(2000)
    t0 = time.perf_counter()
    module = parse_module(text)
    elapsed = time.perf_counter() - t0
    n = module.instruction_count()
    assert n == 2000 * 5 + 7
    rate = n / elapsed
    print(f"\nparsed {n} instructions ({text.count(chr(10))} lines) in {elapsed:.3f}s: "
          f"{rate:,.0f} instructions/s")
    t0 = time.perf_counter()
    printed = print_module(module)
    print(f"printed in {time.perf_counter() - t0:.3f}s")
    assert parse_module(printed).instruction_count() == n


def test_instruction_named_tuple_is_accepted() -> None:
    """XLA rejects primitive-type names (f32, pred, token) as instruction names but accepts
    "tuple", which XLA's own tests use."""
    text = """HloModule m
ENTRY e {
  p = f32[2] parameter(0)
  ROOT tuple = (f32[2]) tuple(p)
}
"""
    module = parse_module(text)
    assert module.entry.root.name == "tuple"

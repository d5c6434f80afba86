"""HLO text printer against jaxlib's printer.

For modules lowered with jax, the checked-in fixtures and a hand-written corpus (each
loaded from a jaxlib proto): ``print_module(module_from_proto(pb))`` must equal what
jaxlib prints for ``pb``, and jaxlib must accept our text and print it back the same way
it prints its own text.
"""
from __future__ import annotations

import numpy as np
import pytest

from test_text_cases import (_CASE_NAMES, CORPUS, canon, fixture_id, fixture_protos,
                             hlo_ext, jax_module, jax_print_proto, jax_print_text,
                             jax_text_to_proto)

from hlo_spmd.ir import Instruction, Shape
from hlo_spmd.ir.primitive_types import PrimitiveType as P
from hlo_spmd.ir.proto_io import module_from_proto, module_to_proto
from hlo_spmd.ir.text_parser import parse_module
from hlo_spmd.ir.text_printer import print_instruction, print_module
from hlo_spmd.proto import hlo_pb2


def _proto(pb: bytes) -> hlo_pb2.HloModuleProto:
    p = hlo_pb2.HloModuleProto()
    p.ParseFromString(pb)
    return p


def _check_against_jaxlib(pb: bytes) -> None:
    module = module_from_proto(_proto(pb))
    ours = print_module(module)
    theirs = jax_print_proto(pb)
    assert ours == theirs
    # jaxlib accepts our text, and its text round trip of ours equals that of its own.
    assert canon(jax_print_text(ours)) == canon(jax_print_text(theirs))


@pytest.mark.parametrize("name", _CASE_NAMES)
def test_jax_module_prints_like_jaxlib(name: str) -> None:
    hlo_ext()
    _check_against_jaxlib(jax_module(name))


@pytest.mark.parametrize("path", fixture_protos(), ids=fixture_id)
def test_fixture_prints_like_jaxlib(path) -> None:
    hlo_ext()
    _check_against_jaxlib(path.read_bytes())


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_prints_like_jaxlib(name: str) -> None:
    """Every opcode / attribute: jaxlib parses the corpus text to a proto; we print that."""
    hlo_ext()
    _check_against_jaxlib(jax_text_to_proto(CORPUS[name]))


def _jax_print(pb: bytes, **options) -> str:
    h = hlo_ext()
    opts = h.HloPrintOptions()
    for k, v in options.items():
        setattr(opts, k, v)
    return h.HloModule.from_serialized_hlo_module_proto(pb).to_string(opts)


@pytest.mark.parametrize("name", ["constants", "constants_x64", "shape_ops", "corpus:constants",
                                  "corpus:layouts"])
def test_small_constants_option(name: str) -> None:
    """print_large_constants=False elides constants of more than 10 elements (and tuple
    constants) like XLA."""
    hlo_ext()
    pb = jax_text_to_proto(CORPUS[name[7:]]) if name.startswith("corpus:") else jax_module(name)
    ours = print_module(module_from_proto(_proto(pb)), print_large_constants=False)
    assert ours == _jax_print(pb, print_large_constants=False)
    if name == "corpus:constants":
        assert ours.count("constant({...})") == 2


@pytest.mark.parametrize("name", ["dot", "while", "sharding_constraint_gspmd",
                                  "shard_map_psum_gather_shardy"])
def test_no_metadata_option(name: str) -> None:
    pb = jax_module(name)
    ours = print_module(module_from_proto(_proto(pb)), print_metadata=False)
    assert ours == _jax_print(pb, print_metadata=False, print_large_constants=True)
    assert "metadata=" not in ours and "FileNames" not in ours


def test_only_filter() -> None:
    module = parse_module(CORPUS["control_flow"])
    text = print_module(module, only={"w", "wv"})
    lines = [line for line in text.splitlines() if " = " in line]
    assert [line.split()[0] for line in lines] == ["%w", "%wv"]
    text = print_module(module, only=lambda i: i.opcode == "conditional")
    assert text.count("conditional(") == 2 and "while(" not in text
    assert "ENTRY %main" in text and "%body" not in text


def test_header_config_and_aliasing() -> None:
    module = parse_module(CORPUS["generic_attrs"])
    text = print_module(module, config={"num_partitions": 4, "replica_count": 2,
                                        "allow_spmd_sharding_propagation_to_output": [True]})
    head = text.splitlines()[0]
    assert head.startswith("HloModule generic_attrs, input_output_alias={ {0}: (0, {}, may-alias),"
                           " {1}: (1, {}, must-alias) }, buffer_donor={ (2, {}) }, "
                           "entry_computation_layout={")
    assert head.endswith(", allow_spmd_sharding_propagation_to_output={true}, replica_count=2, "
                         "num_partitions=4, frontend_attributes={attr_a=\"x\",attr_b={\"json\": 1}}")
    hlo_ext()
    assert jax_print_text(text).splitlines()[0] == head


def test_print_after_ir_edits_is_valid_hlo() -> None:
    """Instructions created by passes (no source protos, fresh ids) print as valid text."""
    module = parse_module(CORPUS["elementwise"])
    entry = module.entry
    a = entry.find("a")
    shape = Shape.array(P.F32, [4])
    neg = Instruction("negate", shape, [a])
    entry.add(neg, "extra_negate")
    attrs = hlo_pb2.HloInstructionProto()
    attrs.comparison_direction = "LT"
    cmp = Instruction("compare", Shape.array(P.PRED, [4]), [neg, a], attrs=attrs)
    entry.add(cmp, "extra_cmp")
    old_root = entry.root
    tup = Instruction("tuple", Shape.tuple_of([old_root.shape, cmp.shape]), [old_root, cmp])
    entry.add(tup, "new_root")
    entry.root = tup
    assert print_instruction(cmp) == "%extra_cmp = pred[4]{0} compare(%extra_negate, %a), direction=LT"
    text = print_module(module)
    assert "ROOT %new_root" in text
    hlo_ext()
    again = jax_print_text(text)
    assert canon(again) == canon(print_module(parse_module(text)))
    # and the proto of the edited module is accepted too
    assert jax_print_proto(module_to_proto(module).SerializeToString())


def test_schedule_order_is_printed() -> None:
    module = parse_module(CORPUS["control_flow"])
    text = print_module(module)
    assert text.startswith("HloModule control_flow, is_scheduled=true")
    hlo_ext()
    assert canon(jax_print_text(CORPUS["control_flow"])) == canon(text)


def test_shapes_and_layouts() -> None:
    from hlo_spmd.ir.text_shapes import format_shape, shape_from_text

    for text in ["f32[8,128]{1,0:T(8,128)(2,1)S(1)}", "s4[16]{0:E(4)}", "f32[<=8,?]{1,0}",
                 "(f32[], (s32[2]{0}, token[]), u8[0]{0})", "f32[]{:S(2)}", "pred[]",
                 "(f32[], f32[], f32[], f32[], f32[], /*index=5*/f32[])",
                 "bf16[2,3]{0,1:T(2,1)L(4)E(16)SC(0:1,2)M(8)}", "f32[4]{0:T(*,2)}"]:
        s = shape_from_text(text)
        assert format_shape(s) == text
    assert format_shape(shape_from_text("f32[2,3]")) == "f32[2,3]{1,0}"
    assert format_shape(shape_from_text("f32[2,3]{0,1}"), layout=False) == "f32[2,3]"


def test_large_constant_printing_is_fast_enough() -> None:

    from hlo_spmd.ir.literal import numpy_to_literal

    module = parse_module("HloModule m\nENTRY e {\n  ROOT c = f32[100000]{0} constant({...})\n}\n")
    c = module.entry.root
    c.attrs.literal.CopyFrom(numpy_to_literal(np.linspace(0, 1, 100000, dtype=np.float32)))
    text = print_module(module)
    assert text.count(",") >= 99999

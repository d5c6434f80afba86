"""The memo of shape inference (``shape_inference.InferenceMemo``, used by the verifier):
each opcode it remembers reads only the attribute fields ``RULE_ATTRIBUTES`` lists, so
its key is complete; it gives the results of ``infer_shape``; bad input still fails."""
from __future__ import annotations

from pathlib import Path

import pytest

from hlo_spmd.errors import VerifierError
from hlo_spmd.ir.io import load_module
from hlo_spmd.ir.primitive_types import PrimitiveType as PT
from hlo_spmd.ir.shape_inference import (ELEMENTWISE, RULE_ATTRIBUTES, InferenceMemo,
                                         array_shape, infer_shape)
from hlo_spmd.ir.verifier import verify_module
from hlo_spmd.proto import hlo_pb2

ROOT = Path(__file__).resolve().parent.parent
MODULES = sorted((ROOT / "fixtures" / "hlo").glob("*.pb")) + \
    sorted((ROOT / "fixtures" / "hlo" / "handwritten").glob("*.hlo"))


class _OnlyFields:
    """An attrs stand-in that fails on any field outside ``allowed``."""

    def __init__(self, real: hlo_pb2.HloInstructionProto, allowed: tuple[str, ...]) -> None:
        self._real = real
        self._allowed = allowed

    def _check(self, name: str) -> None:
        if name not in self._allowed:
            raise AssertionError(f"the rule read attribute {name!r}, not in RULE_ATTRIBUTES")

    def __getattr__(self, name: str):
        self._check(name)
        return getattr(self._real, name)

    def HasField(self, name: str) -> bool:  # noqa: N802 (protobuf's name)
        self._check(name)
        return self._real.HasField(name)


def _instructions():
    for path in MODULES:
        module = load_module(path)
        for inst in module.instructions():
            if inst.opcode in RULE_ATTRIBUTES:
                yield path.stem, module, inst


def test_the_fixtures_cover_most_memoised_opcodes():
    seen = {inst.opcode for _, _, inst in _instructions()}
    assert len(seen) >= len(RULE_ATTRIBUTES) - 3, sorted(set(RULE_ATTRIBUTES) - seen)


def test_memoised_rules_read_only_the_listed_fields():
    checked = 0
    for name, _, inst in _instructions():
        shapes = [o.shape for o in inst.operands]
        proxy = _OnlyFields(inst.attrs, RULE_ATTRIBUTES[inst.opcode])
        got = infer_shape(inst.opcode, shapes, proxy, inst.called_computations, inst.shape)
        want = infer_shape(inst.opcode, shapes, inst.attrs, inst.called_computations, inst.shape)
        assert got == want, (name, inst.name)
        checked += 1
    assert checked > 1000


def test_memo_gives_the_rules_results():
    memo = InferenceMemo()
    for name, _, inst in _instructions():
        shapes = [o.shape for o in inst.operands]
        got = memo.infer(inst.opcode, shapes, inst.attrs, inst.called_computations, inst.shape,
                         lambda: "here")
        want = infer_shape(inst.opcode, shapes, inst.attrs, inst.called_computations, inst.shape)
        assert got == want, (name, inst.name)


def _broadcast_attrs(dims: list[int]) -> hlo_pb2.HloInstructionProto:
    attrs = hlo_pb2.HloInstructionProto()
    attrs.dimensions.extend(dims)
    attrs.metadata.op_name = "jit(f)/broadcast"  # not read: not part of the key
    return attrs


def test_a_bad_instruction_after_a_good_one_of_the_same_shapes_still_fails():
    memo = InferenceMemo()
    x = array_shape(PT.F32, (4,))
    out = array_shape(PT.F32, (4, 4))
    assert memo.infer("broadcast", [x], _broadcast_attrs([1]), (), out, "a") is not None
    assert memo.infer("broadcast", [x], _broadcast_attrs([0]), (), out, "b") is not None
    with pytest.raises(VerifierError, match="out of range") as e:
        memo.infer("broadcast", [x], _broadcast_attrs([2]), (), out, lambda: "where c")
    assert e.value.where == "where c"
    bad = array_shape(PT.F32, (4, 5))
    with pytest.raises(VerifierError, match="must equal result dim"):
        memo.infer("broadcast", [x], _broadcast_attrs([1]), (), bad, "d")


def test_the_verifier_still_names_a_bad_copy_of_a_verified_instruction():
    from hlo_spmd.ir.instruction import Instruction

    module = load_module(MODULES[0])
    verify_module(module)
    good = next(i for i in module.instructions()
                if i.opcode == "broadcast" and i.operands and i.operands[0].shape.rank)
    comp = good.parent
    # A twin of a verified broadcast (same operand and shape) with a wrong dimension.
    attrs = hlo_pb2.HloInstructionProto()
    attrs.CopyFrom(good.attrs)
    del attrs.dimensions[:]
    attrs.dimensions.extend([good.shape.rank + 3] * good.operands[0].shape.rank)
    bad = Instruction("broadcast", good.shape, list(good.operands), good.name + ".bad", attrs)
    bad.parent = comp
    bad.id = max(i.id for i in module.instructions()) + 1
    comp.instructions.insert(comp.instructions.index(good) + 1, bad)
    with pytest.raises(VerifierError, match="out of range") as e:
        verify_module(module)
    assert f"instruction {bad.name}" in str(e.value)


def _elementwise_cases():
    """Every elementwise opcode on operands of each element type (its rule accepts some,
    rejects others), with a declared shape that matches or not."""
    from hlo_spmd.ir.shape_inference import _BINARY

    types = (PT.F32, PT.S32, PT.PRED, PT.C64, PT.U8)
    for opcode in sorted(ELEMENTWISE):
        n = 2 if opcode in _BINARY else 1
        for et in types:
            x = array_shape(et, (4, 2))
            yield opcode, [x] * n, x
        yield opcode, [array_shape(PT.F32, (4, 2)), array_shape(PT.F32, (2, 4))][:n], None


def test_elementwise_rules_read_no_attribute_callee_or_declared_shape():
    for opcode, shapes, declared in _elementwise_cases():
        proxy = _OnlyFields(hlo_pb2.HloInstructionProto(), ())
        try:
            want = infer_shape(opcode, shapes, hlo_pb2.HloInstructionProto(), (), declared)
        except VerifierError as e:
            with pytest.raises(VerifierError) as got:
                infer_shape(opcode, shapes, proxy, (), None)
            assert got.value.message == e.message
            continue
        assert infer_shape(opcode, shapes, proxy, (), None) == want, opcode


def test_the_elementwise_memo_gives_the_rules_results_and_failures():
    memo = InferenceMemo()
    for _ in range(2):  # the second round answers from the memo (or fails again)
        for opcode, shapes, declared in _elementwise_cases():
            attrs = hlo_pb2.HloInstructionProto()
            try:
                want = infer_shape(opcode, shapes, attrs, (), declared)
            except VerifierError as e:
                with pytest.raises(VerifierError) as got:
                    memo.infer(opcode, shapes, attrs, (), declared, lambda: "here")
                assert got.value.message == e.message and got.value.where == "here"
                continue
            assert memo.infer(opcode, shapes, attrs, (), declared, "here") == want, opcode

"""The module verifier (hlo_spmd.ir.verifier): every rule has a failing case, and every
module JAX / XLA produce (the project's fixtures included) passes."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_shape_inference as tsi  # noqa: E402  (sets up N host devices before jax)

from hlo_spmd.errors import VerifierError  # noqa: E402
from hlo_spmd.ir.builder import IotaGroups, set_replica_groups  # noqa: E402
from hlo_spmd.ir.computation import Computation  # noqa: E402
from hlo_spmd.ir.primitive_types import PrimitiveType as PT  # noqa: E402
from hlo_spmd.ir.proto_io import module_from_proto  # noqa: E402
from hlo_spmd.ir.shape import Layout, Shape  # noqa: E402
from hlo_spmd.ir.shape_inference import array_shape  # noqa: E402
from hlo_spmd.ir.verifier import verify_module  # noqa: E402
from hlo_spmd.proto import hlo_pb2  # noqa: E402

F32, S32 = PT.F32, PT.S32
ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "hlo"


# -- valid modules pass --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", tsi.PROGRAM_IDS)
def test_jax_modules_verify(name):
    _, f, arg = tsi.program(name)
    verify_module(tsi.lower(f, arg))


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.pb")), ids=lambda p: p.stem)
def test_fixture_protos_verify(path):
    from hlo_spmd.ir.io import load_module

    verify_module(load_module(path))


@pytest.mark.parametrize("path", sorted((FIXTURES / "handwritten").glob("*.hlo")),
                         ids=lambda p: p.stem)
def test_handwritten_fixtures_verify(path):
    tsi.jax_or_skip()
    from jaxlib import _hlo

    data = _hlo.hlo_module_from_text(path.read_text()).as_serialized_hlo_module_proto()
    verify_module(module_from_proto(hlo_pb2.HloModuleProto.FromString(data)))


def _valid():
    """entry: params, add, reduce(add.f32), while(body, cond), tuple root."""
    module, b = tsi.new_module("valid")
    state = array_shape(F32, (3,))
    body = b.new_computation("body")
    body.set_root(body.negate(body.parameter(0, state)))
    cond = b.new_computation("cond")
    q = cond.parameter(0, state)
    cond.set_root(cond.compare(cond.reduce(q, 0.0, [0], "add"), cond.constant(0.0), "LT"))
    x = b.parameter(0, state)
    y = b.parameter(1, state)
    s = b.add(x, y)
    r = b.reduce(s, 0.0, [0], "add")
    w = b.while_loop(cond.computation, body.computation, s)
    b.set_root(b.tuple([r, w]))
    verify_module(module)
    return module, b, dict(x=x, y=y, s=s, r=r, w=w, body=body.computation, cond=cond.computation)


def _fails(module, match, **kw):
    with pytest.raises(VerifierError, match=match) as info:
        verify_module(module, **kw)
    return info.value


# -- module level --------------------------------------------------------------------------------------
def test_missing_entry():
    module, _, _ = _valid()
    module.entry = None
    _fails(module, "no entry computation")


def test_entry_not_in_module():
    module, _, _ = _valid()
    module.entry = Computation("elsewhere")
    _fails(module, "not in the module")


def test_duplicate_computation_name():
    module, _, refs = _valid()
    refs["body"].name = refs["cond"].name
    _fails(module, "duplicate computation name")


def test_duplicate_computation_id():
    module, _, refs = _valid()
    refs["body"].id = refs["cond"].id
    _fails(module, "duplicate computation id")


def test_computation_listed_twice():
    module, _, refs = _valid()
    module.computations.insert(0, refs["body"])
    _fails(module, "listed twice")


# -- names, ids, membership ----------------------------------------------------------------------------
def test_duplicate_instruction_name_across_computations():
    module, _, refs = _valid()
    refs["s"].name = refs["body"].root.name
    err = _fails(module, "duplicate instruction name")
    assert "computation main" in err.where


def test_duplicate_instruction_id():
    module, _, refs = _valid()
    refs["s"].id = refs["x"].id
    err = _fails(module, "duplicate instruction id")
    assert err.where == f"computation main, instruction {refs['s'].name}"


def test_instruction_listed_twice():
    module, _, refs = _valid()
    module.entry.instructions.append(refs["s"])
    _fails(module, "appears twice")


def test_parent_mismatch():
    module, _, refs = _valid()
    refs["s"].parent = refs["body"]
    _fails(module, "parent is body")


# -- operands and order ----------------------------------------------------------------------------------
def test_operand_from_another_computation():
    module, _, refs = _valid()
    refs["s"].operands[1] = refs["body"].root
    err = _fails(module, "is not an instruction of this computation")
    assert refs["s"].name in err.where


def test_operand_used_before_definition():
    module, _, refs = _valid()
    insts = module.entry.instructions
    insts.remove(refs["x"])
    insts.append(refs["x"])
    _fails(module, "used before it is defined")


def test_undefined_control_predecessor():
    module, _, refs = _valid()
    refs["x"].control_predecessors.append(refs["r"])
    _fails(module, "control predecessor")


def test_root_missing_or_foreign():
    module, _, refs = _valid()
    module.entry.root = None
    _fails(module, "has no root")
    module.entry.root = refs["body"].root
    _fails(module, "is not an instruction of the computation")


def test_empty_computation():
    module, b, _ = _valid()
    b.new_computation("empty")
    _fails(module, "has no instructions")


# -- parameters ---------------------------------------------------------------------------------------------
def test_parameter_numbers_contiguous():
    module, _, refs = _valid()
    refs["y"].attrs.parameter_number = 2
    _fails(module, r"parameter numbers \[0, 2\] are not 0..1")


def test_parameter_number_twice():
    module, _, refs = _valid()
    refs["y"].attrs.parameter_number = 0
    _fails(module, "parameter number 0 is used twice")


def test_a_negative_parameter_number_is_the_rules_error():
    module, _, refs = _valid()
    refs["y"].attrs.parameter_number = -1
    e = _fails(module, "parameter: negative parameter number -1")
    assert "instruction " + refs["y"].name in str(e)


def test_a_parameter_with_an_operand_is_an_error():
    module, _, refs = _valid()
    refs["y"].operands = [refs["x"]]
    e = _fails(module, r"parameter takes 0 operand\(s\), has 1")
    assert "instruction " + refs["y"].name in str(e)


def test_a_valid_parameter_is_still_checked_without_its_rule():
    from hlo_spmd.ir.shape_inference import infer_shape, parameter_is_valid

    module, _, refs = _valid()
    p = refs["y"]
    assert parameter_is_valid(0, p.attrs.parameter_number)
    assert infer_shape("parameter", [], p.attrs, (), p.shape) is p.shape  # what it skips
    p.attrs.parameter_number = -2
    assert not parameter_is_valid(0, -2) and not parameter_is_valid(1, 0)


# -- opcodes and arity ------------------------------------------------------------------------------------
def test_unknown_opcode():
    module, _, refs = _valid()
    refs["s"].opcode = "frobnicate"
    _fails(module, "unknown opcode 'frobnicate'")


def test_non_xla_spelling_is_unknown():
    """The builder translates ``cos`` to ``cosine``; a raw ``cos`` would not load in XLA."""
    module, b, refs = _valid()
    c = b.cos(refs["x"])
    assert c.opcode == "cosine"
    verify_module(module)
    c.opcode = "cos"
    _fails(module, "unknown opcode 'cos'")


def test_bad_arity():
    module, _, refs = _valid()
    refs["s"].operands.append(refs["x"])
    _fails(module, r"add takes 2 operand\(s\), has 3")


def test_bad_arity_xla_spelling():
    module, b, refs = _valid()
    neg = b.cosine(refs["x"])
    neg.operands.append(refs["y"])
    _fails(module, r"cosine takes 1 operand")


# -- called computations ------------------------------------------------------------------------------------
def test_missing_callee():
    module, _, refs = _valid()
    module.computations.remove(refs["body"])
    _fails(module, "called computation body is not in the module")


def test_callee_after_caller():
    module, _, refs = _valid()
    module.computations.remove(refs["body"])
    module.computations.append(refs["body"])
    _fails(module, "comes after its caller")
    verify_module(module, check_computation_order=False)
    module.sort_computations()
    verify_module(module)


def test_calls_own_computation():
    module, b, refs = _valid()
    inst = b.call(refs["body"], [refs["x"]])
    inst.called_computations = [module.entry]
    _fails(module, "calls its own computation")


def test_non_caller_with_callee():
    module, _, refs = _valid()
    refs["s"].called_computations = [refs["body"]]
    _fails(module, "does not call computations")


def test_wrong_callee_count():
    module, _, refs = _valid()
    refs["w"].called_computations = [refs["body"]]
    _fails(module, r"while calls 2 computation\(s\), has 1")


def test_while_signature_mismatch():
    module, _, refs = _valid()
    refs["w"].called_computations = [refs["body"], refs["body"]]
    _fails(module, "must return pred")


def test_reduce_callee_arity():
    module, _, refs = _valid()
    refs["r"].called_computations = [refs["body"]]
    _fails(module, "must take 2 parameters")


def test_conditional_branch_mismatch():
    module, b, refs = _valid()
    other = b.new_computation("other")
    other.set_root(other.convert(other.parameter(0, array_shape(F32, (3,))), S32))
    c = b.conditional(b.constant(True), [refs["body"], refs["body"]], [refs["x"], refs["y"]])
    verify_module(module, check_shapes=True)
    c.called_computations = [refs["body"], other.computation]
    _fails(module, "branch results differ")


# -- shapes --------------------------------------------------------------------------------------------------
def test_wrong_shape():
    module, _, refs = _valid()
    refs["s"].shape = array_shape(F32, (4,))
    err = _fails(module, r"shape f32\[4\] does not match the inferred f32\[3\]")
    assert err.where == f"computation main, instruction {refs['s'].name}"
    verify_module(module, check_shapes=False)


def test_wrong_element_type():
    module, _, refs = _valid()
    refs["r"].shape = array_shape(S32, ())
    _fails(module, "does not match the inferred f32")


def test_layout_is_ignored():
    module, _, refs = _valid()
    refs["s"].shape = Shape(F32, (3,), (), Layout((0,), memory_space=1))
    verify_module(module)


def test_negative_dimension():
    module, _, refs = _valid()
    refs["x"].shape = Shape(F32, (-1,), (), None)
    _fails(module, "negative dimension")


def test_layout_rank_mismatch():
    module, _, refs = _valid()
    refs["x"].shape = Shape(F32, (3,), (), Layout((1, 0)))
    _fails(module, "layout with 2 entries for rank 1")


def test_bad_attribute_is_reported():
    module, b, refs = _valid()
    t = b.transpose(b.reshape(refs["x"], (3, 1)), [1, 0])
    t.attrs.ClearField("dimensions")
    t.attrs.dimensions.extend([0, 0])
    _fails(module, "not a permutation")


def test_bad_collective_groups():
    module, b, refs = _valid()
    ar = b.all_reduce(refs["x"], "add", IotaGroups(2, 4))
    verify_module(module)
    set_replica_groups(ar.attrs, [[0, 1], [1, 2]])
    _fails(module, "device 1 appears twice")
    set_replica_groups(ar.attrs, [[0, 1], [3, 4]])
    _fails(module, "exactly once")
    set_replica_groups(ar.attrs, None)
    _fails(module, "replica groups must be given")
    ag = b.all_gather(refs["x"], 0, [[0, 1], [2, 3]])
    set_replica_groups(ar.attrs, IotaGroups(1, 4))
    verify_module(module)
    set_replica_groups(ag.attrs, [[0, 1, 2], [3]])
    _fails(module, "same size")


def test_bad_source_target_pairs():
    module, b, refs = _valid()
    cp = b.collective_permute(refs["x"], [(0, 1), (1, 0)])
    verify_module(module)
    cp.attrs.source_target_pairs.add(source=0, target=2)
    _fails(module, "appears twice")


# -- shardings ------------------------------------------------------------------------------------------------
def test_bad_sharding_rank():
    from hlo_spmd.sharding import HloSharding

    module, _, refs = _valid()
    refs["x"].sharding = HloSharding.iota_tile([2, 1, 1])
    err = _fails(module, "invalid sharding")
    assert refs["x"].name in err.where
    refs["x"].sharding = HloSharding.iota_tile([2])
    verify_module(module)
    _fails(module, "devices", num_devices=4)
    verify_module(module, check_shardings=False, num_devices=4)


def test_tuple_sharding_on_array():
    from hlo_spmd.sharding import HloSharding

    module, _, refs = _valid()
    refs["s"].sharding = HloSharding.tuple([HloSharding.replicate(), HloSharding.replicate()])
    _fails(module, "invalid sharding")
    refs["s"].sharding = None
    refs["w"].sharding = HloSharding.replicate()
    verify_module(module)


# -- size ----------------------------------------------------------------------------------------------------
def test_large_module_verifies():
    """A 20k-instruction chain (timing is measured in benchmarks, not asserted here)."""
    module, b = tsi.new_module("large")
    x = b.parameter(0, array_shape(F32, (16, 32)))
    w = b.parameter(1, array_shape(F32, (32, 32)))
    cur = x
    while len(module.entry.instructions) < 20_000:
        y = b.tanh(b.add(b.dot(cur, w, lhs_contracting=[1], rhs_contracting=[0]), cur))
        s = b.broadcast(b.reduce(y, 0.0, [1], "add"), (16, 32), [0])
        cur = b.maximum(b.all_reduce(b.multiply(y, s), "add", IotaGroups(2, 4, (4, 2), (1, 0))), y)
    b.set_root(cur)
    verify_module(module)
    assert module.instruction_count() >= 20_000

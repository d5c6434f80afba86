"""The shortcuts the load / verify / save path takes keep their answers and their errors:
the verifier's whole-computation name and id check (same first error as the one-by-one
test), the written-out Shape / Layout classes (dataclass behaviour), a tuple OpSharding's
shared elements, the literal-shape and iota-group memos of shape inference."""
from __future__ import annotations

import copy
import pickle

import pytest

from hlo_spmd.errors import HloSpmdError, VerifierError
from hlo_spmd.ir.builder import Builder, IotaGroups, set_replica_groups
from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.module import Module
from hlo_spmd.ir.primitive_types import PrimitiveType as PT
from hlo_spmd.ir.shape import Layout, Shape
from hlo_spmd.records import FrozenInstanceError
from hlo_spmd.ir.shape_inference import array_shape, infer_shape
from hlo_spmd.ir.verifier import verify_module
from hlo_spmd.proto import hlo_pb2, xla_data_pb2
from hlo_spmd.sharding import HloSharding, from_proto, to_proto


def _module(n: int = 4) -> tuple[Module, list[Instruction]]:
    """entry: p0, then n-1 negates in a chain (root the last)."""
    m = Module("m")
    comp = m.add_computation(Computation("main"))
    m.entry = comp
    b = Builder(comp)
    x = b.parameter(0, array_shape(PT.F32, (4,)))
    insts = [x]
    for _ in range(n - 1):
        insts.append(b.op("negate", [insts[-1]]))
    b.set_root(insts[-1])
    verify_module(m)
    return m, insts


# -- verifier: names and ids --------------------------------------------------------------------
def test_duplicate_name_in_one_computation_names_the_second():
    m, insts = _module()
    insts[2].name = insts[1].name
    with pytest.raises(VerifierError, match="duplicate instruction name") as e:
        verify_module(m)
    assert e.value.where == f"computation main, instruction {insts[2].name}"


def test_an_earlier_problem_is_still_reported_first():
    m, insts = _module(5)
    insts[1].opcode = "no-such-op"      # an earlier instruction fails first ...
    insts[3].name = insts[0].name       # ... before this later duplicate
    with pytest.raises(VerifierError, match="unknown opcode"):
        verify_module(m)
    m, insts = _module(5)
    insts[3].id = insts[0].id
    insts[4].opcode = "no-such-op"      # the duplicate id comes first here
    with pytest.raises(VerifierError, match="duplicate instruction id"):
        verify_module(m)


def test_a_shape_error_names_its_own_instruction():
    m, insts = _module(4)
    insts[2].shape = array_shape(PT.F32, (5,))  # negate of f32[4] declared f32[5]
    with pytest.raises(VerifierError, match="does not match") as e:
        verify_module(m)
    assert e.value.where == f"computation main, instruction {insts[2].name}"


# -- Shape / Layout -------------------------------------------------------------------------------
def test_shape_and_layout_behave_as_frozen_dataclasses():
    lay = Layout((1, 0))
    s = Shape(PT.F32, (2, 3), (), lay, (), source_proto="proto")
    same = Shape(PT.F32, (2, 3), (), Layout((1, 0)))
    assert s == same and hash(s) == hash(same)  # source_proto is outside the value
    assert hash(s) == hash((PT.F32, (2, 3), (), lay, ()))
    assert hash(lay) == hash(((1, 0), (), 0, 0))
    assert s != Shape(PT.F32, (2, 4), (), lay) and s != (PT.F32, (2, 3))
    assert repr(lay) == ("Layout(minor_to_major=(1, 0), tiles=(), element_size_in_bits=0, "
                         "memory_space=0)")
    assert repr(s) == (f"Shape(element_type={PT.F32!r}, dims=(2, 3), tuple_shapes=(), "
                       f"layout={lay!r}, dynamic_dims=())")
    for obj, field in ((s, "dims"), (lay, "tiles")):
        with pytest.raises(FrozenInstanceError):
            setattr(obj, field, ())
        with pytest.raises(AttributeError):
            delattr(obj, field)
    for clone in (copy.copy(s), copy.deepcopy(s), pickle.loads(pickle.dumps(s))):
        assert clone == s and clone.source_proto == "proto"
    assert Shape(PT.TUPLE, (), (s, same)).tuple_shapes == (s, same)


# -- tuple OpSharding -------------------------------------------------------------------------------
def test_tuple_sharding_elements_read_once_and_shared():
    a = HloSharding.replicate()
    t = HloSharding.tuple([a, HloSharding.manual(), a, a])
    msg = to_proto(t)
    got = from_proto(msg)
    assert got == t
    els = got.tuple_elements
    assert els[0] is els[2] is els[3] and els[1] is not els[0]
    bad = xla_data_pb2.OpSharding(type=xla_data_pb2.OpSharding.TUPLE)
    bad.tuple_shardings.add().CopyFrom(to_proto(a))
    el = bad.tuple_shardings.add(type=xla_data_pb2.OpSharding.OTHER)
    el.tile_assignment_dimensions.extend([2])
    el.tile_assignment_devices.extend([0, 0])  # a device twice: invalid
    for _ in range(2):  # never remembered
        with pytest.raises((HloSpmdError, ValueError)):
            from_proto(bad)


# -- memos of shape inference ----------------------------------------------------------------------
def _constant_attrs(dims: tuple[int, ...]) -> hlo_pb2.HloInstructionProto:
    attrs = hlo_pb2.HloInstructionProto()
    lit = attrs.literal
    lit.shape.element_type = int(PT.F32)
    lit.shape.dimensions.extend(dims)
    lit.shape.layout.minor_to_major.extend(range(len(dims) - 1, -1, -1))
    lit.f32s.extend([0.0] * (dims[0] if dims else 1))
    return attrs


def test_literal_shape_memo_keeps_its_own_proto():
    a, b = _constant_attrs((3,)), _constant_attrs((3,))
    sa = infer_shape("constant", [], a)
    assert infer_shape("constant", [], b) is sa and sa.dims == (3,)
    before = sa.source_proto.SerializeToString()
    a.literal.shape.dimensions[0] = 7  # the instruction changes later: the shape does not
    assert sa.source_proto.SerializeToString() == before
    assert infer_shape("constant", [], a).dims == (7,)


def _iota_attrs(groups: IotaGroups) -> hlo_pb2.HloInstructionProto:
    attrs = hlo_pb2.HloInstructionProto(channel_id=1, use_global_device_ids=True)
    set_replica_groups(attrs, groups)
    attrs.dimensions.append(0)
    return attrs


def test_iota_groups_memo_never_hides_a_bad_list():
    s = array_shape(PT.F32, (4,))
    good = _iota_attrs(IotaGroups(2, 4, (2, 4), (1, 0)))
    for _ in range(2):
        assert infer_shape("all-gather", [s], good).dims == (16,)
    bad = _iota_attrs(IotaGroups(2, 4, (2, 4), (1, 0)))
    bad.iota_collective_device_list.iota_transpose_perm[:] = [0, 0]
    for _ in range(2):
        with pytest.raises(VerifierError, match="invalid iota replica groups"):
            infer_shape("all-gather", [s], bad)


def test_iota_groups_with_negative_reshape_dims_are_rejected():
    # (-2) * (-4) holds the 8 devices by count, but no device array has a negative dim.
    s = array_shape(PT.F32, (4,))
    bad = _iota_attrs(IotaGroups(2, 4, (2, 4), (1, 0)))
    bad.iota_collective_device_list.iota_reshape_dims[:] = [-2, -4]
    with pytest.raises(VerifierError, match=r"invalid iota replica groups \[2,4\]<=\[-2, -4\]"):
        infer_shape("all-gather", [s], bad)

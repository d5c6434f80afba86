"""Saving (ir/proto_io.module_to_proto): what each instruction's shape is written as does
not depend on other instructions with equal shapes (the per-save shape cache)."""
from __future__ import annotations

from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.module import Module
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.ir.proto_io import module_to_proto, shape_from_proto, shape_to_proto
from hlo_spmd.ir.shape import Shape
from hlo_spmd.proto import xla_data_pb2


def test_equal_shapes_with_different_source_protos_are_written_as_their_own():
    # A loaded leaf without layout / dynamic flags equals a built one, but their bytes
    # differ; so do tuples made of them.
    loaded = shape_from_proto(xla_data_pb2.ShapeProto(element_type=PrimitiveType.F32,
                                                      dimensions=[4]))
    built = Shape(PrimitiveType.F32, (4,), (), None)
    assert loaded == built and shape_to_proto(loaded) != shape_to_proto(built)
    shapes = [Shape.tuple_of([loaded]), Shape.tuple_of([built]), built,
              Shape.tuple_of([built]), Shape.tuple_of([loaded]), built]
    m = Module("m")
    comp = Computation("main")
    m.add_computation(comp)
    m.entry = comp
    for k, s in enumerate(shapes):
        inst = Instruction("parameter", s, (), f"p{k}")
        inst.attrs.parameter_number = k
        comp.add(inst)
    comp.root = comp.instructions[-1]
    out = module_to_proto(m)
    written = [i.shape for i in out.computations[0].instructions]
    assert written == [shape_to_proto(s) for s in shapes]

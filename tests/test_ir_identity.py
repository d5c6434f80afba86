"""Instructions and computations compare and hash by identity.

The passes (verifier, remove_dead, sort_topologically, the peak-live walk, the
combiner) keep sets and dicts of instructions themselves instead of their id()s; a value
``__eq__`` on either class would silently merge distinct nodes there.
"""
from __future__ import annotations

from hlo_spmd.ir.builder import Builder
from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.module import Module
from hlo_spmd.ir.shape_inference import array_shape


def test_no_value_equality_on_ir_nodes() -> None:
    for cls in (Instruction, Computation):
        assert cls.__eq__ is object.__eq__, cls
        assert cls.__hash__ is object.__hash__, cls


def test_equal_looking_instructions_stay_distinct_in_sets() -> None:
    module = Module("m")
    comp = module.add_computation(Computation("entry"))
    module.entry = comp
    b = Builder(comp)
    x = b.parameter(0, array_shape(11, (4,)))
    a1 = b.binary("add", x, x)
    a2 = b.binary("add", x, x)  # same opcode, shape and operands
    b.set_root(b.binary("add", a1, a2))
    assert len({a1, a2}) == 2
    assert comp.remove_dead() == 0
    comp.root = a1
    assert comp.remove_dead() == 2  # a2 and the old root; a1 and x stay
    assert comp.instructions == [x, a1]

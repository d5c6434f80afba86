"""The IR: modules, computations, instructions, shapes; proto and text I/O."""
from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.module import Module
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.ir.shape import Layout, Shape

__all__ = ["Computation", "Instruction", "Module", "PrimitiveType", "Layout", "Shape"]

"""What a module's rounding depends on: the coarsest floating precision it computes in,
and its reduction depth (the most values it sums into one element). The inputs of the
comparison rule of :mod:`hlo_spmd.runtime.compare`."""
from __future__ import annotations

import math
from typing import NamedTuple

from hlo_spmd.ir import primitive_types as pt
from hlo_spmd.ir.module import Module
from hlo_spmd.runtime.compare import machine_eps


class ProgramPrecision(NamedTuple):
    eps: float | None  # None: no floating values at all
    depth: int


def _reduction_size(inst, shape_of) -> int:
    """How many values ``inst`` sums (or otherwise combines) into one output element."""
    op = inst.opcode
    attrs = inst.attrs
    if op == "dot":
        dims = shape_of(inst.operands[0]).dims
        return math.prod(dims[d] for d in attrs.dot_dimension_numbers.lhs_contracting_dimensions)
    if op == "reduce":
        dims = shape_of(inst.operands[0]).dims
        return math.prod(dims[d] for d in inst.dimensions)
    if op in ("reduce-window", "select-and-scatter"):
        return math.prod(w.size for w in attrs.window.dimensions)
    if op == "convolution":
        cd = attrs.convolution_dimension_numbers
        kernel = shape_of(inst.operands[1]).dims
        window = math.prod(w.size for w in attrs.window.dimensions)
        return window * kernel[cd.kernel_input_feature_dimension]
    if op in ("all-reduce", "reduce-scatter") and len(attrs.replica_groups):
        return max(len(g.replica_ids) for g in attrs.replica_groups)
    return 1


def program_precision(module: Module) -> ProgramPrecision:
    """The coarsest machine epsilon over every floating value of ``module`` and its
    largest reduction size."""
    eps: float | None = None
    depth = 1
    for inst in module.instructions():
        for _, leaf in inst.shape.leaves():
            if leaf.is_array and (pt.is_floating(leaf.element_type)
                                  or leaf.element_type in pt.COMPLEX):
                e = machine_eps(pt.numpy_dtype(leaf.element_type))
                if e is not None and (eps is None or e > eps):
                    eps = e
        try:
            depth = max(depth, _reduction_size(inst, lambda o: o.shape))
        except (IndexError, AttributeError, ValueError):  # malformed: judged elsewhere
            continue
    return ProgramPrecision(eps, depth)

"""Result shapes of HLO instructions, from operand shapes and opcode attributes.

``infer_shape(opcode, operand_shapes, attrs, called, declared)`` looks the opcode up in
one table (``_RULES``); elementwise ops share rules. Semantics follow XLA's
``ShapeInference`` / ``HloVerifier`` at the HLO level: no implicit broadcasting, operands
of an elementwise op have equal dims and element types, callee signatures (reducers,
comparators, while body/condition, branches, call targets) are checked by the rule of
the calling opcode.

Some results cannot be derived from the operands alone. ``declared`` is the result shape
the caller intends (the instruction's own shape when verifying, the builder's request when
building); rules use the part they cannot derive and check the rest:

* ``DECLARED_ONLY``: the whole shape is declared (parameter, custom-call, infeed, rng,
  rng-bit-generator, iota, bitcast, async / send / recv ops, ...); the rule only checks
  what it can (operand count and types, iota dimension, ...).
* ``DECLARED_ELEMENT_TYPE``: convert, bitcast-convert, stochastic-convert take the result
  element type from ``declared``.
* ``DECLARED_DIMS``: broadcast and reshape take the result dims from ``declared``.
* ``OPTIONAL_DECLARED``: dot / scaled-dot / convolution / ragged-dot use ``declared``'s
  element type (preferred element type) when given; all-gather / reduce-scatter use it
  only when the group size is not in the instruction (empty replica groups, or
  cross-replica-and-partition mode); constant uses it only without a literal.

Also public: ``KNOWN_OPCODES``, ``ARITY`` and ``CALLED_COUNT`` (verifier tables),
``XLA_SPELLING`` (older opcode spellings -> XLA's), ``has_rule``, ``array_shape``,
``program_shape``, ``window_output_dims`` and the replica-group readers
``replica_group_list_kind`` / ``replica_group_size`` / ``replica_groups`` /
``expand_iota_groups`` (explicit lists, the iota form in field 92 or the legacy nested
field, the mesh-axes form, the deprecated ``replica_groups`` field).

Errors raise ``VerifierError(message, where)``; inferred array shapes carry XLA's default
layout.
"""
from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from hlo_spmd.errors import VerifierError
from hlo_spmd.ir.opcodes import ALL_OPCODES, TRAITS
from hlo_spmd.ir.opcodes import ARITY as _OPCODES_ARITY
from hlo_spmd.ir.primitive_types import (
    ARRAY_TYPES,
    COMPLEX,
    FLOATING,
    SIGNED_INTEGRAL,
    UNSIGNED_INTEGRAL,
    PrimitiveType,
    bit_width,
    is_array_type,
    text_name,
)
from hlo_spmd.ir.shape import Layout, Shape
from hlo_spmd.memo import BoundedMemo
from hlo_spmd.proto import hlo_pb2, xla_data_pb2

if TYPE_CHECKING:
    from hlo_spmd.ir.computation import Computation

PT = PrimitiveType
_INTEGRAL = SIGNED_INTEGRAL | UNSIGNED_INTEGRAL
_EMPTY_ATTRS = hlo_pb2.HloInstructionProto()

# -- shape helpers ---------------------------------------------------------------------------
_LAYOUTS: dict[int, Layout] = {}


def _layout(rank: int) -> Layout:
    lay = _LAYOUTS.get(rank)
    if lay is None:
        lay = _LAYOUTS[rank] = Layout.default(rank)
    return lay


_ARRAY_SHAPES: dict[tuple, Shape] = {}


def array_shape(element_type: PrimitiveType | int, dims: Sequence[int]) -> Shape:
    """An array shape with XLA's default (major-to-minor) layout.

    One value per (element type, dims): shapes are immutable, and a program has a few
    dozen distinct ones over thousands of instructions, so this saves building a frozen
    dataclass per instruction and lets memos keyed by shape identity (verifier, peak
    estimate, printer) hit. Integer-like dims and element types hash and compare as
    ints, so the raw arguments find the entry."""
    key = (element_type, dims if type(dims) is tuple else tuple(dims))
    shape = _ARRAY_SHAPES.get(key)
    if shape is None:
        dims = tuple(int(d) for d in dims)
        shape = _ARRAY_SHAPES[(int(element_type), dims)] = \
            Shape(PT(element_type), dims, (), _layout(len(dims)))
    return shape


def _scalar(et: PrimitiveType) -> Shape:
    return Shape(et, (), (), _layout(0))


_U32_SCALAR = Shape(PT.U32, (), (), Layout(()))
_S32_SCALAR = Shape(PT.S32, (), (), Layout(()))
_TOKEN = Shape.token()


def _str(shape: Shape) -> str:
    return shape.to_text(print_layout=False)


def _same_et_ignoring_fp(a: PrimitiveType, b: PrimitiveType) -> bool:
    return a == b or (a in FLOATING and b in FLOATING)


def _complex_component(et: PrimitiveType) -> PrimitiveType:
    return PT.F32 if et == PT.C64 else PT.F64


class _Ctx:
    """What a rule sees: opcode, operand shapes, attributes, callees, declared shape."""

    __slots__ = ("opcode", "ops", "attrs", "called", "declared", "where")

    def __init__(self, opcode: str, ops: Sequence[Shape], attrs: hlo_pb2.HloInstructionProto,
                 called: Sequence["Computation"], declared: Shape | None, where: str | None) -> None:
        self.opcode = opcode
        self.ops = ops
        self.attrs = attrs
        self.called = called
        self.declared = declared
        self.where = where

    def fail(self, message: str) -> "VerifierError":
        where = self.where
        # The verifier passes a function making the text: only a failure asks for it.
        return VerifierError(f"{self.opcode}: {message}", where() if callable(where) else where)

    def array(self, i: int, what: str = "") -> Shape:
        s = self.ops[i]
        if s.element_type not in ARRAY_TYPES:
            raise self.fail(f"{what or f'operand {i}'} must be an array, got {_str(s)}")
        return s

    def count(self, n: int) -> None:
        if len(self.ops) != n:
            raise self.fail(f"expects {n} operand(s), got {len(self.ops)}")

    def at_least(self, n: int) -> None:
        if len(self.ops) < n:
            raise self.fail(f"expects at least {n} operand(s), got {len(self.ops)}")

    def need_declared(self, what: str) -> Shape:
        if self.declared is None:
            raise self.fail(f"the {what} cannot be inferred from the operands; pass the "
                            f"declared result shape")
        return self.declared

    def callees(self, n: int) -> Sequence["Computation"]:
        if len(self.called) != n:
            raise self.fail(f"expects {n} called computation(s), got {len(self.called)}")
        return self.called

    def dim(self, shape: Shape, d: int, what: str) -> int:
        if not 0 <= d < shape.rank:
            raise self.fail(f"{what} {d} is out of range for {_str(shape)}")
        return d


Rule = Callable[[_Ctx], Shape]


# -- computation signatures ------------------------------------------------------------------
def program_shape(comp: "Computation") -> tuple[list[Shape], Shape]:
    """(parameter shapes in parameter-number order, root shape) of a computation."""
    params = [i for i in comp.instructions if i.opcode == "parameter"]
    params.sort(key=lambda i: i.attrs.parameter_number)
    if comp.root is None:
        raise VerifierError("computation has no root", f"computation {comp.name}")
    return [p.shape for p in params], comp.root.shape


def _check_reducer(c: _Ctx, comp: "Computation", inits: Sequence[Shape],
                   input_types: Sequence[PrimitiveType]) -> list[PrimitiveType]:
    """XLA's VerifyReducerShape; returns the accumulator element types."""
    n = len(inits)
    params, result = program_shape(comp)
    if len(params) != 2 * n:
        raise c.fail(f"reduction computation {comp.name} must take {2 * n} parameters, "
                     f"takes {len(params)}")
    if result.is_tuple:
        accs = list(result.tuple_shapes)
        if len(accs) != n:
            raise c.fail(f"reduction computation {comp.name} must return a tuple of {n}, "
                         f"returns {_str(result)}")
    elif result.is_array:
        if n != 1:
            raise c.fail(f"reduction computation {comp.name} must return a tuple of {n} "
                         f"scalars, returns {_str(result)}")
        accs = [result]
    else:
        raise c.fail(f"reduction computation {comp.name} returns {_str(result)}")
    for i, acc in enumerate(accs):
        if not acc.is_array or acc.rank != 0:
            raise c.fail(f"reduction computation {comp.name} must return scalars, "
                         f"returns {_str(result)}")
        if not acc.compatible(params[i]):
            raise c.fail(f"reduction computation {comp.name}: parameter {i} is "
                         f"{_str(params[i])} but the result is {_str(acc)}")
        if not (inits[i].is_array and inits[i].rank == 0
                and _same_et_ignoring_fp(inits[i].element_type, acc.element_type)):
            raise c.fail(f"init value {i} {_str(inits[i])} does not match the accumulator "
                         f"{_str(acc)} of {comp.name}")
        p = params[n + i]
        if not (p.is_array and p.rank == 0
                and _same_et_ignoring_fp(p.element_type, input_types[i])
                and _same_et_ignoring_fp(p.element_type, acc.element_type)):
            raise c.fail(f"reduction computation {comp.name}: parameter {n + i} is {_str(p)}, "
                         f"expected {text_name(input_types[i])}[]")
    return [a.element_type for a in accs]


def _tuple_or_single(shapes: Sequence[Shape]) -> Shape:
    return shapes[0] if len(shapes) == 1 else Shape.tuple_of(list(shapes))


# -- replica groups --------------------------------------------------------------------------
def replica_group_list_kind(attrs: hlo_pb2.HloInstructionProto) -> str:
    """'iota', 'explicit', 'mesh' or 'none' (empty groups = one group of all devices)."""
    which = attrs.WhichOneof("replica_group_list")
    if which == "iota_collective_device_list":
        return "iota"
    if which == "mesh_axes_replica_group_list":
        return "mesh"
    if which == "collective_device_list":
        cdl = attrs.collective_device_list
        if cdl.replica_groups:
            return "explicit"
        if cdl.HasField("iota_replica_group_list"):
            return "iota"
    if attrs.replica_groups:
        return "explicit"
    return "none"


def _iota_proto(attrs: hlo_pb2.HloInstructionProto) -> Any:
    if attrs.WhichOneof("replica_group_list") == "iota_collective_device_list":
        return attrs.iota_collective_device_list
    return attrs.collective_device_list.iota_replica_group_list


def _mesh_axis_sizes(attrs: hlo_pb2.HloInstructionProto) -> list[int]:
    m = attrs.mesh_axes_replica_group_list
    sizes = []
    for ax in m.axes:
        if ax.HasField("sub_axis_info"):
            sizes.append(ax.sub_axis_info.size)
        else:
            sizes.append(m.mesh.axes[ax.mesh_axis_index].size)
    return sizes


def replica_group_size(attrs: hlo_pb2.HloInstructionProto) -> int | None:
    """Devices per replica group, in any of the proto encodings; None for empty groups."""
    kind = replica_group_list_kind(attrs)
    if kind == "iota":
        return int(_iota_proto(attrs).num_devices_per_group)
    if kind == "explicit":
        groups = attrs.collective_device_list.replica_groups or attrs.replica_groups
        return len(groups[0].replica_ids)
    if kind == "mesh":
        return int(np.prod(_mesh_axis_sizes(attrs), dtype=np.int64))
    return None


def iota_list_problem(p: Any) -> str | None:
    """Why an iota replica-group list (``IotaReplicaGroupListProto``) is malformed, as
    XLA rejects it (no group, an empty group, reshape dims that do not hold the devices,
    a transpose that is not a permutation), or None when it is well formed."""
    ng, gs = p.num_replica_groups, p.num_devices_per_group
    dims = list(p.iota_reshape_dims) or [ng * gs]
    perm = list(p.iota_transpose_perm) or list(range(len(dims)))
    if (ng < 1 or gs < 1 or min(dims) < 1 or math.prod(dims) != ng * gs
            or sorted(perm) != list(range(len(dims)))):
        return f"invalid iota replica groups [{ng},{gs}]<={dims}T{tuple(perm)}"
    return None


def expand_iota_groups(num_groups: int, group_size: int, reshape_dims: Sequence[int] = (),
                       transpose_perm: Sequence[int] = ()) -> np.ndarray:
    """The [num_groups, group_size] device array of an iota replica-group list."""
    total = num_groups * group_size
    dims = list(reshape_dims) or [total]
    perm = list(transpose_perm) or list(range(len(dims)))
    if int(np.prod(dims, dtype=np.int64)) != total:
        raise ValueError(f"iota reshape dims {dims} do not hold {num_groups}x{group_size} devices")
    if sorted(perm) != list(range(len(dims))):
        raise ValueError(f"iota transpose {perm} is not a permutation of {len(dims)} dims")
    return np.arange(total, dtype=np.int64).reshape(dims).transpose(perm).reshape(
        num_groups, group_size)


def _mesh_groups(attrs: hlo_pb2.HloInstructionProto) -> np.ndarray:
    from hlo_spmd.sharding.named import axis_from_proto, mesh_from_proto, mesh_groups_array
    m = attrs.mesh_axes_replica_group_list
    return mesh_groups_array(mesh_from_proto(m.mesh), [axis_from_proto(a) for a in m.axes])


def replica_groups(attrs: hlo_pb2.HloInstructionProto) -> np.ndarray | None:
    """The groups as a [num_groups, group_size] array; None for empty groups.

    Explicit lists whose groups differ in size (allowed for all-reduce) come back as an
    object array of lists.
    """
    kind = replica_group_list_kind(attrs)
    if kind == "iota":
        p = _iota_proto(attrs)
        return expand_iota_groups(p.num_replica_groups, p.num_devices_per_group,
                                  list(p.iota_reshape_dims), list(p.iota_transpose_perm))
    if kind == "explicit":
        groups = attrs.collective_device_list.replica_groups or attrs.replica_groups
        lists = [list(g.replica_ids) for g in groups]
        if len({len(g) for g in lists}) == 1:
            return np.asarray(lists, dtype=np.int64)
        out = np.empty(len(lists), dtype=object)
        out[:] = lists
        return out
    if kind == "mesh":
        return _mesh_groups(attrs)
    return None


# -- elementwise ------------------------------------------------------------------------------
def _any(et: PrimitiveType) -> bool:
    return True


def _floating(et: PrimitiveType) -> bool:
    return et in FLOATING


def _float_or_complex(et: PrimitiveType) -> bool:
    return et in FLOATING or et in COMPLEX


def _integral(et: PrimitiveType) -> bool:
    return et in _INTEGRAL


def _int_float_complex(et: PrimitiveType) -> bool:
    return et in _INTEGRAL or et in FLOATING or et in COMPLEX


def _signed_or_complex(et: PrimitiveType) -> bool:
    return et in SIGNED_INTEGRAL or et in FLOATING or et in COMPLEX


def _pred_or_integral(et: PrimitiveType) -> bool:
    return et == PT.PRED or et in _INTEGRAL


def _not_pred(et: PrimitiveType) -> bool:
    return et != PT.PRED and is_array_type(et)


def _same(et: PrimitiveType) -> PrimitiveType:
    return et


def _to_pred(et: PrimitiveType) -> PrimitiveType:
    return PT.PRED


def _component_if_complex(et: PrimitiveType) -> PrimitiveType:
    return _complex_component(et) if et in COMPLEX else et


# opcode -> (operand type predicate, description, result element type)
_UNARY: dict[str, tuple[Callable[[PrimitiveType], bool], str, Callable]] = {
    **{op: (_floating, "floating", _same) for op in (
        "floor", "ceil", "round-nearest-afz", "round-nearest-even")},
    "is-finite": (_floating, "floating", _to_pred),
    **{op: (_float_or_complex, "floating or complex", _same) for op in (
        "cos", "sin", "cosine", "sine", "tan", "exponential", "exponential-minus-one", "log",
        "log-plus-one", "logistic", "rsqrt", "sqrt", "cbrt", "tanh", "erf", "acos", "acosh",
        "asin", "asinh", "atan", "atanh", "cosh", "sinh")},
    "real": (_float_or_complex, "floating or complex", _component_if_complex),
    "imag": (_float_or_complex, "floating or complex", _component_if_complex),
    "abs": (_signed_or_complex, "signed or complex", _component_if_complex),
    "sign": (_signed_or_complex, "signed or complex", _same),
    "negate": (_int_float_complex, "integral, floating or complex", _same),
    "clz": (_integral, "integral", _same),
    "count-leading-zeros": (_integral, "integral", _same),
    "popcnt": (_integral, "integral", _same),
    "not": (_pred_or_integral, "pred or integral", _same),
}


def _unary(c: _Ctx) -> Shape:
    c.count(1)
    s = c.array(0)
    pred, desc, result = _UNARY[c.opcode]
    if not pred(s.element_type):
        raise c.fail(f"expects a {desc} element type, got {_str(s)}")
    et = result(s.element_type)
    return s if et == s.element_type else s.with_element_type(et)


def _passthrough(c: _Ctx) -> Shape:
    """copy / domain / optimization-barrier / add-dependency: the first operand's shape."""
    if c.opcode == "add-dependency":
        c.count(2)
    else:
        c.count(1)
    return c.ops[0]


def _reduce_precision(c: _Ctx) -> Shape:
    c.count(1)
    s = c.array(0)
    if s.element_type not in FLOATING:
        raise c.fail(f"expects a floating element type, got {_str(s)}")
    if c.attrs.exponent_bits < 1:
        raise c.fail(f"exponent_bits must be >= 1, got {c.attrs.exponent_bits}")
    if c.attrs.mantissa_bits < 0:
        raise c.fail(f"mantissa_bits must be >= 0, got {c.attrs.mantissa_bits}")
    return s


def _declared_et(c: _Ctx) -> PrimitiveType:
    d = c.need_declared("result element type")
    if not d.is_array:
        raise c.fail(f"result must be an array, declared {_str(d)}")
    return d.element_type


def _convert(c: _Ctx) -> Shape:
    c.count(1)
    s = c.array(0)
    return s.with_element_type(_declared_et(c))


def _bitcast_convert(c: _Ctx) -> Shape:
    c.count(1)
    s = c.array(0)
    new = _declared_et(c)
    old = s.element_type
    if (old in COMPLEX) != (new in COMPLEX):
        raise c.fail(f"cannot bitcast between complex and real types: {_str(s)} -> "
                     f"{text_name(new)}")
    wi, wo = bit_width(old), bit_width(new)
    if max(wi, wo) % min(wi, wo):
        raise c.fail(f"bit widths {wi} and {wo} do not divide: {_str(s)} -> {text_name(new)}")
    if wi == wo:
        return s.with_element_type(new)
    ratio = max(wi, wo) // min(wi, wo)
    if wi > wo:
        return array_shape(new, s.dims + (ratio,))
    if s.rank < 1 or s.dims[-1] != ratio:
        raise c.fail(f"the last dimension of {_str(s)} must equal the bit-width ratio {ratio}")
    return array_shape(new, s.dims[:-1])


def _stochastic_convert(c: _Ctx) -> Shape:
    c.count(2)
    s, r = c.array(0), c.array(1, "random bits")
    if s.element_type not in FLOATING:
        raise c.fail(f"operand must be floating, got {_str(s)}")
    if r.element_type not in UNSIGNED_INTEGRAL:
        raise c.fail(f"random bits must be unsigned integers, got {_str(r)}")
    if bit_width(r.element_type) != bit_width(s.element_type) or r.dims != s.dims:
        raise c.fail(f"random bits {_str(r)} must match the operand {_str(s)} in dims and width")
    return s.with_element_type(_declared_et(c))


# opcode -> (operand type predicate, description)
_BINARY: dict[str, tuple[Callable[[PrimitiveType], bool], str]] = {
    **{op: (_any, "array") for op in ("add", "maximum", "minimum", "multiply", "compare")},
    **{op: (_not_pred, "arithmetic (not pred)") for op in (
        "subtract", "atan2", "power", "divide", "remainder", "shift-left",
        "shift-right-arithmetic", "shift-right-logical")},
    **{op: (_pred_or_integral, "pred or integral") for op in ("and", "or", "xor")},
    "complex": (lambda et: et in (PT.F32, PT.F64), "f32 or f64"),
    "mulhi": (_integral, "integral"),
}


def _binary(c: _Ctx) -> Shape:
    c.count(2)
    a, b = c.array(0, "lhs"), c.array(1, "rhs")
    if a.dims != b.dims:
        raise c.fail(f"operands must have equal dimensions (HLO does not broadcast): "
                     f"{_str(a)} vs {_str(b)}")
    if a.element_type != b.element_type:
        raise c.fail(f"operands must have the same element type: {_str(a)} vs {_str(b)}")
    pred, desc = _BINARY[c.opcode]
    if not pred(a.element_type):
        raise c.fail(f"expects {desc} element types, got {_str(a)}")
    if c.opcode == "compare":
        return a.with_element_type(PT.PRED)
    if c.opcode == "complex":
        return a.with_element_type(PT.C64 if a.element_type == PT.F32 else PT.C128)
    return a


def _select(c: _Ctx) -> Shape:
    c.count(3)
    p, t, f = c.array(0, "predicate"), c.array(1, "on_true"), c.array(2, "on_false")
    if p.element_type != PT.PRED:
        raise c.fail(f"predicate must be pred, got {_str(p)}")
    if not t.compatible(f):
        raise c.fail(f"on_true and on_false differ: {_str(t)} vs {_str(f)}")
    if p.dims != t.dims:
        raise c.fail(f"predicate {_str(p)} and operands {_str(t)} differ in dimensions")
    return t


def _clamp(c: _Ctx) -> Shape:
    c.count(3)
    lo, x, hi = c.array(0, "min"), c.array(1, "operand"), c.array(2, "max")
    for bound, what in ((lo, "min"), (hi, "max")):
        if bound.element_type != x.element_type or (bound.rank != 0 and bound.dims != x.dims):
            raise c.fail(f"{what} {_str(bound)} must be a scalar or match the operand {_str(x)}")
    return x


def _map(c: _Ctx) -> Shape:
    c.at_least(1)
    (comp,) = c.callees(1)
    first = c.array(0)
    for i in range(1, len(c.ops)):
        if c.array(i).dims != first.dims:
            raise c.fail(f"operands must have equal dimensions: {_str(first)} vs {_str(c.ops[i])}")
    params, result = program_shape(comp)
    if len(params) != len(c.ops):
        raise c.fail(f"{comp.name} takes {len(params)} parameters for {len(c.ops)} operands")
    if not result.is_array or result.rank:
        raise c.fail(f"{comp.name} must return a scalar, returns {_str(result)}")
    for i, (p, s) in enumerate(zip(params, c.ops)):
        if not p.is_array or p.rank or p.element_type != s.element_type:
            raise c.fail(f"parameter {i} of {comp.name} is {_str(p)}, expected "
                         f"{text_name(s.element_type)}[]")
    return array_shape(result.element_type, first.dims)


# -- data movement ------------------------------------------------------------------------------
def _broadcast(c: _Ctx) -> Shape:
    c.count(1)
    s = c.array(0)
    d = c.need_declared("broadcast result dims")
    dims = list(c.attrs.dimensions)
    if len(dims) != s.rank:
        raise c.fail(f"dimensions {dims} must map each of the {s.rank} operand dims")
    if len(set(dims)) != len(dims):
        raise c.fail(f"dimensions {dims} repeat")
    for i, od in enumerate(dims):
        if not 0 <= od < d.rank:
            raise c.fail(f"dimension {od} is out of range for result rank {d.rank}")
        if d.dims[od] != s.dims[i]:
            raise c.fail(f"operand dim {i} ({s.dims[i]}) must equal result dim {od} "
                         f"({d.dims[od]}); operand {_str(s)}, result dims {list(d.dims)}")
    return array_shape(s.element_type, d.dims)


def _reshape(c: _Ctx) -> Shape:
    c.count(1)
    s = c.array(0)
    d = c.need_declared("reshape result dims")
    if not d.is_array:
        raise c.fail(f"result must be an array, declared {_str(d)}")
    if d.num_elements != s.num_elements:
        raise c.fail(f"element counts differ: {_str(s)} has {s.num_elements}, "
                     f"{list(d.dims)} has {d.num_elements}")
    return array_shape(s.element_type, d.dims)


def _transpose(c: _Ctx) -> Shape:
    c.count(1)
    s = c.array(0)
    perm = list(c.attrs.dimensions)
    if sorted(perm) != list(range(s.rank)):
        raise c.fail(f"dimensions {perm} are not a permutation of the dims of {_str(s)}")
    return array_shape(s.element_type, [s.dims[p] for p in perm])


def _reverse(c: _Ctx) -> Shape:
    c.count(1)
    s = c.array(0)
    dims = list(c.attrs.dimensions)
    if len(set(dims)) != len(dims):
        raise c.fail(f"dimensions {dims} repeat")
    for d in dims:
        c.dim(s, d, "dimension")
    return s


def _slice(c: _Ctx) -> Shape:
    c.count(1)
    s = c.array(0)
    sd = c.attrs.slice_dimensions
    if len(sd) != s.rank:
        raise c.fail(f"has {len(sd)} slice dimensions for {_str(s)}")
    out = []
    for i, x in enumerate(sd):
        if x.stride <= 0:
            raise c.fail(f"stride {x.stride} of dim {i} must be positive")
        if not 0 <= x.start <= x.limit <= s.dims[i]:
            raise c.fail(f"slice [{x.start}:{x.limit}] of dim {i} is out of bounds for {_str(s)}")
        out.append((x.limit - x.start + x.stride - 1) // x.stride)
    return array_shape(s.element_type, out)


def _check_indices(c: _Ctx, s: Shape, index_shapes: Sequence[Shape]) -> None:
    if len(index_shapes) == 1 and index_shapes[0].is_array and index_shapes[0].rank == 1:
        idx = index_shapes[0]  # legacy single vector of start indices
        if idx.element_type not in _INTEGRAL or idx.dims[0] != s.rank:
            raise c.fail(f"start index vector {_str(idx)} must be integral of size {s.rank}")
        return
    if len(index_shapes) != s.rank:
        raise c.fail(f"needs {s.rank} start indices for {_str(s)}, got {len(index_shapes)}")
    for i, idx in enumerate(index_shapes):
        if not idx.is_array or idx.rank != 0 or idx.element_type not in _INTEGRAL:
            raise c.fail(f"start index {i} must be an integral scalar, got {_str(idx)}")
        if idx.element_type != index_shapes[0].element_type:
            raise c.fail("start indices must all have the same type")


def _dynamic_slice(c: _Ctx) -> Shape:
    c.at_least(1)
    s = c.array(0)
    _check_indices(c, s, c.ops[1:])
    sizes = list(c.attrs.dynamic_slice_sizes)
    if len(sizes) != s.rank:
        raise c.fail(f"dynamic_slice_sizes {sizes} do not match {_str(s)}")
    for i, (z, d) in enumerate(zip(sizes, s.dims)):
        if not 0 <= z <= d:
            raise c.fail(f"slice size {z} of dim {i} is out of range for {_str(s)}")
    return array_shape(s.element_type, sizes)


def _dynamic_update_slice(c: _Ctx) -> Shape:
    c.at_least(2)
    s, u = c.array(0), c.array(1, "update")
    _check_indices(c, s, c.ops[2:])
    if u.rank != s.rank or u.element_type != s.element_type:
        raise c.fail(f"update {_str(u)} must have the rank and type of the operand {_str(s)}")
    for i, (z, d) in enumerate(zip(u.dims, s.dims)):
        if z > d:
            raise c.fail(f"update dim {i} ({z}) exceeds the operand's ({d})")
    return s


def _pad(c: _Ctx) -> Shape:
    c.count(2)
    s, v = c.array(0), c.array(1, "padding value")
    if v.rank != 0 or v.element_type != s.element_type:
        raise c.fail(f"padding value must be a {text_name(s.element_type)} scalar, got {_str(v)}")
    cfg = c.attrs.padding_config.dimensions
    if len(cfg) != s.rank:
        raise c.fail(f"padding config has {len(cfg)} dims for {_str(s)}")
    out = []
    for i, p in enumerate(cfg):
        if p.interior_padding < 0:
            raise c.fail(f"interior padding {p.interior_padding} of dim {i} is negative")
        d = s.dims[i]
        n = d + p.edge_padding_low + p.edge_padding_high + max(d - 1, 0) * p.interior_padding
        if n < 0:
            raise c.fail(f"padding makes dim {i} negative ({n})")
        out.append(n)
    return array_shape(s.element_type, out)


def _concatenate(c: _Ctx) -> Shape:
    c.at_least(1)
    if len(c.attrs.dimensions) != 1:
        raise c.fail("needs exactly one concatenate dimension")
    dim = c.attrs.dimensions[0]
    first = c.array(0)
    c.dim(first, dim, "concatenate dimension")
    total = 0
    for i in range(len(c.ops)):
        s = c.array(i)
        if s.rank != first.rank or s.element_type != first.element_type:
            raise c.fail(f"operands differ in rank or type: {_str(first)} vs {_str(s)}")
        for k in range(s.rank):
            if k != dim and s.dims[k] != first.dims[k]:
                raise c.fail(f"operands differ in dim {k}: {_str(first)} vs {_str(s)}")
        total += s.dims[dim]
    dims = list(first.dims)
    dims[dim] = total
    return array_shape(first.element_type, dims)


def _iota(c: _Ctx) -> Shape:
    c.count(0)
    d = c.need_declared("iota shape")
    if not d.is_array or d.rank == 0:
        raise c.fail(f"iota needs an array result of rank >= 1, declared {_str(d)}")
    if len(c.attrs.dimensions) != 1 or not 0 <= c.attrs.dimensions[0] < d.rank:
        raise c.fail(f"iota dimension {list(c.attrs.dimensions)} is out of range for {_str(d)}")
    if not (d.element_type in _INTEGRAL or d.element_type in FLOATING or d.element_type in COMPLEX):
        raise c.fail(f"iota of {text_name(d.element_type)} is not supported")
    return d


def _get_tuple_element(c: _Ctx) -> Shape:
    c.count(1)
    s = c.ops[0]
    if not s.is_tuple:
        raise c.fail(f"operand is not a tuple: {_str(s)}")
    i = c.attrs.tuple_index
    if not 0 <= i < len(s.tuple_shapes):
        raise c.fail(f"tuple index {i} is out of range for {_str(s)}")
    return s.tuple_shapes[i]


def _tuple(c: _Ctx) -> Shape:
    return Shape.tuple_of(list(c.ops))


def _constant(c: _Ctx) -> Shape:
    c.count(0)
    if c.attrs.HasField("literal") and c.attrs.literal.HasField("shape"):
        msg = c.attrs.literal.shape
        key = msg.SerializeToString()
        shape = _LITERAL_SHAPES.get(key)
        if shape is None:
            from hlo_spmd.ir.proto_io import shape_from_proto

            # Read from a private copy: the Shape keeps its proto (saved back as is),
            # and the literal's own message belongs to an instruction that may change.
            own = xla_data_pb2.ShapeProto()
            own.ParseFromString(key)
            shape = _LITERAL_SHAPES.put(key, shape_from_proto(own))
        return shape
    if c.declared is None:
        raise c.fail("constant has no literal")
    return c.declared


# Serialized literal ShapeProto -> its Shape: a module has a few literal shapes over
# hundreds of constants (scalars, offset tables), each read once.
_LITERAL_SHAPES = BoundedMemo(4096)


# -- reductions and windows -------------------------------------------------------------------
def _reduce(c: _Ctx) -> Shape:
    if not c.ops or len(c.ops) % 2:
        raise c.fail(f"needs an even, positive number of operands, got {len(c.ops)}")
    (comp,) = c.callees(1)
    n = len(c.ops) // 2
    inputs = [c.array(i) for i in range(n)]
    for s in inputs[1:]:
        if s.dims != inputs[0].dims:
            raise c.fail(f"reduced operands differ in dims: {_str(inputs[0])} vs {_str(s)}")
    dims = list(c.attrs.dimensions)
    if len(set(dims)) != len(dims):
        raise c.fail(f"duplicate reduction dimension in {dims}")
    for d in dims:
        c.dim(inputs[0], d, "reduction dimension")
    ets = _check_reducer(c, comp, c.ops[n:], [s.element_type for s in inputs])
    kept = [x for k, x in enumerate(inputs[0].dims) if k not in dims]
    _, result = program_shape(comp)
    if result.is_array:
        return array_shape(ets[0], kept)
    return Shape.tuple_of([array_shape(et, kept) for et in ets])


def window_output_dims(c_or_none: _Ctx | None, base: Sequence[int], window: Any) -> list[int]:
    """Output dims of a window (reduce-window, select-and-scatter, convolution spatial)."""
    def fail(msg: str) -> VerifierError:
        return c_or_none.fail(msg) if c_or_none is not None else VerifierError(msg)

    if len(window.dimensions) != len(base):
        raise fail(f"window has {len(window.dimensions)} dims for a base of rank {len(base)}")
    out = []
    for i, (b, w) in enumerate(zip(base, window.dimensions)):
        if w.size <= 0 or w.stride <= 0 or w.base_dilation < 1 or w.window_dilation < 1:
            raise fail(f"window dim {i} needs positive size, stride and dilations: "
                       f"size={w.size} stride={w.stride} base_dilation={w.base_dilation} "
                       f"window_dilation={w.window_dilation}")
        dilated_base = 0 if b == 0 else (b - 1) * w.base_dilation + 1
        padded = w.padding_low + dilated_base + w.padding_high
        dilated_window = (w.size - 1) * w.window_dilation + 1
        out.append(0 if padded < dilated_window else (padded - dilated_window) // w.stride + 1)
    return out


def _reduce_window(c: _Ctx) -> Shape:
    if not c.ops or len(c.ops) % 2:
        raise c.fail(f"needs an even, positive number of operands, got {len(c.ops)}")
    (comp,) = c.callees(1)
    n = len(c.ops) // 2
    inputs = [c.array(i) for i in range(n)]
    for s in inputs[1:]:
        if s.dims != inputs[0].dims:
            raise c.fail(f"operands differ in dims: {_str(inputs[0])} vs {_str(s)}")
    ets = _check_reducer(c, comp, c.ops[n:], [s.element_type for s in inputs])
    dims = window_output_dims(c, inputs[0].dims, c.attrs.window)
    _, result = program_shape(comp)
    if result.is_array:
        return array_shape(ets[0], dims)
    return Shape.tuple_of([array_shape(et, dims) for et in ets])


def _select_and_scatter(c: _Ctx) -> Shape:
    c.count(3)
    select, scatter = c.callees(2)
    s, src, init = c.array(0), c.array(1, "source"), c.array(2, "init value")
    params, result = program_shape(select)
    if len(params) != 2 or not result.compatible(_scalar(PT.PRED)):
        raise c.fail(f"select computation {select.name} must be (T, T) -> pred[]")
    for p in params:
        if not (p.is_array and p.rank == 0 and _same_et_ignoring_fp(p.element_type, s.element_type)):
            raise c.fail(f"select computation {select.name} takes {_str(p)}, expected "
                         f"{text_name(s.element_type)}[]")
    _check_reducer(c, scatter, [init], [src.element_type])
    dims = window_output_dims(c, s.dims, c.attrs.window)
    if list(src.dims) != dims:
        raise c.fail(f"source {_str(src)} does not match the windowed operand dims {dims}")
    return s


# -- contractions -----------------------------------------------------------------------------
def _result_type(c: _Ctx, lhs: Shape, rhs: Shape) -> PrimitiveType:
    if c.declared is not None and c.declared.is_array:
        return c.declared.element_type
    if lhs.element_type != rhs.element_type:
        if lhs.element_type in FLOATING and rhs.element_type in FLOATING:
            return max((lhs.element_type, rhs.element_type), key=bit_width)
        raise c.fail(f"operand types differ ({_str(lhs)}, {_str(rhs)}); pass a result type")
    return lhs.element_type


def _dot_dims(c: _Ctx, lhs: Shape, rhs: Shape, dn: Any, rhs_skip: Sequence[int] = ()) -> list[int]:
    lc, rc = list(dn.lhs_contracting_dimensions), list(dn.rhs_contracting_dimensions)
    lb, rb = list(dn.lhs_batch_dimensions), list(dn.rhs_batch_dimensions)
    for dims, shape, side in ((lc + lb, lhs, "lhs"), (rc + rb, rhs, "rhs")):
        if len(set(dims)) != len(dims):
            raise c.fail(f"a {side} dimension number repeats in {dims}")
        for d in dims:
            c.dim(shape, d, f"{side} dimension number")
    if len(lc) != len(rc):
        raise c.fail(f"lhs has {len(lc)} contracting dims, rhs {len(rc)}")
    if len(lb) != len(rb):
        raise c.fail(f"lhs has {len(lb)} batch dims, rhs {len(rb)}")
    for a, b in zip(lc, rc):
        if lhs.dims[a] != rhs.dims[b]:
            raise c.fail(f"contracting dims differ: lhs dim {a} of {_str(lhs)} vs rhs dim {b} "
                         f"of {_str(rhs)}")
    for a, b in zip(lb, rb):
        if lhs.dims[a] != rhs.dims[b]:
            raise c.fail(f"batch dims differ: lhs dim {a} of {_str(lhs)} vs rhs dim {b} "
                         f"of {_str(rhs)}")
    out = [lhs.dims[d] for d in lb]
    out += [x for k, x in enumerate(lhs.dims) if k not in lc and k not in lb]
    out += [x for k, x in enumerate(rhs.dims) if k not in rc and k not in rb and k not in rhs_skip]
    return out


def _dot(c: _Ctx) -> Shape:
    c.at_least(2)  # sparse dots carry metadata operands after lhs and rhs
    lhs, rhs = c.array(0, "lhs"), c.array(1, "rhs")
    dims = _dot_dims(c, lhs, rhs, c.attrs.dot_dimension_numbers)
    return array_shape(_result_type(c, lhs, rhs), dims)


def _scaled_dot(c: _Ctx) -> Shape:
    """(lhs, rhs, lhs_scale, rhs_scale): the dot of lhs and rhs."""
    c.count(4)
    lhs, rhs = c.array(0, "lhs"), c.array(1, "rhs")
    dims = _dot_dims(c, lhs, rhs, c.attrs.dot_dimension_numbers)
    return array_shape(_result_type(c, lhs, rhs), dims)


def _ragged_dot(c: _Ctx) -> Shape:
    c.count(3)
    lhs, rhs, groups = c.array(0, "lhs"), c.array(1, "rhs"), c.array(2, "group sizes")
    rdn = c.attrs.ragged_dot_dimension_numbers
    dn = rdn.dot_dimension_numbers
    if len(rdn.lhs_ragged_dimensions) != 1:
        raise c.fail("needs exactly one lhs ragged dimension")
    ragged = rdn.lhs_ragged_dimensions[0]
    c.dim(lhs, ragged, "lhs ragged dimension")
    et = _result_type(c, lhs, rhs)
    if groups.rank < 1:
        raise c.fail(f"group sizes must have rank >= 1, got {_str(groups)}")
    if ragged in dn.lhs_contracting_dimensions:  # [m,k],[k,n],[g] -> [g,m,n]
        return array_shape(et, (groups.dims[-1],) + tuple(_dot_dims(c, lhs, rhs, dn)))
    if ragged in dn.lhs_batch_dimensions:
        return array_shape(et, _dot_dims(c, lhs, rhs, dn))
    group_dims = list(rdn.rhs_group_dimensions)  # [m,k],[g,k,n],[g] -> [m,n]
    if len(group_dims) != 1:
        raise c.fail("ragged non-contracting mode needs one rhs group dimension")
    c.dim(rhs, group_dims[0], "rhs group dimension")
    if rhs.dims[group_dims[0]] != groups.dims[-1]:
        raise c.fail(f"rhs group dim {rhs.dims[group_dims[0]]} does not match group sizes "
                     f"{_str(groups)}")
    return array_shape(et, _dot_dims(c, lhs, rhs, dn, rhs_skip=group_dims))


def _convolution(c: _Ctx) -> Shape:
    c.at_least(2)  # block-scaled convolutions carry scale operands after lhs and rhs
    lhs, rhs = c.array(0, "lhs"), c.array(1, "rhs")
    dn = c.attrs.convolution_dimension_numbers
    fgc = c.attrs.feature_group_count or 1
    bgc = c.attrs.batch_group_count or 1
    if lhs.rank != rhs.rank:
        raise c.fail(f"lhs {_str(lhs)} and rhs {_str(rhs)} differ in rank")
    nsp = lhs.rank - 2
    if not (len(dn.input_spatial_dimensions) == len(dn.kernel_spatial_dimensions)
            == len(dn.output_spatial_dimensions) == nsp):
        raise c.fail(f"dimension numbers need {nsp} spatial dims for rank {lhs.rank}")
    full = list(range(lhs.rank))
    for name, dims in (
            ("input", [dn.input_batch_dimension, dn.input_feature_dimension,
                       *dn.input_spatial_dimensions]),
            ("kernel", [dn.kernel_input_feature_dimension, dn.kernel_output_feature_dimension,
                        *dn.kernel_spatial_dimensions]),
            ("output", [dn.output_batch_dimension, dn.output_feature_dimension,
                        *dn.output_spatial_dimensions])):
        if sorted(dims) != full:
            raise c.fail(f"{name} dimension numbers {dims} are not a permutation of {full}")
    in_batch = lhs.dims[dn.input_batch_dimension]
    in_feat = lhs.dims[dn.input_feature_dimension]
    k_in = rhs.dims[dn.kernel_input_feature_dimension]
    k_out = rhs.dims[dn.kernel_output_feature_dimension]
    if fgc < 1 or bgc < 1:
        raise c.fail(f"group counts must be positive (feature {fgc}, batch {bgc})")
    if k_out % bgc:
        raise c.fail(f"output features {k_out} are not a multiple of batch_group_count {bgc}")
    if in_feat % fgc or in_feat // fgc != k_in:
        raise c.fail(f"input features {in_feat} / feature_group_count {fgc} must equal the "
                     f"kernel input features {k_in}")
    if k_out % fgc:
        raise c.fail(f"output features {k_out} are not a multiple of feature_group_count {fgc}")
    if in_batch % bgc:
        raise c.fail(f"input batch {in_batch} is not a multiple of batch_group_count {bgc}")
    win = c.attrs.window
    kernel_spatial = [rhs.dims[d] for d in dn.kernel_spatial_dimensions]
    if [w.size for w in win.dimensions] != kernel_spatial:
        raise c.fail(f"window sizes {[w.size for w in win.dimensions]} do not match the kernel "
                     f"spatial dims {kernel_spatial}")
    spatial = window_output_dims(c, [lhs.dims[d] for d in dn.input_spatial_dimensions], win)
    out = [0] * lhs.rank
    out[dn.output_batch_dimension] = in_batch // bgc
    out[dn.output_feature_dimension] = k_out
    for d, n in zip(dn.output_spatial_dimensions, spatial):
        out[d] = n
    return array_shape(_result_type(c, lhs, rhs), out)


# -- gather / scatter ---------------------------------------------------------------------------
def _sorted_unique(c: _Ctx, dims: Sequence[int], what: str) -> None:
    if list(dims) != sorted(set(dims)):
        raise c.fail(f"{what} {list(dims)} must be sorted and unique")


def _expanded_indices(c: _Ctx, idx: Shape, index_vector_dim: int) -> list[int]:
    if idx.element_type not in _INTEGRAL:
        raise c.fail(f"indices must be integral, got {_str(idx)}")
    if not 0 <= index_vector_dim <= idx.rank:
        raise c.fail(f"index_vector_dim {index_vector_dim} is out of range for {_str(idx)}")
    dims = list(idx.dims)
    if index_vector_dim == idx.rank:
        dims.append(1)
    return dims


def _gather(c: _Ctx) -> Shape:
    c.count(2)
    s, idx = c.array(0), c.array(1, "start indices")
    g = c.attrs.gather_dimension_numbers
    ivd = g.index_vector_dim
    exp = _expanded_indices(c, idx, ivd)
    offset = list(g.offset_dims)
    collapsed = list(g.collapsed_slice_dims)
    obatch = list(g.operand_batching_dims)
    ibatch = list(g.start_indices_batching_dims)
    sizes = list(c.attrs.gather_slice_sizes)
    _sorted_unique(c, offset, "offset_dims")
    _sorted_unique(c, collapsed, "collapsed_slice_dims")
    _sorted_unique(c, obatch, "operand_batching_dims")
    out_rank = len(offset) + len(exp) - 1
    for d in offset:
        if not 0 <= d < out_rank:
            raise c.fail(f"offset dim {d} is out of range for output rank {out_rank}")
    if len(g.start_index_map) != exp[ivd]:
        raise c.fail(f"start_index_map has {len(g.start_index_map)} entries but the index "
                     f"vector has {exp[ivd]}")
    if len(set(g.start_index_map)) != len(g.start_index_map):
        raise c.fail(f"start_index_map {list(g.start_index_map)} repeats")
    for d in list(g.start_index_map) + collapsed + obatch:
        c.dim(s, d, "operand dimension")
    if set(collapsed) & set(obatch):
        raise c.fail("collapsed_slice_dims and operand_batching_dims overlap")
    if len(ibatch) != len(obatch):
        raise c.fail("operand_batching_dims and start_indices_batching_dims differ in length")
    for d in ibatch:
        if not 0 <= d < idx.rank or d == ivd:
            raise c.fail(f"start_indices_batching_dim {d} is invalid for {_str(idx)}")
    if len(sizes) != s.rank:
        raise c.fail(f"slice_sizes {sizes} need one entry per dim of {_str(s)}")
    if len(offset) + len(collapsed) + len(obatch) != s.rank:
        raise c.fail(f"offset_dims {offset}, collapsed_slice_dims {collapsed} and "
                     f"operand_batching_dims {obatch} must cover the {s.rank} operand dims")
    for i, (z, d) in enumerate(zip(sizes, s.dims)):
        if not 0 <= z <= d:
            raise c.fail(f"slice size {z} of dim {i} is out of range for {_str(s)}")
    for d in collapsed + obatch:
        if sizes[d] > 1:
            raise c.fail(f"collapsed/batching dim {d} needs slice size <= 1, got {sizes[d]}")
    window = [sizes[k] for k in range(s.rank) if k not in collapsed and k not in obatch]
    batch = [x for k, x in enumerate(exp) if k != ivd]
    out, wi, bi = [], 0, 0
    offset_set = set(offset)
    for i in range(out_rank):
        if i in offset_set:
            out.append(window[wi])
            wi += 1
        else:
            out.append(batch[bi])
            bi += 1
    return array_shape(s.element_type, out)


def _scatter(c: _Ctx) -> Shape:
    n = len(c.ops) // 2
    if n < 1 or len(c.ops) != 2 * n + 1:
        raise c.fail(f"needs 2n+1 operands (n operands, indices, n updates), got {len(c.ops)}")
    (comp,) = c.callees(1)
    operands = [c.array(i) for i in range(n)]
    idx = c.array(n, "scatter indices")
    updates = [c.array(n + 1 + i, f"updates {i}") for i in range(n)]
    sd = c.attrs.scatter_dimension_numbers
    ivd = sd.index_vector_dim
    exp = _expanded_indices(c, idx, ivd)
    uwd = list(sd.update_window_dims)
    iwd = list(sd.inserted_window_dims)
    ibd = list(sd.input_batching_dims)
    _sorted_unique(c, uwd, "update_window_dims")
    _sorted_unique(c, iwd, "inserted_window_dims")
    _sorted_unique(c, ibd, "input_batching_dims")
    first = operands[0]
    for s in operands[1:]:
        if s.dims != first.dims:
            raise c.fail(f"scatter operands differ in dims: {_str(first)} vs {_str(s)}")
    if len(uwd) + len(iwd) + len(ibd) != first.rank:
        raise c.fail(f"update_window_dims {uwd}, inserted_window_dims {iwd} and "
                     f"input_batching_dims {ibd} must cover the {first.rank} operand dims")
    if len(sd.scatter_dims_to_operand_dims) != exp[ivd]:
        raise c.fail(f"scatter_dims_to_operand_dims has {len(sd.scatter_dims_to_operand_dims)} "
                     f"entries but the index vector has {exp[ivd]}")
    for d in list(sd.scatter_dims_to_operand_dims) + iwd + ibd:
        c.dim(first, d, "operand dimension")
    if len(set(sd.scatter_dims_to_operand_dims)) != len(sd.scatter_dims_to_operand_dims):
        raise c.fail("scatter_dims_to_operand_dims repeats")
    max_window = [x for k, x in enumerate(first.dims) if k not in iwd and k not in ibd]
    scatter_bounds = [x for k, x in enumerate(exp) if k != ivd]
    for u in updates:
        if u.rank != len(scatter_bounds) + len(uwd):
            raise c.fail(f"updates {_str(u)} must have rank {len(scatter_bounds) + len(uwd)}")
        for k, d in enumerate(uwd):
            if not 0 <= d < u.rank or u.dims[d] > max_window[k]:
                raise c.fail(f"update window dim {d} of {_str(u)} exceeds the operand bound")
        sdims = [x for k, x in enumerate(u.dims) if k not in uwd]
        if sdims != scatter_bounds:
            raise c.fail(f"update scatter dims {sdims} of {_str(u)} must equal the index "
                         f"batch dims {scatter_bounds}")
    _check_reducer(c, comp, [_scalar(s.element_type) for s in operands],
                   [u.element_type for u in updates])
    return _tuple_or_single(operands)


# -- sort / top-k ------------------------------------------------------------------------------
def _sort(c: _Ctx) -> Shape:
    c.at_least(1)
    (comp,) = c.callees(1)
    first = c.array(0)
    for i in range(1, len(c.ops)):
        if c.array(i).dims != first.dims:
            raise c.fail(f"sort operands differ in dims: {_str(first)} vs {_str(c.ops[i])}")
    if len(c.attrs.dimensions) != 1:
        raise c.fail("needs exactly one sort dimension")
    c.dim(first, c.attrs.dimensions[0], "sort dimension")
    params, result = program_shape(comp)
    if not result.compatible(_scalar(PT.PRED)):
        raise c.fail(f"comparator {comp.name} must return pred[], returns {_str(result)}")
    if len(params) != 2 * len(c.ops):
        raise c.fail(f"comparator {comp.name} takes {len(params)} parameters, needs "
                     f"{2 * len(c.ops)}")
    for k, p in enumerate(params):
        et = c.ops[k // 2].element_type
        if not (p.is_array and p.rank == 0 and _same_et_ignoring_fp(p.element_type, et)):
            raise c.fail(f"comparator parameter {k} is {_str(p)}, expected {text_name(et)}[]")
    return _tuple_or_single(c.ops)


def _top_k(c: _Ctx) -> Shape:
    c.count(1)
    s = c.array(0)
    k = c.attrs.k
    if s.rank < 1 or not 0 <= k <= s.dims[-1]:
        raise c.fail(f"k={k} is out of range for {_str(s)}")
    dims = s.dims[:-1] + (k,)
    return Shape.tuple_of([array_shape(s.element_type, dims), array_shape(PT.S32, dims)])


# -- control flow ------------------------------------------------------------------------------
def _while(c: _Ctx) -> Shape:
    c.count(1)
    body, cond = c.callees(2)
    init = c.ops[0]
    bparams, bresult = program_shape(body)
    cparams, cresult = program_shape(cond)
    if len(bparams) != 1 or len(cparams) != 1:
        raise c.fail(f"body {body.name} and condition {cond.name} must take one parameter")
    if not cresult.compatible(_scalar(PT.PRED)):
        raise c.fail(f"condition {cond.name} must return pred[], returns {_str(cresult)}")
    for what, s in ((f"body {body.name} parameter", bparams[0]),
                    (f"body {body.name} result", bresult),
                    (f"condition {cond.name} parameter", cparams[0])):
        if not s.compatible(init):
            raise c.fail(f"{what} {_str(s)} differs from the loop state {_str(init)}")
    return init


def _conditional(c: _Ctx) -> Shape:
    c.at_least(1)
    branches = c.called
    index = c.ops[0]
    if index.compatible(_scalar(PT.PRED)):
        if len(branches) != 2:
            raise c.fail(f"a pred-indexed conditional needs 2 branches, has {len(branches)}")
    elif index.compatible(_scalar(PT.S32)):
        if not branches:
            raise c.fail("needs at least one branch computation")
    else:
        raise c.fail(f"branch index must be pred[] or s32[], got {_str(index)}")
    if len(c.ops) != len(branches) + 1:
        raise c.fail(f"has {len(c.ops) - 1} branch operands for {len(branches)} branches")
    result = None
    for j, comp in enumerate(branches):
        params, root = program_shape(comp)
        if len(params) != 1 or not params[0].compatible(c.ops[j + 1]):
            raise c.fail(f"branch {comp.name} must take one parameter of shape "
                         f"{_str(c.ops[j + 1])}")
        if result is None:
            result = root
        elif not root.compatible(result):
            raise c.fail(f"branch results differ: {_str(result)} vs {_str(root)} ({comp.name})")
    return result


def _call(c: _Ctx) -> Shape:
    (comp,) = c.callees(1)
    params, root = program_shape(comp)
    if len(params) != len(c.ops):
        raise c.fail(f"{comp.name} takes {len(params)} parameters, given {len(c.ops)} operands")
    for i, (p, s) in enumerate(zip(params, c.ops)):
        if not p.compatible(s):
            raise c.fail(f"operand {i} {_str(s)} does not match parameter {i} {_str(p)} "
                         f"of {comp.name}")
    return root


def _fusion(c: _Ctx) -> Shape:
    return _call(c)


# -- collectives -------------------------------------------------------------------------------
def _check_replica_groups(c: _Ctx, uniform: bool = True) -> None:
    """XLA's CheckReplicaGroups: every id once, ids 0..n-1, no empty group, equal sizes
    (all-reduce may mix sizes); flattened-id mode needs explicit groups."""
    kind = replica_group_list_kind(c.attrs)
    if kind == "none":
        if c.attrs.channel_id > 0 and c.attrs.use_global_device_ids:
            raise c.fail("replica groups must be given when use_global_device_ids is set")
        return
    if kind == "iota":
        p = _iota_proto(c.attrs)
        # As explicit lists below: each distinct iota list (by its bytes) is checked once.
        key = ("iota", p.SerializeToString())
        if key in _GROUPS_OK:
            return
        problem = iota_list_problem(p)
        if problem is not None:
            raise c.fail(problem)
        _GROUPS_OK.put(key, True)
        return
    if kind != "explicit":
        return
    cdl = c.attrs.collective_device_list
    groups = cdl.replica_groups or c.attrs.replica_groups
    # A module repeats a few group lists over many collectives: each distinct one (by
    # its serialized bytes) is checked once; only lists that passed are remembered.
    key = (uniform, cdl.SerializeToString() if cdl.replica_groups else
           tuple(g.SerializeToString() for g in groups))
    if key in _GROUPS_OK:
        return
    # A Python loop over the groups, not over the devices: the ids are gathered and
    # checked by C-level builtins (this runs on every collective, with thousands of
    # devices per group list at scale).
    size = len(groups[0].replica_ids)
    for g in groups:
        if not g.replica_ids:
            raise c.fail("a replica group is empty")
        if uniform and len(g.replica_ids) != size:
            raise c.fail("replica groups must all have the same size")
    ids = list(itertools.chain.from_iterable(g.replica_ids for g in groups))
    seen = set(ids)
    if len(seen) != len(ids):  # name the first repeat in group order, as before
        first: set[int] = set()
        for d in ids:
            if d in first:
                raise c.fail(f"device {d} appears twice in the replica groups")
            first.add(d)
    if min(seen) < 0 or max(seen) != len(seen) - 1:
        raise c.fail(f"replica groups must name devices 0..{len(seen) - 1} exactly once")
    _GROUPS_OK.put(key, True)


# Group lists that passed: (uniform, serialized explicit groups) or ("iota", serialized
# iota list).
_GROUPS_OK = BoundedMemo(4096)


def _collective_reducer(c: _Ctx) -> None:
    (comp,) = c.callees(1)
    for s in c.ops:
        if not s.is_array:
            raise c.fail(f"operands must be arrays, got {_str(s)}")
    params, root = program_shape(comp)
    if len(params) != 2 or not root.is_array or root.rank:
        raise c.fail(f"reduction computation {comp.name} must be a binary scalar computation")


def _all_reduce(c: _Ctx) -> Shape:
    c.at_least(1)
    _collective_reducer(c)
    _check_replica_groups(c, uniform=False)
    return _tuple_or_single(c.ops)


def _all_reduce_start(c: _Ctx) -> Shape:
    return _all_reduce(c)


def _shard_count(c: _Ctx, dim: int, grow: bool) -> int:
    """The group size of a gather/scatter-like collective, from the groups or the declared
    result (empty groups, cross-replica-and-partition mode)."""
    n = replica_group_size(c.attrs)
    exact = not (c.attrs.channel_id > 0 and not c.attrs.use_global_device_ids)
    if n is not None and exact:
        return n
    d = c.declared
    if d is None:
        raise c.fail("the group size is not recorded in the instruction (empty replica groups "
                     "or cross-replica-and-partition mode); pass the declared result shape")
    out = d if d.is_array else (d.tuple_shapes[0] if d.tuple_shapes else d)
    ins = c.ops[0]
    if not out.is_array or not ins.is_array or not 0 <= dim < min(out.rank, ins.rank):
        raise c.fail(f"dimension {dim} is out of range")
    big, small = (out.dims[dim], ins.dims[dim]) if grow else (ins.dims[dim], out.dims[dim])
    if small == 0:
        return n or 1
    if big % small:
        raise c.fail(f"result dim {out.dims[dim]} is not a multiple of operand dim {ins.dims[dim]}")
    return big // small


def _one_dimension(c: _Ctx) -> int:
    if len(c.attrs.dimensions) != 1:
        raise c.fail(f"needs exactly one dimension, has {list(c.attrs.dimensions)}")
    return c.attrs.dimensions[0]


def _all_gather_shapes(c: _Ctx) -> list[Shape]:
    c.at_least(1)
    _check_replica_groups(c)
    dim = _one_dimension(c)
    n = _shard_count(c, dim, grow=True)
    out = []
    for i in range(len(c.ops)):
        s = c.array(i)
        c.dim(s, dim, "all-gather dimension")
        dims = list(s.dims)
        dims[dim] *= n
        out.append(array_shape(s.element_type, dims))
    return out


def _all_gather(c: _Ctx) -> Shape:
    return _tuple_or_single(_all_gather_shapes(c))


def _all_gather_start(c: _Ctx) -> Shape:
    gathered = _tuple_or_single(_all_gather_shapes(c))
    return Shape.tuple_of([_tuple_or_single(c.ops), gathered])


def _reduce_scatter(c: _Ctx) -> Shape:
    c.at_least(1)
    _collective_reducer(c)
    _check_replica_groups(c)
    dim = _one_dimension(c)
    n = _shard_count(c, dim, grow=False)
    out = []
    for i in range(len(c.ops)):
        s = c.array(i)
        c.dim(s, dim, "scatter dimension")
        if s.dims[dim] % n:
            raise c.fail(f"scatter dim {dim} of {_str(s)} is not divisible by the group size {n}")
        dims = list(s.dims)
        dims[dim] //= n
        out.append(array_shape(s.element_type, dims))
    return _tuple_or_single(out)


def _all_to_all(c: _Ctx) -> Shape:
    c.at_least(1)
    _check_replica_groups(c)
    n = replica_group_size(c.attrs)
    if c.attrs.dimensions:
        c.count(1)
        s = c.array(0)
        dim = _one_dimension(c)
        c.dim(s, dim, "split dimension")
        if n is not None and s.dims[dim] % n:
            raise c.fail(f"split dim {dim} of {_str(s)} is not divisible by the group size {n}")
        return s
    first = c.array(0)
    for i in range(1, len(c.ops)):
        if not c.array(i).compatible(first):
            raise c.fail(f"tuple all-to-all operands differ: {_str(first)} vs {_str(c.ops[i])}")
    if n is not None and len(c.ops) != n:
        raise c.fail(f"tuple all-to-all needs one operand per group member ({n}), "
                     f"has {len(c.ops)}")
    return Shape.tuple_of(list(c.ops))


def _ragged_all_to_all(c: _Ctx) -> Shape:
    c.count(6)
    return c.array(1, "output buffer")


def _collective_broadcast(c: _Ctx) -> Shape:
    c.at_least(1)
    return _tuple_or_single(c.ops)


def _collective_permute(c: _Ctx) -> Shape:
    c.at_least(1)
    sources: set[int] = set()
    targets: set[int] = set()
    for p in c.attrs.source_target_pairs:
        if p.source < 0 or p.target < 0:
            raise c.fail(f"negative device in source-target pair {{{p.source},{p.target}}}")
        if p.source in sources or p.target in targets:
            raise c.fail(f"device {p.source if p.source in sources else p.target} appears twice "
                         f"as a source or target")
        sources.add(p.source)
        targets.add(p.target)
    if len(c.ops) == 4 and c.ops[2].is_tuple:  # in-place: input, output, offsets, offsets
        return c.ops[1]
    for i in range(len(c.ops)):
        c.array(i)
    return _tuple_or_single(c.ops)


def _tuple_element(index: int) -> Rule:
    def rule(c: _Ctx) -> Shape:
        c.count(1)
        s = c.ops[0]
        if not s.is_tuple or len(s.tuple_shapes) <= index:
            raise c.fail(f"operand must be a tuple with element {index}, got {_str(s)}")
        return s.tuple_shapes[index]

    return rule


def _fixed(shape: Shape, arity: int | None = 0) -> Rule:
    def rule(c: _Ctx) -> Shape:
        if arity is not None:
            c.count(arity)
        return shape

    return rule


def _after_all(c: _Ctx) -> Shape:
    for i, s in enumerate(c.ops):
        if not s.is_token:
            raise c.fail(f"operand {i} must be a token, got {_str(s)}")
    return _TOKEN


def _get_dimension_size(c: _Ctx) -> Shape:
    c.count(1)
    s = c.array(0)
    c.dim(s, _one_dimension(c), "dimension")
    return _S32_SCALAR


def _set_dimension_size(c: _Ctx) -> Shape:
    c.count(2)
    s = c.array(0)
    d = c.dim(s, _one_dimension(c), "dimension")
    if not c.ops[1].compatible(_S32_SCALAR):
        raise c.fail(f"size must be s32[], got {_str(c.ops[1])}")
    dyn = list(s.dynamic_dims or [False] * s.rank)
    dyn[d] = True
    return Shape(s.element_type, s.dims, (), s.layout, tuple(dyn))


# -- linear algebra ----------------------------------------------------------------------------
def _fft(c: _Ctx) -> Shape:
    c.count(1)
    s = c.array(0)
    lengths = list(c.attrs.fft_length)
    r = len(lengths)
    if not 1 <= r <= 3 or s.rank < r:
        raise c.fail(f"fft_length {lengths} does not fit {_str(s)} (ranks 1-3)")
    kind = c.attrs.fft_type
    tail = list(s.dims[s.rank - r:])
    if kind in (0, 1):  # FFT, IFFT
        if s.element_type not in COMPLEX:
            raise c.fail(f"needs a complex operand, got {_str(s)}")
        return s
    if kind == 2:  # RFFT
        if s.element_type not in (PT.F32, PT.F64):
            raise c.fail(f"RFFT needs f32 or f64, got {_str(s)}")
        if tail != lengths:
            raise c.fail(f"RFFT innermost dims {tail} must equal fft_length {lengths}")
        dims = list(s.dims)
        if lengths[-1]:
            dims[-1] = lengths[-1] // 2 + 1
        return array_shape(PT.C64 if s.element_type == PT.F32 else PT.C128, dims)
    if kind == 3:  # IRFFT
        if s.element_type not in COMPLEX:
            raise c.fail(f"IRFFT needs a complex operand, got {_str(s)}")
        if tail[:-1] != lengths[:-1]:
            raise c.fail(f"IRFFT innermost dims {tail} must match fft_length {lengths}")
        if (tail[-1] or lengths[-1]) and tail[-1] != lengths[-1] // 2 + 1:
            raise c.fail(f"IRFFT innermost dim {tail[-1]} must be fft_length/2+1")
        dims = list(s.dims)
        dims[-1] = lengths[-1]
        return array_shape(_complex_component(s.element_type), dims)
    raise c.fail(f"unknown fft_type {kind}")


def _square_matrix(c: _Ctx, s: Shape, what: str) -> None:
    if s.element_type not in FLOATING and s.element_type not in COMPLEX:
        raise c.fail(f"{what} must be floating or complex, got {_str(s)}")
    if s.rank < 2 or s.dims[-1] != s.dims[-2]:
        raise c.fail(f"{what} must have rank >= 2 and square minor dims, got {_str(s)}")


def _cholesky(c: _Ctx) -> Shape:
    c.count(1)
    s = c.array(0)
    _square_matrix(c, s, "operand")
    return s


def _triangular_solve(c: _Ctx) -> Shape:
    c.count(2)
    a, b = c.array(0, "a"), c.array(1, "b")
    _square_matrix(c, a, "a")
    if a.element_type != b.element_type or b.rank != a.rank:
        raise c.fail(f"a {_str(a)} and b {_str(b)} must have the same type and rank")
    opts = c.attrs.triangular_solve_options
    shared = b.dims[-2] if opts.left_side else b.dims[-1]
    if a.dims[-1] != shared:
        raise c.fail(f"shared dimension of a {_str(a)} and b {_str(b)} differs")
    if a.dims[:-2] != b.dims[:-2]:
        raise c.fail(f"batch dims of a {_str(a)} and b {_str(b)} differ")
    if opts.transpose_a == 0:
        raise c.fail("transpose_a is not set")
    return b


def _batch_norm_check(c: _Ctx, n_vectors: int) -> tuple[Shape, Shape]:
    s = c.array(0)
    f = c.attrs.feature_index
    if s.element_type not in FLOATING:
        raise c.fail(f"operand must be floating, got {_str(s)}")
    c.dim(s, f, "feature_index")
    vec = array_shape(s.element_type, (s.dims[f],))
    for i in range(1, 1 + n_vectors):
        if not c.array(i).compatible(vec):
            raise c.fail(f"operand {i} must be {_str(vec)}, got {_str(c.ops[i])}")
    return s, vec


def _batch_norm_training(c: _Ctx) -> Shape:
    c.count(3)
    s, vec = _batch_norm_check(c, 2)
    return Shape.tuple_of([s, vec, vec])


def _batch_norm_inference(c: _Ctx) -> Shape:
    c.count(5)
    s, _ = _batch_norm_check(c, 4)
    return s


def _batch_norm_grad(c: _Ctx) -> Shape:
    c.count(5)
    s, vec = _batch_norm_check(c, 3)
    if c.array(4, "output gradient").dims != s.dims:
        raise c.fail(f"output gradient {_str(c.ops[4])} must match the operand {_str(s)}")
    return Shape.tuple_of([s, vec, vec])


# -- ops whose shape is declared ----------------------------------------------------------------
def _declared(check: Callable[[_Ctx, Shape], None] | None = None) -> Rule:
    def rule(c: _Ctx) -> Shape:
        d = c.need_declared("result shape")
        if check is not None:
            check(c, d)
        return d

    return rule


# Annotation custom-calls: identities on one value (shape kept), or the manual-region
# boundaries (one value, per-device <-> global shape: same rank and element type).
_IDENTITY_CALLS = frozenset({"Sharding", "xla.sdy.FuncResultSharding",
                             "xla.sdy.PropagationBarrier"})
_BOUNDARY_CALLS = frozenset({"SPMDFullToShardShape", "SPMDShardToFullShape"})


def _check_custom_call(c: _Ctx, d: Shape) -> None:
    target = c.attrs.custom_call_target
    if target in _IDENTITY_CALLS:
        c.count(1)
        if not c.ops[0].compatible(d):
            raise c.fail(f"{target} must keep its operand's shape: operand {_str(c.ops[0])}, "
                         f"result {_str(d)}")
    elif target in _BOUNDARY_CALLS:
        c.count(1)
        a = c.array(0)
        if not d.is_array or d.rank != a.rank or d.element_type != a.element_type:
            raise c.fail(f"{target} must keep rank and element type: operand {_str(a)}, "
                         f"result {_str(d)}")


def parameter_is_valid(n_operands: int, number: int) -> bool:
    """All the parameter rule checks (it returns the declared shape): no operands and a
    non-negative parameter number. The verifier asks this instead of running the rule;
    the rule raises the error."""
    return n_operands == 0 and number >= 0


def _check_parameter(c: _Ctx, d: Shape) -> None:
    c.count(0)
    if not parameter_is_valid(0, c.attrs.parameter_number):
        raise c.fail(f"negative parameter number {c.attrs.parameter_number}")


def _check_rng(c: _Ctx, d: Shape) -> None:
    c.count(2)
    a, b = c.array(0), c.array(1)
    if a.rank or b.rank:
        raise c.fail("rng bounds must be scalars")
    if not d.is_array or a.element_type != b.element_type or a.element_type != d.element_type:
        raise c.fail(f"rng bounds {_str(a)}, {_str(b)} and result {_str(d)} differ in type")


def _check_rng_bit_generator(c: _Ctx, d: Shape) -> None:
    c.count(1)
    if d.is_tuple and (len(d.tuple_shapes) != 2 or not d.tuple_shapes[0].compatible(c.ops[0])):
        raise c.fail(f"result {_str(d)} must be (state {_str(c.ops[0])}, values)")


def _check_infeed(c: _Ctx, d: Shape) -> None:
    c.count(1)
    if not (d.is_tuple and len(d.tuple_shapes) == 2 and d.tuple_shapes[1].is_token):
        raise c.fail(f"result must be (data, token), declared {_str(d)}")


def _check_bitcast(c: _Ctx, d: Shape) -> None:
    c.count(1)


_U64_2 = array_shape(PT.U64, (2,))

_RULES: dict[str, Rule] = {
    **{op: _unary for op in _UNARY},
    **{op: _binary for op in _BINARY},
    "copy": _passthrough, "domain": _passthrough, "optimization-barrier": _passthrough,
    "opt-barrier": _passthrough,
    "add-dependency": _passthrough,
    "reduce-precision": _reduce_precision,
    "convert": _convert, "bitcast-convert": _bitcast_convert,
    "stochastic-convert": _stochastic_convert,
    "select": _select, "clamp": _clamp, "map": _map,
    "broadcast": _broadcast, "reshape": _reshape, "transpose": _transpose, "reverse": _reverse,
    "slice": _slice, "dynamic-slice": _dynamic_slice,
    "dynamic-update-slice": _dynamic_update_slice, "pad": _pad, "concatenate": _concatenate,
    "iota": _iota, "get-tuple-element": _get_tuple_element, "tuple": _tuple,
    "constant": _constant,
    "reduce": _reduce, "reduce-window": _reduce_window,
    "select-and-scatter": _select_and_scatter,
    "dot": _dot, "ragged-dot": _ragged_dot, "convolution": _convolution,
    "gather": _gather, "scatter": _scatter, "sort": _sort, "top-k": _top_k, "topk": _top_k,
    "while": _while, "conditional": _conditional, "call": _call, "fusion": _fusion,
    "all-reduce": _all_reduce, "all-reduce-start": _all_reduce_start,
    "all-reduce-done": _passthrough,
    "all-gather": _all_gather, "all-gather-start": _all_gather_start,
    "all-gather-done": _tuple_element(1),
    "reduce-scatter": _reduce_scatter, "all-to-all": _all_to_all,
    "ragged-all-to-all": _ragged_all_to_all, "collective-broadcast": _collective_broadcast,
    "collective-permute": _collective_permute,
    "collective-permute-done": _tuple_element(1),
    "copy-done": _tuple_element(0),
    "partition-id": _fixed(_U32_SCALAR), "replica-id": _fixed(_U32_SCALAR),
    "rng-get-and-update-state": _fixed(_U64_2),
    "after-all": _after_all, "outfeed": _fixed(_TOKEN, None), "send-done": _fixed(_TOKEN, 1),
    "get-dimension-size": _get_dimension_size, "set-dimension-size": _set_dimension_size,
    "fft": _fft, "cholesky": _cholesky, "triangular-solve": _triangular_solve,
    "batch-norm-training": _batch_norm_training,
    "batch-norm-inference": _batch_norm_inference, "batch-norm-grad": _batch_norm_grad,
    # Declared shapes (not derivable from operands and attributes).
    "parameter": _declared(_check_parameter), "custom-call": _declared(_check_custom_call),
    "infeed": _declared(_check_infeed), "rng": _declared(_check_rng),
    "rng-bit-generator": _declared(_check_rng_bit_generator), "bitcast": _declared(_check_bitcast),
    "dynamic-reshape": _declared(), "async-start": _declared(), "async-update": _declared(),
    "async-done": _declared(), "copy-start": _declared(), "send": _declared(),
    "recv": _declared(), "recv-done": _declared(), "collective-permute-start": _declared(),
    # Newer XLA opcodes whose semantics this version does not model.
    "scan": _declared(), "shuffle": _declared(), "collective-reduce": _declared(),
    "scaled-dot": _scaled_dot,
}

#: Non-XLA spellings older code may use -> XLA's opcode string. ``infer_shape`` and the
#: builder accept both; the verifier only XLA's (an alias would not load in XLA).
XLA_SPELLING = {"clz": "count-leading-zeros", "cos": "cosine", "sin": "sine",
                "optimization-barrier": "opt-barrier", "top-k": "topk"}
#: Every opcode the verifier accepts: ``ir.opcodes`` plus any other XLA opcode with a rule.
KNOWN_OPCODES = ALL_OPCODES | (frozenset(_RULES) - frozenset(XLA_SPELLING))

#: Fixed operand counts (the verifier's): ``ir.opcodes.ARITY``.
ARITY: dict[str, int] = _OPCODES_ARITY

#: Opcodes whose whole result shape / element type / dims come from ``declared``, and
#: those that use ``declared`` when given (element type / unrecorded group size): the
#: ``declared-*`` traits of ``ir.opcodes``.
DECLARED_ONLY = frozenset(op for op, t in TRAITS.items() if t.declared == "shape")
DECLARED_ELEMENT_TYPE = frozenset(op for op, t in TRAITS.items() if t.declared == "type")
DECLARED_DIMS = frozenset(op for op, t in TRAITS.items() if t.declared == "dims")
OPTIONAL_DECLARED = frozenset(op for op, t in TRAITS.items() if t.declared == "optional")
#: Opcodes inferred from operands and attributes alone.
INFERRED = frozenset(_RULES) - DECLARED_ONLY - DECLARED_ELEMENT_TYPE - DECLARED_DIMS

# Opcodes whose instructions may call computations (and how many).
CALLED_COUNT: dict[str, int | None] = {
    "while": 2, "call": 1, "map": 1, "reduce": 1, "reduce-window": 1, "sort": 1,
    "scatter": 1, "select-and-scatter": 2, "all-reduce": 1, "all-reduce-start": 1,
    "reduce-scatter": 1, "fusion": 1, "conditional": None, "custom-call": None,
    "async-start": None, "async-update": None, "async-done": None, "scan": None,
    "collective-reduce": None,
}


def has_rule(opcode: str) -> bool:
    """True when the shape of ``opcode`` is checked beyond being declared."""
    return opcode in _RULES and opcode not in DECLARED_ONLY


def infer_shape(opcode: str, operand_shapes: Sequence[Shape],
                attrs: hlo_pb2.HloInstructionProto | None = None,
                called: Sequence["Computation"] = (), declared: Shape | None = None,
                where: str | Callable[[], str] | None = None) -> Shape:
    """The result shape of an ``opcode`` instruction; raises VerifierError when the operands
    or attributes are inconsistent. See the module docstring for ``declared``. ``where``
    may be a function making the text: it is called only when the inference fails."""
    rule = _RULES.get(opcode)
    if rule is None:
        where = where() if callable(where) else where
        if opcode in ALL_OPCODES:
            raise VerifierError(f"{opcode}: no shape rule", where)
        raise VerifierError(f"unknown opcode {opcode!r}", where)
    return rule(_Ctx(opcode, operand_shapes, attrs if attrs is not None else _EMPTY_ATTRS,
                     called, declared, where))


# -- memoised inference -------------------------------------------------------------------------
#: The attribute fields each listed opcode's rule reads. For these opcodes the rule is a
#: pure function of the operand shapes, the declared shape, the called computations'
#: signatures and these fields, so instructions that agree on all of them infer the same
#: shape (a module repeats a few dozen such keys over thousands of instructions). Listed:
#: the rules that cost several times a memo lookup (the elementwise opcodes, below, have
#: a cheaper key of their own). ``tests/test_shape_inference_memo.py`` runs each
#: listed rule on the fixtures through an attrs proxy that fails on any other field:
#: keep an entry in step with its rule.
RULE_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    **{op: () for op in ("reshape", "dynamic-update-slice", "compare", "convert",
                         "select")},
    **{op: ("dimensions",) for op in ("broadcast", "transpose", "reverse", "concatenate",
                                      "reduce")},
    "dynamic-slice": ("dynamic_slice_sizes",),
    "dot": ("dot_dimension_numbers",),
}
#: The elementwise opcodes: one rule each for unary and binary ops, reading the opcode and
#: the operand shapes only (no attribute, no callee, not the declared shape;
#: ``tests/test_shape_inference_memo.py`` runs them through the same proxy). The most
#: common instructions of a model, remembered by the cheapest key.
ELEMENTWISE = frozenset(_UNARY) | frozenset(_BINARY)
# Opcodes whose memo key is the opcode and the shape objects alone.
_SHAPES_ONLY = ELEMENTWISE | frozenset(op for op, names in RULE_ATTRIBUTES.items() if not names)

_FIELDS = hlo_pb2.HloInstructionProto.DESCRIPTOR.fields_by_name


def _field_reader(name: str) -> Callable[[Any], Any]:
    """A hashable view of one attribute field: the value, a tuple for repeated scalars,
    serialized bytes for messages."""
    f = _FIELDS[name]
    repeated = f.is_repeated
    if f.message_type is None:
        # ``[:]`` copies a repeated field in one call (iterating it is per element).
        return (lambda a: tuple(getattr(a, name)[:])) if repeated else (lambda a: getattr(a, name))
    if repeated:
        return lambda a: tuple(m.SerializeToString(deterministic=True) for m in getattr(a, name))
    return lambda a: (a.HasField(name), getattr(a, name).SerializeToString(deterministic=True))


def _only_fields(attrs: hlo_pb2.HloInstructionProto,
                 names: tuple[str, ...]) -> hlo_pb2.HloInstructionProto:
    """A copy of ``attrs`` holding only the fields ``names``."""
    out = hlo_pb2.HloInstructionProto()
    for name in names:
        f = _FIELDS[name]
        if f.is_repeated:
            getattr(out, name).extend(getattr(attrs, name))
        elif f.message_type is not None:
            if attrs.HasField(name):
                getattr(out, name).CopyFrom(getattr(attrs, name))
        else:
            setattr(out, name, getattr(attrs, name))
    return out


_READERS = {op: tuple(_field_reader(n) for n in names) for op, names in RULE_ATTRIBUTES.items()}


class InferenceMemo:
    """``infer_shape`` with the results of the opcodes in ``RULE_ATTRIBUTES`` remembered
    per key: opcode, operand and declared shape objects, the signature of each called
    computation (its parameter and root shape objects: the listed rules read callees
    only through ``program_shape``) and the fields read. A miss runs the rule on a copy of
    the attributes holding only those fields, so what is remembered cannot depend on
    any other field. Keys name objects by identity and the memo holds them: for one
    pass over modules nobody edits meanwhile (e.g. one ``verify_module`` call).
    Failures are not remembered: they raise, once."""

    __slots__ = ("_results", "_signatures")

    def __init__(self) -> None:
        self._results: dict[tuple, tuple] = {}
        self._signatures: dict[int, tuple] = {}

    def infer(self, opcode: str, operand_shapes: Sequence[Shape],
              attrs: hlo_pb2.HloInstructionProto, called: Sequence["Computation"],
              declared: Shape | None, where: str | Callable[[], str] | None) -> Shape:
        """As ``infer_shape``; ``where`` may be a function making the text (only asked
        when an inference runs)."""
        if opcode in _SHAPES_ONLY and not called:
            # (a tuple of ints after the opcode: never equal to a key made below)
            key = (opcode, id(declared), *map(id, operand_shapes))
            got = self._results.get(key)
            if got is None:
                shape = infer_shape(opcode, operand_shapes, _EMPTY_ATTRS, (), declared, where)
                got = self._results[key] = (shape, declared, tuple(operand_shapes))
            return got[0]
        readers = _READERS.get(opcode)
        if readers is None:
            return infer_shape(opcode, operand_shapes, attrs, called, declared, where)
        # (most listed rules read one field: no comprehension for it)
        key = (opcode, id(declared), tuple(map(id, operand_shapes)),
               tuple(map(self._signature, called)) if called else (),
               (readers[0](attrs),) if len(readers) == 1
               else tuple([r(attrs) for r in readers]) if readers else ())
        got = self._results.get(key)
        if got is None:
            shape = infer_shape(opcode, operand_shapes,
                                _only_fields(attrs, RULE_ATTRIBUTES[opcode]), called, declared,
                                where)
            # The key's objects are held, so their ids stay theirs while the memo lives.
            got = self._results[key] = (shape, declared, tuple(operand_shapes))
        return got[0]

    def _signature(self, comp: "Computation") -> tuple:
        got = self._signatures.get(id(comp))
        if got is None:
            try:
                params, result = program_shape(comp)
            except VerifierError:  # no root: a key of its own (the rule reports it)
                params, result = [comp], None
            got = self._signatures[id(comp)] = (tuple(map(id, params)), id(result),
                                                params, result, comp)
        return got[:2]

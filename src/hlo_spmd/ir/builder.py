"""Appending instructions to a computation, with shape inference.

A partitioner handler writes ``b.dynamic_slice(x, offsets, sizes)`` and never computes a
result shape by hand::

    b = Builder(computation)
    pid = b.partition_id()
    ...
    y = b.all_reduce(x, "add", IotaGroups(2, 4, (4, 2), (1, 0)))

Every method validates its operands through ``infer_shape`` (raising ``VerifierError``)
and appends the new instruction with ``computation.add`` (module-unique name and id).
Opcode strings are XLA's own (``cosine``, ``opt-barrier``, ``topk``...), so the saved proto
loads in XLA; older spellings (``cos``, ``clz``, ``top-k``...) are accepted and translated.

Replica groups are given as an explicit ``[num_groups, group_size]`` array (or list of
lists), written to ``collective_device_list.replica_groups``, or as ``IotaGroups``,
written to ``iota_collective_device_list`` (field 92) -- what jaxlib 0.10 itself writes for
``replica_groups=[2,4]<=[4,2]T(1,0)``. ``None`` means one group of all devices.
"""
from __future__ import annotations

import keyword
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence, Union

import numpy as np

from hlo_spmd.errors import VerifierError
from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.opcodes import BUILDER_TAKES_ATTRS, ELEMENTWISE_BINARY, ELEMENTWISE_UNARY
from hlo_spmd.ir.primitive_types import (
    FLOATING,
    SIGNED_INTEGRAL,
    PrimitiveType,
    from_numpy_dtype,
    numpy_dtype,
    text_name,
)
from hlo_spmd.ir.shape import Shape
from hlo_spmd.ir.shape_inference import XLA_SPELLING, InferenceMemo, array_shape, infer_shape
from hlo_spmd.memo import BoundedMemo
from hlo_spmd.proto import hlo_pb2, xla_data_pb2

if TYPE_CHECKING:
    from hlo_spmd.ir.module import Module

PT = PrimitiveType
ElementType = Union[PrimitiveType, int, str, np.dtype, type]


class IotaGroups(NamedTuple):
    """Replica groups ``iota(prod(reshape_dims)).reshape(reshape_dims).transpose(perm)
    .reshape(num_groups, group_size)``; XLA text ``[G,S]<=[reshape]T(perm)``."""

    num_groups: int
    group_size: int
    reshape_dims: tuple[int, ...] = ()
    transpose_perm: tuple[int, ...] = ()

    def to_array(self) -> np.ndarray:
        from hlo_spmd.ir.shape_inference import expand_iota_groups

        return expand_iota_groups(self.num_groups, self.group_size, self.reshape_dims,
                                  self.transpose_perm)


# Short reducer names accepted by ``scalar_computation`` (and every ``reducer=`` argument).
_SHORT_NAMES = {"max": "maximum", "min": "minimum", "mul": "multiply", "sub": "subtract",
                "div": "divide", "sum": "add", "prod": "multiply"}

#: None (one group of all devices), IotaGroups or a plain tuple
#: ``(num_groups, group_size, reshape_dims, transpose_perm)``, or explicit groups.
ReplicaGroups = Union[None, IotaGroups, tuple, np.ndarray, Sequence[Sequence[int]]]


# -- element types and literals ------------------------------------------------------------------
def element_type_of(t: ElementType) -> PrimitiveType:
    """A PrimitiveType from an enum value, an XLA text name ('f32') or a numpy dtype."""
    if isinstance(t, PrimitiveType):
        return t
    if isinstance(t, str):
        from hlo_spmd.ir.primitive_types import from_text

        et = from_text(t.lower())
        if et is not None:
            return et
        return from_numpy_dtype(np.dtype(t))
    if isinstance(t, (int, np.integer)) and not isinstance(t, bool):
        return PT(int(t))
    return from_numpy_dtype(np.dtype(t))


def literal_from_numpy(value: Any, element_type: ElementType) -> xla_data_pb2.LiteralProto:
    """The literal for ``value`` (array or scalar) as ``element_type`` (``ir.literal``)."""
    from hlo_spmd.ir.literal import numpy_to_literal

    et = element_type_of(element_type)
    return numpy_to_literal(np.asarray(value, dtype=numpy_dtype(et)), element_type=et)


def _default_element_type(value: Any) -> PrimitiveType:
    if isinstance(value, (bool, np.bool_)):
        return PT.PRED
    if isinstance(value, int):
        return PT.S32
    if isinstance(value, float):
        return PT.F32
    if isinstance(value, complex):
        return PT.C64
    return from_numpy_dtype(np.asarray(value).dtype)


# Partitioned code asks for the same small constants (zeros, identities, offset tables)
# thousands of times; converting to a literal is the costly part. One literal per distinct
# (element type, bytes) of small arrays; callers copy it into their own attrs.
_LITERALS = BoundedMemo(4096)
_LITERAL_MEMO_BYTES = 1 << 14


def _small_literal(value: Any, et: PrimitiveType) -> xla_data_pb2.LiteralProto:
    arr = np.asarray(value, dtype=numpy_dtype(et))
    if arr.nbytes > _LITERAL_MEMO_BYTES:
        return literal_from_numpy(arr, et)
    key = (int(et), arr.dtype.str, arr.shape, arr.tobytes())
    hit = _LITERALS.get(key)
    if hit is None:
        hit = _LITERALS.put(key, literal_from_numpy(arr, et))
    return hit


# -- per-module state (channel ids, cached scalar computations) -----------------------------------
class _ModuleState:
    __slots__ = ("next_channel", "computations", "inferred")

    def __init__(self) -> None:
        self.next_channel: int | None = None
        self.computations: dict[Any, Computation] = {}
        # Shape inference of the module's builders, remembered per key for the opcodes
        # whose rule is a pure function of it (shape_inference.InferenceMemo: operand and
        # declared shape objects, callee signatures, the fields read; failures are not
        # remembered). A partitioned model builds the same few reduces, dots, broadcasts
        # and reshapes in every layer. Holds its keys' objects while the module lives.
        self.inferred = InferenceMemo()


def _state(module: "Module") -> _ModuleState:
    """The module's state, kept on the module (``Module.builder_state``): it lives
    exactly as long as the module (a cycle with it, which the collector frees)."""
    st = module.builder_state
    if st is None:
        st = module.builder_state = _ModuleState()
    return st


def next_channel_id(module: "Module") -> int:
    """A fresh channel id: (max channel_id in the module) + 1 on first use, then counting up.

    Instructions added later with explicit channel ids not taken from here are not seen;
    call ``reset_channel_ids(module)`` after such edits.
    """
    st = _state(module)
    if st.next_channel is None:
        top = 0
        for inst in module.instructions():
            if inst.attrs.channel_id > top:
                top = inst.attrs.channel_id
        st.next_channel = top + 1
    cid = st.next_channel
    st.next_channel += 1
    return cid


def reset_channel_ids(module: "Module") -> None:
    """Forget the cached counter; the next ``next_channel_id`` rescans the module."""
    _state(module).next_channel = None


def set_replica_groups(attrs: hlo_pb2.HloInstructionProto, groups: ReplicaGroups) -> None:
    """Write replica groups (explicit array / lists, IotaGroups, or None) into ``attrs``."""
    attrs.ClearField("replica_groups")
    attrs.ClearField("collective_device_list")
    attrs.ClearField("iota_collective_device_list")
    attrs.ClearField("mesh_axes_replica_group_list")
    _write_replica_groups(attrs, groups)


# IotaGroups -> its IotaReplicaGroupListProto: the partitioner writes the same few group
# lists on thousands of collectives (copied into each instruction's attrs).
_IOTA_PROTOS = BoundedMemo(4096)


def _iota_list_proto(groups: IotaGroups) -> Any:
    key = (int(groups.num_groups), int(groups.group_size), tuple(groups.reshape_dims),
           tuple(groups.transpose_perm))
    hit = _IOTA_PROTOS.get(key)
    if hit is None:
        iota = hlo_pb2.HloInstructionProto().iota_collective_device_list
        iota.num_replica_groups = int(groups.num_groups)
        iota.num_devices_per_group = int(groups.group_size)
        reshape = list(groups.reshape_dims) or [groups.num_groups * groups.group_size]
        iota.iota_reshape_dims.extend(int(d) for d in reshape)
        iota.iota_transpose_perm.extend(int(p) for p in (groups.transpose_perm
                                                           or range(len(reshape))))
        hit = _IOTA_PROTOS.put(key, iota)
    return hit


def _write_replica_groups(attrs: hlo_pb2.HloInstructionProto, groups: ReplicaGroups) -> None:
    """``set_replica_groups`` on attrs that hold no replica groups yet."""
    if groups is None:
        return
    if (isinstance(groups, tuple) and not isinstance(groups, IotaGroups) and groups
            and isinstance(groups[0], (int, np.integer))):
        groups = IotaGroups(*groups)  # (num_groups, group_size[, reshape_dims, perm])
    if isinstance(groups, IotaGroups):
        attrs.iota_collective_device_list.CopyFrom(_iota_list_proto(groups))
        return
    if isinstance(groups, np.ndarray) and groups.ndim != 2:
        raise ValueError(f"replica groups must be a [num_groups, group_size] array, got "
                         f"shape {groups.shape}")
    cdl = attrs.collective_device_list
    cdl.SetInParent()
    for group in groups:
        cdl.replica_groups.add().replica_ids.extend(int(d) for d in np.asarray(group).reshape(-1))


def _as_list(x: Any) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def make_window(sizes: Sequence[int], strides: Sequence[int] | None = None,
                padding: Sequence[tuple[int, int]] | None = None,
                base_dilations: Sequence[int] | None = None,
                window_dilations: Sequence[int] | None = None,
                reversal: Sequence[bool] | None = None) -> xla_data_pb2.Window:
    """A Window proto; every unspecified stride and dilation is 1, padding 0."""
    n = len(sizes)
    win = xla_data_pb2.Window()
    for i in range(n):
        d = win.dimensions.add()
        d.size = int(sizes[i])
        d.stride = int(strides[i]) if strides else 1
        lo, hi = padding[i] if padding else (0, 0)
        d.padding_low, d.padding_high = int(lo), int(hi)
        d.base_dilation = int(base_dilations[i]) if base_dilations else 1
        d.window_dilation = int(window_dilations[i]) if window_dilations else 1
        d.window_reversal = bool(reversal[i]) if reversal else False
    return win


def conv_dimension_numbers(labels: str) -> xla_data_pb2.ConvolutionDimensionNumbers:
    """Parse XLA's ``dim_labels`` (e.g. ``b01f_01io->b01f``) into dimension numbers."""
    try:
        lhs_rhs, out = labels.split("->")
        lhs, rhs = lhs_rhs.split("_")
    except ValueError:
        raise ValueError(f"bad convolution dim_labels {labels!r}") from None
    dn = xla_data_pb2.ConvolutionDimensionNumbers()

    def spatial(s: str) -> list[int]:
        digits = sorted((int(ch), pos) for pos, ch in enumerate(s) if ch.isdigit())
        if [d for d, _ in digits] != list(range(len(digits))):
            raise ValueError(f"bad spatial labels in {labels!r}")
        return [pos for _, pos in digits]

    if len(lhs) != len(rhs) or len(lhs) != len(out):
        raise ValueError(f"dim_labels {labels!r} have different ranks")
    dn.input_batch_dimension, dn.input_feature_dimension = lhs.index("b"), lhs.index("f")
    dn.input_spatial_dimensions.extend(spatial(lhs))
    dn.kernel_input_feature_dimension = rhs.index("i")
    dn.kernel_output_feature_dimension = rhs.index("o")
    dn.kernel_spatial_dimensions.extend(spatial(rhs))
    dn.output_batch_dimension, dn.output_feature_dimension = out.index("b"), out.index("f")
    dn.output_spatial_dimensions.extend(spatial(out))
    return dn


# -- the builder -----------------------------------------------------------------------------------
class Builder:
    """Appends shape-checked instructions to ``computation``.

    ``metadata`` (an OpMetadata), when set, is copied onto every new instruction, so
    partitioned code keeps the source location of the instruction it came from.
    """

    def __init__(self, computation: Computation,
                 metadata: xla_data_pb2.OpMetadata | None = None) -> None:
        self.computation = computation
        self.metadata = metadata
        self._infer: Any = None  # the module's InferenceMemo.infer, found by the first op

    @property
    def module(self) -> "Module":
        module = self.computation.module
        if module is None:
            raise VerifierError("the computation is not part of a module",
                                f"computation {self.computation.name}")
        return module

    # -- core ---------------------------------------------------------------------------------
    def op(self, opcode: str, operands: Sequence[Instruction] = (),
           attrs: hlo_pb2.HloInstructionProto | None = None,
           called: Sequence[Computation] = (), declared: Shape | None = None,
           name: str | None = None) -> Instruction:
        """Append any instruction; the shape comes from ``infer_shape``."""
        opcode = XLA_SPELLING.get(opcode, opcode)
        operands = list(operands)
        comp = self.computation
        for o in operands:  # one test per operand on the path every handler takes
            if o.__class__ is not Instruction or o.parent is not comp:
                self._bad_operands(opcode, operands)
        if attrs is None:
            attrs = hlo_pb2.HloInstructionProto()
        if self.metadata is not None and not attrs.HasField("metadata"):
            attrs.metadata.CopyFrom(self.metadata)
        infer = self._infer
        if infer is None:
            infer = self._inference()
        shape = infer(opcode, [o.shape for o in operands], attrs, called, declared,
                      self._where)
        inst = Instruction(opcode, shape, operands, "", attrs, called)  # (positional: hot)
        return comp.add(inst, name or opcode)

    def _inference(self):
        """The module's memoised shape inference, or plain ``infer_shape`` while the
        computation belongs to no module yet (asked again by the next op)."""
        module = self.computation.module
        if module is None:
            return infer_shape
        self._infer = _state(module).inferred.infer
        return self._infer

    def _where(self) -> str:
        """Where an inference failure happened (made only when one does)."""
        return f"computation {self.computation.name}"

    def _bad_operands(self, opcode: str, operands: list) -> None:
        for i, o in enumerate(operands):
            if not isinstance(o, Instruction):
                raise TypeError(f"{opcode}: operand {i} is {type(o).__name__}, not an Instruction")
            if o.parent is not self.computation:
                raise VerifierError(f"{opcode}: operand {o.name} belongs to another computation",
                                    f"computation {self.computation.name}")

    def set_root(self, inst: Instruction) -> Instruction:
        if inst.parent is not self.computation:
            raise VerifierError(f"root {inst.name} belongs to another computation",
                                f"computation {self.computation.name}")
        self.computation.root = inst
        return inst

    def new_computation(self, name: str) -> "Builder":
        """A builder for a new computation registered in the module, placed before this
        builder's computation (callees precede callers in the proto)."""
        comp = Computation(name)
        self._register(comp)
        return Builder(comp, self.metadata)

    def _register(self, comp: Computation) -> None:
        module = self.module
        module.add_computation(comp)
        comps = module.computations
        comps.pop()
        try:
            comps.insert(comps.index(self.computation), comp)
        except ValueError:
            comps.insert(0, comp)

    # -- leaves -------------------------------------------------------------------------------
    def parameter(self, number: int, shape: Shape, name: str | None = None) -> Instruction:
        attrs = hlo_pb2.HloInstructionProto(parameter_number=number)
        return self.op("parameter", (), attrs, declared=shape, name=name or f"param_{number}")

    def constant(self, value: Any, element_type: ElementType | None = None,
                 name: str | None = None) -> Instruction:
        """A constant from a numpy array or scalar. Without ``element_type``: the array's
        dtype; Python bool/int/float/complex become pred/s32/f32/c64."""
        et = element_type_of(element_type) if element_type is not None else _default_element_type(value)
        attrs = hlo_pb2.HloInstructionProto()
        attrs.literal.CopyFrom(_small_literal(value, et))
        return self.op("constant", (), attrs, name=name)

    def scalar(self, value: Any, like: Instruction | ElementType) -> Instruction:
        """A scalar constant with the element type of ``like`` (an instruction or a type)."""
        et = like.shape.element_type if isinstance(like, Instruction) else element_type_of(like)
        return self.constant(value, et)

    def iota(self, element_type: ElementType, dims: Sequence[int], dimension: int,
             name: str | None = None) -> Instruction:
        attrs = hlo_pb2.HloInstructionProto(dimensions=[dimension])
        return self.op("iota", (), attrs, declared=array_shape(element_type_of(element_type), dims),
                       name=name)

    def partition_id(self, name: str | None = None) -> Instruction:
        return self.op("partition-id", name=name)

    def replica_id(self, name: str | None = None) -> Instruction:
        return self.op("replica-id", name=name)

    def after_all(self, *tokens: Instruction, name: str | None = None) -> Instruction:
        return self.op("after-all", tokens, name=name)

    # -- elementwise --------------------------------------------------------------------------
    def unary(self, opcode: str, x: Instruction, name: str | None = None) -> Instruction:
        return self.op(opcode, [x], name=name)

    def binary(self, opcode: str, x: Instruction, y: Instruction,
               name: str | None = None) -> Instruction:
        return self.op(opcode, [x, y], name=name)

    def convert(self, x: Instruction, element_type: ElementType,
                name: str | None = None) -> Instruction:
        et = element_type_of(element_type)
        return self.op("convert", [x], declared=array_shape(et, ()), name=name)

    def bitcast_convert(self, x: Instruction, element_type: ElementType,
                        name: str | None = None) -> Instruction:
        et = element_type_of(element_type)
        return self.op("bitcast-convert", [x], declared=array_shape(et, ()), name=name)

    def reduce_precision(self, x: Instruction, exponent_bits: int, mantissa_bits: int,
                         name: str | None = None) -> Instruction:
        attrs = hlo_pb2.HloInstructionProto(exponent_bits=exponent_bits,
                                            mantissa_bits=mantissa_bits)
        return self.op("reduce-precision", [x], attrs, name=name)

    def compare(self, x: Instruction, y: Instruction, direction: str,
                comparison_type: str | None = None, name: str | None = None) -> Instruction:
        direction = direction.upper()
        if direction not in ("EQ", "NE", "LT", "LE", "GT", "GE"):
            raise ValueError(f"unknown comparison direction {direction!r}")
        attrs = hlo_pb2.HloInstructionProto(comparison_direction=direction)
        if comparison_type:
            attrs.comparison_type = comparison_type
        return self.op("compare", [x, y], attrs, name=name)

    def select(self, pred: Instruction, on_true: Instruction, on_false: Instruction,
               name: str | None = None) -> Instruction:
        return self.op("select", [pred, on_true, on_false], name=name)

    def clamp(self, lo: Instruction, x: Instruction, hi: Instruction,
              name: str | None = None) -> Instruction:
        return self.op("clamp", [lo, x, hi], name=name)

    def map(self, operands: Sequence[Instruction], computation: Computation,
            name: str | None = None) -> Instruction:
        rank = operands[0].shape.rank
        attrs = hlo_pb2.HloInstructionProto(dimensions=list(range(rank)))
        return self.op("map", operands, attrs, [computation], name=name)

    # -- data movement ------------------------------------------------------------------------
    def broadcast(self, x: Instruction, out_dims: Sequence[int],
                  dimensions: Sequence[int] | None = None, name: str | None = None) -> Instruction:
        """Broadcast ``x`` to ``out_dims``; ``dimensions[i]`` is the result dim of operand dim
        i (default: the trailing result dims, numpy style)."""
        if dimensions is None:
            dimensions = range(len(out_dims) - x.shape.rank, len(out_dims))
        attrs = hlo_pb2.HloInstructionProto(dimensions=list(dimensions))
        return self.op("broadcast", [x], attrs,
                       declared=array_shape(x.shape.element_type, out_dims), name=name)

    def reshape(self, x: Instruction, dims: Sequence[int], name: str | None = None) -> Instruction:
        return self.op("reshape", [x], declared=array_shape(x.shape.element_type, dims), name=name)

    def transpose(self, x: Instruction, permutation: Sequence[int],
                  name: str | None = None) -> Instruction:
        attrs = hlo_pb2.HloInstructionProto(dimensions=list(permutation))
        return self.op("transpose", [x], attrs, name=name)

    def reverse(self, x: Instruction, dimensions: Sequence[int],
                name: str | None = None) -> Instruction:
        attrs = hlo_pb2.HloInstructionProto(dimensions=list(dimensions))
        return self.op("reverse", [x], attrs, name=name)

    def slice(self, x: Instruction, starts: Sequence[int], limits: Sequence[int],
              strides: Sequence[int] | None = None, name: str | None = None) -> Instruction:
        attrs = hlo_pb2.HloInstructionProto()
        for i, (s, l) in enumerate(zip(starts, limits)):
            attrs.slice_dimensions.add(start=int(s), limit=int(l),
                                       stride=int(strides[i]) if strides else 1)
        if len(starts) != len(limits) or len(attrs.slice_dimensions) != x.shape.rank:
            raise VerifierError(f"slice: {len(starts)} starts / {len(limits)} limits for "
                                f"rank {x.shape.rank}", f"computation {self.computation.name}")
        return self.op("slice", [x], attrs, name=name)

    def _indices(self, offsets: Sequence[Instruction | int]) -> list[Instruction]:
        types = [o.shape.element_type for o in offsets if isinstance(o, Instruction)]
        et = types[0] if types else PT.S32
        return [o if isinstance(o, Instruction) else self.constant(int(o), et) for o in offsets]

    def dynamic_slice(self, x: Instruction, offsets: Sequence[Instruction | int],
                      sizes: Sequence[int], name: str | None = None) -> Instruction:
        """Slice ``sizes`` at scalar start ``offsets`` (instructions or ints)."""
        attrs = hlo_pb2.HloInstructionProto(dynamic_slice_sizes=[int(s) for s in sizes])
        return self.op("dynamic-slice", [x, *self._indices(offsets)], attrs, name=name)

    def dynamic_update_slice(self, x: Instruction, update: Instruction,
                             offsets: Sequence[Instruction | int],
                             name: str | None = None) -> Instruction:
        return self.op("dynamic-update-slice", [x, update, *self._indices(offsets)], name=name)

    def pad(self, x: Instruction, value: Instruction | Any, low: Sequence[int],
            high: Sequence[int], interior: Sequence[int] | None = None,
            name: str | None = None) -> Instruction:
        """Edge padding ``low``/``high`` (may be negative) and ``interior`` padding."""
        if not isinstance(value, Instruction):
            value = self.scalar(value, x)
        attrs = hlo_pb2.HloInstructionProto()
        for i, (lo, hi) in enumerate(zip(low, high)):
            attrs.padding_config.dimensions.add(
                edge_padding_low=int(lo), edge_padding_high=int(hi),
                interior_padding=int(interior[i]) if interior else 0)
        attrs.padding_config.SetInParent()
        return self.op("pad", [x, value], attrs, name=name)

    def concatenate(self, operands: Sequence[Instruction], dimension: int,
                    name: str | None = None) -> Instruction:
        attrs = hlo_pb2.HloInstructionProto(dimensions=[dimension])
        return self.op("concatenate", operands, attrs, name=name)

    def tuple(self, elements: Sequence[Instruction], name: str | None = None) -> Instruction:
        return self.op("tuple", elements, name=name)

    def get_tuple_element(self, x: Instruction, index: int,
                          name: str | None = None) -> Instruction:
        attrs = hlo_pb2.HloInstructionProto(tuple_index=index)
        return self.op("get-tuple-element", [x], attrs, name=name)

    def optimization_barrier(self, x: Instruction, name: str | None = None) -> Instruction:
        return self.op("opt-barrier", [x], name=name)

    # -- computations -------------------------------------------------------------------------
    def scalar_computation(self, opcode: str, element_type: ElementType) -> Computation:
        """``(x: T[], y: T[]) -> T[] opcode(x, y)``, registered in the module and cached per
        (opcode, type) -- the reducer of reduce / all-reduce / reduce-scatter."""
        et = element_type_of(element_type)
        opcode = _SHORT_NAMES.get(opcode, opcode)
        opcode = XLA_SPELLING.get(opcode, opcode)

        def build(sb: Builder) -> None:
            x = sb.parameter(0, array_shape(et, ()), name="x")
            y = sb.parameter(1, array_shape(et, ()), name="y")
            sb.set_root(sb.binary(opcode, x, y))

        return self._cached_computation(("binary", opcode, et), f"{opcode}.{text_name(et)}",
                                        build)

    def comparator_computation(self, direction: str,
                               element_types: Sequence[ElementType]) -> Computation:
        """A sort comparator over ``len(element_types)`` operands comparing the first pair
        (total order for floats, so NaNs sort consistently)."""
        ets = tuple(element_type_of(t) for t in element_types)
        def build(sb: Builder) -> None:
            params = []
            for i, et in enumerate(ets):
                params.append(sb.parameter(2 * i, array_shape(et, ()), name=f"lhs_{i}"))
                params.append(sb.parameter(2 * i + 1, array_shape(et, ()), name=f"rhs_{i}"))
            kind = ("TOTALORDER" if ets[0] in FLOATING else
                    "SIGNED" if ets[0] in SIGNED_INTEGRAL or ets[0] == PT.PRED else "UNSIGNED")
            sb.set_root(sb.compare(params[0], params[1], direction, kind))

        return self._cached_computation(("compare", direction.upper(), ets),
                                        f"compare.{direction.lower()}", build)

    def valid_first_comparator(self, comparator: Computation) -> Computation:
        """``comparator`` over one more operand pair, a pred ``valid``: a valid element
        sorts before an invalid one, two valid ones as ``comparator`` says, two invalid
        ones tie (a strict weak order when ``comparator`` is one). Sorting with it keeps
        padding out of the leading positions whatever the comparator."""
        def build(sb: Builder) -> None:
            params = [sb.parameter(p.parameter_number, p.shape, name=f"{p.name}.v")
                      for p in comparator.parameters]
            n = len(params)
            pred = array_shape(PT.PRED, ())
            va = sb.parameter(n, pred, name="valid_lhs")
            vb = sb.parameter(n + 1, pred, name="valid_rhs")
            inner = sb.call(comparator, params)
            yes, no = sb.constant(True, PT.PRED), sb.constant(False, PT.PRED)
            sb.set_root(sb.select(va, sb.select(vb, inner, yes), no))

        # (the comparator is held by the key: its id stays its own)
        return self._cached_computation(("valid-first", comparator),
                                        f"{comparator.name}.valid_first", build)

    def _cached_computation(self, key: tuple, name: str,
                            build: Callable[["Builder"], None]) -> Computation:
        """The helper computation cached under ``key`` in this module, or a new one named
        ``name`` whose body ``build`` writes, registered and cached."""
        st = _state(self.module)
        comp = st.computations.get(key)
        if comp is not None and comp in self.module.computations:
            return comp
        comp = Computation(name)
        build(Builder(comp))
        self._register(comp)
        st.computations[key] = comp
        return comp

    def _reducer(self, reducer: Computation | str, et: PrimitiveType) -> Computation:
        return self.scalar_computation(reducer, et) if isinstance(reducer, str) else reducer

    # -- reductions and windows ---------------------------------------------------------------
    def reduce(self, x: Instruction | Sequence[Instruction], init: Any,
               dimensions: Sequence[int], reducer: Computation | str,
               name: str | None = None) -> Instruction:
        """Reduce ``x`` (one array or a list, variadic) over ``dimensions``; ``init`` are
        instructions or Python scalars; ``reducer`` a computation or a binary opcode."""
        xs, inits = _as_list(x), _as_list(init)
        inits = [v if isinstance(v, Instruction) else self.scalar(v, xs[i])
                 for i, v in enumerate(inits)]
        comp = self._reducer(reducer, xs[0].shape.element_type)
        attrs = hlo_pb2.HloInstructionProto(dimensions=list(dimensions))
        return self.op("reduce", [*xs, *inits], attrs, [comp], name=name)

    def reduce_window(self, x: Instruction | Sequence[Instruction], init: Any,
                      window: xla_data_pb2.Window | Sequence[int],
                      reducer: Computation | str, strides: Sequence[int] | None = None,
                      padding: Sequence[tuple[int, int]] | None = None,
                      base_dilations: Sequence[int] | None = None,
                      window_dilations: Sequence[int] | None = None,
                      name: str | None = None) -> Instruction:
        xs, inits = _as_list(x), _as_list(init)
        inits = [v if isinstance(v, Instruction) else self.scalar(v, xs[i])
                 for i, v in enumerate(inits)]
        if not isinstance(window, xla_data_pb2.Window):
            window = make_window(window, strides, padding, base_dilations, window_dilations)
        attrs = hlo_pb2.HloInstructionProto()
        attrs.window.CopyFrom(window)
        comp = self._reducer(reducer, xs[0].shape.element_type)
        return self.op("reduce-window", [*xs, *inits], attrs, [comp], name=name)

    def select_and_scatter(self, x: Instruction, source: Instruction, init: Any,
                           window: xla_data_pb2.Window, select: Computation,
                           scatter: Computation | str, name: str | None = None) -> Instruction:
        if not isinstance(init, Instruction):
            init = self.scalar(init, source)
        attrs = hlo_pb2.HloInstructionProto()
        attrs.window.CopyFrom(window)
        comp = self._reducer(scatter, source.shape.element_type)
        return self.op("select-and-scatter", [x, source, init], attrs, [select, comp], name=name)

    # -- contractions -------------------------------------------------------------------------
    def dot(self, lhs: Instruction, rhs: Instruction, lhs_batch: Sequence[int] = (),
            rhs_batch: Sequence[int] = (), lhs_contracting: Sequence[int] = (),
            rhs_contracting: Sequence[int] = (), result_type: ElementType | None = None,
            precision_config: xla_data_pb2.PrecisionConfig | None = None,
            name: str | None = None) -> Instruction:
        attrs = hlo_pb2.HloInstructionProto()
        dn = attrs.dot_dimension_numbers
        dn.lhs_batch_dimensions.extend(lhs_batch)
        dn.rhs_batch_dimensions.extend(rhs_batch)
        dn.lhs_contracting_dimensions.extend(lhs_contracting)
        dn.rhs_contracting_dimensions.extend(rhs_contracting)
        dn.SetInParent()
        if precision_config is not None:
            attrs.precision_config.CopyFrom(precision_config)
        declared = array_shape(element_type_of(result_type), ()) if result_type is not None else None
        return self.op("dot", [lhs, rhs], attrs, declared=declared, name=name)

    def convolution(self, lhs: Instruction, rhs: Instruction,
                    window: xla_data_pb2.Window,
                    dimension_numbers: xla_data_pb2.ConvolutionDimensionNumbers | str,
                    feature_group_count: int = 1, batch_group_count: int = 1,
                    result_type: ElementType | None = None,
                    precision_config: xla_data_pb2.PrecisionConfig | None = None,
                    name: str | None = None) -> Instruction:
        """``dimension_numbers`` is a proto or XLA dim_labels text (``b01f_01io->b01f``)."""
        if isinstance(dimension_numbers, str):
            dimension_numbers = conv_dimension_numbers(dimension_numbers)
        attrs = hlo_pb2.HloInstructionProto(feature_group_count=feature_group_count,
                                            batch_group_count=batch_group_count)
        attrs.window.CopyFrom(window)
        attrs.convolution_dimension_numbers.CopyFrom(dimension_numbers)
        if precision_config is not None:
            attrs.precision_config.CopyFrom(precision_config)
        declared = array_shape(element_type_of(result_type), ()) if result_type is not None else None
        return self.op("convolution", [lhs, rhs], attrs, declared=declared, name=name)

    def gather(self, operand: Instruction, indices: Instruction, slice_sizes: Sequence[int], *,
               offset_dims: Sequence[int], collapsed_slice_dims: Sequence[int],
               start_index_map: Sequence[int], index_vector_dim: int,
               operand_batching_dims: Sequence[int] = (),
               start_indices_batching_dims: Sequence[int] = (),
               indices_are_sorted: bool = False, name: str | None = None) -> Instruction:
        attrs = hlo_pb2.HloInstructionProto(gather_slice_sizes=list(slice_sizes),
                                            indices_are_sorted=indices_are_sorted)
        g = attrs.gather_dimension_numbers
        g.offset_dims.extend(offset_dims)
        g.collapsed_slice_dims.extend(collapsed_slice_dims)
        g.start_index_map.extend(start_index_map)
        g.index_vector_dim = index_vector_dim
        g.operand_batching_dims.extend(operand_batching_dims)
        g.start_indices_batching_dims.extend(start_indices_batching_dims)
        return self.op("gather", [operand, indices], attrs, name=name)

    def scatter(self, operands: Instruction | Sequence[Instruction], indices: Instruction,
                updates: Instruction | Sequence[Instruction],
                update_computation: Computation | str, *, update_window_dims: Sequence[int],
                inserted_window_dims: Sequence[int],
                scatter_dims_to_operand_dims: Sequence[int], index_vector_dim: int,
                input_batching_dims: Sequence[int] = (),
                scatter_indices_batching_dims: Sequence[int] = (),
                indices_are_sorted: bool = False, unique_indices: bool = False,
                name: str | None = None) -> Instruction:
        ops, ups = _as_list(operands), _as_list(updates)
        attrs = hlo_pb2.HloInstructionProto(indices_are_sorted=indices_are_sorted,
                                            unique_indices=unique_indices)
        s = attrs.scatter_dimension_numbers
        s.update_window_dims.extend(update_window_dims)
        s.inserted_window_dims.extend(inserted_window_dims)
        s.scatter_dims_to_operand_dims.extend(scatter_dims_to_operand_dims)
        s.index_vector_dim = index_vector_dim
        s.input_batching_dims.extend(input_batching_dims)
        s.scatter_indices_batching_dims.extend(scatter_indices_batching_dims)
        comp = self._reducer(update_computation, ops[0].shape.element_type)
        return self.op("scatter", [*ops, indices, *ups], attrs, [comp], name=name)

    def sort(self, operands: Instruction | Sequence[Instruction], dimension: int,
             comparator: Computation | None = None, is_stable: bool = False,
             name: str | None = None) -> Instruction:
        """Sort along ``dimension``; default comparator: ascending on the first operand."""
        ops = _as_list(operands)
        if comparator is None:
            comparator = self.comparator_computation("LT", [o.shape.element_type for o in ops])
        attrs = hlo_pb2.HloInstructionProto(dimensions=[dimension], is_stable=is_stable)
        return self.op("sort", ops, attrs, [comparator], name=name)

    def top_k(self, x: Instruction, k: int, largest: bool = True,
              name: str | None = None) -> Instruction:
        attrs = hlo_pb2.HloInstructionProto(k=k, largest=largest)
        return self.op("topk", [x], attrs, name=name)

    # -- control flow -------------------------------------------------------------------------
    def while_loop(self, condition: Computation, body: Computation, init: Instruction,
                   name: str | None = None) -> Instruction:
        return self.op("while", [init], called=[body, condition], name=name)

    def conditional(self, index: Instruction, branches: Sequence[Computation],
                    operands: Sequence[Instruction], name: str | None = None) -> Instruction:
        """``index`` is pred[] (two branches: true, false) or s32[]."""
        return self.op("conditional", [index, *operands], called=list(branches), name=name)

    def call(self, computation: Computation, args: Sequence[Instruction],
             name: str | None = None) -> Instruction:
        return self.op("call", args, called=[computation], name=name)

    def custom_call(self, target: str, operands: Sequence[Instruction], shape: Shape,
                    backend_config: bytes | str = b"", has_side_effect: bool = False,
                    called: Sequence[Computation] = (), api_version: int | None = None,
                    name: str | None = None) -> Instruction:
        attrs = hlo_pb2.HloInstructionProto(custom_call_target=target,
                                            custom_call_has_side_effect=has_side_effect)
        if backend_config:
            attrs.backend_config = (backend_config.encode() if isinstance(backend_config, str)
                                    else backend_config)
        if api_version is not None:
            attrs.custom_call_api_version = api_version
        return self.op("custom-call", operands, attrs, called, declared=shape, name=name)

    # -- collectives --------------------------------------------------------------------------
    def _collective_attrs(self, groups: ReplicaGroups, channel_id: int | None,
                          use_global_device_ids: bool | None) -> hlo_pb2.HloInstructionProto:
        attrs = hlo_pb2.HloInstructionProto()
        _write_replica_groups(attrs, groups)
        attrs.channel_id = channel_id if channel_id is not None else next_channel_id(self.module)
        if use_global_device_ids and groups is not None:
            # Flattened device ids; without groups the mode is cross-partition (all devices).
            attrs.use_global_device_ids = True
        return attrs

    def all_reduce(self, x: Instruction | Sequence[Instruction], reducer: Computation | str,
                   replica_groups: ReplicaGroups, channel_id: int | None = None,
                   use_global_device_ids: bool = True, name: str | None = None) -> Instruction:
        xs = _as_list(x)
        attrs = self._collective_attrs(replica_groups, channel_id, use_global_device_ids)
        comp = self._reducer(reducer, xs[0].shape.element_type)
        return self.op("all-reduce", xs, attrs, [comp], name=name)

    def all_gather(self, x: Instruction | Sequence[Instruction], dimension: int,
                   replica_groups: ReplicaGroups, channel_id: int | None = None,
                   use_global_device_ids: bool = True, name: str | None = None) -> Instruction:
        attrs = self._collective_attrs(replica_groups, channel_id, use_global_device_ids)
        attrs.dimensions.append(dimension)
        return self.op("all-gather", _as_list(x), attrs, name=name)

    def reduce_scatter(self, x: Instruction | Sequence[Instruction], dimension: int,
                       reducer: Computation | str, replica_groups: ReplicaGroups,
                       channel_id: int | None = None, use_global_device_ids: bool = True,
                       name: str | None = None) -> Instruction:
        xs = _as_list(x)
        attrs = self._collective_attrs(replica_groups, channel_id, use_global_device_ids)
        attrs.dimensions.append(dimension)
        comp = self._reducer(reducer, xs[0].shape.element_type)
        return self.op("reduce-scatter", xs, attrs, [comp], name=name)

    def all_to_all(self, x: Instruction | Sequence[Instruction], replica_groups: ReplicaGroups,
                   split_dimension: int | None = None, channel_id: int | None = None,
                   name: str | None = None) -> Instruction:
        """Array form (one operand, ``split_dimension`` split and concatenated in place) or
        tuple form (one operand per group member, no split dimension)."""
        attrs = self._collective_attrs(replica_groups, channel_id, None)
        if split_dimension is not None:
            attrs.dimensions.append(split_dimension)
        return self.op("all-to-all", _as_list(x), attrs, name=name)

    def collective_permute(self, x: Instruction, source_target_pairs: Sequence[tuple[int, int]],
                           channel_id: int | None = None, name: str | None = None) -> Instruction:
        attrs = hlo_pb2.HloInstructionProto(
            channel_id=channel_id if channel_id is not None else next_channel_id(self.module))
        for s, t in source_target_pairs:
            attrs.source_target_pairs.add(source=int(s), target=int(t))
        return self.op("collective-permute", [x], attrs, name=name)


def _method_name(opcode: str) -> str:
    name = opcode.replace("-", "_")
    return name + "_" if keyword.iskeyword(name) else name


def _make_unary(opcode: str):
    def method(self: Builder, x: Instruction, name: str | None = None) -> Instruction:
        return self.op(opcode, [x], name=name)

    method.__doc__ = f"``{opcode}(x)``"
    return method


def _make_binary(opcode: str):
    def method(self: Builder, x: Instruction, y: Instruction,
               name: str | None = None) -> Instruction:
        return self.op(opcode, [x, y], name=name)

    method.__doc__ = f"``{opcode}(x, y)``"
    return method


#: Opcodes with a generated ``b.<name>(x)`` / ``b.<name>(x, y)`` method ('-' -> '_',
#: Python keywords get a trailing '_': ``b.and_``, ``b.not_``); ops whose result needs more
#: than operands (the table's ``builder-attrs``) get none.
UNARY_OPCODES = tuple(sorted(ELEMENTWISE_UNARY - BUILDER_TAKES_ATTRS))
BINARY_OPCODES = tuple(sorted(ELEMENTWISE_BINARY - BUILDER_TAKES_ATTRS))
for _op in UNARY_OPCODES:
    setattr(Builder, _method_name(_op), _make_unary(_op))
for _alias, _op in XLA_SPELLING.items():
    if _op in UNARY_OPCODES:
        setattr(Builder, _method_name(_alias), _make_unary(_op))
for _op in BINARY_OPCODES:
    setattr(Builder, _method_name(_op), _make_binary(_op))
Builder.exp = _make_unary("exponential")  # type: ignore[attr-defined]
Builder.sub = _make_binary("subtract")  # type: ignore[attr-defined]
Builder.mul = _make_binary("multiply")  # type: ignore[attr-defined]
Builder.div = _make_binary("divide")  # type: ignore[attr-defined]
Builder.max = _make_binary("maximum")  # type: ignore[attr-defined]
Builder.min = _make_binary("minimum")  # type: ignore[attr-defined]

"""Immutable shape values: element type, dims, layout, tuple children.

A shape loaded from a proto remembers that proto (outside equality) so that saving an
unchanged shape writes back exactly the bytes that were read, fields we do not model
included.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from hlo_spmd.records import FrozenRecord
from hlo_spmd.ir.primitive_types import (
    ARRAY_TYPES,
    PrimitiveType,
    bit_width,
    is_array_type,
    text_name,
)


# Enum members looked up once: ``PrimitiveType.TUPLE`` is a class-attribute lookup
# through the enum's metaclass, and shapes are asked ``is_tuple`` on every instruction.
_TUPLE = PrimitiveType.TUPLE
_TOKEN = PrimitiveType.TOKEN


_set = object.__setattr__


# Layout and Shape are frozen records (``hlo_spmd.records``: no dataclass exec at import)
# whose ``__eq__`` / ``__hash__`` spell their field tuples out: every shape compare asks.
class Layout(FrozenRecord):
    __slots__ = ("minor_to_major", "tiles", "element_size_in_bits", "memory_space")
    __match_args__ = __slots__
    minor_to_major: tuple[int, ...]
    tiles: tuple[tuple[int, ...], ...]
    element_size_in_bits: int
    memory_space: int

    def __init__(self, minor_to_major: tuple[int, ...], tiles: tuple[tuple[int, ...], ...] = (),
                 element_size_in_bits: int = 0, memory_space: int = 0) -> None:
        self._set_fields(minor_to_major, tiles, element_size_in_bits, memory_space)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return (self.minor_to_major, self.tiles, self.element_size_in_bits,
                    self.memory_space) == (other.minor_to_major, other.tiles,  # type: ignore[attr-defined]
                                           other.element_size_in_bits, other.memory_space)  # type: ignore[attr-defined]
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.minor_to_major, self.tiles, self.element_size_in_bits,
                     self.memory_space))

    @staticmethod
    def default(rank: int) -> "Layout":
        # One value per rank (layouts are immutable); asked for on every derived shape.
        lay = _DEFAULT_LAYOUTS.get(rank)
        if lay is None:
            lay = _DEFAULT_LAYOUTS[rank] = Layout(tuple(range(rank - 1, -1, -1)))
        return lay

    def __str__(self) -> str:
        text = ",".join(str(d) for d in self.minor_to_major)
        extras = []
        if self.tiles:
            extras.append("".join("T(" + ",".join(_tile_dim(d) for d in t) + ")" for t in self.tiles))
        if self.element_size_in_bits:
            extras.append(f"E({self.element_size_in_bits})")
        if self.memory_space:
            extras.append(f"S({self.memory_space})")
        if extras:
            text += ":" + "".join(extras)
        return "{" + text + "}"


_DEFAULT_LAYOUTS: dict[int, Layout] = {}


def _tile_dim(d: int) -> str:
    return "*" if d == -(2**63) else str(d)


class Shape(FrozenRecord):
    __slots__ = ("element_type", "dims", "tuple_shapes", "layout", "dynamic_dims",
                 "source_proto")
    # ``source_proto`` is outside the value: not compared, hashed or printed.
    __match_args__ = ("element_type", "dims", "tuple_shapes", "layout", "dynamic_dims")
    element_type: PrimitiveType
    dims: tuple[int, ...]
    tuple_shapes: tuple["Shape", ...]
    layout: Layout | None
    # True for a bounded-dynamic dimension (`f32[<=8]`).
    dynamic_dims: tuple[bool, ...]
    # The ShapeProto this value was read from, reused on save; not part of the value.
    source_proto: Any

    def __init__(self, element_type: PrimitiveType, dims: tuple[int, ...] = (),
                 tuple_shapes: tuple["Shape", ...] = (), layout: Layout | None = None,
                 dynamic_dims: tuple[bool, ...] = (), source_proto: Any = None) -> None:
        # (set one by one, not through ``_set_fields``: shapes are made on every derived
        # value, and ``source_proto`` is not a field)
        _set(self, "element_type", element_type)
        _set(self, "dims", dims)
        _set(self, "tuple_shapes", tuple_shapes)
        _set(self, "layout", layout)
        _set(self, "dynamic_dims", dynamic_dims)
        _set(self, "source_proto", source_proto)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return (self.element_type, self.dims, self.tuple_shapes, self.layout,
                    self.dynamic_dims) == (other.element_type, other.dims,  # type: ignore[attr-defined]
                                           other.tuple_shapes, other.layout,  # type: ignore[attr-defined]
                                           other.dynamic_dims)  # type: ignore[attr-defined]
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.element_type, self.dims, self.tuple_shapes, self.layout,
                     self.dynamic_dims))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # A copy keeps the proto it was read from (saved back as read).
        return Shape, self._fields() + (self.source_proto,)

    # -- constructors -------------------------------------------------------------------
    @staticmethod
    def array(element_type: PrimitiveType | int, dims: Iterable[int],
              layout: Layout | None | str = "default") -> "Shape":
        dims = tuple(int(d) for d in dims)
        if layout == "default":
            layout = Layout.default(len(dims))
        return Shape(PrimitiveType(element_type), dims, (), layout)

    @staticmethod
    def tuple_of(shapes: Sequence["Shape"]) -> "Shape":
        return Shape(PrimitiveType.TUPLE, (), tuple(shapes), None)

    @staticmethod
    def token() -> "Shape":
        return Shape(PrimitiveType.TOKEN)

    # -- queries ------------------------------------------------------------------------
    @property
    def is_tuple(self) -> bool:
        return self.element_type == _TUPLE

    @property
    def is_array(self) -> bool:
        # The set test first (most shapes are arrays); the call handles the rest.
        return self.element_type in ARRAY_TYPES or is_array_type(self.element_type)

    @property
    def is_token(self) -> bool:
        return self.element_type == _TOKEN

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def num_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    def byte_size(self) -> int:
        """Bytes of the dense array (sub-byte types packed), or the sum over a tuple."""
        if self.is_tuple:
            return sum(s.byte_size() for s in self.tuple_shapes)
        if not self.is_array:
            return 0
        return (self.num_elements * bit_width(self.element_type) + 7) // 8

    def leaves(self) -> list[tuple[tuple[int, ...], "Shape"]]:
        """(shape index, array shape) for every non-tuple leaf, in pre-order."""
        if not self.is_tuple:
            return [((), self)]
        out: list[tuple[tuple[int, ...], Shape]] = []
        for i, child in enumerate(self.tuple_shapes):
            out.extend(((i,) + idx, leaf) for idx, leaf in child.leaves())
        return out

    def subshape(self, index: Sequence[int]) -> "Shape":
        s = self
        for i in index:
            s = s.tuple_shapes[i]
        return s

    # -- derived shapes -----------------------------------------------------------------
    def with_dims(self, dims: Iterable[int]) -> "Shape":
        """Same element type with new dims; keeps the layout when the rank is unchanged."""
        dims = tuple(map(int, dims))
        layout = self.layout
        if layout is not None and len(dims) != len(self.dims):
            layout = Layout.default(len(dims))
        dyn = self.dynamic_dims if len(self.dynamic_dims) == len(dims) else ()
        return Shape(self.element_type, dims, (), layout, dyn)

    def with_element_type(self, element_type: PrimitiveType | int) -> "Shape":
        return Shape(PrimitiveType(element_type), self.dims, self.tuple_shapes, self.layout,
                     self.dynamic_dims)

    def without_layout(self) -> "Shape":
        if self.is_tuple:
            return Shape.tuple_of([s.without_layout() for s in self.tuple_shapes])
        return Shape(self.element_type, self.dims, (), None, self.dynamic_dims)

    def compatible(self, other: "Shape") -> bool:
        """Equal ignoring layout (XLA's ShapeUtil::Compatible)."""
        if self.is_tuple or other.is_tuple:
            return (self.is_tuple and other.is_tuple
                    and len(self.tuple_shapes) == len(other.tuple_shapes)
                    and all(a.compatible(b) for a, b in zip(self.tuple_shapes, other.tuple_shapes)))
        return self.element_type == other.element_type and self.dims == other.dims

    # -- text ---------------------------------------------------------------------------
    def to_text(self, print_layout: bool = True) -> str:
        if self.is_tuple:
            return "(" + ", ".join(s.to_text(print_layout) for s in self.tuple_shapes) + ")"
        name = text_name(self.element_type)
        if self.element_type in (PrimitiveType.TOKEN, PrimitiveType.OPAQUE_TYPE):
            return f"{name}[]"
        dims = ",".join(
            ("<=" if i < len(self.dynamic_dims) and self.dynamic_dims[i] else "") + str(d)
            for i, d in enumerate(self.dims))
        text = f"{name}[{dims}]"
        if print_layout and self.layout is not None and self.is_array and self.rank > 0:
            # XLA prints no layout for scalars.
            text += str(self.layout)
        return text

    def __str__(self) -> str:
        return self.to_text()

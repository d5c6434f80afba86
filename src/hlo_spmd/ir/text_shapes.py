"""Shape and layout text exactly as XLA prints and parses it.

``format_shape`` is ShapeUtil::PrintHumanString(WithLayout): ``f32[8,16]{1,0}``,
``pred[]``, ``(f32[2]{0}, s32[], /*index=5*/...)`` (an index comment before every 5th
tuple element), bounded dynamic ``<=8``, unbounded ``?``, ``token[]``.  Layouts are
``{minor_to_major:T(..)(..)L(n)#(type)*(type)E(n)S(n)SC(..)P(shape)M(n)}``; scalars print
no ``{}``.

``parse_shape`` reads the same syntax (layout optional; a missing layout becomes the
default one, as XLA's parser does) and returns an IR ``Shape`` whose ``source_proto`` is
the ShapeProto XLA would write for it, so saving reproduces jaxlib's bytes (tail
padding alignment 1, explicit ``is_dynamic_dimension``...).  Parsed shapes are cached by
their exact text: HLO modules repeat a handful of shapes thousands of times.
"""
from __future__ import annotations

import re
from typing import Any

from hlo_spmd.ir.primitive_types import PrimitiveType, text_name
from hlo_spmd.ir.primitive_types import from_text as _type_from_text
from hlo_spmd.ir.shape import Layout, Shape
from hlo_spmd.proto import xla_data_pb2

__all__ = ["format_shape", "format_shape_proto", "format_layout_proto", "parse_shape",
           "shape_from_text", "UNBOUNDED", "ShapeParser"]

P = PrimitiveType
UNBOUNDED = -(2 ** 63)          # Shape::kUnboundedSize
_COMBINE = -(2 ** 63)           # Tile::kCombineDimension, printed '*'
_NON_ARRAY = {P.TUPLE, P.TOKEN, P.OPAQUE_TYPE, P.BUFFER, P.PRIMITIVE_TYPE_INVALID}


# -- printing ---------------------------------------------------------------------------
def _tile_text(dims) -> str:
    return "(" + ",".join("*" if d == _COMBINE else str(d) for d in dims) + ")"


def _layout_text(m2m, tiles, element_size_in_bits: int, memory_space: int,
                 extra: Any = None) -> str:
    """Layout::Print; ``extra`` is a LayoutProto for the fields the IR Layout lacks."""
    out = ["{", ",".join(map(str, m2m))]
    parts: list[str] = []
    if tiles:
        parts.append("T" + "".join(_tile_text(t) for t in tiles))
    if extra is not None:
        tpa = extra.tail_padding_alignment_in_elements
        if tpa not in (0, 1):
            parts.append(f"L({tpa})")
        if extra.index_primitive_type:
            parts.append(_type_attr("#", extra.index_primitive_type))
        if extra.pointer_primitive_type:
            parts.append(_type_attr("*", extra.pointer_primitive_type))
    if element_size_in_bits:
        parts.append(f"E({element_size_in_bits})")
    if memory_space:
        parts.append(f"S({memory_space})")
    if extra is not None:
        if len(extra.split_configs):
            parts.append("SC" + "".join(
                f"({sc.dimension}:" + ",".join(map(str, sc.split_indices)) + ")"
                for sc in extra.split_configs))
        if extra.HasField("physical_shape"):
            parts.append("P(" + format_shape_proto(extra.physical_shape) + ")")
        if extra.dynamic_shape_metadata_prefix_bytes > 0:
            parts.append(f"M({extra.dynamic_shape_metadata_prefix_bytes})")
    if parts:
        out.append(":")
        out.extend(parts)
    out.append("}")
    return "".join(out)


def _type_attr(sym: str, t: int) -> str:
    from hlo_spmd.ir.primitive_types import is_integral

    try:
        ok = is_integral(t)
    except ValueError:
        ok = False
    return f"{sym}({text_name(t)})" if ok else f"{sym}(invalid)"


def format_layout_proto(lp: xla_data_pb2.LayoutProto) -> str:
    return _layout_text(lp.minor_to_major, [tuple(t.dimensions) for t in lp.tiles],
                        lp.element_size_in_bits, lp.memory_space, lp)


def _dims_text(dims, dynamic) -> str:
    if not dynamic:
        return ",".join(map(str, dims))
    return ",".join(("?" if d == UNBOUNDED else f"<={d}") if dyn else str(d)
                    for d, dyn in zip(dims, dynamic))


def _tuple_text(children: list[str]) -> str:
    parts = []
    for i, c in enumerate(children):
        if i == 0:
            parts.append(c)
        elif i % 5 == 0:
            parts.append(f", /*index={i}*/" + c)
        else:
            parts.append(", " + c)
    return "(" + "".join(parts) + ")"


def format_shape(shape: Shape, layout: bool = True) -> str:
    """ShapeUtil::PrintHumanString / PrintHumanStringWithLayout of an IR Shape."""
    et = shape.element_type
    if et == P.TUPLE:
        return _tuple_text([format_shape(s, layout) for s in shape.tuple_shapes])
    if et in _NON_ARRAY:
        return text_name(et) + "[]"
    text = f"{text_name(et)}[{_dims_text(shape.dims, shape.dynamic_dims)}]"
    if layout and shape.layout is not None:
        lay = shape.layout
        src = shape.source_proto
        extra = src.layout if src is not None and src.HasField("layout") else None
        lt = _layout_text(lay.minor_to_major, lay.tiles, lay.element_size_in_bits,
                          lay.memory_space, extra)
        if shape.dims or lt != "{}":
            text += lt
    return text


def format_shape_proto(sp: xla_data_pb2.ShapeProto, layout: bool = True) -> str:
    """The same text for a ShapeProto (operand layout constraints, literals, outfeed)."""
    et = sp.element_type
    if et == P.TUPLE:
        return _tuple_text([format_shape_proto(s, layout) for s in sp.tuple_shapes])
    if et in _NON_ARRAY:
        return text_name(et) + "[]"
    dyn = tuple(sp.is_dynamic_dimension) if any(sp.is_dynamic_dimension) else ()
    text = f"{text_name(et)}[{_dims_text(sp.dimensions, dyn)}]"
    if layout and sp.HasField("layout"):
        lt = format_layout_proto(sp.layout)
        if len(sp.dimensions) or lt != "{}":
            text += lt
    return text


# -- parsing ------------------------------------------------------------------------------
# Fast path: a plain array shape with an optional plain layout (no ':' extras).
_ARRAY_RE = re.compile(
    r"([a-z][a-z0-9]*)\[([0-9,]*)\](?:\{(?=[ \t\n\r]*[0-9])([0-9, ]*)\})?")
_ARRAY_HEAD = re.compile(r"([a-z][a-z0-9]*)\[")
_LAYOUT_START = re.compile(r"\{(?=(?:[ \t\n\r]+|/\*.*?\*/)*[0-9:])", re.S)


def _array_proto(et: int, dims, dynamic, layout_proto) -> xla_data_pb2.ShapeProto:
    sp = xla_data_pb2.ShapeProto(element_type=et)
    if dims:
        sp.dimensions.extend(dims)
        sp.is_dynamic_dimension.extend(dynamic if dynamic else [False] * len(dims))
    if layout_proto is not None:
        sp.layout.CopyFrom(layout_proto)
    return sp


def _default_layout_proto(rank: int) -> xla_data_pb2.LayoutProto:
    lp = xla_data_pb2.LayoutProto()
    lp.minor_to_major.extend(range(rank - 1, -1, -1))
    lp.tail_padding_alignment_in_elements = 1
    return lp


def _ir_layout(lp: xla_data_pb2.LayoutProto) -> Layout:
    return Layout(tuple(lp.minor_to_major), tuple(tuple(t.dimensions) for t in lp.tiles),
                  lp.element_size_in_bits, lp.memory_space)


class ShapeParser:
    """Parses shapes at a Cursor; caches Shape objects by their exact source text."""

    __slots__ = ("cache",)

    def __init__(self) -> None:
        self.cache: dict[str, Shape] = {}

    def can_start(self, cursor) -> bool:
        """True if a shape (``(``, or ``name[``) starts at the cursor."""
        pos = cursor.skip_ws()
        text = cursor.text
        if pos >= cursor.n:
            return False
        c = text[pos]
        if c == "(":
            return True
        return _ARRAY_HEAD.match(text, pos) is not None

    def parse(self, cursor, what: str = "shape") -> Shape:
        pos = cursor.skip_ws()
        text = cursor.text
        m = _ARRAY_RE.match(text, pos)
        if m is not None:
            end = m.end()
            # A trailing '{' that starts a layout the fast regex did not take -> slow path.
            if not (end < cursor.n and text[end] in "{ \t\n\r/" and
                    _LAYOUT_START.match(text, _skip_blank(text, end))):
                key = m.group(0)
                shape = self.cache.get(key)
                if shape is None:
                    shape = self._array_fast(cursor, m, pos)
                if shape is not None:
                    self.cache[key] = shape
                    cursor.pos = end
                    return shape
        start = pos
        shape = self._parse_slow(cursor, what)
        key = text[start:cursor.pos]
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        self.cache[key] = shape
        return shape

    def _array_fast(self, cursor, m: re.Match, pos: int) -> Shape:
        et = _type_from_text(m.group(1))
        if et is None or et in (P.TUPLE, P.BUFFER, P.PRIMITIVE_TYPE_INVALID):
            raise cursor.error(f"unknown element type '{m.group(1)}' in shape", pos)
        dims_text = m.group(2)
        try:
            dims = tuple(int(d) for d in dims_text.split(",")) if dims_text else ()
        except ValueError:
            return None  # let the slow path point at the bad token
        if any(not _INT64_MIN <= d <= _INT64_MAX for d in dims):
            return None  # (the slow path reads each dim as an int64 and names the bad one)
        if et in (P.TOKEN, P.OPAQUE_TYPE):
            if dims:
                raise cursor.error(f"{text_name(et)} shapes have no dimensions", pos)
            return Shape(et, (), (), None, (), source_proto=xla_data_pb2.ShapeProto(element_type=et))
        lay_text = m.group(3)
        if lay_text is None:
            lp = _default_layout_proto(len(dims))
        else:
            lp = xla_data_pb2.LayoutProto()
            items = [x.strip() for x in lay_text.split(",")] if lay_text.strip() else []
            try:
                m2m = [int(x) for x in items]
            except ValueError:
                return None
            if any(not _INT64_MIN <= x <= _INT64_MAX for x in m2m):
                return None
            _check_m2m(cursor, m2m, len(dims), m.start(3) - 1)
            lp.minor_to_major.extend(m2m)
            lp.tail_padding_alignment_in_elements = 1
        sp = _array_proto(et, dims, None, lp)
        return Shape(et, dims, (), _ir_layout(lp), (), source_proto=sp)

    def _parse_slow(self, cursor, what: str) -> Shape:
        pos = cursor.skip_ws()
        text = cursor.text
        if cursor.eat("("):
            children: list[Shape] = []
            if not cursor.eat(")"):
                while True:
                    children.append(self.parse(cursor, what))
                    if cursor.eat(","):
                        continue
                    cursor.expect(")", "expected ',' or ')' in tuple shape")
                    break
            sp = xla_data_pb2.ShapeProto(element_type=P.TUPLE)
            for c in children:
                sp.tuple_shapes.add().CopyFrom(c.source_proto)
            return Shape(P.TUPLE, (), tuple(children), None, (), source_proto=sp)
        m = _ARRAY_HEAD.match(text, pos)
        if m is None:
            raise cursor.error(f"expected {what} but found {cursor.describe(pos)}", pos)
        et = _type_from_text(m.group(1))
        if et is None or et in (P.TUPLE, P.BUFFER, P.PRIMITIVE_TYPE_INVALID):
            raise cursor.error(f"expected {what} but found {cursor.describe(pos)} "
                               f"(unknown element type)", pos)
        cursor.pos = m.end()
        dims: list[int] = []
        dynamic: list[bool] = []
        if not cursor.eat("]"):
            while True:
                if cursor.eat("?"):
                    dims.append(UNBOUNDED)
                    dynamic.append(True)
                else:
                    dyn = cursor.eat("<=")
                    d = cursor.int("dimension size")
                    if d < 0:
                        raise cursor.error("negative dimension size in shape")
                    dims.append(d)
                    dynamic.append(dyn)
                if cursor.eat(","):
                    continue
                cursor.expect("]", "expected ',' or ']' in shape dimensions")
                break
        if et in (P.TOKEN, P.OPAQUE_TYPE):
            if dims:
                raise cursor.error(f"{text_name(et)} shapes have no dimensions", pos)
            return Shape(et, (), (), None, (), source_proto=xla_data_pb2.ShapeProto(element_type=et))
        lp = None
        lpos = cursor.skip_ws()
        if lpos < cursor.n and text[lpos] == "{" and _LAYOUT_START.match(text, lpos):
            lp = self._layout(cursor, len(dims))
        if lp is None:
            lp = _default_layout_proto(len(dims))
        dyn_t = tuple(dynamic) if any(dynamic) else ()
        sp = _array_proto(et, dims, dynamic, lp)
        return Shape(et, tuple(dims), (), _ir_layout(lp), dyn_t, source_proto=sp)

    def _layout(self, cursor, rank: int) -> xla_data_pb2.LayoutProto:
        start = cursor.expect("{")
        lp = xla_data_pb2.LayoutProto()
        lp.tail_padding_alignment_in_elements = 1
        m2m: list[int] = []
        if cursor.peek() not in (":", "}"):
            while True:
                m2m.append(cursor.int("minor_to_major entry"))
                if not cursor.eat(","):
                    break
        _check_m2m(cursor, m2m, rank, start)
        lp.minor_to_major.extend(m2m)
        if cursor.eat(":"):
            if cursor.keyword("D"):
                cursor.expect("(")
                kinds = {"D": 0, "C": 1, "S": 2, "H": 3}
                if not cursor.eat(")"):
                    while True:
                        k = cursor.ident("dim level type")
                        if k not in kinds:
                            raise cursor.error(f"unknown dim level type '{k}'")
                        lp.dim_level_types.append(kinds[k])
                        cursor.eat("+")
                        cursor.eat("~")
                        if cursor.eat(","):
                            continue
                        cursor.expect(")")
                        break
            if cursor.keyword("T"):
                while cursor.peek() == "(":
                    cursor.expect("(")
                    tile = lp.tiles.add()
                    if not cursor.eat(")"):
                        while True:
                            if cursor.eat("*"):
                                tile.dimensions.append(_COMBINE)
                            else:
                                tile.dimensions.append(cursor.int("tile dimension"))
                            if cursor.eat(","):
                                continue
                            cursor.expect(")")
                            break
            if cursor.keyword("L"):
                lp.tail_padding_alignment_in_elements = self._paren_int(cursor)
            if cursor.eat("#"):
                lp.index_primitive_type = self._paren_type(cursor)
            if cursor.eat("*"):
                lp.pointer_primitive_type = self._paren_type(cursor)
            if cursor.keyword("E"):
                lp.element_size_in_bits = self._paren_int(cursor)
            if cursor.keyword("S"):
                lp.memory_space = self._paren_int(cursor)
            if cursor.keyword("SC"):
                while cursor.peek() == "(":
                    cursor.expect("(")
                    sc = lp.split_configs.add()
                    sc.dimension = cursor.int()
                    cursor.expect(":")
                    if not cursor.eat(")"):
                        while True:
                            sc.split_indices.append(cursor.int())
                            if cursor.eat(","):
                                continue
                            cursor.expect(")")
                            break
            if cursor.keyword("P"):
                cursor.expect("(")
                lp.physical_shape.CopyFrom(self.parse(cursor).source_proto)
                cursor.expect(")")
            if cursor.keyword("M"):
                lp.dynamic_shape_metadata_prefix_bytes = self._paren_int(cursor)
        cursor.expect("}", "expected '}}' at the end of the layout")
        return lp

    @staticmethod
    def _paren_int(cursor) -> int:
        cursor.expect("(")
        v = cursor.int()
        cursor.expect(")")
        return v

    @staticmethod
    def _paren_type(cursor) -> int:
        cursor.expect("(")
        pos = cursor.skip_ws()
        name = cursor.ident("primitive type")
        t = _type_from_text(name)
        if t is None:
            raise cursor.error(f"unknown primitive type '{name}'", pos)
        cursor.expect(")")
        return int(t)


_INT64_MIN, _INT64_MAX = -2 ** 63, 2 ** 63 - 1


def _skip_blank(text: str, pos: int) -> int:
    n = len(text)
    while pos < n and text[pos] in " \t\n\r":
        pos += 1
    return pos


def _check_m2m(cursor, m2m: list[int], rank: int, pos: int) -> None:
    if len(m2m) != rank:
        raise cursor.error(f"layout has {len(m2m)} minor_to_major entries but the shape has "
                           f"{rank} dimensions", pos)
    if sorted(m2m) != list(range(rank)):
        raise cursor.error(f"layout {{{','.join(map(str, m2m))}}} is not a permutation of the "
                           f"dimensions", pos)


_DEFAULT_PARSER = ShapeParser()


def parse_shape(cursor, what: str = "shape") -> Shape:
    return _DEFAULT_PARSER.parse(cursor, what)


def shape_from_text(text: str) -> Shape:
    """Parse a standalone shape string such as ``f32[8,16]{0,1}``."""
    from hlo_spmd.ir.text_lexer import Cursor

    c = Cursor(text, "<shape>")
    s = _DEFAULT_PARSER.parse(c)
    if not c.at_end():
        raise c.error(f"unexpected text after the shape: {c.describe()}")
    return s

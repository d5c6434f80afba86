"""Shardy (``sdy``) attribute text: parsing, and conversion to ``HloSharding``.

A module that JAX exports with its default (Shardy) partitioner carries the user's
shardings as MLIR attribute text inside frontend attributes:

* module ``xla.sdy.meshes``: ``{mesh = #sdy.mesh<["x"=2, "y"=4]>, other = ...}``;
* parameters ``xla.sdy.sharding``: ``#sdy.sharding<@mesh, [{"x"}, {"y", ?}]>``;
* ops ``xla.sdy.sharding``: ``#sdy.sharding_per_value<[<@mesh, [{"x"}, {}]>, ...]>``;
* manual computations ``xla.sdy.manual_axes``: ``#sdy<manual_axes{"x", "y"}>`` with
  ``xla.sdy.in_shardings`` / ``xla.sdy.out_shardings`` (per-value form).

Grammar accepted (whitespace is free between tokens)::

    mesh         := '#sdy.mesh' mesh-body | 'mesh' mesh-body | mesh-body
    mesh-body    := '<' '[' (axis (',' axis)*)? ']' (',' 'device_ids' '=' '[' ints ']')? '>'
    axis         := string '=' int
    sharding     := '#sdy.sharding' tensor | tensor
    tensor       := '<' (mesh-ref | 'mesh' mesh-body) ',' '[' (dim (',' dim)*)? ']'
                    (',' ('replicated' | 'unreduced') '=' '{' axis-refs '}')* '>'
    mesh-ref     := '@' (identifier | string)
    dim          := '{' (axis-ref (',' axis-ref)* (',' '?')? | '?')? '}' ('p' int)?
    axis-ref     := string (':' '(' int ')' int)?          -- "x":(pre)size, a sub-axis
    per-value    := '#sdy.sharding_per_value' '<' '[' (tensor (',' tensor)*)? ']' '>'
    manual-axes  := '#sdy' '<' 'manual_axes' '{' (string (',' string)*)? '}' '>'
    meshes       := '{' (name '=' mesh (',' name '=' mesh)*)? '}'

Conversion to an ``HloSharding`` follows XLA's Shardy export: every mesh axis is cut
into the sub-axes the sharding mentions; tensor dims are tiled by their axes in the
order listed (major to minor); manual axes (of enclosing manual computations) form a
``manual`` subgroup dim, unreduced axes an ``unreduced`` one, and all remaining axes
replicate (``last_tile_dim_replicate``).  A mesh with ``device_ids`` gives an explicit
tile assignment, otherwise an iota one.  Open dims (``{?}``, ``{"x", ?}``) are the
"unspecified dims" that propagation may still refine.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np

from hlo_spmd.errors import ShardingError

__all__ = [
    "AxisRef", "MeshAxis", "SdyMesh", "DimSharding", "TensorSharding",
    "parse_mesh", "parse_meshes", "parse_sharding", "parse_sharding_per_value",
    "parse_shardings", "parse_manual_axes", "resolve_mesh", "to_hlo_sharding",
    "erase_axes",
]


# ---------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AxisRef:
    """A mesh axis, or the sub-axis ``name:(pre_size)size`` of one."""

    name: str
    pre_size: int | None = None
    size: int | None = None

    @property
    def is_sub_axis(self) -> bool:
        return self.pre_size is not None

    def extent(self, mesh: "SdyMesh") -> tuple[int, int]:
        """(pre_size, size) inside the full axis; a full axis is (1, axis size)."""
        if self.pre_size is None:
            return 1, mesh.axis_size(self.name)
        assert self.size is not None
        return self.pre_size, self.size

    def __str__(self) -> str:
        text = _quote(self.name)
        if self.pre_size is not None:
            text += f":({self.pre_size}){self.size}"
        return text


@dataclass(frozen=True)
class MeshAxis:
    name: str
    size: int


@dataclass(frozen=True)
class SdyMesh:
    """``#sdy.mesh<[...], device_ids=[...]>``; empty ``device_ids`` means iota order."""

    axes: tuple[MeshAxis, ...] = ()
    device_ids: tuple[int, ...] = ()

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    @property
    def total_size(self) -> int:
        return math.prod(a.size for a in self.axes)

    @property
    def is_maximal(self) -> bool:
        """No axes and one device id: everything on that device."""
        return not self.axes and len(self.device_ids) == 1

    def has_axis(self, name: str) -> bool:
        return any(a.name == name for a in self.axes)

    def axis_size(self, name: str) -> int:
        for a in self.axes:
            if a.name == name:
                return a.size
        raise ShardingError(f"mesh {self} has no axis {_quote(name)}")

    def __str__(self) -> str:
        text = "#sdy.mesh<[" + ", ".join(f"{_quote(a.name)}={a.size}" for a in self.axes) + "]"
        if self.device_ids:
            text += ", device_ids=[" + ", ".join(map(str, self.device_ids)) + "]"
        return text + ">"


@dataclass(frozen=True)
class DimSharding:
    """The axes tiling one tensor dim; open (``?``) dims may be sharded further."""

    axes: tuple[AxisRef, ...] = ()
    is_closed: bool = True
    priority: int | None = None

    def __str__(self) -> str:
        parts = [str(a) for a in self.axes]
        if not self.is_closed:
            parts.append("?")
        text = "{" + ", ".join(parts) + "}"
        if self.priority is not None:
            text += f"p{self.priority}"
        return text


@dataclass(frozen=True)
class TensorSharding:
    """``#sdy.sharding<mesh, [dims], replicated={...}, unreduced={...}>``.

    ``mesh`` is the referenced mesh's name (``@mesh``) or an inline ``SdyMesh``.
    """

    mesh: str | SdyMesh
    dims: tuple[DimSharding, ...] = ()
    replicated: tuple[AxisRef, ...] = ()
    unreduced: tuple[AxisRef, ...] = ()
    text: str = field(default="", compare=False)

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def open_dims(self) -> tuple[int, ...]:
        """Dims marked ``?``: XLA's "unspecified dims" of a sharding constraint."""
        return tuple(i for i, d in enumerate(self.dims) if not d.is_closed)

    @property
    def priorities(self) -> dict[int, int]:
        return {i: d.priority for i, d in enumerate(self.dims) if d.priority is not None}

    def axis_refs(self) -> list[AxisRef]:
        out = [a for d in self.dims for a in d.axes]
        return out + list(self.replicated) + list(self.unreduced)

    def __str__(self) -> str:
        mesh = f"@{_symbol(self.mesh)}" if isinstance(self.mesh, str) else \
            "mesh" + str(self.mesh)[len("#sdy.mesh"):]
        text = f"#sdy.sharding<{mesh}, [" + ", ".join(map(str, self.dims)) + "]"
        if self.replicated:
            text += ", replicated={" + ", ".join(map(str, self.replicated)) + "}"
        if self.unreduced:
            text += ", unreduced={" + ", ".join(map(str, self.unreduced)) + "}"
        return text + ">"


def _quote(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _symbol(name: str) -> str:
    if name and (name[0].isalpha() or name[0] == "_") and all(
            c.isalnum() or c in "_$." for c in name):
        return name
    return _quote(name)


# ---------------------------------------------------------------------------------------
# Lexer / parser
# ---------------------------------------------------------------------------------------
_PUNCT = set("<>[]{}(),=:@?")


@dataclass
class _Tok:
    kind: str   # 'punct', 'int', 'string', 'ident', 'eof'
    value: str
    pos: int


def _error(text: str, pos: int | None, message: str, where: str | None) -> ShardingError:
    at = f" at column {pos + 1}" if pos is not None else ""
    shown = text if len(text) <= 200 else text[:200] + "..."
    return ShardingError(f"cannot parse Shardy attribute {shown!r}: {message}{at}", where)


def _lex(text: str, where: str | None) -> list[_Tok]:
    toks: list[_Tok] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        if c == '"':
            j = i + 1
            out: list[str] = []
            while True:
                if j >= n:
                    raise _error(text, i, "unterminated string", where)
                ch = text[j]
                if ch == '"':
                    break
                if ch == "\\":
                    if j + 1 >= n:
                        raise _error(text, j, "unterminated escape", where)
                    nxt = text[j + 1]
                    if nxt in '"\\':
                        out.append(nxt)
                        j += 2
                        continue
                    if nxt == "n":
                        out.append("\n")
                        j += 2
                        continue
                    if nxt == "t":
                        out.append("\t")
                        j += 2
                        continue
                    hx = text[j + 1:j + 3]
                    if len(hx) == 2 and all(h in "0123456789abcdefABCDEF" for h in hx):
                        out.append(chr(int(hx, 16)))
                        j += 3
                        continue
                    raise _error(text, j, f"unknown escape '\\{nxt}'", where)
                out.append(ch)
                j += 1
            toks.append(_Tok("string", "".join(out), i))
            i = j + 1
            continue
        if c == "-" or c.isdigit():
            j = i + 1 if c == "-" else i
            while j < n and text[j].isdigit():
                j += 1
            if j == i + (1 if c == "-" else 0):
                raise _error(text, i, "unexpected '-'", where)
            toks.append(_Tok("int", text[i:j], i))
            i = j
            continue
        if c == "#" or c.isalpha() or c == "_":
            j = i + 1
            while j < n and (text[j].isalnum() or text[j] in "_.$"):
                j += 1
            toks.append(_Tok("ident", text[i:j], i))
            i = j
            continue
        if c in _PUNCT:
            toks.append(_Tok("punct", c, i))
            i += 1
            continue
        raise _error(text, i, f"unexpected character {c!r}", where)
    toks.append(_Tok("eof", "", n))
    return toks


class _Parser:
    def __init__(self, text: str, where: str | None) -> None:
        self.text = text
        self.where = where
        self.toks = _lex(text, where)
        self.i = 0

    # -- token helpers --------------------------------------------------------------------
    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def fail(self, message: str, tok: _Tok | None = None) -> ShardingError:
        t = tok or self.tok
        return _error(self.text, t.pos, message, self.where)

    def _describe(self, t: _Tok) -> str:
        if t.kind == "eof":
            return "end of text"
        if t.kind == "string":
            return f"string {_quote(t.value)}"
        return f"{t.value!r}"

    def at(self, kind: str, value: str | None = None) -> bool:
        t = self.tok
        return t.kind == kind and (value is None or t.value == value)

    def accept(self, kind: str, value: str | None = None) -> _Tok | None:
        if self.at(kind, value):
            t = self.tok
            self.i += 1
            return t
        return None

    def expect(self, kind: str, value: str | None = None, what: str | None = None) -> _Tok:
        t = self.accept(kind, value)
        if t is None:
            wanted = what or (f"'{value}'" if value is not None else kind)
            raise self.fail(f"expected {wanted}, got {self._describe(self.tok)}")
        return t

    def punct(self, p: str) -> _Tok:
        return self.expect("punct", p)

    def int_(self, what: str = "an integer") -> int:
        return int(self.expect("int", what=what).value)

    def end(self) -> None:
        if not self.at("eof"):
            raise self.fail(f"unexpected trailing {self._describe(self.tok)}")

    # -- grammar --------------------------------------------------------------------------
    def mesh(self) -> SdyMesh:
        """After an optional '#sdy.mesh' / 'mesh' keyword: '<' ... '>'."""
        self.punct("<")
        self.punct("[")
        axes: list[MeshAxis] = []
        seen: set[str] = set()
        if not self.accept("punct", "]"):
            while True:
                name_tok = self.expect("string", what="a quoted axis name")
                if name_tok.value in seen:
                    raise self.fail(f"duplicate mesh axis {_quote(name_tok.value)}", name_tok)
                seen.add(name_tok.value)
                self.punct("=")
                size_tok = self.tok
                size = self.int_("an axis size")
                if size < 1:
                    raise self.fail(f"mesh axis size must be positive, got {size}", size_tok)
                axes.append(MeshAxis(name_tok.value, size))
                if self.accept("punct", "]"):
                    break
                self.punct(",")
        device_ids: tuple[int, ...] = ()
        if self.accept("punct", ","):
            kw = self.expect("ident", what="'device_ids'")
            if kw.value != "device_ids":
                raise self.fail(f"expected 'device_ids', got {kw.value!r}", kw)
            self.punct("=")
            self.punct("[")
            ids: list[int] = []
            if not self.accept("punct", "]"):
                while True:
                    ids.append(self.int_("a device id"))
                    if self.accept("punct", "]"):
                        break
                    self.punct(",")
            device_ids = tuple(ids)
            self._check_device_ids(axes, device_ids, kw)
        self.punct(">")
        return SdyMesh(tuple(axes), device_ids)

    def _check_device_ids(self, axes: list[MeshAxis], ids: tuple[int, ...], tok: _Tok) -> None:
        total = math.prod(a.size for a in axes)
        if not axes:
            if len(ids) != 1:
                raise self.fail(f"a mesh without axes takes exactly one device id, got {len(ids)}",
                                tok)
            if ids[0] < 0:
                raise self.fail(f"device id {ids[0]} is negative", tok)
            return
        if len(ids) != total:
            raise self.fail(f"mesh has {total} devices but device_ids lists {len(ids)}", tok)
        if sorted(ids) != list(range(total)):
            raise self.fail(f"device_ids must be a permutation of 0..{total - 1}, got {list(ids)}",
                            tok)

    def mesh_keyword_and_body(self) -> SdyMesh:
        t = self.tok
        if t.kind == "ident" and t.value in ("#sdy.mesh", "mesh"):
            self.i += 1
        elif t.kind == "ident":
            raise self.fail(f"expected '#sdy.mesh<...>', got {t.value!r}")
        return self.mesh()

    def axis_ref(self) -> AxisRef:
        name_tok = self.expect("string", what="a quoted axis name")
        if self.accept("punct", ":"):
            self.punct("(")
            pre_tok = self.tok
            pre = self.int_("a sub-axis pre-size")
            self.punct(")")
            size_tok = self.tok
            size = self.int_("a sub-axis size")
            if pre < 1:
                raise self.fail(f"sub-axis pre-size must be >= 1, got {pre}", pre_tok)
            if size < 1:
                raise self.fail(f"sub-axis size must be >= 1, got {size}", size_tok)
            return AxisRef(name_tok.value, pre, size)
        return AxisRef(name_tok.value)

    def axis_ref_list(self) -> tuple[AxisRef, ...]:
        """'{' refs '}'"""
        self.punct("{")
        refs: list[AxisRef] = []
        if not self.accept("punct", "}"):
            while True:
                refs.append(self.axis_ref())
                if self.accept("punct", "}"):
                    break
                self.punct(",")
        return tuple(refs)

    def dim(self) -> DimSharding:
        self.punct("{")
        axes: list[AxisRef] = []
        closed = True
        while not self.accept("punct", "}"):
            if axes and not self.accept("punct", ","):
                raise self.fail(f"expected ',' or '}}' in a dimension sharding, got "
                                f"{self._describe(self.tok)}")
            if self.accept("punct", "?"):
                closed = False
                if not self.accept("punct", "}"):
                    raise self.fail("'?' must be the last entry of a dimension sharding")
                break
            if not self.at("string"):
                raise self.fail(f"expected a quoted axis name or '?', got "
                                f"{self._describe(self.tok)}")
            axes.append(self.axis_ref())
        priority = None
        t = self.tok
        if t.kind == "ident" and t.value.startswith("p"):
            digits = t.value[1:]
            if not digits or not digits.isdigit():
                raise self.fail(f"expecting priority in format 'p<number>', got {t.value!r}")
            if len(digits) > 1 and digits[0] == "0":
                raise self.fail(f"priorities with leading zeros are not allowed, got {t.value!r}")
            priority = int(digits)
            self.i += 1
        elif t.kind == "ident":
            raise self.fail(f"expecting priority in format 'p<number>', got {t.value!r}")
        return DimSharding(tuple(axes), closed, priority)

    def tensor(self) -> TensorSharding:
        """'<' mesh-or-ref ',' '[' dims ']' (',' replicated/unreduced)* '>'"""
        start = self.tok.pos
        self.punct("<")
        mesh: str | SdyMesh
        if self.accept("punct", "@"):
            t = self.tok
            if t.kind in ("ident", "string"):
                self.i += 1
                mesh = t.value
            else:
                raise self.fail(f"expected a mesh name after '@', got {self._describe(t)}")
        elif self.at("ident", "mesh") or self.at("ident", "#sdy.mesh"):
            self.i += 1
            mesh = self.mesh()
        else:
            raise self.fail(f"expected a mesh reference '@name' or an inline 'mesh<...>', got "
                            f"{self._describe(self.tok)}")
        self.punct(",")
        self.punct("[")
        dims: list[DimSharding] = []
        if not self.accept("punct", "]"):
            while True:
                if not self.at("punct", "{"):
                    raise self.fail(f"expected a dimension sharding '{{...}}', got "
                                    f"{self._describe(self.tok)}")
                dims.append(self.dim())
                if self.accept("punct", "]"):
                    break
                self.punct(",")
        replicated: tuple[AxisRef, ...] = ()
        unreduced: tuple[AxisRef, ...] = ()
        seen: set[str] = set()
        while self.accept("punct", ","):
            kw = self.expect("ident", what="'replicated' or 'unreduced'")
            if kw.value not in ("replicated", "unreduced"):
                raise self.fail(f"expected 'replicated' or 'unreduced', got {kw.value!r}", kw)
            if kw.value in seen:
                raise self.fail(f"'{kw.value}' given twice", kw)
            seen.add(kw.value)
            self.punct("=")
            refs = self.axis_ref_list()
            if kw.value == "replicated":
                replicated = refs
            else:
                unreduced = refs
        end = self.punct(">")
        return TensorSharding(mesh, tuple(dims), replicated, unreduced,
                              self.text[start:end.pos + 1])

    def sharding(self) -> TensorSharding:
        if self.at("ident", "#sdy.sharding"):
            self.i += 1
        elif self.at("ident"):
            raise self.fail(f"expected '#sdy.sharding<...>', got {self.tok.value!r}")
        s = self.tensor()
        return s

    def per_value(self) -> tuple[TensorSharding, ...]:
        if self.at("ident", "#sdy.sharding_per_value"):
            self.i += 1
        elif self.at("ident"):
            raise self.fail(f"expected '#sdy.sharding_per_value<[...]>', got {self.tok.value!r}")
        self.punct("<")
        self.punct("[")
        out: list[TensorSharding] = []
        if not self.accept("punct", "]"):
            while True:
                out.append(self.tensor())
                if self.accept("punct", "]"):
                    break
                self.punct(",")
        self.punct(">")
        return tuple(out)

    def manual_axes(self) -> tuple[str, ...]:
        if self.at("ident", "#sdy"):
            self.i += 1
            self.punct("<")
            closing = True
        else:
            closing = False
        kw = self.expect("ident", what="'manual_axes'")
        if kw.value != "manual_axes":
            raise self.fail(f"expected 'manual_axes', got {kw.value!r}", kw)
        self.punct("{")
        names: list[str] = []
        if not self.accept("punct", "}"):
            while True:
                t = self.expect("string", what="a quoted axis name")
                if t.value in names:
                    raise self.fail(f"manual axis {_quote(t.value)} listed twice", t)
                names.append(t.value)
                if self.accept("punct", "}"):
                    break
                self.punct(",")
        if closing:
            self.punct(">")
        return tuple(names)

    def meshes(self) -> dict[str, SdyMesh]:
        self.punct("{")
        out: dict[str, SdyMesh] = {}
        if not self.accept("punct", "}"):
            while True:
                t = self.tok
                if t.kind not in ("ident", "string"):
                    raise self.fail(f"expected a mesh name, got {self._describe(t)}")
                self.i += 1
                if t.value in out:
                    raise self.fail(f"mesh {t.value!r} defined twice", t)
                self.punct("=")
                out[t.value] = self.mesh_keyword_and_body()
                if self.accept("punct", "}"):
                    break
                self.punct(",")
        return out


def _run(text: str, where: str | None, rule: str):  # type: ignore[no-untyped-def]
    if not isinstance(text, str):
        text = text.decode("utf-8") if isinstance(text, (bytes, bytearray)) else str(text)
    p = _Parser(text, where)
    value = getattr(p, rule)()
    p.end()
    return value


def parse_mesh(text: str, where: str | None = None) -> SdyMesh:
    """``#sdy.mesh<["x"=2, "y"=4], device_ids=[...]>`` (the keyword is optional)."""
    return _run(text, where, "mesh_keyword_and_body")


def parse_meshes(text: str, where: str | None = None) -> dict[str, SdyMesh]:
    """The module attribute ``xla.sdy.meshes``: ``{mesh = #sdy.mesh<...>, ...}``."""
    return _run(text, where, "meshes")


def parse_sharding(text: str, where: str | None = None) -> TensorSharding:
    """``#sdy.sharding<@mesh, [{"x"}, {"y", ?}], replicated={"z"}>``."""
    return _run(text, where, "sharding")


def parse_sharding_per_value(text: str, where: str | None = None) -> tuple[TensorSharding, ...]:
    """``#sdy.sharding_per_value<[<@mesh, [...]>, ...]>``."""
    return _run(text, where, "per_value")


def parse_shardings(text: str, where: str | None = None) -> tuple[tuple[TensorSharding, ...], bool]:
    """Either form: (shardings, is_per_value)."""
    stripped = text.lstrip() if isinstance(text, str) else text
    if isinstance(stripped, str) and stripped.startswith("#sdy.sharding_per_value"):
        return parse_sharding_per_value(text, where), True
    return (parse_sharding(text, where),), False


def parse_manual_axes(text: str, where: str | None = None) -> tuple[str, ...]:
    """``#sdy<manual_axes{"x", "y"}>``."""
    return _run(text, where, "manual_axes")


# ---------------------------------------------------------------------------------------
# Semantics: mesh lookup, validation, conversion
# ---------------------------------------------------------------------------------------
def resolve_mesh(sharding: TensorSharding, meshes: Mapping[str, SdyMesh],
                 where: str | None = None) -> SdyMesh:
    if isinstance(sharding.mesh, SdyMesh):
        return sharding.mesh
    mesh = meshes.get(sharding.mesh)
    if mesh is None:
        known = ", ".join(f"@{n}" for n in meshes) or "none (no xla.sdy.meshes attribute)"
        raise ShardingError(f"Shardy sharding {sharding.text or sharding} refers to unknown mesh "
                            f"@{sharding.mesh}; meshes declared: {known}", where)
    return mesh


def _atoms(mesh: SdyMesh, refs: Iterable[AxisRef]) -> list[tuple[str, int, int]]:
    """Every mesh axis cut at the sub-axis boundaries ``refs`` use: (name, pre, size).

    Ordered like the mesh (major to minor), each axis's pieces by increasing pre-size.
    """
    cuts: dict[str, set[int]] = {a.name: {1, a.size} for a in mesh.axes}
    for r in refs:
        if r.pre_size is not None:
            assert r.size is not None
            cuts[r.name].update((r.pre_size, r.pre_size * r.size))
    out: list[tuple[str, int, int]] = []
    for a in mesh.axes:
        bounds = sorted(cuts[a.name])
        for lo, hi in zip(bounds, bounds[1:]):
            out.append((a.name, lo, hi // lo))
    return out


def _validate_refs(sharding: TensorSharding, mesh: SdyMesh, manual: Sequence[str],
                   where: str | None, allow_manual_in_sharding: bool) -> None:
    text = sharding.text or str(sharding)
    used: list[tuple[AxisRef, int, int]] = []   # (ref, lo, hi) within its axis
    for ref in sharding.axis_refs():
        if not mesh.has_axis(ref.name):
            raise ShardingError(f"Shardy sharding {text} uses axis {_quote(ref.name)} which is "
                                f"not in mesh {mesh}", where)
        full = mesh.axis_size(ref.name)
        if ref.pre_size is not None:
            assert ref.size is not None
            if ref.size < 2 or full % (ref.pre_size * ref.size) != 0:
                raise ShardingError(f"Shardy sharding {text}: sub-axis {ref} does not fit axis "
                                    f"{_quote(ref.name)} of size {full}", where)
        if ref.name in manual and not allow_manual_in_sharding:
            raise ShardingError(f"Shardy sharding {text} uses axis {_quote(ref.name)}, which is "
                                "manual here", where)
        lo, size = ref.extent(mesh)
        hi = lo * size
        for other, olo, ohi in used:
            if other.name == ref.name and lo < ohi and olo < hi:
                what = "twice" if other == ref else f"overlapping {other}"
                raise ShardingError(f"Shardy sharding {text} uses axis {ref} {what}", where)
        used.append((ref, lo, hi))
    # Sub-axes must nest along the axis: every boundary must divide the next one.
    cuts: dict[str, set[int]] = {}
    for ref in sharding.axis_refs():
        if ref.pre_size is not None:
            assert ref.size is not None
            cuts.setdefault(ref.name, {1, mesh.axis_size(ref.name)}).update(
                (ref.pre_size, ref.pre_size * ref.size))
    for name, bset in cuts.items():
        bounds = sorted(bset)
        for lo, hi in zip(bounds, bounds[1:]):
            if hi % lo:
                raise ShardingError(f"Shardy sharding {text}: sub-axes of {_quote(name)} do not "
                                    "split it consistently", where)


def erase_axes(sharding: TensorSharding, axes: Iterable[str]) -> TensorSharding:
    """Drop the named axes (and their sub-axes) everywhere (XLA's eraseManualAxes)."""
    drop = set(axes)
    if not drop:
        return sharding
    dims = tuple(DimSharding(tuple(a for a in d.axes if a.name not in drop), d.is_closed,
                             d.priority) for d in sharding.dims)
    return TensorSharding(sharding.mesh, dims,
                          tuple(a for a in sharding.replicated if a.name not in drop),
                          tuple(a for a in sharding.unreduced if a.name not in drop),
                          sharding.text)


def to_hlo_sharding(sharding: TensorSharding, meshes: Mapping[str, SdyMesh] | None = None,
                    manual_axes: Sequence[str] = (), where: str | None = None,
                    rank: int | None = None):  # -> HloSharding
    """The ``HloSharding`` equal to ``sharding`` (see the module docstring).

    ``manual_axes``: axes that are manual where the value lives (the enclosing manual
    computations' axes); they become a ``manual`` subgroup and must not appear in
    ``sharding`` itself.  ``rank``: when given, the number of dim shardings must match.
    """
    from hlo_spmd.sharding import HloSharding, ShardingType, TileAssignment

    mesh = resolve_mesh(sharding, meshes or {}, where)
    text = sharding.text or str(sharding)
    # A sharding on an axis-less (maximal / empty) mesh may omit the dims: `<@maximal, []>`.
    axisless_short = not mesh.axes and sharding.rank == 0
    if rank is not None and rank != sharding.rank and not axisless_short:
        raise ShardingError(f"Shardy sharding {text} has {sharding.rank} dimension shardings "
                            f"but the value has rank {rank}", where)
    if not mesh.axes:
        # Maximal (one device id) or empty mesh; manual axes of other meshes do not apply.
        _validate_refs(sharding, mesh, (), where, allow_manual_in_sharding=False)
        return HloSharding.maximal(mesh.device_ids[0]) if mesh.device_ids else \
            HloSharding.replicate()
    for name in manual_axes:
        if not mesh.has_axis(name):
            raise ShardingError(f"manual axis {_quote(name)} is not in mesh {mesh}", where)
    _validate_refs(sharding, mesh, manual_axes, where, allow_manual_in_sharding=False)
    if len(set(manual_axes)) == len(mesh.axes):
        return HloSharding.manual()
    if mesh.total_size == 1:
        return HloSharding.replicate()

    atoms = _atoms(mesh, sharding.axis_refs())
    index = {atom: i for i, atom in enumerate(atoms)}

    def covered(ref: AxisRef) -> list[int]:
        lo, size = ref.extent(mesh)
        hi = lo * size
        return [index[a] for a in atoms if a[0] == ref.name and a[1] >= lo and a[1] * a[2] <= hi]

    order: list[int] = []
    tile_dims: list[int] = []
    for d in sharding.dims:
        n = 1
        for ref in d.axes:
            ids = covered(ref)
            order.extend(ids)
            n *= math.prod(atoms[i][2] for i in ids)
        tile_dims.append(n)
    types: list[ShardingType] = []
    if manual_axes:
        n = 1
        for name in manual_axes:
            ids = covered(AxisRef(name))
            order.extend(ids)
            n *= math.prod(atoms[i][2] for i in ids)
        tile_dims.append(n)
        types.append(ShardingType.MANUAL)
    if sharding.unreduced:
        n = 1
        for ref in sharding.unreduced:
            ids = covered(ref)
            order.extend(ids)
            n *= math.prod(atoms[i][2] for i in ids)
        tile_dims.append(n)
        types.append(ShardingType.UNREDUCED)
    taken = set(order)
    rest = [i for i in range(len(atoms)) if i not in taken]
    replicated = math.prod(atoms[i][2] for i in rest)
    order.extend(rest)
    if replicated > 1:
        tile_dims.append(replicated)
        types.append(ShardingType.REPLICATED)
    if not tile_dims:   # rank-0 value, nothing manual/unreduced/replicated: one device
        return HloSharding.replicate()

    reshape = [atoms[i][2] for i in range(len(atoms))]
    try:
        if mesh.device_ids:
            arr = np.asarray(mesh.device_ids, dtype=np.int64).reshape(
                [a.size for a in mesh.axes])
            arr = arr.reshape(reshape).transpose(order).reshape(tile_dims)
            ta = TileAssignment.from_array(arr)
        else:
            ta = TileAssignment(tile_dims, reshape, order)
        if not types:
            return HloSharding.tile(ta)
        return HloSharding.subgroup(ta, types)
    except ShardingError as e:
        raise ShardingError(f"Shardy sharding {text}: {e.message}", where) from None

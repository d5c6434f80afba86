"""Named (mesh-axis) shardings: XLA's ``NamedSharding`` / ``Mesh`` / ``AxisRef``.

XLA's newest sharding form names mesh axes instead of listing a tile
assignment::

    {mesh['x'=2,'y'=4], [{'x'}, {'y':(1)2, ?}], replicated={'y':(2)2}}
    {mesh['x'=8], device_ids=([4,2]T(1,0)), [{'x':(1)2, 'x':(4)2}, {}]}
    {maximal_mesh[device_id=3]}        {mesh['x'=2], unreduced}

This module holds that structure exactly (so it prints back as XLA's
``NamedSharding::ToString`` prints it, and goes to and from
``NamedShardingProto``), validates it the way XLA's ``VerifyNamedSharding``
does, and maps it to the tile assignment the sharding algebra works on
(``to_tiles``).  ``HloSharding`` carries the structure next to the tile form
(``HloSharding.named``); every pass sees the tile form only.

A sub-axis ``'x':(pre)size`` is the slice of mesh axis ``x`` obtained by
viewing it as ``[pre, size, rest]`` (major to minor) and taking the middle.
Also here: the ``replica_groups=mesh[...] {axes}`` form (XLA's
``MeshAxesReplicaGroupList``) shares the mesh and axis syntax.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hlo_spmd.errors import ShardingError
from hlo_spmd.sharding.tile_assignment import TileAssignment, canonicalize_iota

__all__ = ["AxisRef", "Mesh", "DimSharding", "NamedSharding", "parse_named",
           "parse_mesh_groups", "mesh_groups_text", "mesh_groups_array",
           "named_to_proto", "named_from_proto", "mesh_from_proto", "mesh_to_proto",
           "axis_from_proto", "axis_to_proto"]


# -- the structure ------------------------------------------------------------------------
@dataclass(frozen=True)
class AxisRef:
    """A whole mesh axis (``pre_size`` None) or the sub-axis ``(pre_size)size`` of it."""

    index: int
    pre_size: int | None = None
    size: int | None = None

    @property
    def is_sub_axis(self) -> bool:
        return self.pre_size is not None

    def extent(self, mesh: Mesh) -> tuple[int, int]:
        """[lo, hi) of this axis in the multiplicative coordinates of its mesh axis."""
        if self.pre_size is None:
            return 1, mesh.sizes[self.index]
        assert self.size is not None
        return self.pre_size, self.pre_size * self.size

    def length(self, mesh: Mesh) -> int:
        lo, hi = self.extent(mesh)
        return hi // lo

    def text(self, mesh: Mesh) -> str:
        s = _quote(mesh.names[self.index])
        if self.pre_size is not None:
            s += f":({self.pre_size}){self.size}"
        return s


@dataclass(frozen=True)
class Mesh:
    """Axis names and sizes plus the device order (iota, iota transform, or explicit).

    ``maximal_device`` set means ``maximal_mesh[device_id=N]`` (no axes).
    """

    names: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()
    device_ids: tuple[int, ...] | None = None
    iota: tuple[tuple[int, ...], tuple[int, ...]] | None = None   # (reshape_dims, perm)
    maximal_device: int | None = None

    @property
    def num_devices(self) -> int:
        return 1 if self.maximal_device is not None else math.prod(self.sizes)

    def index_of(self, name: str) -> int | None:
        try:
            return self.names.index(name)
        except ValueError:
            return None

    def device_assignment(self) -> TileAssignment:
        """The mesh's devices as a tile assignment of shape ``sizes``."""
        if self.device_ids is not None:
            return TileAssignment.from_devices(self.sizes, self.device_ids)
        if self.iota is not None:
            return TileAssignment(self.sizes, self.iota[0], self.iota[1])
        return TileAssignment(self.sizes)

    def text(self) -> str:
        """XLA's Mesh::ToString."""
        if self.maximal_device is not None:
            return f"maximal_mesh[device_id={self.maximal_device}]"
        out = "mesh[" + ",".join(f"{_quote(n)}={s}" for n, s in zip(self.names, self.sizes)) + "]"
        if self.device_ids is not None:
            out += ", device_ids=(" + ",".join(map(str, self.device_ids)) + ")"
        elif self.iota is not None:
            out += (", device_ids=([" + ",".join(map(str, self.iota[0])) + "]T("
                    + ",".join(map(str, self.iota[1])) + "))")
        return out


@dataclass(frozen=True)
class DimSharding:
    """Axes sharding one tensor dim (major first); open (``?``) when not closed."""

    axes: tuple[AxisRef, ...] = ()
    is_closed: bool = True

    def text(self, mesh: Mesh) -> str:
        body = ", ".join(a.text(mesh) for a in self.axes)
        if not self.is_closed:
            body += ", ?" if self.axes else "?"
        return "{" + body + "}"


@dataclass(frozen=True)
class NamedSharding:
    """XLA's NamedSharding minus metadata (which lives on the HloSharding)."""

    mesh: Mesh
    dims: tuple[DimSharding, ...] = ()
    replicated: tuple[AxisRef, ...] = ()
    unreduced: tuple[AxisRef, ...] = ()
    manual: tuple[AxisRef, ...] = ()

    @property
    def is_maximal(self) -> bool:
        return self.mesh.maximal_device is not None

    def _covers_mesh(self, axes: tuple[AxisRef, ...]) -> bool:
        return len(axes) == len(self.mesh.names) and all(
            a.index == i and not a.is_sub_axis for i, a in enumerate(axes))

    def text(self, metadata_text: str = "") -> str:
        """XLA's NamedSharding::ToString (``metadata_text``: ``, metadata={...}`` or '')."""
        out = "{" + self.mesh.text()
        if self.is_maximal:
            return out + metadata_text + "}"
        if not self.dims and not self.replicated and not self.unreduced and not self.manual:
            return out + ", replicated" + metadata_text + "}"
        if not self.dims and not self.replicated and not self.manual and \
                self._covers_mesh(self.unreduced):
            return out + ", unreduced" + metadata_text + "}"
        if not self.dims and not self.replicated and not self.unreduced and \
                self._covers_mesh(self.manual):
            return out + ", manual" + metadata_text + "}"
        out += ", [" + ", ".join(d.text(self.mesh) for d in self.dims) + "]"
        for word, axes in (("replicated", self.replicated), ("unreduced", self.unreduced),
                           ("manual", self.manual)):
            if axes:
                out += f", {word}={{" + ", ".join(a.text(self.mesh) for a in axes) + "}"
        return out + metadata_text + "}"

    # -- validation (XLA's VerifyNamedSharding, with messages naming the axis) -------------
    def validate(self) -> None:
        validate_mesh(self.mesh)
        refs: list[tuple[str, AxisRef]] = []
        for i, d in enumerate(self.dims):
            refs.extend((f"dim {i}", a) for a in d.axes)
        for word, axes in (("replicated", self.replicated), ("unreduced", self.unreduced),
                           ("manual", self.manual)):
            refs.extend((word, a) for a in axes)
        _check_axes(self.mesh, refs)
        lists = [(f"dim {i}", d.axes) for i, d in enumerate(self.dims)]
        lists += [(w, axes) for w, axes in (("replicated", self.replicated),
                                             ("unreduced", self.unreduced),
                                             ("manual", self.manual))]
        for where, axes in lists:
            _check_canonical(self.mesh, where, axes, sorted_list=not where.startswith("dim "))

    # -- the tile form ----------------------------------------------------------------
    def to_tiles(self) -> TileAssignment:
        """The tile assignment: one dim per tensor dim, then manual, unreduced, replicated.

        The three subgroup dims are always there (size 1 when empty); the mesh
        axes no one names are replicated, as in Shardy.
        """
        mesh = self.mesh
        cuts: list[set[int]] = [{1, s} for s in mesh.sizes]
        groups = [list(d.axes) for d in self.dims] + [list(self.manual), list(self.unreduced)]
        for g in groups:
            for a in g:
                cuts[a.index].update(a.extent(mesh))
        for a in self.replicated:
            cuts[a.index].update(a.extent(mesh))
        factor_dims: list[int] = []
        factors: list[list[tuple[int, int, int]]] = []   # per axis: (lo, hi, factor index)
        for ax, s in enumerate(mesh.sizes):
            bounds = sorted(cuts[ax])
            entries = []
            for lo, hi in zip(bounds, bounds[1:]):
                entries.append((lo, hi, len(factor_dims)))
                factor_dims.append(hi // lo)
            factors.append(entries)

        def factor_ids(a: AxisRef) -> list[int]:
            lo, hi = a.extent(mesh)
            return [f for (l, h, f) in factors[a.index] if l >= lo and h <= hi]

        used: set[int] = set()
        perm: list[int] = []
        tile_dims: list[int] = []
        for g in groups:
            ids = [f for a in g for f in factor_ids(a)]
            used.update(ids)
            perm.extend(ids)
            tile_dims.append(math.prod(factor_dims[f] for f in ids))
        rest = [f for f in range(len(factor_dims)) if f not in used]
        perm.extend(rest)
        tile_dims.append(math.prod(factor_dims[f] for f in rest))
        ta = mesh.device_assignment()
        if factor_dims:
            ta = ta.reshape(factor_dims).transpose(perm)
        return ta.reshape(tile_dims)


def validate_mesh(mesh: Mesh) -> None:
    if mesh.maximal_device is not None:
        if mesh.maximal_device < 0:
            raise ShardingError(f"maximal mesh device {mesh.maximal_device} is negative")
        return
    if len(set(mesh.names)) != len(mesh.names):
        dup = next(n for n in mesh.names if mesh.names.count(n) > 1)
        raise ShardingError(f"mesh axis {_quote(dup)} is declared twice")
    for n, s in zip(mesh.names, mesh.sizes):
        if s < 1:
            raise ShardingError(f"mesh axis {_quote(n)} has size {s}, must be positive")
    total = math.prod(mesh.sizes)
    if mesh.device_ids is not None:
        ids = mesh.device_ids
        if len(ids) != total:
            raise ShardingError(f"mesh {mesh.text()} lists {len(ids)} device ids but its axis "
                                f"sizes multiply to {total}")
        if sorted(ids) != list(range(total)):
            raise ShardingError(f"mesh device ids {list(ids)} are not a permutation of "
                                f"0..{total - 1}")
    if mesh.iota is not None and math.prod(mesh.iota[0]) != total:
        raise ShardingError(f"mesh device_ids iota {list(mesh.iota[0])} holds "
                            f"{math.prod(mesh.iota[0])} devices but the axis sizes multiply "
                            f"to {total}")


def _check_axes(mesh: Mesh, refs: Sequence[tuple[str, AxisRef]]) -> None:
    """Every axis ref valid for the mesh, none overlapping another, cuts nesting."""
    if mesh.maximal_device is not None and refs:
        raise ShardingError("a maximal mesh has no axes to shard over")
    seen: dict[int, list[tuple[str, AxisRef]]] = {}
    for where, a in refs:
        if not 0 <= a.index < len(mesh.names):
            raise ShardingError(f"{where}: axis index {a.index} is not in mesh {mesh.text()}")
        full = mesh.sizes[a.index]
        name = _quote(mesh.names[a.index])
        if a.is_sub_axis:
            assert a.pre_size is not None and a.size is not None
            if a.pre_size < 1 or a.size < 2:
                raise ShardingError(f"{where}: sub-axis {a.text(mesh)} needs pre-size >= 1 and "
                                    "size >= 2")
            if full % (a.pre_size * a.size) or a.size >= full:
                raise ShardingError(
                    f"{where}: sub-axis {a.text(mesh)} does not divide axis {name} of size "
                    f"{full} (pre-size x size must divide it, size must be smaller)")
        lo, hi = a.extent(mesh)
        for other_where, b in seen.get(a.index, []):
            blo, bhi = b.extent(mesh)
            if lo < bhi and blo < hi:
                what = f"axis {name}" if not (a.is_sub_axis or b.is_sub_axis) else \
                    f"axes {b.text(mesh)} and {a.text(mesh)} of {name} overlap:"
                raise ShardingError(f"{what} used twice ({other_where} and {where})"
                                    if what.startswith("axis ") else
                                    f"{what} used in {other_where} and {where}")
            if max(lo, blo) % min(hi, bhi):
                raise ShardingError(f"sub-axes {b.text(mesh)} and {a.text(mesh)} of {name} do "
                                    "not nest (their sizes do not multiply to a split of the "
                                    "axis)")
        seen.setdefault(a.index, []).append((where, a))


def _check_canonical(mesh: Mesh, where: str, axes: Sequence[AxisRef], sorted_list: bool
                     ) -> None:
    """XLA's canonical form of one axis list (ValidateSpanOfAxes, jaxlib 0.10.2 checks each
    list on its own): no two neighbours that are consecutive sub-axes of one axis (they
    must be written merged), and replicated / unreduced / manual sorted by mesh axis and
    sub-axis pre-size."""
    for a, b in zip(axes, axes[1:]):
        if a.index == b.index and a.is_sub_axis and b.is_sub_axis and \
                a.extent(mesh)[1] == b.pre_size:
            size = a.length(mesh) * b.length(mesh)
            merged = AxisRef(a.index) if size == mesh.sizes[a.index] else \
                AxisRef(a.index, a.pre_size, size)
            raise ShardingError(f"{where}: adjacent sub-axes {a.text(mesh)}, {b.text(mesh)} "
                                f"can be merged; write {merged.text(mesh)}")
    if sorted_list:
        keys = [(a.index, a.pre_size or 1) for a in axes]
        if keys != sorted(keys):
            raise ShardingError(f"{where} axes must be sorted by mesh axis and sub-axis "
                                "pre-size: " + ", ".join(a.text(mesh) for a in axes))


def _quote(name: str) -> str:
    return "'" + name + "'"


# -- text parsing ---------------------------------------------------------------------------
_WS = re.compile(r"\s*")
_INT = re.compile(r"-?\d+")
_NAME = re.compile(r"'([^']*)'|\"([^\"]*)\"")


class _Scan:
    """Character scanner over a sharding string; errors carry the offset."""

    def __init__(self, text: str, pos: int = 0) -> None:
        self.text, self.pos = text, pos

    def ws(self) -> None:
        self.pos = _WS.match(self.text, self.pos).end()  # type: ignore[union-attr]

    def error(self, msg: str, pos: int | None = None) -> ShardingError:
        p = self.pos if pos is None else pos
        err = ShardingError(f"{msg} at character {p} in {self.text!r}")
        err.position = p  # type: ignore[attr-defined]
        return err

    def peek(self, s: str) -> bool:
        self.ws()
        return self.text.startswith(s, self.pos)

    def eat(self, s: str) -> bool:
        if self.peek(s):
            self.pos += len(s)
            return True
        return False

    def expect(self, s: str, what: str) -> None:
        if not self.eat(s):
            raise self.error(f"expected {what}")

    def word(self, w: str) -> bool:
        self.ws()
        if self.text.startswith(w, self.pos):
            end = self.pos + len(w)
            if end >= len(self.text) or not (self.text[end].isalnum() or self.text[end] == "_"):
                self.pos = end
                return True
        return False

    def int(self, what: str) -> int:
        self.ws()
        m = _INT.match(self.text, self.pos)
        if m is None:
            raise self.error(f"expected {what}")
        self.pos = m.end()
        return int(m.group())

    def ints(self, close: str, what: str) -> list[int]:
        vals: list[int] = []
        if self.peek(close):
            return vals
        while True:
            vals.append(self.int(what))
            if not self.eat(","):
                return vals

    def name(self, what: str) -> tuple[str, int]:
        self.ws()
        m = _NAME.match(self.text, self.pos)
        if m is None:
            raise self.error(f"expected a quoted {what}")
        start = self.pos
        self.pos = m.end()
        return (m.group(1) if m.group(1) is not None else m.group(2)), start


def parse_mesh(sc: _Scan) -> Mesh:
    """``mesh['x'=2,...][, device_ids=(...)]`` or ``maximal_mesh[device_id=N]``."""
    if sc.word("maximal_mesh"):
        sc.expect("[", "'[' after maximal_mesh")
        if not sc.word("device_id"):
            raise sc.error("expected device_id= in maximal_mesh")
        sc.expect("=", "'=' after device_id")
        dev = sc.int("a device id")
        sc.expect("]", "']' to end maximal_mesh")
        mesh = Mesh(maximal_device=dev)
        validate_mesh(mesh)
        return mesh
    if not sc.word("mesh"):
        raise sc.error("expected 'mesh[' or 'maximal_mesh['")
    sc.expect("[", "'[' after mesh")
    names: list[str] = []
    sizes: list[int] = []
    if not sc.eat("]"):
        while True:
            n, _ = sc.name("mesh axis name")
            sc.expect("=", f"'=' after mesh axis {_quote(n)}")
            names.append(n)
            sizes.append(sc.int(f"the size of mesh axis {_quote(n)}"))
            if sc.eat(","):
                continue
            sc.expect("]", "',' or ']' in the mesh axes")
            break
    device_ids: tuple[int, ...] | None = None
    iota: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    save = sc.pos
    if sc.eat(",") and sc.word("device_ids"):
        sc.expect("=", "'=' after device_ids")
        sc.expect("(", "'(' to start device_ids")
        if sc.eat("["):
            reshape = sc.ints("]", "an iota reshape dim")
            sc.expect("]", "']' to end the iota reshape dims")
            perm = list(range(len(reshape)))
            if sc.word("T"):
                sc.expect("(", "'(' after T")
                perm = sc.ints(")", "an iota transpose index")
                sc.expect(")", "')' to end the iota transpose")
            if sorted(perm) != list(range(len(reshape))) or not reshape or \
                    any(d < 1 for d in reshape):
                raise sc.error(f"device_ids iota [{reshape}]T({perm}) is not valid")
            r, p = canonicalize_iota(reshape, perm)
            if len(r) > 1:
                iota = (tuple(r), tuple(p))
            elif math.prod(reshape) != math.prod(sizes):
                raise ShardingError(f"mesh device_ids iota {reshape} holds {math.prod(reshape)} "
                                    f"devices but the axis sizes multiply to {math.prod(sizes)}")
        else:
            device_ids = tuple(sc.ints(")", "a device id"))
        sc.expect(")", "')' to end device_ids")
    else:
        sc.pos = save
    mesh = Mesh(tuple(names), tuple(sizes), device_ids, iota)
    validate_mesh(mesh)
    return mesh


def parse_axis(sc: _Scan, mesh: Mesh) -> AxisRef:
    n, start = sc.name("axis name")
    idx = mesh.index_of(n)
    if idx is None:
        raise sc.error(f"axis {_quote(n)} is not in mesh {mesh.text()}", start)
    if sc.eat(":"):
        sc.expect("(", "'(' to start a sub-axis pre-size")
        pre = sc.int("a sub-axis pre-size")
        sc.expect(")", "')' after the sub-axis pre-size")
        size = sc.int("a sub-axis size")
        return AxisRef(idx, pre, size)
    return AxisRef(idx)


def parse_axis_list(sc: _Scan, mesh: Mesh, allow_open: bool) -> tuple[tuple[AxisRef, ...], bool]:
    """``{'x', 'y':(1)2[, ?]}`` -> (axes, is_closed)."""
    sc.expect("{", "'{' to start a list of axes")
    axes: list[AxisRef] = []
    closed = True
    if sc.eat("}"):
        return (), True
    while True:
        if allow_open and sc.eat("?"):
            closed = False
            sc.expect("}", "'}' after '?'")
            return tuple(axes), closed
        axes.append(parse_axis(sc, mesh))
        if sc.eat(","):
            continue
        sc.expect("}", "',' or '}' in a list of axes")
        return tuple(axes), closed


def _skip_balanced(text: str, pos: int) -> int:
    """Index past the '}' matching the '{' at ``pos`` (double-quoted strings skipped)."""
    depth = 0
    i = pos
    while i < len(text):
        c = text[i]
        if c == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def parse_named(text: str, pos: int) -> tuple[NamedSharding, str | None, int]:
    """Parse a named single sharding body starting at ``pos`` (just after its '{').

    Returns (structure, metadata text or None, position just past the closing '}').
    """
    sc = _Scan(text, pos)
    mesh = parse_mesh(sc)
    dims: list[DimSharding] = []
    kinds: dict[str, tuple[AxisRef, ...]] = {}
    metadata: str | None = None
    shorthand: str | None = None
    have_dims = False
    sc.eat(",")   # XLA prints a comma after the mesh; XLA's tests often omit it
    first = True
    while not sc.peek("}"):
        if not first:
            sc.expect(",", "',' before the next part of the named sharding")
        first = False
        if mesh.maximal_device is None and sc.peek("[") and not have_dims and not shorthand:
            sc.eat("[")
            have_dims = True
            if not sc.eat("]"):
                while True:
                    axes, closed = parse_axis_list(sc, mesh, allow_open=True)
                    dims.append(DimSharding(axes, closed))
                    if sc.eat(","):
                        continue
                    sc.expect("]", "',' or ']' in the dim shardings")
                    break
            continue
        word_pos = sc.pos
        for w in ("replicated", "unreduced", "manual", "metadata"):
            if sc.word(w):
                break
        else:
            raise sc.error("expected '[dims]', replicated, unreduced, manual or metadata= in a "
                           "named sharding")
        if w == "metadata":
            sc.expect("=", "'=' after metadata")
            sc.ws()
            end = _skip_balanced(text, sc.pos)
            if end < 0:
                raise sc.error("unbalanced metadata value")
            metadata = text[sc.pos:end]
            sc.pos = end
            continue
        if mesh.maximal_device is not None:
            raise sc.error(f"a maximal mesh sharding cannot be {w}", word_pos)
        if sc.eat("="):
            if w in kinds:
                raise sc.error(f"{w}= given twice", word_pos)
            kinds[w] = parse_axis_list(sc, mesh, allow_open=False)[0]
        else:
            if have_dims or kinds or shorthand:
                raise sc.error(f"'{w}' without axes must stand alone after the mesh", word_pos)
            shorthand = w
    sc.expect("}", "'}' to end the named sharding")
    if shorthand is not None:
        every = tuple(AxisRef(i) for i in range(len(mesh.names)))
        if shorthand == "unreduced":
            kinds["unreduced"] = every
        elif shorthand == "manual":
            kinds["manual"] = every
    ns = NamedSharding(mesh, tuple(dims), kinds.get("replicated", ()),
                       kinds.get("unreduced", ()), kinds.get("manual", ()))
    ns.validate()
    return ns, metadata, sc.pos


# -- replica groups over mesh axes -------------------------------------------------------
def parse_mesh_groups(text: str, pos: int = 0) -> tuple[Mesh, tuple[AxisRef, ...], int]:
    """``mesh['x'=2,'y'=4][, device_ids=(...)] {'x','y':(1)2}`` -> (mesh, axes, end)."""
    sc = _Scan(text, pos)
    mesh = parse_mesh(sc)
    if mesh.maximal_device is not None:
        raise sc.error("replica groups need a mesh with axes, not a maximal mesh")
    axes, _ = parse_axis_list(sc, mesh, allow_open=False)
    _check_axes(mesh, [("replica groups", a) for a in axes])
    if math.prod(a.length(mesh) for a in axes) < 2:
        raise sc.error("replica groups over mesh axes need more than one device per group")
    return mesh, axes, sc.pos


def mesh_groups_text(mesh: Mesh, axes: Sequence[AxisRef]) -> str:
    """XLA's MeshAxesReplicaGroupList::ToString."""
    return mesh.text() + " {" + ",".join(a.text(mesh) for a in axes) + "}"


def mesh_groups_array(mesh: Mesh, axes: Sequence[AxisRef]) -> np.ndarray:
    """[num_groups, group_size] devices: a group varies over ``axes`` (in the order listed)."""
    ta = NamedSharding(mesh, (), (), (), tuple(axes)).to_tiles()
    # to_tiles gives [manual = the listed axes, unreduced = 1, the other factors];
    # a group fixes the other factors and varies the listed axes.
    arr = ta.array().reshape(ta.dims[0], -1)
    return np.ascontiguousarray(arr.T)


# -- protos -------------------------------------------------------------------------------
def axis_from_proto(msg: Any) -> AxisRef:
    if msg.HasField("sub_axis_info"):
        return AxisRef(int(msg.mesh_axis_index), int(msg.sub_axis_info.pre_size),
                       int(msg.sub_axis_info.size))
    return AxisRef(int(msg.mesh_axis_index))


def axis_to_proto(a: AxisRef, msg: Any) -> None:
    msg.mesh_axis_index = a.index
    if a.pre_size is not None:
        msg.sub_axis_info.pre_size = a.pre_size
        msg.sub_axis_info.size = int(a.size or 0)


def mesh_from_proto(msg: Any) -> Mesh:
    if not len(msg.axes):
        if len(msg.device_ids) == 1:
            mesh = Mesh(maximal_device=int(msg.device_ids[0]))
            validate_mesh(mesh)
            return mesh
        if len(msg.device_ids):
            raise ShardingError(f"a mesh without axes lists {len(msg.device_ids)} device ids "
                                "(a maximal mesh has exactly one)")
        return Mesh()
    names = tuple(str(a.name) for a in msg.axes)
    sizes = tuple(int(a.size) for a in msg.axes)
    ids = tuple(int(d) for d in msg.device_ids) if len(msg.device_ids) else None
    iota = None
    if ids is None and msg.HasField("iota_transform") and len(msg.iota_transform.reshape_dims):
        t = msg.iota_transform
        reshape = [int(d) for d in t.reshape_dims]
        perm = [int(p) for p in t.transpose_perm] or list(range(len(reshape)))
        if sorted(perm) != list(range(len(reshape))):
            raise ShardingError(f"mesh iota_transform perm {perm} is not a permutation")
        r, p = canonicalize_iota(reshape, perm)
        if math.prod(reshape) != math.prod(sizes):
            raise ShardingError(f"mesh iota_transform {reshape} holds {math.prod(reshape)} "
                                f"devices but the axis sizes multiply to {math.prod(sizes)}")
        iota = (tuple(r), tuple(p)) if len(r) > 1 else None
    mesh = Mesh(names, sizes, ids, iota)
    validate_mesh(mesh)
    return mesh


def mesh_to_proto(mesh: Mesh, msg: Any) -> None:
    if mesh.maximal_device is not None:
        msg.device_ids.append(mesh.maximal_device)
        return
    for n, s in zip(mesh.names, mesh.sizes):
        ax = msg.axes.add()
        ax.name, ax.size = n, s
    if mesh.device_ids is not None:
        msg.device_ids.extend(mesh.device_ids)
    elif mesh.iota is not None:
        msg.iota_transform.reshape_dims.extend(mesh.iota[0])
        msg.iota_transform.transpose_perm.extend(mesh.iota[1])


def named_from_proto(msg: Any) -> NamedSharding:
    mesh = mesh_from_proto(msg.mesh)
    dims = tuple(DimSharding(tuple(axis_from_proto(a) for a in d.axes), bool(d.is_closed))
                 for d in msg.dim_shardings)
    ns = NamedSharding(mesh, dims, tuple(axis_from_proto(a) for a in msg.replicated_axes),
                       tuple(axis_from_proto(a) for a in msg.unreduced_axes),
                       tuple(axis_from_proto(a) for a in msg.manual_axes))
    ns.validate()
    return ns


def named_to_proto(ns: NamedSharding, msg: Any) -> None:
    """Fill a NamedShardingProto (metadata is written by the caller)."""
    msg.mesh.SetInParent()
    mesh_to_proto(ns.mesh, msg.mesh)
    for d in ns.dims:
        dm = msg.dim_shardings.add()
        for a in d.axes:
            axis_to_proto(a, dm.axes.add())
        dm.is_closed = d.is_closed
    for field, axes in (("replicated_axes", ns.replicated), ("unreduced_axes", ns.unreduced),
                        ("manual_axes", ns.manual)):
        for a in axes:
            axis_to_proto(a, getattr(msg, field).add())

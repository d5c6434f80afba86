"""Annotations given from outside the module: ``--mesh data=2,model=4`` and
``--shard TARGET=SPEC`` (any framework, or an unannotated dump), and the reverse: a
sharding written back in that mesh-axis form for display.

TARGET is an instruction name, ``#K`` (entry parameter K), ``out`` (the entry result) or
``out#K`` (element K of a tuple result). SPEC has one entry per tensor dim, separated by
commas: a mesh axis name, several joined with ``+`` (major first), or ``_`` (unsharded);
an empty SPEC is a scalar. Mesh axes a spec does not use replicate the data. Shardings
are built by :func:`hlo_spmd.sharding.mesh.named_split` (GSPMD's ``mesh_split``), so a
spec means what ``jax.sharding.PartitionSpec`` means on a mesh of the same shape. There
is no XLA counterpart; this is what JAX's ``NamedSharding`` does before lowering.
"""
from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from hlo_spmd.errors import HloSpmdError, ShardingError

if TYPE_CHECKING:
    from hlo_spmd.ir.instruction import Instruction
    from hlo_spmd.ir.module import Module
    from hlo_spmd.sharding import HloSharding

Mesh = list[tuple[str, int]]
DimSpec = Union[str, tuple[str, ...], None]
SpecLike = Union[str, Sequence[Union[str, Sequence[str], None]]]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SpecError(ShardingError):
    """A malformed --mesh or --shard value."""


@dataclass(frozen=True)
class ShardSpec:
    target: str
    dims: tuple[DimSpec, ...]
    text: str


def parse_mesh(text: str | Mapping[str, int] | Sequence[tuple[str, int]]) -> Mesh:
    """``"data=2,model=4"`` (or a mapping / pairs) -> ``[("data", 2), ("model", 4)]``."""
    if isinstance(text, Mapping):
        items = [(str(k), v) for k, v in text.items()]
    elif isinstance(text, str):
        items = []
        for part in text.split(","):
            name, eq, size = part.strip().partition("=")
            if not eq:
                raise SpecError(f"--mesh {text!r}: expected NAME=SIZE, got {part.strip()!r}")
            items.append((name.strip(), size.strip()))
    else:
        items = [(str(k), v) for k, v in text]
    out: Mesh = []
    for name, size in items:
        if name == "_" or not _NAME.match(name):
            raise SpecError(f"--mesh: {name!r} is not a valid axis name")
        try:
            n = int(size)
        except (TypeError, ValueError):
            raise SpecError(f"--mesh: axis {name} has size {size!r}, not an integer") from None
        if n < 1:
            raise SpecError(f"--mesh: axis {name} must have size >= 1, got {n}")
        if any(name == m for m, _ in out):
            raise SpecError(f"--mesh: axis {name} given twice")
        out.append((name, n))
    if not out:
        raise SpecError("--mesh: no axes given")
    return out


def mesh_text(mesh: Mesh) -> str:
    return ",".join(f"{n}={s}" for n, s in mesh)


def _parse_dims(spec: str, where: str) -> tuple[DimSpec, ...]:
    spec = spec.strip()
    if not spec:
        return ()
    dims: list[DimSpec] = []
    for entry in spec.split(","):
        entry = entry.strip()
        if entry == "_":
            dims.append(None)
            continue
        axes = tuple(a.strip() for a in entry.split("+"))
        for a in axes:
            if not _NAME.match(a) or a == "_":
                raise SpecError(f"{where}: {entry!r} is not an axis name, a+b, or _")
        dims.append(axes[0] if len(axes) == 1 else axes)
    return tuple(dims)


def parse_shard(text: str) -> ShardSpec:
    """``"#0=data,_"`` -> ShardSpec(target="#0", dims=("data", None))."""
    target, eq, spec = text.partition("=")
    target = target.strip()
    if not eq or not target:
        raise SpecError(f"--shard {text!r}: expected TARGET=SPEC (e.g. '#0=data,_')")
    return ShardSpec(target, _parse_dims(spec, f"--shard {text!r}"), text)


def as_shard_specs(shard: Mapping[str, SpecLike] | Sequence[str] | None) -> list[ShardSpec]:
    """The API's forms: {"#0": "data,_"}, {"#0": ["data", None]}, or ["#0=data,_"]."""
    if not shard:
        return []
    if isinstance(shard, str):
        return [parse_shard(shard)]
    if isinstance(shard, Mapping):
        out = []
        for target, spec in shard.items():
            if isinstance(spec, str):
                out.append(parse_shard(f"{target}={spec}"))
            else:
                dims: list[DimSpec] = []
                for d in spec:
                    dims.append(None if d is None or d == "_" else
                                d if isinstance(d, str) else tuple(d))
                out.append(ShardSpec(str(target), tuple(dims), f"{target}={list(spec)}"))
        return out
    return [parse_shard(s) for s in shard]


def spec_sharding(mesh: Mesh, dims: Sequence[DimSpec], rank: int, where: str) -> "HloSharding":
    from hlo_spmd.sharding.mesh import named_split

    if len(dims) != rank:
        raise SpecError(f"{where}: {len(dims)} spec entries for a rank-{rank} value "
                        "(one per dim; '_' for unsharded)")
    try:
        return named_split(rank, mesh, list(dims))
    except ShardingError as e:
        raise SpecError(f"{where}: {e.message if hasattr(e, 'message') else e}") from None


def _resolve(module: "Module", target: str, where: str,
             params: "dict[int, Instruction] | None" = None) -> tuple["Instruction", int | None]:
    """``params``: the entry parameters by number, when the caller resolves many targets
    (listing them scans the whole entry computation)."""
    entry = module.entry
    m = re.fullmatch(r"#(\d+)", target)
    if m:
        k = int(m.group(1))
        if params is None:
            params = {p.parameter_number: p for p in entry.parameters}
        if k not in params:
            raise SpecError(f"{where}: the entry computation has no parameter {k} "
                            f"(it has {len(params)})")
        return params[k], None
    m = re.fullmatch(r"out(?:#(\d+))?", target)
    if m:
        root = entry.root
        if m.group(1) is None:
            return root, None
        k = int(m.group(1))
        if not root.shape.is_tuple or k >= len(root.shape.tuple_shapes):
            raise SpecError(f"{where}: the result has no tuple element {k}")
        return root, k
    found = [i for c in module.computations for i in c.instructions if i.name == target]
    if not found:
        raise SpecError(f"{where}: no instruction named {target!r}")
    return found[0], None


def apply_shards(module: "Module", mesh: Mesh | None, shards: Sequence[ShardSpec]) -> "Module":
    """Set the given shardings on ``module`` (in place) as user annotations."""
    from hlo_spmd.sharding import HloSharding

    if shards and mesh is None:
        raise SpecError("--shard needs --mesh (or a Shardy mesh in the module)")
    tuple_parts: dict[int, tuple["Instruction", dict[int, "HloSharding"]]] = {}
    params = ({p.parameter_number: p for p in module.entry.parameters}
              if shards and module.entry is not None else None)
    for spec in shards:
        where = f"--shard {spec.text!r}"
        inst, k = _resolve(module, spec.target, where, params)
        shape = inst.shape.tuple_shapes[k] if k is not None else inst.shape
        if not shape.is_array:
            raise SpecError(f"{where}: {inst.name} is a tuple or token; "
                            "name an element (out#K) or an array value")
        s = spec_sharding(mesh, spec.dims, shape.rank, where)  # type: ignore[arg-type]
        if k is None:
            inst.sharding = s
        else:
            tuple_parts.setdefault(id(inst), (inst, {}))[1][k] = s
    for inst, parts in tuple_parts.values():
        n = len(inst.shape.tuple_shapes)
        old = inst.sharding
        elems = []
        for k in range(n):
            if k in parts:
                elems.append(parts[k])
            elif old is not None:
                elems.append(old.tuple_elements[k] if old.is_tuple else old)
            else:
                missing = [f"out#{j}" for j in range(n) if j not in parts]
                raise SpecError(f"--shard: the result is a {n}-tuple without a sharding; "
                                f"also give {', '.join(missing)}")
        inst.sharding = HloSharding.tuple(elems)
    return module


# -- the reverse: a sharding in mesh-axis form ----------------------------------------------
def _axis_orders(mesh: Mesh, tiles: int, free: list[int]) -> list[tuple[int, ...]]:
    """Ordered sets of unused mesh axes whose sizes multiply to ``tiles``."""
    out = []
    if tiles == 1:
        return [()]
    for r in range(1, len(free) + 1):
        for combo in itertools.permutations(free, r):
            if math.prod(mesh[a][1] for a in combo) == tiles:
                out.append(combo)
    return out


def mesh_form(sharding: "HloSharding | None", rank: int | None, mesh: Mesh,
              limit: int = 4096) -> str | None:
    """``sharding`` written as a spec on ``mesh`` (``"data,_"``), or None when it is not
    such a sharding (maximal, manual, another device order, or a different size)."""
    from hlo_spmd.sharding.mesh import named_split

    if sharding is None or rank is None:
        return None
    if sharding.is_tuple:
        return None
    if sharding.is_replicated:
        return ",".join(["_"] * rank) if rank else "replicated"
    if not sharding.is_tiled or sharding.is_manual:
        return None
    if sharding.num_devices != math.prod(s for _, s in mesh):
        return None
    try:
        tiles = list(sharding.tile_dims_for_data(rank))
    except HloSpmdError:
        return None
    if len(tiles) != rank:  # a sharding of another rank (an unverified module): no form
        return None
    tried = 0

    def search(d: int, free: list[int], acc: list[tuple[int, ...]]) -> list | None:
        nonlocal tried
        if d == rank:
            tried += 1
            if tried > limit:
                return None
            spec = [None if not a else mesh[a[0]][0] if len(a) == 1 else
                    tuple(mesh[x][0] for x in a) for a in acc]
            try:
                if named_split(rank, mesh, spec) == sharding:
                    return list(acc)
            except ShardingError:
                return None
            return None
        for order in _axis_orders(mesh, tiles[d], free):
            got = search(d + 1, [a for a in free if a not in order], acc + [order])
            if got is not None:
                return got
        return None

    found = search(0, list(range(len(mesh))), [])
    if found is None:
        return None
    return ",".join("_" if not a else "+".join(mesh[x][0] for x in a) for a in found) or "replicated"


def mesh_form_of(sharding: "HloSharding | None", shape, mesh: Mesh | None) -> str | None:
    """Mesh form of an instruction's sharding (tuple shardings element by element)."""
    if mesh is None or sharding is None or shape is None:
        return None
    try:
        if sharding.is_tuple and shape.is_tuple:
            parts = [mesh_form(e, s.rank if s.is_array else None, mesh) or "?"
                     for e, s in zip(sharding.tuple_elements, shape.tuple_shapes)]
            return "(" + " | ".join(parts) + ")"
        if not shape.is_array:
            return None
        return mesh_form(sharding, shape.rank, mesh)
    except HloSpmdError:
        return None


def module_mesh(module: "Module") -> Mesh | None:
    """The module's Shardy mesh (``xla.sdy.meshes``) when it has exactly one."""
    try:
        from hlo_spmd.annotations.normalize import module_meshes

        meshes = module_meshes(module)
    except HloSpmdError:
        return None
    if len(meshes) != 1:
        return None
    (m,) = meshes.values()
    if m.device_ids and list(m.device_ids) != list(range(len(m.device_ids))):
        return None  # a permuted mesh: the spec form would hide the device order
    try:
        axes = [(a.name, int(a.size)) for a in m.axes]
    except (AttributeError, TypeError, ValueError):
        return None
    return axes or None


__all__ = ["parse_mesh", "parse_shard", "as_shard_specs", "apply_shards", "mesh_form",
           "mesh_form_of", "module_mesh", "mesh_text", "SpecError", "ShardSpec"]


# -- which outputs / parameters propagation may choose (--propagate-to-output / -params) ----
def parse_propagation_flags(text: str, count: int, what: str) -> tuple[bool, ...]:
    """See below; ``what`` is "output" or "parameter"."""
    option = "--propagate-to-output" if what == "output" else "--propagate-to-params"
    return _propagation_flags(text, count, what, option)


def _propagation_flags(text: str, count: int, what: str, option: str) -> tuple[bool, ...]:
    """``--propagate-to-output WHICH`` / ``--propagate-to-params WHICH`` for a module with
    ``count`` outputs / entry parameters, as one bool each (XLA's
    ``allow_spmd_sharding_propagation_to_*`` list). WHICH is ``all``, ``none``, the
    indices allowed (``0,2``), or XLA's bool list (``true,false,true``; one for all)."""
    words = [w.strip() for w in text.strip().strip("{}").split(",")]
    low = [w.lower() for w in words]
    if low == ["all"]:
        return (True,) * count
    if low == ["none"]:
        return (False,) * count
    if low and all(w in ("true", "false") for w in low):
        return per_item_flags([w == "true" for w in low], count, what, f"{option} {text!r}")
    if low and all(w.isdigit() for w in low):
        chosen = {int(w) for w in low}
        bad = sorted(k for k in chosen if k >= count)
        if bad:
            raise ShardingError(f"{option} {text!r}: no {what} {bad[0]} (the "
                                f"module has {count})")
        return tuple(k in chosen for k in range(count))
    raise ShardingError(f"{option} {text!r}: expected all, none, indices like "
                        "0,2 or booleans like true,false")


def per_item_flags(flags: bool | Sequence[bool], n: int, what: str,
                   source: str | None = None) -> tuple[bool, ...]:
    """``flags`` (one bool, or a list of one per item or a single one for all, XLA's
    convention for ``allow_spmd_sharding_propagation_to_*``) as one bool per item;
    ``source`` names where the list came from in the error."""
    if isinstance(flags, bool):
        return (flags,) * n
    flags = tuple(bool(f) for f in flags)
    if len(flags) == 1:
        return flags * n
    if len(flags) != n:
        raise ShardingError(f"{source or f'propagation to {what}s'}: {len(flags)} flags "
                            f"given but the module has {n} {what}s")
    return flags


def propagation_counts(module: "Module") -> tuple[int, int]:
    """(outputs, entry parameters) of ``module``: what the flags above count. Outputs are
    the root's tuple elements (one for an array root)."""
    entry = module.entry
    if entry is None or entry.root is None:
        return 0, 0
    shape = entry.root.shape
    return (len(shape.tuple_shapes) if shape.is_tuple else 1), len(entry.parameters)

"""Read every form of user sharding annotation into ``Instruction.sharding``.

Forms (all may appear in one module; a current JAX with default settings emits the
Shardy form next to the classic one):

1. the classic ``sharding`` field of an instruction;
2. ``custom-call`` target ``Sharding`` (``with_sharding_constraint``), whose
   ``backend_config`` may be ``unspecified_dims=[0,1]``: dims propagation may refine;
3. ``SPMDFullToShardShape`` / ``SPMDShardToFullShape`` custom-calls: the boundaries of
   a manual region (``shard_map`` in classic form);
4. Shardy: ``xla.sdy.sharding`` frontend attributes (read where XLA reads them:
   parameters, send/recv/after-all, ``Sharding`` and Python-callback custom-calls), the
   module's ``xla.sdy.meshes``,
   ``xla.sdy.FuncResultSharding`` custom-calls (the sharding of the entry result they
   feed), ``xla.sdy.tuple_args_shardings`` / ``xla.sdy.tuple_results_shardings`` on the
   module, and manual computations: ``xla.sdy.GlobalToLocalShape`` -> ``call`` of an
   ``xla.sdy.manual_computation_body`` -> ``xla.sdy.LocalToGlobalShape`` with
   ``xla.sdy.manual_axes`` / ``xla.sdy.in_shardings`` / ``xla.sdy.out_shardings``.

``normalize_annotations`` sets ``inst.sharding`` where only the Shardy form gives one,
checks that classic and Shardy forms agree where both are present, validates every
sharding against its shape and the module's device count, and returns an
``AnnotationReport``.  Custom-calls are neither removed nor rewritten.

Inside a Shardy manual computation the manual axes are implicit in Shardy's
shardings; they are made explicit here (a ``manual`` subgroup), as XLA's Shardy export
does.  JAX writes the classic field of such instructions without the manual axes, so
for them a classic sharding agrees when it matches either reading.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping, Sequence

from hlo_spmd.annotations import sdy
from hlo_spmd.errors import ShardingError
from hlo_spmd.ir.opcodes import SDY_SHARDING_ATTR
from hlo_spmd.records import Record

if TYPE_CHECKING:
    from hlo_spmd.ir.computation import Computation
    from hlo_spmd.ir.instruction import Instruction
    from hlo_spmd.ir.module import Module
    from hlo_spmd.ir.shape import Shape
    from hlo_spmd.sharding import HloSharding

__all__ = [
    "AnnotationRecord", "ManualBoundary", "ManualRegion", "AnnotationReport",
    "normalize_annotations", "module_device_count", "module_meshes",
    "parse_unspecified_dims", "ORIGINS",
]

# Custom-call targets and attribute names (XLA's xla/service/spmd/shardy/constants.h).
SHARDING_TARGET = "Sharding"
FULL_TO_SHARD = "SPMDFullToShardShape"
SHARD_TO_FULL = "SPMDShardToFullShape"
SDY_FUNC_RESULT = "xla.sdy.FuncResultSharding"
SDY_GLOBAL_TO_LOCAL = "xla.sdy.GlobalToLocalShape"
SDY_LOCAL_TO_GLOBAL = "xla.sdy.LocalToGlobalShape"
ATTR_SHARDING = "xla.sdy.sharding"
ATTR_MESHES = "xla.sdy.meshes"
ATTR_MANUAL_AXES = "xla.sdy.manual_axes"
ATTR_IN_SHARDINGS = "xla.sdy.in_shardings"
ATTR_OUT_SHARDINGS = "xla.sdy.out_shardings"
ATTR_TUPLE_ARGS = "xla.sdy.tuple_args_shardings"
ATTR_TUPLE_RESULTS = "xla.sdy.tuple_results_shardings"
MANUAL_BODY_PREFIXES = ("xla.sdy.manual_computation_body",
                        "xla.sdy.inlinable_manual_computation_body")

# Where XLA's Shardy import honours an ``xla.sdy.sharding`` attribute (the table's
# ``sdy-attr``); elsewhere it is dropped, because XLA passes copy frontend attributes onto
# new instructions (e.g. the get-tuple-elements of a callback) where the sharding no
# longer fits.
SDY_SHARDING_OPCODES = SDY_SHARDING_ATTR
PYTHON_CALLBACK_TARGETS = ("xla_python_cpu_callback", "xla_ffi_python_cpu_callback",
                           "xla_python_gpu_callback", "xla_ffi_python_gpu_callback")

ORIGINS = ("sharding-field", "sharding-custom-call", "sdy", "sdy-func-result",
           "manual-boundary")

_ENTERS = (FULL_TO_SHARD, SDY_GLOBAL_TO_LOCAL)
_EXITS = (SHARD_TO_FULL, SDY_LOCAL_TO_GLOBAL)


# ---------------------------------------------------------------------------------------
# Report types
# ---------------------------------------------------------------------------------------
# The report types are hlo_spmd.records.Record classes (equality and repr as the
# dataclasses they were; a dataclass costs ~0.4-0.8 ms to create at import).
class AnnotationRecord(Record):
    """The user annotation of one instruction and where it came from."""
    __match_args__ = ("name", "computation", "sharding", "origin", "unspecified_dims",
                      "leaf_unspecified_dims", "sdy_text", "classic", "manual_axes",
                      "result_indices")
    __slots__ = __match_args__

    def __init__(self, name: str, computation: str, sharding: "HloSharding", origin: str,
                 unspecified_dims: tuple[int, ...] = (),
                 leaf_unspecified_dims: dict[int, tuple[int, ...]] | None = None,
                 sdy_text: str | None = None, classic: "HloSharding | None" = None,
                 manual_axes: tuple[str, ...] = (),
                 result_indices: tuple[tuple[int, ...], ...] = ()) -> None:
        self.name = name
        self.computation = computation
        self.sharding = sharding
        self.origin = origin
        # Dims propagation may still refine (array-shaped values).
        self.unspecified_dims = unspecified_dims
        # Same for tuple-shaped values: flat leaf index -> dims.
        self.leaf_unspecified_dims = ({} if leaf_unspecified_dims is None
                                      else leaf_unspecified_dims)
        # The Shardy attribute text the sharding was read from, if any.
        self.sdy_text = sdy_text
        # The classic ``sharding`` field as loaded, when a Shardy form was present too.
        self.classic = classic
        # Manual axes (Shardy) in effect where the instruction lives.
        self.manual_axes = manual_axes
        # For 'sdy-func-result': the entry result leaves (shape indices) it annotates.
        self.result_indices = result_indices


class ManualBoundary(Record):
    """One value crossing into (``enter``) or out of (``exit``) manual mode."""
    __match_args__ = ("name", "kind", "target", "value_index", "full_shape", "shard_shape",
                      "full_sharding", "manual_sharding", "unspecified_dims")
    __slots__ = __match_args__

    def __init__(self, name: str, kind: str, target: str, value_index: int,
                 full_shape: "Shape", shard_shape: "Shape",
                 full_sharding: "HloSharding | None", manual_sharding: "HloSharding | None",
                 unspecified_dims: tuple[int, ...] = ()) -> None:
        self.name = name                    # the boundary custom-call
        self.kind = kind                    # 'enter' | 'exit'
        self.target = target                # custom_call_target
        self.value_index = value_index      # operand (enter) / result leaf (exit) position
        self.full_shape = full_shape
        self.shard_shape = shard_shape
        self.full_sharding = full_sharding      # sharding of the global-shaped side
        self.manual_sharding = manual_sharding  # sharding of the local (manual) side
        self.unspecified_dims = unspecified_dims


class ManualRegion(Record):
    """Instructions between manual-mode entries and exits, plus the bodies they call."""
    __match_args__ = ("computation", "form", "manual_axes", "all_manual_axes", "entries",
                      "exits", "instructions", "body_computations")
    __slots__ = __match_args__

    def __init__(self, computation: str, form: str, manual_axes: tuple[str, ...] = (),
                 all_manual_axes: tuple[str, ...] = (),
                 entries: list[ManualBoundary] | None = None,
                 exits: list[ManualBoundary] | None = None,
                 instructions: tuple[str, ...] = (),
                 body_computations: tuple[str, ...] = ()) -> None:
        self.computation = computation
        self.form = form                        # 'classic' | 'sdy'
        self.manual_axes = manual_axes          # sdy: this region's own manual axes
        self.all_manual_axes = all_manual_axes  # sdy: enclosing + own
        self.entries = [] if entries is None else entries
        self.exits = [] if exits is None else exits
        self.instructions = instructions        # inside, in `computation`, boundaries excluded
        self.body_computations = body_computations  # called (transitively) from inside

    @property
    def boundary_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(b.name for b in self.entries + self.exits))


class AnnotationReport(Record):
    __match_args__ = ("records", "manual_regions", "user_annotated", "device_count",
                      "meshes", "has_shardy", "ignored_sdy")
    __slots__ = __match_args__

    def __init__(self, records: list[AnnotationRecord] | None = None,
                 manual_regions: list[ManualRegion] | None = None,
                 user_annotated: set[str] | None = None, device_count: int | None = None,
                 meshes: dict[str, sdy.SdyMesh] | None = None, has_shardy: bool = False,
                 ignored_sdy: list[str] | None = None) -> None:
        self.records = [] if records is None else records
        self.manual_regions = [] if manual_regions is None else manual_regions
        # Instructions whose sharding propagation must keep (their open dims aside).
        self.user_annotated = set() if user_annotated is None else user_annotated
        self.device_count = device_count
        self.meshes = {} if meshes is None else meshes
        self.has_shardy = has_shardy
        # Instructions whose ``xla.sdy.sharding`` was ignored, as XLA ignores it (see
        # SDY_SHARDING_OPCODES); their classic field, if any, is still read.
        self.ignored_sdy = [] if ignored_sdy is None else ignored_sdy

    def get(self, name: str) -> AnnotationRecord | None:
        for r in self.records:
            if r.name == name:
                return r
        return None

    def __getitem__(self, name: str) -> AnnotationRecord:
        r = self.get(name)
        if r is None:
            raise KeyError(name)
        return r

    def __contains__(self, name: object) -> bool:
        return any(r.name == name for r in self.records)

    def by_origin(self, origin: str) -> list[AnnotationRecord]:
        return [r for r in self.records if r.origin == origin]

    def unspecified_dims(self, name: str) -> tuple[int, ...]:
        r = self.get(name)
        return r.unspecified_dims if r is not None else ()


# ---------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------
def _where(source: str | None, comp: "Computation | None", inst: "Instruction | None") -> str:
    parts = []
    if comp is not None:
        parts.append(f"computation {comp.name}")
    if inst is not None:
        parts.append(f"instruction {inst.name}")
    text = ", ".join(parts)
    return f"{source}: {text}" if source else text


def _target(inst: "Instruction") -> str:
    return inst.custom_call_target if inst.opcode == "custom-call" else ""


def _fattrs(inst: "Instruction") -> Mapping[str, str]:
    """The frontend attributes, read in place (every caller only reads them)."""
    return inst.attrs.frontend_attributes.map


def _leaf_shapes(shape: "Shape") -> list["Shape"]:
    return [s for _, s in shape.leaves()] if shape.is_tuple else [shape]


def _leaf_indices(shape: "Shape") -> list[tuple[int, ...]]:
    return [idx for idx, _ in shape.leaves()] if shape.is_tuple else [()]


def _sharding_leaves(sharding: "HloSharding", shape: "Shape") -> list["HloSharding"]:
    """One sharding per leaf of ``shape`` (a non-tuple sharding applies to every leaf)."""
    n = len(_leaf_shapes(shape))
    if sharding.is_tuple:
        return list(sharding.tuple_elements)
    return [sharding] * max(n, 1)


def _leaf_producers(inst: "Instruction", idx: tuple[int, ...],
                    producers: dict[tuple[int, ...], "Instruction"]) -> None:
    """Fill ``producers`` with the instruction producing each tuple leaf of ``inst``
    (by leaf index), looking through tuples and get-tuple-elements of tuples.  (A
    module function: a recursive closure is a reference cycle, freed only by a garbage
    collection.)"""
    if inst.opcode == "tuple":
        for i, op in enumerate(inst.operands):
            _leaf_producers(op, idx + (i,), producers)
    elif (inst.opcode == "get-tuple-element" and inst.operands
          and inst.operands[0].opcode == "tuple"):
        _leaf_producers(inst.operands[0].operands[inst.tuple_index], idx, producers)
    else:
        producers[idx] = inst


def _combine(shardings: Sequence["HloSharding"], shape: "Shape") -> "HloSharding":
    from hlo_spmd.sharding import HloSharding

    if shape.is_tuple:
        if not shape.leaves() and len(shardings) == 1:
            return shardings[0]        # a no-result op: the sharding of the op itself
        return HloSharding.tuple(shardings)
    assert len(shardings) == 1
    return shardings[0]


_ATTR_RE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*=\s*")
_DIMS_RE = re.compile(r"\[\s*(-?\d+(?:\s*,\s*-?\d+)*)?\s*,?\s*\]")


def parse_unspecified_dims(config: str | bytes, where: str | None = None) -> tuple[int, ...]:
    """``unspecified_dims=[0,1]`` (XLA's sharding_op_util attribute text); '' -> ()."""
    if isinstance(config, (bytes, bytearray)):
        try:
            text = bytes(config).decode("utf-8")
        except UnicodeDecodeError:
            raise ShardingError("cannot parse sharding op attributes: backend_config is not "
                                "UTF-8 text", where) from None
    else:
        text = config
    if not text.strip() or text.strip() == "{}":
        return ()
    dims: list[int] = []
    pos = 0
    while pos < len(text):
        if not text[pos:].strip():
            break
        m = _ATTR_RE.match(text, pos)
        if m is None:
            raise ShardingError(f"cannot parse sharding op attributes {text!r}", where)
        name = m.group(1)
        if name != "unspecified_dims":
            raise ShardingError(f"unknown attribute {name!r} in sharding op attributes {text!r}",
                                where)
        d = _DIMS_RE.match(text, m.end())
        if d is None:
            raise ShardingError(f"cannot parse sharding op attributes {text!r}: expected "
                                "unspecified_dims=[d0,d1,...]", where)
        if d.group(1):
            dims.extend(int(x) for x in d.group(1).split(","))
        pos = d.end()
    return tuple(dims)


def _check_dims(dims: Iterable[int], rank: int, what: str, where: str) -> tuple[int, ...]:
    out = tuple(dims)
    for d in out:
        if not 0 <= d < rank:
            raise ShardingError(f"{what}: dim {d} out of range for rank {rank}", where)
    if len(set(out)) != len(out):
        raise ShardingError(f"{what}: repeated dims {list(out)}", where)
    return tuple(sorted(out))


def module_meshes(module: "Module", source: str | None = None) -> dict[str, sdy.SdyMesh]:
    """The ``xla.sdy.meshes`` module attribute, parsed ({} when absent)."""
    attrs = module.attrs
    if attrs is None or not attrs.HasField("frontend_attributes"):
        return {}
    text = attrs.frontend_attributes.map.get(ATTR_MESHES)
    if text is None:
        return {}
    where = f"{source}: module {module.name}" if source else f"module {module.name}"
    return sdy.parse_meshes(text, f"{where}, frontend attribute {ATTR_MESHES}")


def _ordered_computations(module: "Module") -> list["Computation"]:
    rest = [c for c in module.computations if c is not module.entry]
    return ([module.entry] if module.entry is not None else []) + rest


def _iter_shardings(module: "Module") -> Iterator[tuple["Computation", "Instruction"]]:
    """Instructions with a sharding: entry parameters, entry, then the other computations."""
    comps = _ordered_computations(module)
    for comp in comps[:1]:
        for p in comp.parameters:
            if p.sharding is not None:
                yield comp, p
    for n, comp in enumerate(comps):
        for inst in comp.instructions:
            if inst.sharding is not None and not (n == 0 and inst.opcode == "parameter"):
                yield comp, inst


def _leaf_device_counts(sharding: "HloSharding") -> Iterator[int]:
    leaves = sharding.tuple_elements if sharding.is_tuple else (sharding,)
    for s in leaves:
        if s.is_tiled and s.tile_assignment is not None:
            yield s.tile_assignment.num_devices


def module_device_count(module: "Module", source: str | None = None) -> int | None:
    """Devices the module's tiled shardings use (None when none is tiled).

    All tiled shardings must use the same number of devices; the first one found
    (entry parameters first) sets the count, and a later one that differs raises
    ``ShardingError("sharding uses 4 devices but the module uses 8", where)``.
    """
    count: int | None = None
    # Instructions share sharding objects: one that passed (all its leaves agree with
    # the count) passes again, so each object is read once (ids stay valid: the
    # instructions hold them for the whole call).
    passed: set[int] = set()
    for comp, inst in _iter_shardings(module):
        sid = id(inst.sharding)
        if sid in passed:
            continue
        for n in _leaf_device_counts(inst.sharding):
            if count is None:
                count = n
            elif n != count:
                raise ShardingError(f"sharding uses {n} devices but the module uses {count}",
                                    _where(source, comp, inst))
        passed.add(sid)
    return count


# ---------------------------------------------------------------------------------------
# Manual regions
# ---------------------------------------------------------------------------------------
class _RawRegion(Record):
    __match_args__ = ("comp", "entries", "exits", "inner", "form", "own_axes",
                      "in_shardings", "out_shardings")
    __slots__ = __match_args__

    def __init__(self, comp: "Computation", entries: list["Instruction"],
                 exits: list["Instruction"], inner: list["Instruction"], form: str,
                 own_axes: tuple[str, ...] = (),
                 in_shardings: tuple[sdy.TensorSharding, ...] = (),
                 out_shardings: tuple[sdy.TensorSharding, ...] = ()) -> None:
        self.comp = comp
        self.entries = entries
        self.exits = exits
        self.inner = inner
        self.form = form
        self.own_axes = own_axes
        self.in_shardings = in_shardings
        self.out_shardings = out_shardings


def _find_regions(comp: "Computation") -> list[_RawRegion]:
    entries: list["Instruction"] = []
    exits: list["Instruction"] = []
    for i in comp.instructions:   # (one scan: only custom-calls can be boundaries)
        if i.opcode == "custom-call":
            t = i.custom_call_target
            if t in _ENTERS:
                entries.append(i)
            if t in _EXITS:
                exits.append(i)
    if not entries and not exits:
        return []
    users = comp.users()
    boundary = {id(i) for i in entries + exits}
    entry_ids = {id(i) for i in entries}
    exit_ids = {id(i) for i in exits}
    inside: dict[int, "Instruction"] = {}
    # Forward from entries, stopping at exits.
    stack = [u for e in entries for u in users.get(id(e), [])]
    while stack:
        inst = stack.pop()
        if id(inst) in boundary or id(inst) in inside:
            continue
        inside[id(inst)] = inst
        stack.extend(users.get(id(inst), []))
    # Backward from exits, stopping at entries.
    back: set[int] = set()
    stack = [o for x in exits for o in x.operands]
    while stack:
        inst = stack.pop()
        if id(inst) in boundary or id(inst) in back:
            continue
        back.add(id(inst))
        inside[id(inst)] = inst
        stack.extend(inst.operands)
    # Connected components over region members; an entry's operands and an exit's
    # users are global (outside), so those edges do not join regions.
    members = {**inside, **{id(i): i for i in entries + exits}}
    parent: dict[int, int] = {k: k for k in members}

    def find(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for inst in members.values():
        if id(inst) in entry_ids:
            continue
        for op in inst.operands:
            if id(op) in members and id(op) not in exit_ids:
                parent[find(id(op))] = find(id(inst))
    groups: dict[int, list["Instruction"]] = {}
    for inst in comp.instructions:     # program order
        if id(inst) in members:
            groups.setdefault(find(id(inst)), []).append(inst)
    out = []
    for insts in groups.values():
        ents = [i for i in insts if id(i) in entry_ids]
        exs = [i for i in insts if id(i) in exit_ids]
        if not ents and not exs:
            continue
        targets = {_target(i) for i in ents + exs}
        form = "sdy" if targets & {SDY_GLOBAL_TO_LOCAL, SDY_LOCAL_TO_GLOBAL} else "classic"
        out.append(_RawRegion(comp, ents, exs, [i for i in insts if id(i) not in boundary], form))
    return out


def _called_closure(insts: Iterable["Instruction"]) -> list["Computation"]:
    seen: dict[int, "Computation"] = {}
    stack = [c for i in insts for c in i.called_computations]
    while stack:
        c = stack.pop()
        if id(c) in seen:
            continue
        seen[id(c)] = c
        stack.extend(cc for i in c.instructions for cc in i.called_computations)
    return list(seen.values())


# ---------------------------------------------------------------------------------------
# The pass
# ---------------------------------------------------------------------------------------
class _Normalizer:
    def __init__(self, module: "Module", source: str | None) -> None:
        self.module = module
        self.source = source
        self.report = AnnotationReport()
        self.meshes = module_meshes(module, source)
        self.report.meshes = dict(self.meshes)
        self.used_meshes: dict[str, tuple["Computation", "Instruction"]] = {}
        self.regions: list[_RawRegion] = []
        self.inner_region: dict[int, _RawRegion] = {}     # id(inst) -> sdy region it is in
        self.comp_ctx: dict[int, set[tuple[str, ...]]] = {}
        self.records: dict[int, AnnotationRecord] = {}     # id(inst) -> record
        self._visit_fattrs: dict[int, Mapping[str, str]] = {}  # id(inst) -> non-empty ones

    # -- sdy helpers -----------------------------------------------------------------------
    def where(self, comp: "Computation | None", inst: "Instruction | None") -> str:
        return _where(self.source, comp, inst)

    def ctx(self, comp: "Computation", inst: "Instruction | None") -> tuple[str, ...]:
        ctxs = self.comp_ctx.get(id(comp), {()})
        if len(ctxs) > 1:
            raise ShardingError(
                f"computation {comp.name} is called with different manual axes "
                f"({' vs '.join(str(list(c)) for c in sorted(ctxs))}); its Shardy shardings are "
                "ambiguous", self.where(comp, inst))
        base = next(iter(ctxs))
        region = self.inner_region.get(id(inst)) if inst is not None else None
        if region is not None:
            base = base + tuple(a for a in region.own_axes if a not in base)
        return base

    def convert(self, s: sdy.TensorSharding, manual: Sequence[str], rank: int | None,
                comp: "Computation", inst: "Instruction") -> "HloSharding":
        where = self.where(comp, inst)
        if isinstance(s.mesh, str):
            self.used_meshes.setdefault(s.mesh, (comp, inst))
        return sdy.to_hlo_sharding(s, self.meshes, manual, where, rank)

    def convert_values(self, shardings: Sequence[sdy.TensorSharding], shape: "Shape",
                       manual: Sequence[str], comp: "Computation", inst: "Instruction",
                       text: str) -> list["HloSharding"]:
        leaves = _leaf_shapes(shape)
        if len(shardings) == 1 and len(leaves) != 1 and self.axisless(shardings[0]):
            # One maximal / replicated sharding for a whole multi-result (or no-result)
            # op, as Shardy allows; XLA reads it as applying to every leaf.
            return [self.convert(shardings[0], manual, None, comp, inst)] * max(len(leaves), 1)
        if len(shardings) != len(leaves):
            raise ShardingError(f"Shardy sharding {text} has {len(shardings)} value(s) but the "
                                f"instruction has {len(leaves)} result leaf/leaves ({shape})",
                                self.where(comp, inst))
        return [self.convert(s, manual, None if leaf.is_token else leaf.rank, comp, inst)
                for s, leaf in zip(shardings, leaves)]

    def axisless(self, s: sdy.TensorSharding) -> bool:
        mesh = s.mesh if isinstance(s.mesh, sdy.SdyMesh) else self.meshes.get(s.mesh)
        return mesh is not None and not mesh.axes and s.rank == 0

    def parse_values(self, text: str, comp: "Computation", inst: "Instruction",
                     attr: str = ATTR_SHARDING) -> tuple[sdy.TensorSharding, ...]:
        where = f"{self.where(comp, inst)}, frontend attribute {attr}"
        values, _ = sdy.parse_shardings(text, where)
        return values

    def agree(self, classic: "HloSharding", sdy_leaves: Sequence["HloSharding"],
              alt_leaves: Sequence["HloSharding"] | None, shape: "Shape") -> bool:
        try:
            cl = _sharding_leaves(classic, shape)
        except ShardingError:
            return False
        if len(cl) != len(sdy_leaves):
            return False
        for i, c in enumerate(cl):
            if c == sdy_leaves[i]:
                continue
            if alt_leaves is not None and c == alt_leaves[i]:
                continue
            return False
        return True

    def contradiction(self, classic: "HloSharding", text: str, value: "HloSharding",
                      comp: "Computation", inst: "Instruction") -> ShardingError:
        return ShardingError(f"classic sharding {classic} contradicts Shardy sharding {text} "
                             f"(which is {value})", self.where(comp, inst))

    # -- analysis --------------------------------------------------------------------------
    def find_regions(self) -> None:
        for comp in self.module.computations:
            for r in _find_regions(comp):
                if r.form == "sdy":
                    self.read_sdy_region_attrs(r)
                    for inst in r.inner:
                        self.inner_region[id(inst)] = r
                self.regions.append(r)

    def read_sdy_region_attrs(self, r: _RawRegion) -> None:
        axes: tuple[str, ...] | None = None
        holders = list(r.entries) + list(r.exits)
        for inst in holders:
            fa = _fattrs(inst)
            if ATTR_MANUAL_AXES not in fa:
                continue
            where = f"{self.where(r.comp, inst)}, frontend attribute {ATTR_MANUAL_AXES}"
            got = sdy.parse_manual_axes(fa[ATTR_MANUAL_AXES], where)
            if axes is not None and set(got) != set(axes):
                raise ShardingError(f"manual axes {list(got)} differ from {list(axes)} on the "
                                    "other boundary of the same manual computation",
                                    self.where(r.comp, inst))
            axes = got if axes is None else axes
        in_sh: list[sdy.TensorSharding] = []
        out_sh: list[sdy.TensorSharding] = []
        for inst in r.entries:
            fa = _fattrs(inst)
            if _target(inst) == SDY_GLOBAL_TO_LOCAL and ATTR_IN_SHARDINGS in fa:
                in_sh.extend(sdy.parse_sharding_per_value(
                    fa[ATTR_IN_SHARDINGS],
                    f"{self.where(r.comp, inst)}, frontend attribute {ATTR_IN_SHARDINGS}"))
        for inst in r.exits:
            fa = _fattrs(inst)
            if _target(inst) == SDY_LOCAL_TO_GLOBAL and ATTR_OUT_SHARDINGS in fa:
                out_sh.extend(sdy.parse_sharding_per_value(
                    fa[ATTR_OUT_SHARDINGS],
                    f"{self.where(r.comp, inst)}, frontend attribute {ATTR_OUT_SHARDINGS}"))
        # Older exports kept the attributes on the call of the body.
        if axes is None:
            for inst in r.inner:
                fa = _fattrs(inst)
                if inst.opcode == "call" and ATTR_MANUAL_AXES in fa:
                    w = self.where(r.comp, inst)
                    axes = sdy.parse_manual_axes(fa[ATTR_MANUAL_AXES], w)
                    if ATTR_IN_SHARDINGS in fa:
                        in_sh = list(sdy.parse_sharding_per_value(fa[ATTR_IN_SHARDINGS], w))
                    if ATTR_OUT_SHARDINGS in fa:
                        out_sh = list(sdy.parse_sharding_per_value(fa[ATTR_OUT_SHARDINGS], w))
                    break
        if axes is None:
            first = holders[0]
            raise ShardingError(f"Shardy manual computation has no {ATTR_MANUAL_AXES} attribute",
                                self.where(r.comp, first))
        r.own_axes = axes
        r.in_shardings = tuple(in_sh)
        r.out_shardings = tuple(out_sh)

    def compute_contexts(self) -> None:
        entry = self.module.entry
        if entry is None:
            return
        stack: list[tuple["Computation", tuple[str, ...]]] = [(entry, ())]
        visited: set[tuple[int, tuple[str, ...]]] = set()
        while stack:
            comp, ctx = stack.pop()
            if (id(comp), ctx) in visited:
                continue
            visited.add((id(comp), ctx))
            self.comp_ctx.setdefault(id(comp), set()).add(ctx)
            for inst in comp.instructions:
                callees = inst.called_computations
                if not callees:
                    continue   # (most instructions: nothing to carry the context to)
                region = self.inner_region.get(id(inst))
                inner = ctx + tuple(a for a in region.own_axes if a not in ctx) if region else ctx
                for callee in callees:
                    stack.append((callee, inner))

    # -- per instruction --------------------------------------------------------------------
    def add(self, inst: "Instruction", comp: "Computation", sharding: "HloSharding",
            origin: str, **kw) -> AnnotationRecord:  # type: ignore[no-untyped-def]
        rec = AnnotationRecord(inst.name, comp.name, sharding, origin, **kw)
        self.records[id(inst)] = rec
        return rec

    def unspecified_from_sdy(self, values: Sequence[sdy.TensorSharding], shape: "Shape"
                             ) -> tuple[tuple[int, ...], dict[int, tuple[int, ...]]]:
        if shape.is_tuple:
            per = {i: v.open_dims for i, v in enumerate(values) if v.open_dims}
            return (), per
        return (values[0].open_dims if values else ()), {}

    def visit(self, comp: "Computation", inst: "Instruction") -> None:
        target = _target(inst)
        if target in _ENTERS or target in _EXITS:
            return          # handled with its region
        fa = self._visit_fattrs.get(id(inst))
        text = None if fa is None else fa.get(ATTR_SHARDING)
        classic = inst.sharding
        if target == SHARDING_TARGET:
            where = self.where(comp, inst)
            unspec = ()
            if inst.attrs.backend_config:
                unspec = parse_unspecified_dims(inst.attrs.backend_config, where)
            if text is None and classic is None:
                raise ShardingError("Sharding custom-call has no sharding", where)
            self.annotate(comp, inst, text, classic, "sharding-custom-call", unspec)
            return
        if target == SDY_FUNC_RESULT:
            if text is None:
                if classic is None:
                    raise ShardingError(f"{SDY_FUNC_RESULT} custom-call has no {ATTR_SHARDING} "
                                        "attribute", self.where(comp, inst))
                self.add(inst, comp, classic, "sdy-func-result")
                return
            self.annotate(comp, inst, text, classic, "sdy-func-result", ())
            return
        if text is not None and (inst.opcode in SDY_SHARDING_OPCODES
                                 or target in PYTHON_CALLBACK_TARGETS):
            self.annotate(comp, inst, text, classic, "sdy", ())
            return
        if text is not None:
            self.report.ignored_sdy.append(inst.name)
        if classic is not None:
            self.add(inst, comp, classic, "sharding-field")

    def annotate(self, comp: "Computation", inst: "Instruction", text: str | None,
                 classic: "HloSharding | None", origin: str, unspec: tuple[int, ...]) -> None:
        where = self.where(comp, inst)
        shape = inst.shape
        if text is None:
            assert classic is not None
            if not shape.is_tuple:
                unspec = _check_dims(unspec, shape.rank, "unspecified_dims", where)
            self.add(inst, comp, classic, origin, unspecified_dims=unspec)
            return
        values = self.parse_values(text, comp, inst)
        ctx = self.ctx(comp, inst)
        leaves = self.convert_values(values, shape, ctx, comp, inst, text)
        value = _combine(leaves, shape)
        sdy_unspec, leaf_unspec = self.unspecified_from_sdy(values, shape)
        if not shape.is_tuple:
            unspec = _check_dims(set(unspec) | set(sdy_unspec), shape.rank, "unspecified_dims",
                                 where)
        if classic is not None:
            alt = None
            if ctx:
                alt = [self.convert(v, (), None, comp, inst) for v in values]
            if not self.agree(classic, leaves, alt, shape):
                raise self.contradiction(classic, text, value, comp, inst)
            if classic == value:
                value = classic            # keep the loaded object: saves byte-exact
        inst.sharding = value
        self.add(inst, comp, value, origin, unspecified_dims=unspec,
                 leaf_unspecified_dims=leaf_unspec, sdy_text=text,
                 classic=classic, manual_axes=ctx)

    # -- regions ---------------------------------------------------------------------------
    def do_region(self, r: _RawRegion) -> ManualRegion:
        comp = r.comp
        bodies = _called_closure(r.inner)
        region = ManualRegion(comp.name, r.form,
                              instructions=tuple(i.name for i in r.inner),
                              body_computations=tuple(c.name for c in bodies))
        if r.form == "classic":
            self.classic_boundaries(r, region)
        else:
            self.sdy_boundaries(r, region)
        return region

    def classic_boundaries(self, r: _RawRegion, region: ManualRegion) -> None:
        comp = r.comp
        for inst in r.entries + r.exits:
            where = self.where(comp, inst)
            target = _target(inst)
            if target not in (FULL_TO_SHARD, SHARD_TO_FULL):
                raise ShardingError(f"{target} custom-call inside a manual region entered with "
                                    f"{FULL_TO_SHARD}", where)
            if len(inst.operands) != 1 or inst.shape.is_tuple:
                raise ShardingError(f"{target} custom-call must take one array operand and "
                                    "return one array", where)
            unspec: tuple[int, ...] = ()
            if inst.attrs.backend_config:
                unspec = parse_unspecified_dims(inst.attrs.backend_config, where)
            unspec = _check_dims(unspec, inst.shape.rank, "unspecified_dims", where)
            fa = _fattrs(inst)
            if inst.sharding is None and ATTR_SHARDING in fa:
                values = self.parse_values(fa[ATTR_SHARDING], comp, inst)
                inst.sharding = _combine(self.convert_values(
                    values, inst.shape, self.ctx(comp, inst), comp, inst, fa[ATTR_SHARDING]),
                    inst.shape)
            if inst.sharding is None:
                raise ShardingError(f"{target} custom-call has no sharding", where)
            operand = inst.operands[0]
            if operand.shape.rank != inst.shape.rank:
                raise ShardingError(f"{target} changes the rank: {operand.shape} -> {inst.shape}",
                                    where)
            if target == FULL_TO_SHARD:
                s = inst.sharding
                if not (s.is_manual or s.is_manual_subgroup):
                    raise ShardingError(f"{FULL_TO_SHARD} result sharding {s} is not manual", where)
                region.entries.append(ManualBoundary(
                    inst.name, "enter", target, 0, operand.shape, inst.shape,
                    operand.sharding, s, unspec))
            else:
                s = operand.sharding
                if s is not None and not (s.is_manual or s.is_manual_subgroup):
                    raise ShardingError(f"operand {operand.name} of {SHARD_TO_FULL} has "
                                        f"non-manual sharding {s}", where)
                region.exits.append(ManualBoundary(
                    inst.name, "exit", target, 0, inst.shape, operand.shape,
                    inst.sharding, s, unspec))
            self.add(inst, comp, inst.sharding, "manual-boundary", unspecified_dims=unspec)

    def sdy_boundaries(self, r: _RawRegion, region: ManualRegion) -> None:
        comp = r.comp
        outer = self.ctx(comp, None)
        inner_ctx = outer + tuple(a for a in r.own_axes if a not in outer)
        region.manual_axes = r.own_axes
        region.all_manual_axes = inner_ctx
        for a in r.own_axes:
            if a in outer:
                first = (r.entries + r.exits)[0]
                raise ShardingError(f"manual axis {a!r} is already manual in the enclosing "
                                    "manual computation", self.where(comp, first))
        in_pos = 0
        for inst in r.entries:
            if _target(inst) != SDY_GLOBAL_TO_LOCAL:
                raise ShardingError(f"{_target(inst)} custom-call inside a Shardy manual "
                                    "computation", self.where(comp, inst))
            n = len(inst.operands)
            values = r.in_shardings[in_pos:in_pos + n]
            in_pos += n
            self.sdy_boundary(comp, inst, "enter", list(inst.operands), _leaf_shapes(inst.shape),
                              values, outer, inner_ctx, r, region, ATTR_IN_SHARDINGS)
        if r.entries and in_pos != len(r.in_shardings):
            raise ShardingError(f"{ATTR_IN_SHARDINGS} has {len(r.in_shardings)} shardings but the "
                                f"manual computation has {in_pos} operands",
                                self.where(comp, r.entries[0]))
        out_pos = 0
        for inst in r.exits:
            if _target(inst) != SDY_LOCAL_TO_GLOBAL:
                raise ShardingError(f"{_target(inst)} custom-call inside a Shardy manual "
                                    "computation", self.where(comp, inst))
            n = len(inst.operands)
            values = r.out_shardings[out_pos:out_pos + n]
            out_pos += n
            self.sdy_boundary(comp, inst, "exit", list(inst.operands), _leaf_shapes(inst.shape),
                              values, outer, inner_ctx, r, region, ATTR_OUT_SHARDINGS)
        if r.exits and out_pos != len(r.out_shardings):
            raise ShardingError(f"{ATTR_OUT_SHARDINGS} has {len(r.out_shardings)} shardings but "
                                f"the manual computation has {out_pos} results",
                                self.where(comp, r.exits[0]))

    def sdy_boundary(self, comp: "Computation", inst: "Instruction", kind: str,
                     operands: list["Instruction"], results: list["Shape"],
                     values: Sequence[sdy.TensorSharding], outer: tuple[str, ...],
                     inner_ctx: tuple[str, ...], r: _RawRegion, region: ManualRegion,
                     attr: str) -> None:
        where = self.where(comp, inst)
        if len(operands) != len(results):
            raise ShardingError(f"{_target(inst)} has {len(operands)} operands but "
                                f"{len(results)} results", where)
        if len(values) != len(operands):
            raise ShardingError(f"{attr} gives {len(values)} shardings for {len(operands)} "
                                "values", where)
        result_shardings: list["HloSharding"] = []
        leaf_unspec: dict[int, tuple[int, ...]] = {}
        for i, (op, res, v) in enumerate(zip(operands, results, values)):
            full_shape = op.shape if kind == "enter" else res
            local_shape = res if kind == "enter" else op.shape
            if full_shape.is_tuple or local_shape.is_tuple:
                raise ShardingError(f"{_target(inst)} value {i} is a tuple", where)
            full = self.convert(v, outer, full_shape.rank, comp, inst)
            local_v = sdy.erase_axes(v, r.own_axes)
            local = self.convert(local_v, inner_ctx, local_shape.rank, comp, inst)
            self.check_local_shape(v, r.own_axes, full_shape, local_shape, where, i)
            unspec = v.open_dims
            if unspec:
                leaf_unspec[i] = unspec
            boundary = ManualBoundary(inst.name, kind, _target(inst), i, full_shape, local_shape,
                                      full, local, unspec)
            (region.entries if kind == "enter" else region.exits).append(boundary)
            result_shardings.append(local if kind == "enter" else full)
        value = _combine(result_shardings, inst.shape)
        classic = inst.sharding
        if classic is not None and not self.agree(classic, result_shardings, None, inst.shape):
            raise self.contradiction(classic, str(list(v.text for v in values)), value, comp, inst)
        if classic is not None and classic == value:
            value = classic
        inst.sharding = value
        unspec_top = leaf_unspec.get(0, ()) if not inst.shape.is_tuple else ()
        self.add(inst, comp, value, "manual-boundary",
                 unspecified_dims=unspec_top,
                 leaf_unspecified_dims=leaf_unspec if inst.shape.is_tuple else {},
                 sdy_text=_fattrs(inst).get(attr), classic=classic,
                 manual_axes=inner_ctx if kind == "enter" else outer)

    def check_local_shape(self, v: sdy.TensorSharding, own: Sequence[str], full: "Shape",
                          local: "Shape", where: str, i: int) -> None:
        mesh = sdy.resolve_mesh(v, self.meshes, where)
        if full.rank != local.rank or full.element_type != local.element_type:
            raise ShardingError(f"manual computation value {i}: global shape {full} and local "
                                f"shape {local} do not match", where)
        for d, (dim, g, l) in enumerate(zip(v.dims, full.dims, local.dims)):
            factor = 1
            for a in dim.axes:
                if a.name in own:
                    factor *= a.extent(mesh)[1]
            if g != l * factor:
                raise ShardingError(
                    f"manual computation value {i}: dim {d} has global size {g} and local size "
                    f"{l}, but the manual axes of {v.text or v} split it {factor} ways", where)

    # -- entry results and tuple args -------------------------------------------------------
    def entry_results(self) -> None:
        entry = self.module.entry
        if entry is None or entry.root is None:
            return
        root = entry.root
        producers: dict[tuple[int, ...], "Instruction"] = {}
        _leaf_producers(root, (), producers)
        leaf_idx = _leaf_indices(root.shape)
        frs_leaf: dict[int, "HloSharding"] = {}
        for n, idx in enumerate(leaf_idx):
            prod = producers.get(idx)
            if prod is None or _target(prod) != SDY_FUNC_RESULT or prod.shape.is_tuple:
                continue
            rec = self.records.get(id(prod))
            if rec is None:
                continue
            rec.result_indices = rec.result_indices + (idx,)
            frs_leaf[n] = rec.sharding
        if not frs_leaf:
            return
        classic = root.sharding
        if classic is not None:
            cl = _sharding_leaves(classic, root.shape)
            for n, s in frs_leaf.items():
                if n < len(cl) and cl[n] != s:
                    prod = producers[leaf_idx[n]]
                    raise ShardingError(
                        f"classic sharding {cl[n]} of entry result {list(leaf_idx[n])} "
                        f"contradicts Shardy result sharding {s} ({SDY_FUNC_RESULT} "
                        f"{prod.name})", self.where(entry, root))
        elif len(frs_leaf) == len(leaf_idx) and id(root) not in self.records:
            value = _combine([frs_leaf[n] for n in range(len(leaf_idx))], root.shape)
            root.sharding = value
            self.add(root, entry, value, "sdy-func-result", result_indices=tuple(leaf_idx))

    def tuple_attrs(self) -> None:
        attrs = self.module.attrs
        entry = self.module.entry
        if attrs is None or entry is None or not attrs.HasField("frontend_attributes"):
            return
        fmap = attrs.frontend_attributes.map
        for attr, is_args in ((ATTR_TUPLE_ARGS, True), (ATTR_TUPLE_RESULTS, False)):
            text = fmap.get(attr)
            if text is None:
                continue
            mwhere = f"{self.source}: module {self.module.name}" if self.source else \
                f"module {self.module.name}"
            values = sdy.parse_sharding_per_value(text, f"{mwhere}, frontend attribute {attr}")
            if is_args:
                params = entry.parameters
                one_tuple = len(params) == 1 and params[0].shape.is_tuple
                if len(params) == len(values) and not one_tuple:
                    for p, v in zip(params, values):
                        self.annotate(entry, p, _per_value_text([v]), p.sharding, "sdy", ())
                    continue
                if one_tuple:
                    self.annotate(entry, params[0], _per_value_text(values), params[0].sharding,
                                  "sdy", ())
                    continue
                raise ShardingError(f"{attr} has {len(values)} shardings but the entry has "
                                    f"{len(params)} parameters", mwhere)
            root = entry.root
            if root is None:
                continue
            self.annotate(entry, root, _per_value_text(values), root.sharding, "sdy", ())

    # -- validation ------------------------------------------------------------------------
    def validate(self) -> None:
        count = module_device_count(self.module, self.source)
        self.report.device_count = count
        for name, (comp, inst) in self.used_meshes.items():
            mesh = self.meshes.get(name)
            if mesh is None or not mesh.axes:
                continue
            if count is None:
                count = mesh.total_size
                self.report.device_count = count
            elif mesh.total_size != count:
                raise ShardingError(f"mesh @{name} has {mesh.total_size} devices but the module "
                                    f"uses {count}", self.where(comp, inst))
        # (sharding, shape) pairs already found valid: a training step repeats a few.
        valid: set[tuple[HloSharding, Shape]] = set()
        for comp in self.module.computations:
            for inst in comp.instructions:
                s = inst.sharding
                if s is None:
                    continue
                key = None
                if s.named is None and not any(e.named is not None for e in s.tuple_elements):
                    key = (s, inst.shape)
                    if key in valid:
                        continue
                where = self.where(comp, inst)
                try:
                    if inst.shape.is_tuple and not s.is_tuple:
                        # XLA reads a non-tuple sharding on a tuple as one per leaf.
                        for leaf in _leaf_shapes(inst.shape):
                            s.validate_for_shape(leaf)
                    else:
                        s.validate_for_shape(inst.shape)
                except ShardingError as e:
                    raise ShardingError(e.message, where) from None
                if count is not None:
                    leaves = s.tuple_elements if s.is_tuple else (s,)
                    for leaf in leaves:
                        if leaf.is_maximal and leaf.device is not None and leaf.device >= count:
                            raise ShardingError(f"sharding {leaf} names device {leaf.device} but "
                                                f"the module uses {count} devices", where)
                        if leaf.is_tiled and leaf.tile_assignment is not None:
                            ta = leaf.tile_assignment
                            mx = ta.num_devices - 1 if ta.is_iota else int(ta.flat().max())
                            if mx >= count:
                                raise ShardingError(f"sharding {leaf} names device {mx} but the "
                                                    f"module uses {count} devices", where)
                if key is not None:
                    valid.add(key)

    # -- driver ----------------------------------------------------------------------------
    def run(self) -> AnnotationReport:
        rep = self.report
        # The frontend attributes of every instruction are read once, here: most have
        # none, and ``visit`` needs only the non-empty ones (nothing here writes them).
        fattrs = self._visit_fattrs
        sdy_target = False
        for i in self.module.instructions():
            fa = i.attrs.frontend_attributes.map
            if fa:
                fattrs[id(i)] = fa
            if i.opcode == "custom-call" and i.custom_call_target.startswith("xla.sdy."):
                sdy_target = True
        rep.has_shardy = bool(self.meshes) or sdy_target or any(
            k.startswith("xla.sdy.") for fa in fattrs.values() for k in fa)
        self.find_regions()
        self.compute_contexts()
        for comp in self.module.computations:
            for inst in comp.instructions:
                # (an unsharded non-custom-call without attributes has nothing to visit)
                if inst.sharding is not None or id(inst) in fattrs or \
                        inst.opcode == "custom-call":
                    self.visit(comp, inst)
        # Boundaries after the other instructions: a classic entry reads the sharding of
        # its operand (normally a Sharding custom-call, read by now).
        regions_out: dict[int, ManualRegion] = {}
        for r in self.regions:
            regions_out[id(r)] = self.do_region(r)
        self.tuple_attrs()
        self.entry_results()
        self.validate()
        # (instructions are distinct: a position per id, in module order)
        by_id: dict[int, "Instruction"] = {id(i): i for i in self.module.instructions()}
        order: dict[int, int] = {k: n for n, k in enumerate(by_id)}
        rep.records = [self.records[k] for k in sorted(self.records, key=lambda k: order.get(k, -1))
                       if k in by_id]
        # Keep records in sync with the final shardings (tuple attrs / results may update).
        for k, rec in self.records.items():
            inst = by_id.get(k)
            if inst is not None and inst.sharding is not None:
                rec.sharding = inst.sharding
        rep.manual_regions = [regions_out[id(r)] for r in self.regions]
        rep.user_annotated = {r.name for r in rep.records}
        return rep


def _per_value_text(values: Sequence[sdy.TensorSharding]) -> str:
    return "#sdy.sharding_per_value<[" + ", ".join(
        (v.text if v.text else str(v)[len("#sdy.sharding"):]) for v in values) + "]>"


def normalize_annotations(module: "Module", source: str | None = None) -> AnnotationReport:
    """Set ``inst.sharding`` from every annotation form and report what was found.

    Raises ``ShardingError`` (naming the instruction and the offending text) for
    unparsable Shardy text, classic and Shardy shardings that contradict each other,
    shardings that do not fit their shapes, and device counts that differ.
    """
    return _Normalizer(module, source).run()

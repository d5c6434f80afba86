"""Instruction-by-instruction agreement of two sets of shardings (ours and XLA's
completion): semantic equality, name alignment across XLA's renames, and the
:class:`AgreementReport` with its table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from hlo_spmd.ir.module import Module
    from hlo_spmd.sharding import HloSharding

def module_shardings(module: "Module") -> dict[str, "HloSharding | None"]:
    """Instruction name -> sharding (None if unsharded), every computation."""
    return {inst.name: inst.sharding for inst in module.instructions()}


def _fully_replicated(s: "HloSharding") -> bool:
    """Every device holds the whole array: replicated, or tiled with all tile dims 1
    and nothing but replication in the subgroup dims."""
    if s.is_tuple:
        return False
    if s.is_replicated:
        return True
    if not s.is_tiled or s.tile_assignment is None:
        return False
    from hlo_spmd.sharding import ShardingType

    if any(t != ShardingType.REPLICATED for t in s.subgroup_types):
        return False
    return all(d == 1 for d in s.tile_dims_for_data())


def semantically_equal(a: "HloSharding | None", b: "HloSharding | None",
                       num_devices: int | None = None) -> bool:
    """Same device placement: ``HloSharding`` equality (metadata ignored; iota and
    explicit device lists compare by value), plus: ``{replicated}`` equals a tiling
    whose data dims are all 1 (``{devices=[1,1]0}``), a tuple sharding equals a
    non-tuple one that every element equals, and with one device ``{maximal device=0}``
    equals replicated."""
    if a is None or b is None:
        return a is None and b is None
    if a == b:
        return True
    if a.is_tuple and b.is_tuple:
        ea, eb = a.tuple_elements, b.tuple_elements
        return len(ea) == len(eb) and all(
            semantically_equal(x, y, num_devices) for x, y in zip(ea, eb))
    if a.is_tuple or b.is_tuple:
        tup, one = (a, b) if a.is_tuple else (b, a)
        return all(semantically_equal(x, one, num_devices) for x in tup.tuple_elements)
    if _fully_replicated(a) and _fully_replicated(b):
        return True
    if num_devices == 1:
        def whole(s: "HloSharding") -> bool:
            return _fully_replicated(s) or (s.is_maximal and s.device == 0)
        return whole(a) and whole(b)
    return False


@dataclass(frozen=True)
class Disagreement:
    """One instruction whose shardings differ (``name`` is ours; ``xla_name`` is set
    when XLA's instruction has another name, e.g. the ``copy`` replacing a ``Sharding``
    custom-call)."""

    name: str
    opcode: str
    ours: str
    xla: str
    xla_name: str = ""

    def row(self) -> str:
        shown = f"{self.name}~{self.xla_name}" if self.xla_name else self.name
        return f"{shown:<32} {self.opcode:<18} ours={self.ours}  xla={self.xla}"


@dataclass
class AgreementReport:
    """Instruction-by-instruction agreement of our shardings with XLA's."""

    compared: int
    agreed: int
    disagreements: list[Disagreement]
    only_ours: list[str] = field(default_factory=list)  # names XLA's module lacks
    only_xla: list[str] = field(default_factory=list)   # names our module lacks
    aliases: dict[str, str] = field(default_factory=dict)  # ours -> xla, matched by structure
    label: str = ""
    # same name, different instruction (opcode or shape differ): not compared, also
    # listed in only_ours / only_xla
    name_clashes: list[str] = field(default_factory=list)
    # XLA gives no reference for these (e.g. ``xla.sdy.*`` custom-calls): not compared
    no_reference: list[str] = field(default_factory=list)

    @property
    def percent(self) -> float:
        return 100.0 * self.agreed / self.compared if self.compared else 100.0

    @property
    def disagreed(self) -> int:
        return len(self.disagreements)

    def summary(self) -> str:
        """One line: counts and percentage."""
        return (f"{self.label + ': ' if self.label else ''}{self.agreed}/{self.compared} "
                f"agree ({self.percent:.1f}%), {self.disagreed} disagree, "
                f"{len(self.only_ours)} only ours, {len(self.only_xla)} only XLA"
                + (f", {len(self.no_reference)} without XLA reference "
                   f"({', '.join(self.no_reference)})" if self.no_reference else ""))

    def table(self, limit: int | None = None) -> str:
        """:meth:`summary` and one row per disagreement (the first ``limit``)."""
        rows = self.disagreements if limit is None else self.disagreements[:limit]
        lines = [self.summary()] + ["  " + d.row() for d in rows]
        if limit is not None and len(self.disagreements) > limit:
            lines.append(f"  ... {len(self.disagreements) - limit} more")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _replicated() -> "HloSharding":
    from hlo_spmd.sharding import HloSharding

    return HloSharding.replicate()


def _text(s: "HloSharding | None") -> str:
    return "<none>" if s is None else str(s)


def compare_shardings(ours: Mapping[str, "HloSharding | None"],
                      xla: Mapping[str, "HloSharding | None"], *,
                      opcodes: Mapping[str, str] | None = None,
                      num_devices: int | None = None,
                      aliases: Mapping[str, str] | None = None,
                      xla_unsharded_is_replicated: bool = True,
                      clashes: Iterable[str] = (),
                      no_reference: Iterable[str] = (),
                      label: str = "") -> AgreementReport:
    """Compare, by instruction name, over the names both sides have.

    ``clashes``: names both sides use for different instructions; they are not compared
    (listed as only ours / only XLA and in ``name_clashes``). ``no_reference``: XLA
    names whose sharding XLA does not define; not compared (``no_reference``).

    Equality is :func:`semantically_equal`. ``aliases`` maps some of our names to XLA's
    (instructions XLA renamed, such as a ``Sharding`` custom-call its propagation turned
    into a ``copy``). An instruction neither side shards agrees. XLA leaves a few
    instructions unsharded after ``sharding-propagation`` (scalar constants that only
    feed a reduce's init value, the scalar ops of reduce/sort/scatter/all-reduce
    computations, ``topk``, ``xla.sdy.*`` custom-calls); its partitioner then treats
    them as replicated, so with ``xla_unsharded_is_replicated`` (default) XLA's
    ``None`` reads as ``{replicated}``. Our ``None`` against an XLA sharding is always a
    disagreement (shown as ``<none>``): our completion left a hole. ``opcodes``
    (name -> opcode) fills the table's opcode column.
    """
    aliases = dict(aliases or {})
    opcodes = opcodes or {}
    clashes = set(clashes) - set(aliases)
    skipped = set(no_reference)
    xla_used: set[str] = set()
    excluded: list[str] = []
    compared = agreed = 0
    disagreements: list[Disagreement] = []
    only_ours: list[str] = []
    for name, mine in ours.items():
        other = aliases.get(name, name)
        if other not in xla or name in clashes:
            only_ours.append(name)
            continue
        xla_used.add(other)
        if other in skipped:
            excluded.append(name)
            continue
        theirs = xla[other]
        compared += 1
        if theirs is None and mine is not None and xla_unsharded_is_replicated:
            theirs = _replicated()
        if semantically_equal(mine, theirs, num_devices):
            agreed += 1
        else:
            disagreements.append(Disagreement(
                name, opcodes.get(name, opcodes.get(other, "")), _text(mine),
                _text(xla[other]), "" if other == name else other))
    only_xla = [n for n in xla if n not in xla_used]
    return AgreementReport(compared, agreed, disagreements, only_ours, only_xla,
                           {k: v for k, v in aliases.items() if k != v}, label,
                           sorted(n for n in clashes if n in xla and n in ours), excluded)


def _align_names(ours: "Module", xla: "Module") -> dict[str, str]:
    """Pair instructions XLA renamed with ours by structure.

    Starting from instructions with the same name on both sides and the same operand
    count, an operand pair whose names exist on one side only is matched (e.g. our
    ``Sharding`` custom-call ``sharding_constraint.3`` and the ``copy.1`` XLA's
    propagation replaced it with). Roots of same-named computations pair up too.
    """
    ours_by = {i.name: i for i in ours.instructions()}
    xla_by = {i.name: i for i in xla.instructions()}
    aliases: dict[str, str] = {}
    taken: set[str] = set()
    clashes = _name_clashes(ours, xla)
    work = [(n, n) for n in ours_by if n in xla_by and n not in clashes]
    roots = []
    if ours.entry is not None and xla.entry is not None:
        roots.append((ours.entry, xla.entry))
    xla_comps = {c.name: c for c in xla.computations}
    roots += [(c, xla_comps[c.name]) for c in ours.computations
              if c.name in xla_comps and c is not ours.entry]
    for co, cx in roots:
        if co.root is None or cx.root is None:
            continue
        ro, rx = co.root.name, cx.root.name
        if ro != rx and ro not in xla_by and rx not in ours_by and rx not in taken \
                and ro not in aliases:
            aliases[ro] = rx
            taken.add(rx)
            work.append((ro, rx))
    while work:
        a, b = work.pop()
        ia, ib = ours_by[a], xla_by[b]
        if len(ia.operands) != len(ib.operands):
            continue
        for oa, ob in zip(ia.operands, ib.operands):
            if oa.name == ob.name or oa.name in aliases:
                continue
            if oa.name in xla_by or ob.name in ours_by or ob.name in taken:
                continue
            if oa.shape.dims != ob.shape.dims:
                continue
            aliases[oa.name] = ob.name
            taken.add(ob.name)
            work.append((oa.name, ob.name))
    return aliases


def _name_clashes(ours: "Module", xla: "Module") -> set[str]:
    """Names both modules use for different instructions (opcode or dims differ): XLA's
    HLO -> StableHLO -> HLO import renumbers names, so a fixture and XLA's module can
    share a name for unrelated instructions."""
    xla_by = {i.name: i for i in xla.instructions()}
    out = set()
    for inst in ours.instructions():
        other = xla_by.get(inst.name)
        if other is not None and (other.opcode != inst.opcode
                                  or other.shape.dims != inst.shape.dims
                                  or other.shape.is_tuple != inst.shape.is_tuple):
            out.add(inst.name)
    return out


def no_xla_reference(xla: "Module") -> list[str]:
    """Instructions whose sharding XLA's GSPMD completion does not define: ``xla.sdy.*``
    custom-calls (Shardy markers such as ``xla.sdy.FuncResultSharding``). GSPMD's
    propagation leaves them unsharded and its partitioner refuses them ("shouldn't
    appear in the XLA partitioner"), so there is nothing to compare with."""
    return [i.name for i in xla.instructions()
            if i.opcode == "custom-call" and i.custom_call_target.startswith("xla.sdy.")]


def compare_modules(ours: "Module", xla: "Module", *, num_devices: int | None = None,
                    align: bool = True, xla_unsharded_is_replicated: bool = True,
                    skip_no_reference: bool = True, label: str = "") -> AgreementReport:
    """:func:`compare_shardings` of two modules' instructions (by name; with ``align``
    also the instructions XLA renamed, paired by :func:`_align_names`). Same-named
    instructions with different opcodes or shapes are not compared (name clashes), nor,
    with ``skip_no_reference``, those :func:`no_xla_reference` lists."""
    opcodes = {i.name: i.opcode for i in ours.instructions()}
    for i in xla.instructions():
        opcodes.setdefault(i.name, i.opcode)
    aliases = _align_names(ours, xla) if align else {}
    return compare_shardings(module_shardings(ours), module_shardings(xla), opcodes=opcodes,
                             num_devices=num_devices, aliases=aliases,
                             xla_unsharded_is_replicated=xla_unsharded_is_replicated,
                             clashes=_name_clashes(ours, xla),
                             no_reference=no_xla_reference(xla) if skip_no_reference else (),
                             label=label)

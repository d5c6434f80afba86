"""Skipping inferences whose inputs have not changed since they last changed nothing.

XLA's RunToFixPoint re-infers every instruction at every aggressiveness level (its
``already_inferred_from_*`` caches live for one level).  Most of those re-inferences see
exactly the shardings they saw at the previous level and, where the level does not
enter their rules, change nothing again.  This memo remembers, per instruction and
direction, the inputs of the last inference that returned "no change": the identity
of every sharding the rule reads and the part of the level the rule depends on.  When
the same inputs come back, the inference is skipped: it would return False again and
offer the same rejected candidates, which the recorder already holds (it keeps one
copy of each), so shardings and provenance are exactly those of running it.

What a rule reads is declared with the rule (``forward.ForwardRule``,
``backward.BackwardRule``) and read here:

* the level: rules ask ``Propagator.at_least(k)`` (``may_combine`` is ``at_least(1)``),
  and a no-change run then holds at every level giving the same answers.  A rule that
  reads ``Propagator.level`` as a number holds at its level class only: each level
  below the rule's declared ``level_classes``, or all levels from it on.
* forward (``infer_from_operands``): the instruction's own sharding and its operands';
  with ``caller_operands``, a parameter of a called computation also reads its
  caller's operands; with ``lookahead`` (dot, convolution), the single-user chain
  (``_lookahead_reads``, per visit).
* backward (``infer_from_users``): the instruction's own sharding and its users'; for a
  user whose rule declares ``reads_operands`` (dot, reduce, scatter, ...) every operand
  of that user.

An inference none of whose reads is sharded yet is not run either: every rule needs a
sharded neighbour to offer a candidate (except a user rule declared ``from_nothing``),
at any level, so it holds until one of them is sharded.

``HLO_SPMD_CHECK_SKIPS=1`` runs every skipped inference anyway and raises if it would
have changed a sharding or recorded a new alternative (the tests run every fixture so).
"""
from __future__ import annotations

import functools
import operator
import os
from typing import TYPE_CHECKING

from hlo_spmd.errors import HloSpmdError
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.passes.propagation import forward as fw
from hlo_spmd.passes.propagation import graph as g

if TYPE_CHECKING:
    from hlo_spmd.passes.propagation.interface import PropagatorInterface

_is = operator.is_
_sharding = operator.attrgetter("sharding")
_is_none = functools.partial(operator.is_, None)
NO_LEVEL_LIMIT = 1 << 62
FW, BW = 0, 1            # directions (``dirty``)


def check_enabled() -> bool:
    return os.environ.get("HLO_SPMD_CHECK_SKIPS", "") not in ("", "0")


class MemoEntry:
    """One instruction's memo in one direction: what its last no-change inference read.
    ``reads`` None: the read set moves with the shardings (a lookahead), made per visit.
    The run holds at levels ``lo <= level < hi`` (empty: none) with ``seen`` the
    shardings of ``reads`` it saw.  A base of the engine's per-inference records
    (``engine.ForwardFacts`` / ``BackwardFacts``): one object per inference holds what
    it reads and what it last saw; ``start`` makes it an entry."""

    __slots__ = ("reads", "level_classes", "lo", "hi", "seen", "may_be_trivial")

    def start(self, reads: tuple[Instruction, ...] | None, level_classes: int,
              may_be_trivial: bool) -> "MemoEntry":
        """Begin the memo of this inference: nothing seen yet (holds at no level)."""
        self.reads = reads
        self.level_classes = level_classes
        self.lo = 1
        self.hi = 0
        self.seen: list | None = None
        self.may_be_trivial = may_be_trivial   # (no declared ``from_nothing`` user)
        return self

    def holds(self, level: int, reads) -> bool:
        """Whether the last no-change run holds at ``level`` with these reads."""
        seen = self.seen
        return (self.lo <= level < self.hi and len(seen) == len(reads)
                and all(map(_is, seen, map(_sharding, reads))))


class UnchangedMemo:
    """Inputs of the last no-change inference per instruction, for one propagation run.

    The fix point asks ``infer(inst, d, level)``: the inference of ``inst`` in direction
    ``d``, skipped when its inputs are those of its last no-change run."""

    def __init__(self, p: "PropagatorInterface") -> None:
        self.p = p
        self.check = check_enabled()
        # inst -> its entry, per direction (made on first ask; instructions hash by
        # identity).
        self.entries: tuple[dict[Instruction, MemoEntry],
                            dict[Instruction, MemoEntry]] = ({}, {})
        # Entries whose last no-change run holds below some level only: a later level
        # makes them stale (``stale_at``).  id(inst) -> entry, per direction.
        self._upgradable: tuple[dict[int, MemoEntry], dict[int, MemoEntry]] = ({}, {})
        self.skipped = 0
        self.trivial = 0
        # (bound once: asked ~10^4-10^5 times per module)
        self._infer = (p.infer_from_operands, p.infer_from_users)
        self._new_entry = (self._forward_entry, self._backward_entry)

    # -- what each rule reads (its declaration) ---------------------------------------------
    def _forward_entry(self, inst: Instruction) -> MemoEntry:
        p = self.p
        facts = p.forward_facts(inst)
        rule = facts.declared
        if rule.lookahead:
            reads = None
        else:
            reads = (inst,) + tuple(inst.operands)
            owner = p.graph.owner(inst) if rule.caller_operands else None
            if owner is not None:
                reads += tuple(owner.operands)
        entry = self.entries[FW][inst] = facts.start(reads, rule.level_classes, True)
        return entry

    def _lookahead_reads(self, inst: Instruction) -> list[Instruction]:
        """The instruction, its operands, and what ``lookahead_user_sharding`` reads:
        the single-user chain up to the first sharded user, with the operands of chain
        members whose backward rule reads them.  The chain depends on shardings only
        through the members read before each step, so equal shardings element by
        element (and equal length) mean the same chain."""
        reads = [inst]
        reads.extend(inst.operands)
        users_of = self.p.graph.users_of
        users = users_of(inst)
        if len(users) != 1:
            return reads
        user_rule = self.p.user_rule
        cur = users[0]
        while True:
            reads.append(cur)
            if user_rule(cur).reads_operands:
                reads.extend(cur.operands)
            if cur.sharding is not None:
                return reads
            nxt = users_of(cur)
            if len(nxt) != 1:
                return reads
            cur = nxt[0]

    def _backward_entry(self, inst: Instruction) -> MemoEntry:
        facts = self.p.backward_facts(inst)
        reads = [inst]
        level_classes = 1
        trivial = True
        for user, rule in zip(facts.users, facts.user_rules):
            reads.append(user)
            if rule.level_classes > level_classes:
                level_classes = rule.level_classes
            if rule.from_nothing:
                trivial = False
            if rule.reads_operands:
                reads.extend(user.operands)
        entry = self.entries[BW][inst] = facts.start(tuple(reads), level_classes, trivial)
        return entry

    # -- the memo ---------------------------------------------------------------------------
    def stale_at(self, level: int, d: int) -> list[int]:
        """Instructions (ids) whose last no-change inference in direction ``d`` does not
        hold at ``level``: the memo cannot skip them now."""
        up = self._upgradable[d]
        stale = [key for key, entry in up.items() if not entry.lo <= level < entry.hi]
        for key in stale:
            del up[key]
        return stale

    def infer(self, inst: Instruction, d: int, level: int) -> bool:
        """Infer ``inst``'s sharding in direction ``d`` at ``level`` (True if it changed),
        unless its inputs are those of its last no-change run."""
        entry = self.entries[d].get(inst) or self._new_entry[d](inst)
        infer = self._infer[d]
        reads = entry.reads
        if reads is None:
            reads = self._lookahead_reads(inst)
        seen = entry.seen
        if entry.lo <= level < entry.hi and len(seen) == len(reads) and \
                all(map(_is, seen, map(_sharding, reads))):
            self.skipped += 1
            if self.check:
                self._verify(inst, infer)
            return False
        now = list(map(_sharding, reads))
        # The levels at which a no-change run reads the same: the level class of the
        # declared ``level_classes`` if the rule read the level as a number, else the
        # range its ``at_least`` answers hold in.
        if entry.may_be_trivial and all(map(_is_none, now)):
            # Nothing sharded to infer from: no rule offers a candidate, at any level.
            self.trivial += 1
            if self.check:
                self._verify(inst, infer)
            lo, hi = 0, NO_LEVEL_LIMIT
        else:
            p = self.p
            p.level_read = False
            p.level_lo = 0
            p.level_hi = NO_LEVEL_LIMIT
            if infer(inst):
                entry.lo, entry.hi = 1, 0
                entry.seen = None
                return True
            if p.level_read:
                cap = entry.level_classes
                lo, hi = (level, level + 1) if level < cap else (cap, NO_LEVEL_LIMIT)
            else:
                lo, hi = p.level_lo, p.level_hi
        # Nothing changed: these are the shardings the rule read.
        entry.lo, entry.hi = lo, hi
        entry.seen = now
        if hi != NO_LEVEL_LIMIT:
            self._upgradable[d][id(inst)] = entry
        return False

    def close(self) -> None:
        """After the run: drop the entries and the references to the run."""
        for entries in self.entries:
            entries.clear()
        for up in self._upgradable:
            up.clear()
        self._infer = self._new_entry = None
        self.p = None

    def check_unflagged(self, order: list[Instruction], d: int, dirty, level: int) -> None:
        """Check mode, after a sweep: every inference the dirty set does not flag is one
        the memo skips, and running it anyway changes nothing."""
        entries = self.entries[d]
        infer = self._infer[d]
        flagged = dirty.flagged[d]
        always = dirty.always if d == FW else frozenset()
        for inst in order:
            key = id(inst)
            if key in flagged or key in always or key in self.p.provided:
                continue
            entry = entries.get(inst)
            if entry is None or entry.reads is None or entry.seen is None or \
                    not entry.holds(level, entry.reads):
                raise HloSpmdError(f"propagation's dirty set misses an inference of "
                                   f"{inst.name} ({inst.opcode}) whose inputs changed at "
                                   f"level {level}")
            self.skipped += 1
            self._verify(inst, infer)

    def _verify(self, inst: Instruction, infer) -> None:
        before = inst.sharding
        d = self.p.rec.decisions.get(inst.name)
        alts = None if d is None else len(d.alternatives)
        changed = infer(inst)
        d = self.p.rec.decisions.get(inst.name)
        if changed or inst.sharding is not before or \
                (None if d is None else len(d.alternatives)) != alts:
            raise HloSpmdError(f"propagation skipped an inference of {inst.name} "
                               f"({inst.opcode}) that changes something at level "
                               f"{self.p.level}")

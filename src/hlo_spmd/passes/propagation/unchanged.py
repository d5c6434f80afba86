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

What a rule reads (keep in sync with ``forward`` / ``backward`` when rules change):

* the level: rules ask ``Propagator.at_least(k)`` (``may_combine`` is ``at_least(1)``),
  and a no-change run then holds at every level giving the same answers.  A rule that
  reads ``Propagator.level`` as a number holds at its level class only: 0 vs >= 1, and
  for broadcast its own thresholds (forward 2 and 3, backward 2), the caps below.
* forward (``infer_from_operands``): the instruction's own sharding and its operands'.
  A parameter of a called computation also reads its caller's operands; dot and
  convolution also read their lookahead chain of single users (``FORWARD_LOOKAHEAD``,
  see ``_lookahead_reads``).
* backward (``infer_from_users``): the instruction's own sharding and its users'; for a
  user whose rule also reads its other operands (anything not in
  ``BACKWARD_READS_USER_ONLY``, e.g. dot, reduce, scatter) every operand of that user;
  the level as above (cap 2 where the instruction or a user is a broadcast).

An inference none of whose reads is sharded yet is not run either: every rule needs a
sharded neighbour to offer a candidate (except a ``BACKWARD_FROM_NOTHING`` user), at
any level, so it holds until one of them is sharded.

``HLO_SPMD_CHECK_SKIPS=1`` runs every skipped inference anyway and raises if it would
have changed a sharding or recorded a new alternative (the tests run every fixture so).
"""
from __future__ import annotations

import functools
import operator
import os
from typing import TYPE_CHECKING

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.passes.propagation import graph as g

if TYPE_CHECKING:
    from hlo_spmd.passes.propagation.engine import Propagator

# Forward rules that read shardings beyond the instruction's operands: dot and
# convolution look ahead along their single-user chain (``lookahead_user_sharding``),
# a parameter of a called computation reads its caller's operands.
FORWARD_LOOKAHEAD = frozenset({"dot", "convolution"})
# Users whose backward rule reads only the user's sharding (and the operand's own):
# the elementwise rule and these; every other user also has its operands read.
BACKWARD_READS_USER_ONLY = frozenset({
    "broadcast", "concatenate", "dynamic-slice", "dynamic-update-slice", "reduce-window",
    "reshape", "pad", "slice", "transpose", "tuple", "get-tuple-element", "sort", "reverse",
    "outfeed", "gather", "custom-call", "copy"})

# Users whose backward rule gives their operand a sharding from nothing (the rng
# state of rng-bit-generator is replicated whatever the user's sharding).
BACKWARD_FROM_NOTHING = frozenset({"rng-bit-generator"})

_is = operator.is_
_sharding = operator.attrgetter("sharding")
_is_none = functools.partial(operator.is_, None)
LOOKAHEAD = "lookahead"  # reads computed per visit (``_lookahead_reads``)
NO_LEVEL_LIMIT = 1 << 62
FW, BW = 0, 1            # directions (``dirty``)


def check_enabled() -> bool:
    return os.environ.get("HLO_SPMD_CHECK_SKIPS", "") not in ("", "0")


class UnchangedMemo:
    """Inputs of the last no-change inference per instruction, for one propagation run."""

    def __init__(self, p: "Propagator") -> None:
        self.p = p
        self.check = check_enabled()
        # id(inst) -> [instructions whose shardings the rule reads (LOOKAHEAD: per visit),
        #              level cap, levels [lo, hi) at which the last no-change run reads
        #              the same (empty: none), the shardings it read, may be trivial]
        self._fw: dict[int, list] = {}
        self._bw: dict[int, list] = {}
        # Entries whose last no-change run holds below some level only: a later level
        # makes them stale (``stale_at``).  id(inst) -> entry, per direction.
        self._upgradable: tuple[dict[int, list], dict[int, list]] = ({}, {})
        self.skipped = 0
        self.trivial = 0
        # (bound once: asked ~10^4-10^5 times per module)
        self._infer_fw = p.infer_from_operands
        self._infer_bw = p.infer_from_users

    # -- what each rule reads ---------------------------------------------------------------
    def _forward_entry(self, inst: Instruction) -> list:
        op = self.p.graph.op[inst]
        if op in FORWARD_LOOKAHEAD:
            reads = LOOKAHEAD
        else:
            reads = (inst,) + tuple(inst.operands)
            owner = self.p.graph.owner(inst) if op == "parameter" else None
            if owner is not None:
                reads += tuple(owner.operands)
        entry = [reads, 3 if op == "broadcast" else 1, 1, 0, None, True]
        self._fw[id(inst)] = entry
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
        user_facts = self.p.user_facts
        cur = users[0]
        while True:
            reads.append(cur)
            if user_facts(cur)[1]:   # (its backward rule reads its operands)
                reads.extend(cur.operands)
            if cur.sharding is not None:
                return reads
            nxt = users_of(cur)
            if len(nxt) != 1:
                return reads
            cur = nxt[0]

    def _backward_entry(self, inst: Instruction) -> list:
        reads = [inst]
        cap = 2 if self.p.graph.op[inst] == "broadcast" else 1
        trivial = True
        user_facts = self.p.user_facts
        known = self.p._user_facts.get   # (its memo, read first)
        for user in self.p.graph.users_of(inst):
            reads.append(user)
            uop, reads_operands, _source, _rule = known(user) or user_facts(user)
            if uop == "broadcast":
                cap = 2
            if uop in BACKWARD_FROM_NOTHING:
                trivial = False
            if reads_operands:
                reads.extend(user.operands)
        entry = [tuple(reads), cap, 1, 0, None, trivial]
        self._bw[id(inst)] = entry
        return entry

    # -- the memo ---------------------------------------------------------------------------
    # The fix point asks ``_run(inst, entry, infer, d)`` itself, with the entry of ``inst``
    # in ``_fw`` / ``_bw`` (made by ``_forward_entry`` / ``_backward_entry`` on first ask):
    # ``infer(inst)``, skipped when its inputs are those of its last no-change run.

    def stale_at(self, level: int, d: int) -> list[int]:
        """Instructions (ids) whose last no-change inference in direction ``d`` does not
        hold at ``level``: the memo cannot skip them now."""
        up = self._upgradable[d]
        stale = []
        for key, entry in up.items():
            if not entry[2] <= level < entry[3]:
                stale.append(key)
        for key in stale:
            del up[key]
        return stale

    def _run(self, inst: Instruction, entry: list, infer, d: int) -> bool:
        insts = entry[0]
        if insts is LOOKAHEAD:
            insts = self._lookahead_reads(inst)
        p = self.p
        level = p._level
        last = entry[4]
        if entry[2] <= level < entry[3] and len(last) == len(insts) and \
                all(map(_is, last, map(_sharding, insts))):
            self.skipped += 1
            if self.check:
                self._verify(inst, infer)
            return False
        now = list(map(_sharding, insts))
        # The levels at which a no-change run reads the same: the level class of the
        # declared cap if the rule read the level as a number, else the range its
        # ``at_least`` answers hold in.
        if entry[5] and all(map(_is_none, now)):
            # Nothing sharded to infer from: no rule offers a candidate, at any level.
            self.trivial += 1
            if self.check:
                self._verify(inst, infer)
            lo, hi = 0, NO_LEVEL_LIMIT
        else:
            p.level_read = False
            p.level_lo = 0
            p.level_hi = NO_LEVEL_LIMIT
            if infer(inst):
                entry[2], entry[3] = 1, 0
                entry[4] = None
                return True
            if p.level_read:
                cap = entry[1]
                lo, hi = (level, level + 1) if level < cap else (cap, NO_LEVEL_LIMIT)
            else:
                lo, hi = p.level_lo, p.level_hi
        # Nothing changed: these are the shardings the rule read.
        entry[2], entry[3] = lo, hi
        entry[4] = now
        if hi != NO_LEVEL_LIMIT:
            self._upgradable[d][id(inst)] = entry
        return False

    def check_unflagged(self, order: list[Instruction], d: int, dirty) -> None:
        """Check mode, after a sweep: every inference the dirty set does not flag is one
        the memo skips, and running it anyway changes nothing."""
        from hlo_spmd.errors import HloSpmdError

        entries = self._fw if d == FW else self._bw
        infer = self.p.infer_from_operands if d == FW else self.p.infer_from_users
        flagged = dirty.flagged[d]
        always = dirty.always if d == FW else frozenset()
        level = self.p._level
        for inst in order:
            key = id(inst)
            if key in flagged or key in always or key in self.p.provided:
                continue
            entry = entries.get(key)
            ok = entry is not None and entry[0] is not LOOKAHEAD and entry[4] is not None
            if ok:
                ok = (entry[2] <= level < entry[3] and len(entry[4]) == len(entry[0])
                      and all(map(_is, entry[4], map(_sharding, entry[0]))))
            if not ok:
                raise HloSpmdError(f"propagation's dirty set misses an inference of "
                                   f"{inst.name} ({inst.opcode}) whose inputs changed at "
                                   f"level {level}")
            self.skipped += 1
            self._verify(inst, infer)

    def _verify(self, inst: Instruction, infer) -> None:
        from hlo_spmd.errors import HloSpmdError

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

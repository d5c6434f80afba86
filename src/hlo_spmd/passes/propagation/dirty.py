"""The inferences the skip memo could not skip, known without asking it.

XLA's RunToFixPoint (``xla/service/sharding_propagation.cc``) re-infers every
instruction not in its ``already_inferred_from_*`` caches; ``unchanged.UnchangedMemo``
then skips most of those because the shardings the rule reads are those of its last
no-change run and the level is one where that run holds.  Comparing the read shardings
costs about as much as a cheap rule.  This dirty set answers the same question from
the other side: when a sharding changes (``changed``, called by ``Propagator.set``), the
inferences whose read set contains it (the read sets of ``unchanged``) are flagged; at a
level start, those whose last no-change run does not hold at the new level are flagged
(``start_level``).  An unflagged inference is one the memo would skip, so the fix point
does not ask the memo about it; the walk, its order and its caches are XLA's, unchanged.
The flags are a byte per walk position (``Flags``), so the fix point jumps from flagged
instruction to flagged instruction (``Propagator.run_to_fix_point``).

Always asked (never trusted unflagged): forward rules declared ``lookahead`` (dot,
convolution), whose lookahead chain is read per visit.  Everything is flagged at the start of a round (setup and
Shardy priorities write shardings directly).

``HLO_SPMD_CHECK_SKIPS=1`` checks after every sweep that every unflagged inference would
indeed be skipped (same inputs, a level where its last run holds) and runs it anyway,
which must change nothing (``UnchangedMemo.check_unflagged``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.passes.propagation.forward import LOOKAHEAD_OPCODES
from hlo_spmd.passes.propagation.unchanged import BW, FW

if TYPE_CHECKING:
    from hlo_spmd.passes.propagation.interface import PropagatorInterface


class Flags:
    """One direction's flags: a byte per walk position (``Graph.walk``), 1 = flagged, so
    the fix point finds the next flagged instruction with ``bytearray.find`` instead of
    visiting every instruction.  Also answers as a set of instruction ids."""

    __slots__ = ("bits", "pos")

    def __init__(self, pos: dict[int, int]) -> None:
        self.pos = pos
        self.bits = bytearray(len(pos))

    def __contains__(self, key: int) -> bool:
        p = self.pos.get(key)
        return p is not None and self.bits[p] == 1

    def add(self, key: int) -> None:
        self.bits[self.pos[key]] = 1

    def discard(self, key: int) -> None:
        p = self.pos.get(key)
        if p is not None:
            self.bits[p] = 0

    def update(self, keys) -> None:
        bits, pos = self.bits, self.pos
        for key in keys:
            bits[pos[key]] = 1


class DirtySet:
    """Per direction, the instructions whose next inference the memo may not skip.

    The fix point reads the flags' bytes (``Flags.bits``) directly and clears an
    instruction's byte when it asks the memo about it."""

    def __init__(self, p: "PropagatorInterface") -> None:
        self.p = p
        fpos, bpos = p.graph.walk_pos
        self.flagged: tuple[Flags, Flags] = (Flags(fpos), Flags(bpos))
        op = p.graph.op
        self.always: frozenset[int] = frozenset(
            id(i) for i in p.graph.instructions() if op[i] in LOOKAHEAD_OPCODES)
        self._pos = p.graph.walk_pos
        self._users_of = p.graph.users_of
        self._clear_targets = p.graph.clear_targets
        self._own: dict[Instruction, tuple[int, tuple[int, ...]]] = {}

    def start_round(self) -> None:
        """Before the levels of a round: nothing may be skipped."""
        for f in self.flagged:
            f.bits[:] = b"\x01" * len(f.bits)

    def start_level(self, level: int) -> None:
        """Flag the inferences whose last no-change run does not hold at ``level``."""
        for d in (FW, BW):
            self.flagged[d].update(self.p.unchanged.stale_at(level, d))

    def changed(self, inst: Instruction) -> None:
        """``inst``'s sharding changed: flag every inference that reads it (forward: the
        instruction and its users, and the parameters of computations those users call;
        backward: the instruction, its operands and, for users whose rule reads their
        operands, those users' operands).  Users and operands are the positions the fix
        point clears next (``Graph.clear_targets``, shared)."""
        fw = self.flagged[FW].bits
        bw = self.flagged[BW].bits
        fw_t, bw_t = self._clear_targets(inst)
        for q in fw_t:
            fw[q] = 1
        for q in bw_t:
            bw[q] = 1
        own = self._own.get(inst)
        if own is None:
            own = self._own_of(inst)
        fw[own[0]] = 1
        for q in own[1]:
            bw[q] = 1

    def close(self) -> None:
        """After the run: drop the references to the run."""
        self._own.clear()
        self._users_of = self._clear_targets = None
        self.p = None

    def _own_of(self, inst: Instruction) -> tuple[int, tuple[int, ...]]:
        """``inst``'s forward position, and the backward positions of ``inst`` and of the
        operands of its users whose backward rule reads them (computed once)."""
        fpos, bpos = self._pos
        bw = [bpos[id(inst)]]
        user_rule = self.p.user_rule
        for u in self._users_of(inst):
            if user_rule(u).reads_operands:
                for o in u.operands:
                    bw.append(bpos[id(o)])
        own = self._own[inst] = (fpos[id(inst)], tuple(bw))
        return own

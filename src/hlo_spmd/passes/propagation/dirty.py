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

Always asked (never trusted unflagged): dot / convolution forward, whose lookahead
chain is read per visit.  Everything is flagged at the start of a round (setup and
Shardy priorities write shardings directly).

``HLO_SPMD_CHECK_SKIPS=1`` checks after every sweep that every unflagged inference would
indeed be skipped (same inputs, a level where its last run holds) and runs it anyway,
which must change nothing (``UnchangedMemo.check_unflagged``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.passes.propagation import graph as g
from hlo_spmd.passes.propagation.unchanged import (BACKWARD_READS_USER_ONLY, BW,
                                                   FORWARD_LOOKAHEAD, FW)

if TYPE_CHECKING:
    from hlo_spmd.passes.propagation.engine import Propagator


class DirtySet:
    """Per direction, the instructions (ids) whose next inference the memo may not skip.

    The fix point reads ``flagged`` and ``always`` directly (once per instruction and
    sweep) and removes an instruction's flag when it asks the memo about it."""

    def __init__(self, p: "Propagator") -> None:
        self.p = p
        self.flagged: tuple[set[int], set[int]] = (set(), set())
        self.always: frozenset[int] = frozenset(
            id(i) for i in p.graph.instructions() if g.opcode(i) in FORWARD_LOOKAHEAD)
        self._reads_operands: dict[int, bool] = {}

    def start_round(self) -> None:
        """Before the levels of a round: nothing may be skipped."""
        ids = [id(i) for i in self.p.graph.instructions()]
        self.flagged[FW].update(ids)
        self.flagged[BW].update(ids)

    def start_level(self, level: int) -> None:
        """Flag the inferences whose last no-change run does not hold at ``level``."""
        for d in (FW, BW):
            self.flagged[d].update(self.p.unchanged.stale_at(level, d))

    def changed(self, inst: Instruction) -> None:
        """``inst``'s sharding changed: flag every inference that reads it (forward: the
        instruction and its users, and the parameters of computations those users call;
        backward: the instruction, its operands and, for users whose rule reads their
        operands, those users' operands)."""
        fw, bw = self.flagged
        key = id(inst)
        fw.add(key)
        bw.add(key)
        for o in inst.operands:
            bw.add(id(o))
        reads = self._reads_operands
        for u in self.p.graph.users_of(inst):
            fw.add(id(u))
            for c in u.called_computations:
                for prm in c.parameters:
                    fw.add(id(prm))
            r = reads.get(id(u))
            if r is None:
                r = reads[id(u)] = not (g.opcode(u) in BACKWARD_READS_USER_ONLY
                                         or g.is_elementwise(u))
            if r:
                for o in u.operands:
                    bw.add(id(o))

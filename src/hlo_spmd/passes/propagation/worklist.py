"""Which instructions a fix-point sweep must look at, without walking the others.

XLA's RunToFixPoint (``xla/service/sharding_propagation.cc``) walks every instruction of
every computation in every iteration and skips those in its ``already_inferred_from_*``
caches; ``unchanged.UnchangedMemo`` then skips most of the rest because their inputs are
those of their last no-change run.  Both checks cost a visit per instruction, per
direction, per iteration.  This worklist visits only the instructions where one of the
two could come out differently, in exactly the order and with exactly the outcome of
the full walk:

* **done** (XLA's caches): an instruction is done in a direction once a sweep has passed
  it in the current level, until ``undo`` (``clear_cache``) takes it out again.  A sweep
  position the worklist jumps over is passed all the same, as the full walk would have
  added it to its cache.
* **flagged** (the memo could not skip it): every instruction whose memo entry reads a
  sharding that changed since its last inference (``changed``, called from
  ``Propagator.set`` with the read sets of ``unchanged``), whose level class changes at a
  level start (``start_level``), or that has never been inferred.  An unflagged
  instruction would be skipped by the memo, so not visiting it changes nothing.
* **always** visited when not done: dot / convolution forward (their lookahead chain is
  read per visit), manual-region boundaries backward (their visit re-opens their
  operand), and fixed annotations with open dims (not memoised).

A sweep is a min-heap of post-order positions (negated for the backward direction):
what becomes relevant ahead of the cursor joins the running sweep, what becomes
relevant behind it waits for the next sweep of that computation and direction.

``HLO_SPMD_CHECK_SKIPS=1`` checks after every sweep that every unflagged instruction
would indeed have been skipped (same inputs, same level class) and runs its inference
anyway, which must change nothing (``UnchangedMemo.check_unflagged``).
"""
from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.passes.propagation import graph as g
from hlo_spmd.passes.propagation.unchanged import (BACKWARD_READS_USER_ONLY, BW,
                                                   FORWARD_LOOKAHEAD, FW)

if TYPE_CHECKING:
    from hlo_spmd.passes.propagation.engine import Propagator

_BEFORE_ALL = -(1 << 62)


class Worklist:
    """Visiting state of one propagation run (per level: what is done; across levels:
    what the memo could not skip)."""

    def __init__(self, p: "Propagator") -> None:
        self.p = p
        graph = p.graph
        self.orders: list[list[Instruction]] = [graph.post_orders[c.name]
                                                for c in graph.computations]
        # id(inst) -> (computation index, post-order position)
        self.where: dict[int, tuple[int, int]] = {}
        for ci, order in enumerate(self.orders):
            for pos, inst in enumerate(order):
                self.where[id(inst)] = (ci, pos)
        n = len(self.orders)
        self.flagged: tuple[set[int], set[int]] = (set(), set())
        self.always: list[tuple[set[int], set[int]]] = [(set(), set()) for _ in range(n)]
        self.always_ids: tuple[set[int], set[int]] = (set(), set())
        self._reads_operands: dict[int, bool] = {}
        self._reset_level()

    def _reset_level(self) -> None:
        n = len(self.orders)
        # heap keys (position, or -position backward) to look at in the next sweep
        self.pending: list[list[set[int]]] = [[set(), set()] for _ in range(n)]
        self.swept: list[list[bool]] = [[False, False] for _ in range(n)]
        self.undone: tuple[set[int], set[int]] = (set(), set())   # passed, then undone
        self.early: tuple[set[int], set[int]] = (set(), set())    # done before passed
        self._cur: tuple[int, int] | None = None
        self._cur_key = _BEFORE_ALL
        self._heap: list[int] = []

    # -- rounds and levels ----------------------------------------------------------------------
    def start_round(self) -> None:
        """Before the levels of a round: shardings may have been written directly (setup,
        priorities), so nothing may be skipped; the always-visited sets are rebuilt."""
        p = self.p
        for s in self.always_ids:
            s.clear()
        for a in self.always:
            a[FW].clear()
            a[BW].clear()
        boundaries = p.boundaries
        for ci, order in enumerate(self.orders):
            afw, abw = self.always[ci]
            for pos, inst in enumerate(order):
                key = id(inst)
                if key in p.provided and key in p.unspecified:
                    afw.add(pos)
                    abw.add(-pos)
                    self.always_ids[FW].add(key)
                    self.always_ids[BW].add(key)
                    continue
                if g.opcode(inst) in FORWARD_LOOKAHEAD:
                    afw.add(pos)
                    self.always_ids[FW].add(key)
                if key in boundaries:
                    abw.add(-pos)
                    self.always_ids[BW].add(key)
        self.flagged[FW].update(self.where)
        self.flagged[BW].update(self.where)

    def start_level(self, level: int) -> None:
        """New level: nothing is done; flagged are the instructions whose memo entry's
        level class changes now, besides those flagged already."""
        self._reset_level()
        for d in (FW, BW):
            self.flagged[d].update(self.p.unchanged.stale_at(level, d))
            where = self.where
            pending = self.pending
            for key in self.flagged[d]:
                ci, pos = where[key]
                pending[ci][d].add(pos if d == FW else -pos)

    # -- events -----------------------------------------------------------------------------------
    def _push(self, key: int, d: int) -> None:
        w = self.where.get(key)
        if w is None:
            return
        ci, pos = w
        hk = pos if d == FW else -pos
        if self._cur is not None and self._cur[0] == ci and self._cur[1] == d \
                and hk > self._cur_key:
            heapq.heappush(self._heap, hk)
        else:
            self.pending[ci][d].add(hk)

    def _flag(self, key: int, d: int) -> None:
        f = self.flagged[d]
        if key not in f:
            f.add(key)
            self._push(key, d)

    def changed(self, inst: Instruction) -> None:
        """``inst``'s sharding changed: flag every inference that reads it (the read sets
        of ``unchanged``: a forward rule reads the instruction and its operands, and a
        parameter its caller's operands; a backward rule reads the instruction, its users
        and, for users whose rule reads them, those users' operands)."""
        flag = self._flag
        key = id(inst)
        flag(key, FW)
        flag(key, BW)
        for o in inst.operands:
            flag(id(o), BW)
        reads = self._reads_operands
        for u in self.p.graph.users_of(inst):
            flag(id(u), FW)
            for c in u.called_computations:
                for prm in c.parameters:
                    flag(id(prm), FW)
            r = reads.get(id(u))
            if r is None:
                r = reads[id(u)] = not (g.opcode(u) in BACKWARD_READS_USER_ONLY
                                         or g.is_elementwise(u))
            if r:
                for o in u.operands:
                    flag(id(o), BW)

    def undo(self, inst: Instruction, d: int) -> None:
        """Take ``inst`` out of the done set of direction ``d`` (XLA's cache erase)."""
        key = id(inst)
        self.early[d].discard(key)
        self.undone[d].add(key)
        self._push(key, d)

    def keep(self, inst: Instruction, d: int) -> None:
        """The visit just made does not count as done (fixed annotations)."""
        self.undone[d].add(id(inst))

    def mark_done(self, inst: Instruction, d: int) -> None:
        """Put ``inst`` into the done set of direction ``d`` (possibly ahead of the cursor)."""
        key = id(inst)
        self.undone[d].discard(key)
        w = self.where.get(key)
        if w is None:
            return
        ci, pos = w
        hk = pos if d == FW else -pos
        passed = self.swept[ci][d] or (self._cur is not None and self._cur[0] == ci
                                       and self._cur[1] == d and hk <= self._cur_key)
        if not passed:
            self.early[d].add(key)

    # -- a sweep ----------------------------------------------------------------------------------
    def sweep(self, ci: int, d: int) -> Iterator[Instruction]:
        """The instructions of computation ``ci`` the full walk in direction ``d`` would
        visit and not skip, in its order (each is done when yielded)."""
        heap = list(self.pending[ci][d] | self.always[ci][d])
        self.pending[ci][d] = set()
        heapq.heapify(heap)
        self._heap = heap
        self._cur = (ci, d)
        self._cur_key = _BEFORE_ALL
        order = self.orders[ci]
        first = not self.swept[ci][d]
        undone = self.undone[d]
        early = self.early[d]
        flagged = self.flagged[d]
        always = self.always_ids[d]
        pop = heapq.heappop
        last = _BEFORE_ALL
        try:
            while heap:
                hk = pop(heap)
                if hk <= last:
                    continue
                last = self._cur_key = hk
                inst = order[hk] if d == FW else order[-hk]
                key = id(inst)
                if key in undone:
                    undone.discard(key)
                elif not first or key in early:
                    early.discard(key)
                    continue
                if key in flagged:
                    flagged.discard(key)
                    yield inst
                elif key in always:
                    yield inst
        finally:
            self.swept[ci][d] = True
            self._cur = None
            self._cur_key = _BEFORE_ALL
            self._heap = []
        if self.p.unchanged.check:
            self.p.unchanged.check_unflagged(order, d, flagged, always)

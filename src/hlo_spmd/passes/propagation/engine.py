"""The propagation driver: XLA's ShardingPropagation::Run / RunToFixPoint.

Per aggressiveness level 0..3 (then once more at 3): iterate every computation in
module order, a forward pass over XLA's post order (shardings from operands) then a
backward pass in reverse (shardings from users), until an iteration changes nothing.
An instruction is re-inferred only when a neighbour changed since it was last
inferred (XLA's ``already_inferred_from_*`` caches), so later iterations touch only
the frontier.  User annotations are fixed (only their open dims may be refined);
while / conditional / call keep their computations' parameters and roots in sync;
``shard_as`` / ``shard_like`` group members take shardings from each other first in
every iteration, and ``shard_as`` groups are aligned before the last level-3 run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hlo_spmd.annotations import parse_unspecified_dims
from hlo_spmd.annotations.cli_spec import per_item_flags
from hlo_spmd.errors import HloSpmdError
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.module import Module
from hlo_spmd.passes.propagation import backward as bw
from hlo_spmd.passes.propagation import forward as fw
from hlo_spmd.passes.propagation import graph as g
from hlo_spmd.passes.propagation import provenance as prov
from hlo_spmd.passes.propagation import sdy_manual
from hlo_spmd.passes.propagation import shard_groups as sg
from hlo_spmd.passes.propagation import sharding_ops as ops
from hlo_spmd.passes.propagation import unspecified as unspec
from hlo_spmd.passes.propagation.dims import DotDims, parse_conv, parse_dot
from hlo_spmd.passes.propagation.graph import Graph
from hlo_spmd.passes.propagation.improve import SAME, Verdict, improved, improved_sub
from hlo_spmd.passes.propagation.dirty import DirtySet
from hlo_spmd.passes.propagation.unchanged import BW, FW, MemoEntry, UnchangedMemo
from hlo_spmd.records import Record
from hlo_spmd.ir.opcodes import (CONTROL_FLOW, LINEAR_OPS, MANUAL_FORWARD_LATE,
                                 MANUAL_TUPLE_FORWARD, SPATIAL)
from hlo_spmd.sharding import HloSharding
from hlo_spmd.sharding import is_spatially_partitioned
from hlo_spmd.sharding.unreduced import reduce_all

LEVELS = (0, 1, 2, 3, 3)
LOOKAHEAD_LEVEL = 1 << 62
NO_LEVEL_LIMIT = 1 << 62  # (``level_hi`` when no answer bounds the level from above)

class ForwardFacts(Record, MemoEntry):
    """One instruction's forward inference: what ``infer_from_operands`` reads of it that
    never changes during a run (``Propagator.forward_facts``), and the skip memo's entry
    (``MemoEntry``, started by the memo)."""
    __slots__ = __match_args__ = ("min_level", "op", "manual_ok", "declared", "infer",
                                  "spatial")
    min_level: int          # the level it propagates from (``bw.level_of``)
    op: str                 # its propagation opcode (``Graph.op``)
    manual_ok: bool         # a manual operand makes it manual
    declared: fw.ForwardRule    # its declared forward rule and read set
    infer: fw.Rule          # (``declared.infer``)
    spatial: bool           # ``supports_spatial`` forward

    def __init__(self, min_level: int, op: str, manual_ok: bool,
                 declared: fw.ForwardRule, spatial: bool) -> None:
        self.min_level = min_level
        self.op = op
        self.manual_ok = manual_ok
        self.declared = declared
        self.infer = declared.infer
        self.spatial = spatial


class BackwardFacts(Record, MemoEntry):
    """One instruction's backward inference: what ``infer_from_users`` reads of it that
    never changes during a run (``Propagator.backward_facts``), and the skip memo's entry
    (``MemoEntry``, started by the memo); ``user_rules`` is per user."""
    __slots__ = __match_args__ = ("is_broadcast", "users", "spatial", "user_rules")
    is_broadcast: bool
    users: Sequence[Instruction]
    spatial: bool              # ``supports_spatial`` backward
    user_rules: list[bw.UserRule]

    def __init__(self, is_broadcast: bool, users: Sequence[Instruction], spatial: bool,
                 user_rules: list[bw.UserRule]) -> None:
        self.is_broadcast = is_broadcast
        self.users = users
        self.spatial = spatial
        self.user_rules = user_rules


class KnownVerdict(Record):
    """A memoised ``verdict``: the verdict, ``may_combine``'s answer if the verdict asked
    it (else None), and the keyed objects (kept alive so that no id is reused)."""
    __slots__ = __match_args__ = ("verdict", "may_combine", "keyed")
    verdict: Verdict
    may_combine: bool | None
    keyed: tuple

    def __init__(self, verdict: Verdict, may_combine: bool | None, keyed: tuple) -> None:
        self.verdict = verdict
        self.may_combine = may_combine
        self.keyed = keyed


@dataclass(slots=True)
class WalkDirection:
    """One direction of the fix point's walk (``Propagator.run_to_fix_point``)."""
    d: int                      # FW or BW
    name: str                   # the recorder's direction
    walk: list[tuple[int, Instruction]]    # (id, instruction) by walk position
    pos: dict[int, int]         # id -> walk position
    flags: bytearray            # the dirty set's flags (1: the memo must be asked)
    keep: bytearray             # 1 where a visit leaves the flag set: asked every visit
    inferred: bytearray         # XLA's already_inferred_from_{operands,users} (1: skip)
    # The same for provided (fixed) instructions, which only an explicit mark puts in
    # (a visit does not, nor do the visits jumped over: ``inferred`` is not read there).
    provided_inferred: bytearray
    boundaries: frozenset[int]  # visiting one re-opens its operand (backward only)


class Propagator:
    """State of one propagation run over a module (shardings live on the instructions).

    The rules (``forward``, ``backward``, ...) and the skip memo and dirty set use it
    only through ``interface.PropagatorInterface``, its public interface.
    """

    # (slots: the rules call its methods ~10^5 times per module, and an instance with a
    # few dozen attributes in a dict of its own makes every such call a slower one)
    __slots__ = ("module", "graph", "rec", "output_allowed", "params_allowed", "to_output",
                 "to_params", "_root_given", "report_open_dims", "_level", "level_read",
                 "level_lo", "level_hi", "direction", "provided", "unspecified",
                 "iterations", "level_iterations", "_dims_cache", "_verdicts", "groups",
                 "unchanged", "dirty", "_fw_facts", "_bw_facts", "_user_rule",
                 "_boundaries", "_synced", "_walks", "_done_group", "_has_groups")

    def __init__(self, module: Module, graph: Graph, recorder: prov.Recorder, *,
                 to_output: bool | Sequence[bool], to_params: bool | Sequence[bool],
                 annotations=None) -> None:
        self.module = module
        self.graph = graph
        self.rec = recorder
        entry = module.entry
        root = graph.entry_root
        # XLA's allow_spmd_sharding_propagation_to_{output,parameters}: one flag for all,
        # or one per output (root tuple element) / entry parameter.
        n_out = len(root.shape.tuple_shapes) if root is not None and root.shape.is_tuple \
            else 1
        self.output_allowed = per_item_flags(to_output, n_out, "output")
        params = entry.parameters if entry is not None else []
        allowed = per_item_flags(to_params, len(params), "parameter")
        self.params_allowed = {id(p) for p, ok in zip(params, allowed) if ok}
        self.to_output = any(self.output_allowed)
        self.to_params = bool(self.params_allowed)
        self._root_given: HloSharding | None = None
        # Open dims the annotation report knows (Shardy attributes), by instruction name.
        self.report_open_dims: dict[str, tuple[int, ...]] = {
            r.name: tuple(r.unspecified_dims)
            for r in getattr(annotations, "records", ()) if r.unspecified_dims}
        self._level = 0
        # What the running inference learnt about the level (``unchanged`` resets and
        # reads these): a plain read of ``level`` makes it depend on the exact level;
        # ``at_least`` answers bound it to [level_lo, level_hi).
        self.level_read = False
        self.level_lo = 0
        self.level_hi = NO_LEVEL_LIMIT
        self.direction = "forward"
        self.provided: set[int] = set()
        self.unspecified: dict[int, tuple[int, ...]] = {}
        self.iterations = 0
        self.level_iterations: list[int] = []
        self._dims_cache: dict[int, DotDims] = {}
        # (id(candidate), id(current), id(shape), linear, allow) ->
        #   (verdict, may_combine's answer if asked else None, the keyed objects)
        self._verdicts: dict[tuple, KnownVerdict] = {}
        self.groups = sg.ShardGroups()
        # Inferences whose inputs are unchanged since they last changed nothing are
        # skipped, across levels too (see ``unchanged``).
        self.unchanged = UnchangedMemo(self)
        self.dirty = DirtySet(self)
        # (keyed by the instructions, which hash by identity: no id() call per question)
        self._fw_facts: dict[Instruction, ForwardFacts] = {}
        self._bw_facts: dict[Instruction, BackwardFacts] = {}
        self._user_rule: dict[Instruction, bw.UserRule] = {}
        self._boundaries: frozenset[int] | None = None
        # Ids of the values a control-flow op keeps in sync (``related``), set in
        # ``setup``: only their changes need ``computation_propagation``.
        self._synced: frozenset[int] = frozenset()
        # The fix point's walk state (``run_to_fix_point``).
        self._walks: tuple[WalkDirection, WalkDirection] | None = None
        self._done_group: set[int] = set()
        self._has_groups = False

    def dot_dims(self, inst: Instruction) -> DotDims:
        """The dot dimension numbers of a dot or convolution (cached for the run)."""
        d = self._dims_cache.get(id(inst))
        if d is None:
            d = parse_dot(inst) if inst.opcode == "dot" else parse_conv(inst)
            self._dims_cache[id(inst)] = d
        return d

    # -- the level ----------------------------------------------------------------------------
    @property
    def level(self) -> int:
        """The aggressiveness level (read as a number: the inference depends on it exactly;
        prefer ``at_least``)."""
        self.level_read = True
        return self._level

    @level.setter
    def level(self, value: int) -> None:
        self._level = value

    def at_least(self, k: int, level: int | None = None) -> bool:
        """Whether the level (``level``, default the current one) is >= ``k``, noting the
        answer so that the memo knows at which other levels the inference would read the
        same (``unchanged``).  The lookahead's level is not the run's: not noted."""
        lv = self._level
        if level is not None and level != lv:
            return level >= k
        r = lv >= k
        if lv != LOOKAHEAD_LEVEL:
            if r:
                if k > self.level_lo:
                    self.level_lo = k
            elif k < self.level_hi:
                self.level_hi = k
        return r

    @property
    def may_combine(self) -> bool:
        return self.at_least(1)

    def _may_combine(self) -> bool:
        return self.at_least(1)

    # -- sharding updates with provenance ----------------------------------------------------

    def verdict(self, inst: Instruction, cand: HloSharding, allow: bool = False) -> Verdict:
        """ReturnImprovedSharding for ``inst``: a pure function of the candidate, the
        current sharding, the shape, whether the opcode is linear, ``allow`` and (when it
        is asked) ``may_combine``, so it is memoised per run on those.  Propagated
        shardings are shared objects (28 layers offer the same pairs), so the key is
        their identity; the memo keeps them alive, so no id is reused meanwhile."""
        cur = inst.sharding
        shape = inst.shape
        linear = inst.opcode in LINEAR_OPS
        key = (id(cand), id(cur), id(shape), linear, allow)
        hit = self._verdicts.get(key)
        if hit is not None and (hit.may_combine is None
                                or self.at_least(1) == hit.may_combine):
            return hit.verdict
        asked: list[bool] = []

        def may_combine() -> bool:
            # (asked only if the verdict needs it: see ``at_least``)
            r = self.at_least(1)
            asked.append(r)
            return r

        v = self._verdict(cand, cur, shape, linear, may_combine, allow)
        self._verdicts[key] = KnownVerdict(v, asked[0] if asked else None, (cand, cur, shape))
        return v

    @staticmethod
    def _verdict(cand: HloSharding, cur: HloSharding | None, shape, linear: bool,
                 may_combine, allow: bool) -> Verdict:
        if cand.is_tuple and not shape.is_tuple:
            return Verdict(None, prov.INCOMPATIBLE)
        cand = ops.normalize_tuple(cand, shape)
        if not linear:  # partial sums flow through linear ops only
            cand = reduce_all(cand)
        return improved(cand, cur, shape, may_combine, allow)

    def set(self, inst: Instruction, sharding: HloSharding, rule: str,
            sources: tuple[Instruction, ...] = (), direction: str | None = None) -> None:
        sharding = ops.normalize_tuple(sharding, inst.shape)
        inst.sharding = sharding
        self.dirty.changed(inst)
        self.rec.accept(inst.name, sharding, rule, direction or self.direction,
                        (sources[0].name,) if len(sources) == 1
                        else tuple(s.name for s in sources))

    def reject(self, inst: Instruction, cand: HloSharding, rule: str,
               sources: tuple[Instruction, ...], reason: str) -> None:
        self.rec.reject(inst.name, cand, rule, tuple(s.name for s in sources), reason)

    def improve(self, inst: Instruction, cand: HloSharding, rule: str,
                sources: tuple[Instruction, ...], allow: bool = False) -> bool:
        """MaybeImproveInstructionSharding: adopt ``cand`` if it improves ``inst``."""
        # (``verdict``'s memo hit inlined: ~10^4 questions per module)
        key = (id(cand), id(inst.sharding), id(inst.shape), inst.opcode in LINEAR_OPS, allow)
        hit = self._verdicts.get(key)
        if hit is not None and (hit.may_combine is None
                                or self.at_least(1) == hit.may_combine):
            v = hit.verdict
        else:
            v = self.verdict(inst, cand, allow)
        if v.sharding is None:
            if v.reason is not SAME:
                self.reject(inst, cand, rule, sources, v.reason)
            return False
        self.set(inst, v.sharding, rule, sources)
        return True

    def improve_sub(self, inst: Instruction, cand: HloSharding, index: int, rule: str,
                    sources: tuple[Instruction, ...], allow: bool = False) -> bool:
        """MaybeImproveInstructionSubSharding (tuple element ``index``)."""
        new = improved_sub(cand, inst.sharding, inst.shape, index, self._may_combine, allow)
        if new is None:
            self.reject(inst, cand, rule, sources, prov.NOT_FINER)
            return False
        self.set(inst, new, rule, sources)
        return True

    # -- what can be sharded ------------------------------------------------------------------
    @property
    def boundaries(self) -> frozenset[int]:
        """Manual-region boundaries (ids): their operand is re-inferred with them."""
        if self._boundaries is None:
            self._boundaries = frozenset(
                id(i) for i in self.graph.instructions()
                if i.opcode == "custom-call"
                and i.custom_call_target in (g.FULL_TO_SHARD, g.SHARD_TO_FULL))
        return self._boundaries

    def user_rule(self, user: Instruction) -> bw.UserRule:
        """``bw.user_rule`` once per instruction (the skip memo, the dirty set and
        ``infer_from_users`` each ask per edge)."""
        r = self._user_rule.get(user)
        if r is None:
            r = self._user_rule[user] = bw.user_rule(user, self.graph.op[user],
                                                     self.graph.elementwise[user])
        return r

    def supports_spatial(self, inst: Instruction, to_output: bool, to_params: bool) -> bool:
        """SupportSpatialPartitioning (static once ``setup`` has mapped the computations;
        asked once per instruction and direction, by the cached forward / backward
        facts)."""
        if (self.graph.is_root(inst) and self.graph.owner(inst) is None
                and not (inst is self.graph.entry_root and to_output)):
            return False
        if self.graph.elementwise[inst]:
            return True
        op = self.graph.op[inst]
        if op in SPATIAL:   # (SupportSpatialPartitioning)
            return True
        if op == "parameter":
            return (to_params and id(inst) in self.params_allowed) or \
                self.graph.owner(inst) is not None
        if inst.opcode == "custom-call":
            return g.is_passthrough_custom_call(inst)
        return False

    # -- forward / backward inference ---------------------------------------------------------
    def forward_facts(self, inst: Instruction) -> ForwardFacts:
        """``ForwardFacts`` of ``inst``, made once (asked after ``setup``)."""
        facts = self._fw_facts.get(inst)
        if facts is None:
            op = self.graph.op[inst]
            elementwise = self.graph.elementwise[inst]
            tuple_cc = inst.opcode == "custom-call" and inst.shape.is_tuple
            manual_ok = inst.shape.is_array or op in MANUAL_TUPLE_FORWARD or tuple_cc
            facts = self._fw_facts[inst] = ForwardFacts(
                bw.level_of(op, elementwise), op, manual_ok,
                fw.forward_rule_of(self.graph, inst),
                self.supports_spatial(inst, self.to_output, False))
        return facts

    def infer_from_operands(self, inst: Instruction) -> bool:
        """InferShardingFromOperands."""
        facts = self._fw_facts.get(inst) or self.forward_facts(inst)
        ml = facts.min_level
        if ml and not self.at_least(ml):
            return False
        s = inst.sharding
        if s is not None and s.is_manual:
            return False
        if facts.manual_ok and (s is None or s.is_tile_maximal):
            for o in inst.operands:
                if o.sharding is None or not o.sharding.is_manual:
                    continue
                if g.is_custom_call(inst, g.SHARD_TO_FULL):
                    return False
                if facts.op in MANUAL_FORWARD_LATE and not self.at_least(1):
                    return False
                manual = ops.normalize_tuple(HloSharding.manual(), inst.shape)
                self.set(inst, manual, "manual.forward", (o,), direction="manual")
                return True
        if not facts.spatial:
            return fw.unsupported_rule(self, inst)
        return facts.infer(self, inst)

    def backward_facts(self, inst: Instruction) -> BackwardFacts:
        """``BackwardFacts`` of ``inst``, made once (asked after ``setup``)."""
        facts = self._bw_facts.get(inst)
        if facts is None:
            users = self.graph.users_of(inst)
            facts = self._bw_facts[inst] = BackwardFacts(
                self.graph.op[inst] == "broadcast", users,
                self.supports_spatial(inst, False, self.to_params),
                [self.user_rule(u) for u in users])
        return facts

    def infer_from_users(self, inst: Instruction) -> bool:
        """InferShardingFromUsers."""
        facts = self._bw_facts.get(inst) or self.backward_facts(inst)
        if facts.is_broadcast and not self.at_least(2):
            return False
        s = inst.sharding
        if s is not None and s.is_manual:
            return False
        users, user_rules = facts.users, facts.user_rules
        # What each user gave in the manual check, reused below while ``inst``'s own
        # sharding (all that changes in between) is still the one it was computed with.
        asked: dict[int, HloSharding | None] = {}
        if s is None or s.is_tile_maximal:
            for k, user in enumerate(users):
                if user.sharding is None or not user_rules[k].manual_source:
                    continue   # (the operand is not made manual)
                if user.sharding.is_manual and inst.shape.is_array:   # (cheap test first)
                    self.set(inst, HloSharding.manual(), "manual.backward", (user,),
                             direction="manual")
                    return True
                us = asked[k] = bw.operand_from_user(self, inst, user, self._level,
                                                     user_rules[k])
                if us is not None and us.is_manual:
                    self.set(inst, us, "manual.backward", (user,), direction="manual")
                    return True
        if not facts.spatial:
            return False
        changed = False
        shape_is_tuple = inst.shape.is_tuple
        for k, user in enumerate(users):
            rule = user_rules[k]
            if rule.from_nothing:
                rep = ops.single_tuple(inst.shape, HloSharding.replicate())
                if inst.sharding != rep:
                    self.set(inst, rep, "rng-bit-generator.backward", (user,))
                    return True
                return False
            if k in asked and inst.sharding is s:
                us = asked[k]
            # (``bw.operand_from_user``, inlined: asked per user per visit)
            elif rule.min_level and not self.at_least(rule.min_level):
                continue
            elif rule.blocked or not is_spatially_partitioned(user.sharding):
                continue
            else:
                us = rule.operand_of(self, inst, user)
            if us is not None:
                if us.is_tuple != shape_is_tuple:
                    us = ops.normalize_tuple(us, inst.shape)
                    if us.is_tuple != shape_is_tuple:
                        continue
                changed |= self.improve(inst, us, rule.name, (user,))
        return changed

    def lookahead_user_sharding(self, inst: Instruction) -> HloSharding | None:
        """LookaheadUserSharding: follow a single-user chain to the first sharded user and
        map its sharding back to ``inst`` (used to order a dot's operand shardings)."""
        users = self.graph.users_of(inst)
        if len(users) != 1:
            return None
        cur = users[0]
        chain = [inst, cur]
        while cur.sharding is None:
            nxt = self.graph.users_of(cur)
            if len(nxt) != 1:
                return None
            cur = nxt[0]
            chain.append(cur)
        saved_level = self._level
        self.level = LOOKAHEAD_LEVEL
        result: HloSharding | None = None
        try:
            for i in range(len(chain) - 1, 0, -1):
                result = bw.operand_from_user(self, chain[i - 1], chain[i], self._level)
                if result is not None and i != 1:
                    chain[i - 1].sharding = result
                    continue
                break
        finally:
            self.level = saved_level
            for mid in chain[1:-1]:
                mid.sharding = None
        return result

    # -- control flow ---------------------------------------------------------------------------
    def related(self, inst: Instruction) -> list[Instruction]:
        """GetRelatedInstructions: values that must share ``inst``'s sharding."""
        op = inst.opcode
        if op == "while":
            cond, body = _while_parts(inst)
            return [inst, body.root, body.parameters[0], cond.parameters[0]]
        if op == "conditional":
            return [inst] + [c.root for c in inst.called_computations]
        if op == "call":
            return [inst, inst.called_computations[0].root]
        if op == "parameter":
            owner = self.graph.owner(inst)
            if owner is not None and owner.opcode == "conditional":
                for i, c in enumerate(owner.called_computations):
                    if c is inst.parent:
                        return [inst, owner.operands[i + 1]]
            if owner is not None and owner.opcode == "call":
                return [inst, owner.operands[inst.parameter_number]]
        return []

    def computation_propagation(self, inst: Instruction, changed: list[Instruction]) -> None:
        """MaybeComputationPropagation: copy ``inst``'s sharding to its related values."""
        if inst.opcode in CONTROL_FLOW or inst.opcode == "custom-call":
            self._propagate_to(inst, inst, changed)
        if inst.opcode == "parameter" or self.graph.is_root(inst):
            owner = self.graph.owner(inst)
            if owner is not None:
                self._propagate_to(inst, owner, changed)
                if inst.opcode == "parameter":
                    # (a branch's / callee's parameter and the caller's operand; a
                    # while's parameter relates to nothing of its own: ``related``)
                    self._propagate_to(inst, inst, changed)

    def _propagate_to(self, inst: Instruction, search: Instruction,
                      changed: list[Instruction]) -> None:
        """``inst``'s sharding to the values related to ``search``, if ``inst`` is one."""
        related = self.related(search)
        if not any(r is inst for r in related):
            return
        for r in related:
            if id(r) in self.provided:
                continue
            if r.sharding is None or r.sharding != inst.sharding:
                self.set(r, inst.sharding, "computation.sync", (inst,), direction="computation")
                if not any(c is r for c in changed):
                    changed.append(r)
                self.computation_propagation(r, changed)

    # -- setup ----------------------------------------------------------------------------------
    def setup(self) -> None:
        """Sharding custom-calls, computation map, fixed shardings (XLA's Run prologue)."""
        self.rec.level = self.rec.iteration = -1
        for inst in self.graph.instructions():
            if inst.sharding is not None and inst.shape.is_tuple and not inst.sharding.is_tuple:
                inst.sharding = ops.normalize_tuple(inst.sharding, inst.shape)
            if inst.sharding is not None:
                self.rec.accept(inst.name, inst.sharding, "annotation", "user", ())
        self._process_sharding_custom_calls()
        for comp in self.graph.computations:
            for inst in comp.instructions:
                if inst.opcode not in CONTROL_FLOW:
                    continue
                related = self.related(inst)
                # A non-tuple conditional's branch roots sit under fresh, unannotated
                # tuples in XLA (ConditionalCanonicalizer runs first): only the
                # conditional's own sharding seeds the sync, and annotated roots keep theirs.
                canon = inst.opcode == "conditional" and not inst.shape.is_tuple
                first = next((r for r in (related[:1] if canon else related)
                              if r.sharding is not None), None)
                if first is not None:
                    for r in related:
                        if canon and r.sharding is not None:
                            continue
                        if r is not first and r.sharding != first.sharding:
                            self.set(r, first.sharding, "computation.sync(initial)", (first,),
                                     direction="computation")
                if inst.opcode == "while":
                    cond, body = _while_parts(inst)
                    self.graph.computation_map[id(body)] = inst
                    self.graph.computation_map[id(cond)] = inst
                else:
                    for c in inst.called_computations:
                        self.graph.computation_map[id(c)] = inst
        self._synced = frozenset(id(r) for inst in self.graph.instructions()
                                 if inst.opcode in CONTROL_FLOW or inst.opcode == "parameter"
                                 for r in self.related(inst))
        entry = self.module.entry
        root = self.graph.entry_root
        for inst in self.graph.instructions():
            s = inst.sharding
            if (s is not None and inst is not root and inst.opcode != "parameter"
                    and not s.is_unknown):
                self.provided.add(id(inst))
        if root is not None:
            self._root_given = root.sharding
        if root is not None and not self.to_output and (root.sharding is None
                                                         or not root.sharding.is_unknown):
            self.provided.add(id(root))
        if entry is not None:
            for param in entry.parameters:
                if id(param) in self.params_allowed:
                    continue
                if param.sharding is not None and not param.sharding.is_unknown:
                    self.provided.add(id(param))
        for inst in self.graph.instructions():
            if inst.sharding is not None and _is_unknown(inst.sharding):
                inst.sharding = _unknown_to_replicated(inst.sharding)

    def _process_sharding_custom_calls(self) -> None:
        """ProcessShardingInstruction: open dims are recorded; a fully specified
        annotation also shards its (unsharded) operand; shard groups are collected."""
        for comp in self.graph.computations:
            for inst in reversed(self.graph.post_orders[comp.name]):
                if inst.sharding is None and inst.opcode != "custom-call":
                    continue   # (nothing below applies to it)
                gid = g.sharding_group_id(inst)
                if gid is not None and inst.operands:
                    # Shardy's sharding group (shard_as): the operands are the members;
                    # negative ids keep them apart from classic shard_as ids.
                    for op in inst.operands:
                        self.groups.add(op, -1 - gid, True)
                    continue
                if sdy_manual.is_sdy_boundary(inst):
                    # Shardy manual entry / exit: its open dims are read per value
                    # from its attribute (sdy_manual.py), not from this entry.
                    self.unspecified[id(inst)] = self.report_open_dims.get(inst.name, ())
                    sdy_manual.pin_exit_operands(self, inst)
                if not g.is_custom_call(inst, g.SHARDING) or inst.sharding is None:
                    spec = sg.group_spec(inst.sharding)
                    if spec is not None:
                        self.groups.add(inst, *spec)
                        inst.sharding = sg.strip_group(inst.sharding)
                    continue
                original = inst.sharding
                spec = sg.group_spec(original)
                operand = inst.operands[0]
                transparent = False
                if spec is not None:
                    if original.is_unknown and operand.opcode != "parameter":
                        # XLA hands the group to the operand and removes the custom-call;
                        # here it stays, as an unannotated copy.
                        base = operand.sharding or HloSharding.unknown()
                        operand.sharding = sg.with_group(base, original)
                        transparent = True
                    else:
                        self.groups.add(inst, *spec)
                        inst.sharding = sg.strip_group(original)
                try:
                    dims = parse_unspecified_dims(inst.attrs.backend_config)
                except HloSpmdError:
                    dims = ()
                if not dims:
                    # Open dims known only from a Shardy attribute.
                    dims = self.report_open_dims.get(inst.name, ())
                if dims:
                    self.unspecified[id(inst)] = tuple(sorted(dims))
                elif operand.sharding is None:
                    self.set(operand, inst.sharding, "sharding-custom-call.operand",
                             (inst,), direction="preprocess")
                if transparent:
                    inst.sharding = None

    # -- the fixpoint ---------------------------------------------------------------------------
    def run_to_fix_point(self, level: int) -> None:
        """RunToFixPoint at one aggressiveness level.

        XLA's walk visits every instruction per sweep (computations in module order,
        each forward in post order then backward in reverse, after its shard groups)
        and skips those in its ``already_inferred_from_{operands,users}`` sets, which a
        visit fills and a neighbour's change clears (``_clear_cache``).  Here those sets
        are ``WalkDirection.inferred``, and the memo is asked only about inferences the
        dirty set flags (the others it would skip): the walk jumps from flagged position
        to flagged position (``bytearray.find``), and the visits it jumps over, which
        would only fill ``inferred``, fill it in one slice.  Provided (fixed)
        instructions are never put in the sets by a visit (XLA's ``continue`` before
        that), only when their open dims were refined: theirs is
        ``provided_inferred``, which the slices do not touch.  Flagged at every visit:
        dot / convolution forward (lookahead), manual-region boundaries backward, and
        open-dims annotations from level 1 (an unflagged memo question is skipped by
        the memo, so asking it changes nothing)."""
        self.level = level
        self.rec.level = level
        dirty = self.dirty
        dirty.start_level(level)
        graph = self.graph
        n = len(graph.walk[FW])
        walks = self._walks = tuple(
            WalkDirection(d, name, graph.walk[d], graph.walk_pos[d], dirty.flagged[d].bits,
                          keep=bytearray(n), inferred=bytearray(n),
                          provided_inferred=bytearray(n), boundaries=bounds)
            for d, name, bounds in ((FW, "forward", frozenset()),
                                    (BW, "backward", self.boundaries)))
        fwd, bwd = walks
        for key in dirty.always:
            fwd.keep[fwd.pos[key]] = 1
        for key in self.boundaries:
            bwd.keep[bwd.pos[key]] = 1
        if level > 0:
            for key in self.unspecified:
                if key in self.provided and key in fwd.pos:
                    fwd.keep[fwd.pos[key]] = 1
                    bwd.keep[bwd.pos[key]] = 1
        for dr in walks:
            keep, flags = dr.keep, dr.flags
            p = keep.find(1)
            while p >= 0:
                flags[p] = 1
                p = keep.find(1, p + 1)
        self._done_group = set()
        has_groups = self._has_groups = bool(self.groups)   # (collected in ``setup`` only)
        unchanged = self.unchanged
        ones = memoryview(b"\x01" * n)
        iterations = 0
        changed_last = True
        # A computation with no flag in either direction has nothing to visit (most of a
        # transformer's are one-add reducers): skipped whole, unless shard groups or the
        # check mode visit every instruction.
        may_skip = not has_groups and not unchanged.check
        while changed_last:
            changed_last = False
            self.rec.iteration = self.iterations
            for comp, a, b in graph.walk_ranges:
                if may_skip and fwd.flags.find(1, a, b) < 0 and bwd.flags.find(1, a, b) < 0:
                    fwd.inferred[a:b] = ones[:b - a]   # (its visits, jumped over)
                    bwd.inferred[a:b] = ones[:b - a]
                    self.direction = "backward"   # (as after its walk)
                    continue
                if has_groups:
                    changed_last |= self._infer_from_groups(comp, level)
                for dr in walks:
                    self.direction = dr.name
                    changed_last |= self._walk(dr, a, b, level, ones)
                    if unchanged.check:
                        unchanged.check_unflagged(graph.post_orders[comp.name], dr.d, dirty,
                                                  level)
            self.iterations += 1
            iterations += 1
        self.level_iterations.append(iterations)

    def _walk(self, dr: WalkDirection, a: int, b: int, level: int, ones: memoryview) -> bool:
        """One direction's visits of the computation at walk positions [a, b): whether a
        sharding changed."""
        flags, keep, inferred, walk = dr.flags, dr.keep, dr.inferred, dr.walk
        provided_inferred = dr.provided_inferred
        provided = self.provided
        unspecified = self.unspecified
        boundaries = dr.boundaries
        may_combine = level > 0
        infer = self.unchanged.infer
        d = dr.d
        changed = False
        i = a - 1
        while True:   # (the flagged positions in [a, b), each flag read when the walk
            # reaches it; the next position is tried before a find, which costs about
            # ten such steps)
            nxt = i + 1
            if nxt >= b:
                break
            if flags[nxt]:
                i = nxt
            else:
                i = flags.find(1, nxt, b)
                if i < 0:
                    inferred[nxt:b] = ones[:b - nxt]   # (the visits jumped over)
                    break
                inferred[nxt:i] = ones[:i - nxt]
            key, inst = walk[i]
            is_provided = key in provided
            if (provided_inferred if is_provided else inferred)[i]:
                continue              # already inferred: the flag waits for a clear
            if key in boundaries:
                # A manual-region boundary: its operand is re-inferred with it.
                q = dr.pos.get(id(inst.operands[0]))
                if q is not None:
                    inferred[q] = provided_inferred[q] = 0
            if is_provided:
                flags[i] = keep[i]
                if not may_combine or key not in unspecified:
                    continue
                if d == FW:
                    ok, conv = unspec.from_operand(self, inst, unspecified[key])
                else:
                    ok, conv = unspec.from_users(self, inst, unspecified[key], level)
                if ok:
                    self._clear_cache(inst, conv)
                    provided_inferred[i] = 1
                    if d == BW and conv is not None and id(conv) in dr.pos:
                        q = dr.pos[id(conv)]
                        inferred[q] = provided_inferred[q] = 1
                    changed = True
                continue
            flags[i] = keep[i]
            inferred[i] = 1
            if infer(inst, d, level):
                self._after_change(inst)
                changed = True
        return changed

    def _infer_from_groups(self, comp, level: int) -> bool:
        """Shard groups first in every sweep of a computation: each member not done yet
        takes its group's sharding (an open-dims annotation refines its open dims)."""
        self.direction = "shard-group"
        done_group = self._done_group
        changed = False
        for inst in self.graph.post_orders[comp.name]:
            key = id(inst)
            group = self.groups.group_of(inst)
            if key in done_group or group is None:
                continue
            if key in self.provided:
                if level > 0 and key in self.unspecified and \
                        sg.refine_open_dims_from_group(self, inst, self.unspecified[key],
                                                       group):
                    self._clear_cache(inst)
                    done_group.add(key)
                    changed = True
                continue
            done_group.add(key)
            if sg.infer_from_group(self, inst, group):
                self._after_change(inst)
                changed = True
        return changed

    def _clear_cache(self, hlo: Instruction, hlo_for_users: Instruction | None = None) -> None:
        """XLA's clear_cache: a change of ``hlo`` takes its neighbours out of the
        ``inferred`` sets (forward: the users of ``hlo_for_users`` if given) and its
        group's members out of the groups done."""
        fw_t, bw_t = self.graph.clear_targets(hlo)
        if hlo_for_users is not None:
            fw_t = self.graph.clear_targets(hlo_for_users)[0]
        fwd, bwd = self._walks
        fw_inferred, fw_provided = fwd.inferred, fwd.provided_inferred
        bw_inferred, bw_provided = bwd.inferred, bwd.provided_inferred
        for q in fw_t:
            fw_inferred[q] = fw_provided[q] = 0
        for q in bw_t:
            bw_inferred[q] = bw_provided[q] = 0
        group = self.groups.group_of(hlo) if self._has_groups else None
        if group is not None:
            for m in group:
                if m is not hlo:
                    self._done_group.discard(id(m))

    def _after_change(self, inst: Instruction) -> None:
        """``inst``'s sharding changed: computation propagation, then the caches."""
        if id(inst) not in self._synced:   # (most values: nothing to keep in sync)
            self._clear_cache(inst)
            return
        changed: list[Instruction] = []
        self.computation_propagation(inst, changed)
        self._clear_cache(inst)
        for h in changed:
            self._clear_cache(h)

    def run(self) -> None:
        self.setup()
        self.run_levels()
        self.finish()

    def close(self) -> None:
        """After the run: drop the memos and the back references to this run (the memo
        and the dirty set hold it, and it holds them), so that the run's state is freed
        as soon as the caller lets go of it, not by a later garbage collection."""
        self.unchanged.close()
        self.dirty.close()
        self._fw_facts.clear()
        self._bw_facts.clear()
        self._verdicts.clear()

    def run_levels(self) -> None:
        """Every aggressiveness level to its fix point (once per priority round)."""
        self.dirty.start_round()
        for level in LEVELS[:-1]:
            self.run_to_fix_point(level)
        if self.groups:
            sg.align_shard_as(self, self.groups)
        self.run_to_fix_point(LEVELS[-1])

    # -- epilogue -------------------------------------------------------------------------------
    def finish(self) -> None:
        """Uneven parameter / output shardings become replicated (when they were allowed to
        change); every value still unsharded gets XLA's partitioner default, replicated."""
        self.rec.level, self.rec.iteration = -1, self.iterations
        root = self.graph.entry_root
        entry = self.module.entry
        if self.to_output and root is not None and root.sharding is not None:
            self._replicate_uneven(root, "output")
            if not all(self.output_allowed):
                self._restore_outputs(root)
        if self.to_params and entry is not None:
            for param in entry.parameters:
                if param.sharding is not None and id(param) in self.params_allowed:
                    self._replicate_uneven(param, "parameter")
        for inst in self.graph.instructions():
            if inst.sharding is not None:
                if id(inst) not in self.provided and inst.sharding.metadata:
                    inst.sharding = inst.sharding.without_metadata()
                continue
            if inst.shape.is_token:
                continue
            default = ops.single_tuple(inst.shape, HloSharding.replicate())
            inst.sharding = default
            self.rec.accept(inst.name, default, "default.replicated", "default", ())

    def _restore_outputs(self, root: Instruction) -> None:
        """Outputs propagation was not allowed to choose keep what they were given
        (replicated when nothing was), as XLA restores them after propagation."""
        given = self._root_given
        if given is not None and given.is_unknown:
            given = None
        leaves = root.shape.tuple_shapes
        now = root.sharding.tuple_elements if root.sharding.is_tuple else \
            (root.sharding,) * len(leaves)
        before = (given.tuple_elements if given is not None and given.is_tuple
                  else (given,) * len(leaves))
        new = [e if ok else (b if b is not None and not b.is_unknown
                             else HloSharding.replicate())
               for e, b, ok in zip(now, before, self.output_allowed)]
        fixed = HloSharding.tuple(new)
        if fixed != root.sharding:
            self.set(root, fixed, "output.not_allowed", (), direction="default")

    def _replicate_uneven(self, inst: Instruction, what: str) -> None:
        s = inst.sharding
        assert s is not None
        if s.is_tuple and inst.shape.is_tuple:
            leaves = [leaf for _, leaf in inst.shape.leaves()]
            new = [e if ops.evenly_partitions(l, e) else HloSharding.replicate()
                   for l, e in zip(leaves, s.tuple_elements)]
            fixed = HloSharding.tuple(new)
        else:
            fixed = s if ops.evenly_partitions(inst.shape, s) else HloSharding.replicate()
        if fixed != s:
            self.set(inst, fixed, f"{what}.replicate_uneven", (), direction="default")


def _while_parts(inst: Instruction):
    """(condition, body) of a while: XLA stores the body first, the condition second."""
    comps = inst.called_computations
    if len(comps) != 2:
        raise HloSpmdError(f"while {inst.name} does not call a body and a condition")
    return comps[1], comps[0]


def _is_unknown(s: HloSharding) -> bool:
    if s.is_tuple:
        return any(e.is_unknown for e in s.tuple_elements)
    return s.is_unknown


def _unknown_to_replicated(s: HloSharding) -> HloSharding:
    if s.is_tuple:
        return HloSharding.tuple([HloSharding.replicate() if e.is_unknown else e
                                  for e in s.tuple_elements])
    return HloSharding.replicate()

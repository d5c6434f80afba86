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

from typing import Any, Sequence

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
from hlo_spmd.passes.propagation.unchanged import (BACKWARD_READS_USER_ONLY, BW, FW,
                                                   UnchangedMemo)
from hlo_spmd.ir.opcodes import CONTROL_FLOW, LINEAR_OPS
from hlo_spmd.sharding import HloSharding
from hlo_spmd.sharding import is_spatially_partitioned
from hlo_spmd.sharding.unreduced import reduce_all

LEVELS = (0, 1, 2, 3, 3)
LOOKAHEAD_LEVEL = 1 << 62
NO_LEVEL_LIMIT = 1 << 62  # (``level_hi`` when no answer bounds the level from above)

# SupportSpatialPartitioning: opcodes the SPMD partitioner can split.
SPATIAL_OPCODES = frozenset({
    "broadcast", "concatenate", "conditional", "constant", "convolution", "opt-barrier", "dot",
    "dynamic-slice", "dynamic-update-slice", "gather", "get-tuple-element", "infeed", "iota",
    "pad", "reduce-window", "reshape", "scatter", "select-and-scatter", "slice", "sort",
    "transpose", "tuple", "while", "reduce", "rng-bit-generator", "all-reduce",
    "collective-permute", "reduce-scatter", "reverse",
    # Not in XLA's list (its partitioner replicates them); handlers/batch_norm.py splits them.
    "batch-norm-training", "batch-norm-inference", "batch-norm-grad",
    # Not in XLA's list (its results stay replicated): handlers/sort.py splits top-k on
    # every dim, so its results may follow the operand (an MoE router's gates stay on
    # the token shards).
    "topk"})


class Propagator:
    """State of one propagation run over a module (shardings live on the instructions)."""

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
        self._verdicts: dict[tuple, tuple] = {}
        self.groups = sg.ShardGroups()
        # Inferences whose inputs are unchanged since they last changed nothing are
        # skipped, across levels too (see ``unchanged``).
        self.unchanged = UnchangedMemo(self)
        self.dirty = DirtySet(self)
        # (keyed by the instructions, which hash by identity: no id() call per question)
        self._fw_facts: dict[Instruction, tuple[int, str, bool, Any, bool]] = {}
        self._bw_facts: dict[Instruction, tuple] = {}
        self._user_rule: dict[Instruction, tuple] = {}
        self._user_facts: dict[Instruction, tuple] = {}
        self._boundaries: frozenset[int] | None = None

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
        if hit is not None and (hit[1] is None or self.at_least(1) == hit[1]):
            return hit[0]
        asked: list[bool] = []

        def may_combine() -> bool:
            # (asked only if the verdict needs it: see ``at_least``)
            r = self.at_least(1)
            asked.append(r)
            return r

        v = self._verdict(cand, cur, shape, linear, may_combine, allow)
        self._verdicts[key] = (v, asked[0] if asked else None, cand, cur, shape)
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
        if hit is not None and (hit[1] is None or self.at_least(1) == hit[1]):
            v = hit[0]
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

    def user_facts(self, user: Instruction) -> tuple:
        """What the backward walk reads of ``user`` as a user, once per instruction (the
        skip memo, the dirty set and ``infer_from_users`` each ask per edge): its
        propagation opcode, whether its backward rule also reads its other operands
        (``unchanged.BACKWARD_READS_USER_ONLY``), whether a manual sharding of it makes
        its operand manual (not a manual region's entry), and its ``user_rule``."""
        r = self._user_facts.get(user)
        if r is None:
            op = self.graph.op[user]
            reads = not (op in BACKWARD_READS_USER_ONLY or self.graph.elementwise[user])
            manual_source = not (g.is_custom_call(user, g.FULL_TO_SHARD)
                                 or sdy_manual.is_sdy_entry(user))
            r = self._user_facts[user] = (op, reads, manual_source, self.user_rule(user))
        return r

    def user_rule(self, user: Instruction):
        """``bw.user_rule`` once per instruction."""
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
        if op in SPATIAL_OPCODES:
            return True
        if op == "parameter":
            return (to_params and id(inst) in self.params_allowed) or \
                self.graph.owner(inst) is not None
        if inst.opcode == "custom-call":
            return g.is_passthrough_custom_call(inst)
        return False

    # -- forward / backward inference ---------------------------------------------------------
    def _forward_facts(self, inst: Instruction) -> tuple[int, str, bool, Any, bool]:
        """What ``infer_from_operands`` reads of ``inst`` that never changes during a run
        (asked after ``setup``): its minimum level, opcode, whether a manual operand makes
        it manual, its rule, and whether it supports spatial partitioning."""
        op = self.graph.op[inst]
        elementwise = self.graph.elementwise[inst]
        tuple_cc = inst.opcode == "custom-call" and inst.shape.is_tuple
        manual_ok = (inst.shape.is_array or op in ("reduce", "sort", "reduce-window")
                     or tuple_cc)
        rule = fw.FORWARD_RULES.get(op) or (fw.elementwise_rule if elementwise
                                            else fw.default_rule)
        facts = (bw.level_of(op, elementwise), op, manual_ok, rule,
                 self.supports_spatial(inst, self.to_output, False))
        self._fw_facts[inst] = facts
        return facts

    def infer_from_operands(self, inst: Instruction) -> bool:
        """InferShardingFromOperands."""
        ml, op, manual_ok, rule, spatial = (self._fw_facts.get(inst)
                                            or self._forward_facts(inst))
        if ml and not self.at_least(ml):
            return False
        s = inst.sharding
        if s is not None and s.is_manual:
            return False
        if manual_ok and (s is None or s.is_tile_maximal):
            for o in inst.operands:
                if o.sharding is None or not o.sharding.is_manual:
                    continue
                if g.is_custom_call(inst, g.SHARD_TO_FULL):
                    return False
                if op in ("concatenate", "dynamic-slice") and not self.at_least(1):
                    return False
                manual = ops.normalize_tuple(HloSharding.manual(), inst.shape)
                self.set(inst, manual, "manual.forward", (o,), direction="manual")
                return True
        if not spatial:
            return fw.unsupported_rule(self, inst)
        return rule(self, inst)

    def _backward_facts(self, inst: Instruction) -> tuple:
        """What ``infer_from_users`` reads of ``inst`` that never changes during a run
        (asked after ``setup``): whether it is a broadcast, its users, which of them are
        rng-bit-generators, whether it supports spatial partitioning, which users can
        make it manual (not a manual region's entry), and each user's ``user_rule``."""
        users = self.graph.users_of(inst)
        rng: list[bool] = []
        manual_source: list[bool] = []
        rules: list[tuple] = []
        user_facts = self.user_facts
        known = self._user_facts.get   # (its memo, read first)
        for u in users:
            op, _reads, source, rule = known(u) or user_facts(u)
            rng.append(op == "rng-bit-generator")
            manual_source.append(source)
            rules.append(rule)
        facts = (self.graph.op[inst] == "broadcast", users, rng,
                 self.supports_spatial(inst, False, self.to_params), manual_source, rules)
        self._bw_facts[inst] = facts
        return facts

    def infer_from_users(self, inst: Instruction) -> bool:
        """InferShardingFromUsers."""
        is_broadcast, users, is_rng, spatial, manual_source, user_rules = (
            self._bw_facts.get(inst) or self._backward_facts(inst))
        if is_broadcast and not self.at_least(2):
            return False
        s = inst.sharding
        if s is not None and s.is_manual:
            return False
        # What each user gave in the manual check, reused below while ``inst``'s own
        # sharding (all that changes in between) is still the one it was computed with.
        asked: dict[int, HloSharding | None] = {}
        if s is None or s.is_tile_maximal:
            for k, user in enumerate(users):
                if user.sharding is None or not manual_source[k]:  # (operand not manual)
                    continue
                if user.sharding.is_manual and inst.shape.is_array:   # (cheap test first)
                    self.set(inst, HloSharding.manual(), "manual.backward", (user,),
                             direction="manual")
                    return True
                us = asked[k] = bw.operand_from_user(self, inst, user, self._level,
                                                     user_rules[k])
                if us is not None and us.is_manual:
                    self.set(inst, us, "manual.backward", (user,), direction="manual")
                    return True
        if not spatial:
            return False
        changed = False
        shape_is_tuple = inst.shape.is_tuple
        for k, user in enumerate(users):
            if is_rng[k]:
                rep = ops.single_tuple(inst.shape, HloSharding.replicate())
                if inst.sharding != rep:
                    self.set(inst, rep, "rng-bit-generator.backward", (user,))
                    return True
                return False
            min_level, rule, name, blocked = user_rules[k]
            if k in asked and inst.sharding is s:
                us = asked[k]
            # (``bw.operand_from_user``, inlined: asked per user per visit)
            elif min_level and not self.at_least(min_level):
                continue
            elif blocked or not is_spatially_partitioned(user.sharding):
                continue
            else:
                us = rule(self, inst, user)
            if us is not None:
                if us.is_tuple != shape_is_tuple:
                    us = ops.normalize_tuple(us, inst.shape)
                    if us.is_tuple != shape_is_tuple:
                        continue
                changed |= self.improve(inst, us, name, (user,))
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
        def propagate_to(search: Instruction) -> None:
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

        if inst.opcode in CONTROL_FLOW or inst.opcode == "custom-call":
            propagate_to(inst)
        if inst.opcode == "parameter" or self.graph.is_root(inst):
            owner = self.graph.owner(inst)
            if owner is not None:
                propagate_to(owner)
                if inst.opcode == "parameter" and owner.opcode in ("conditional", "call"):
                    propagate_to(inst)

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
        """RunToFixPoint at one aggressiveness level (the memo is asked only about
        inferences the dirty set flags: the others it would skip).

        XLA's walk visits every instruction per sweep and marks it ``already inferred``
        (its caches, here per direction) until a neighbour's change clears the mark.  A
        visit of an unflagged instruction only sets that mark, so the walk jumps from
        flagged instruction to flagged instruction (``Flags``: ``bytearray.find``) and
        keeps the marks as times instead: every instruction is visited at a fixed time
        of each sweep (4 x its place in the sweep: computations in module order, each
        forward then backward), a clear and an explicit mark note the time they happen
        (+1, +2: after the visit they happen in), and an instruction is marked when its
        latest visit or explicit mark in this level is later than its latest clear.
        Provided (fixed) instructions are never marked by a visit, only explicitly
        (XLA's ``continue`` before marking them).  Asked at every unmarked visit whether
        flagged or not: dot / convolution forward (lookahead), manual-region boundaries
        backward, and open-dims annotations from level 1 (an unflagged memo question is
        skipped by the memo, so asking it changes nothing)."""
        self.level = level
        self.rec.level = level
        dirty = self.dirty
        dirty.start_level(level)
        fw_bits, bw_bits = dirty.flagged[FW].bits, dirty.flagged[BW].bits
        may_combine = level > 0
        done_group: set[int] = set()
        has_groups = bool(self.groups)   # (groups are collected in ``setup`` only)
        graph = self.graph
        fw_walk, bw_walk = graph.walk
        fw_pos, bw_pos = graph.walk_pos
        clear_targets = graph.clear_targets
        n = len(fw_walk)
        boundaries = self.boundaries
        provided = self.provided
        unspecified = self.unspecified
        # What a visit leaves in the flags: 1 where the walk asks at every visit.
        fw_keep = bytearray(n)
        bw_keep = bytearray(n)
        for key in dirty.always:
            fw_keep[fw_pos[key]] = 1
        for key in boundaries:
            bw_keep[bw_pos[key]] = 1
        if may_combine:
            for key in unspecified:
                if key in provided and key in fw_pos:
                    fw_keep[fw_pos[key]] = 1
                    bw_keep[bw_pos[key]] = 1
        for keep, bits in ((fw_keep, fw_bits), (bw_keep, bw_bits)):
            p = keep.find(1)
            while p >= 0:
                bits[p] = 1
                p = keep.find(1, p + 1)
        # Times (see the docstring) of the latest clear / explicit mark, by position.
        fw_clear = [-1] * n
        bw_clear = [-1] * n
        fw_mark = [-1] * n
        bw_mark = [-1] * n
        sweep_time = 8 * n

        def clear_cache(hlo: Instruction, t: int, hlo_for_users: Instruction | None = None
                        ) -> None:
            fw_t, bw_t = clear_targets(hlo)
            if hlo_for_users is not None:
                fw_t = clear_targets(hlo_for_users)[0]
            for q in fw_t:
                fw_clear[q] = t
            for q in bw_t:
                bw_clear[q] = t
            group = self.groups.group_of(hlo) if has_groups else None
            if group is not None:
                for m in group:
                    if m is not hlo:
                        done_group.discard(id(m))

        def after_change(inst: Instruction, t: int) -> None:
            op = inst.opcode
            if op in CONTROL_FLOW or op == "custom-call" or op == "parameter" or \
                    graph.is_root(inst):   # (else computation_propagation does nothing)
                changed: list[Instruction] = []
                self.computation_propagation(inst, changed)
                clear_cache(inst, t)
                for h in changed:
                    clear_cache(h, t)
            else:
                clear_cache(inst, t)

        unchanged = self.unchanged
        # The skip memo's question per visit (``UnchangedMemo._run`` and its entries)
        fw_entries, bw_entries = unchanged._fw, unchanged._bw
        fw_entry, bw_entry = unchanged._forward_entry, unchanged._backward_entry
        ask, infer_fw, infer_bw = unchanged._run, unchanged._infer_fw, unchanged._infer_bw
        iterations = 0
        changed_last = True
        # A computation with no flag in either direction has nothing to visit (most of a
        # transformer's are one-add reducers): skipped whole, unless shard groups or the
        # check mode visit every instruction.
        may_skip = not has_groups and not unchanged.check
        while changed_last:
            changed_last = False
            self.rec.iteration = self.iterations
            base = iterations * sweep_time
            for comp, a, b in graph.walk_ranges:
                if may_skip and fw_bits.find(1, a, b) < 0 and bw_bits.find(1, a, b) < 0:
                    self.direction = "backward"   # (as after its walk)
                    continue
                if has_groups:
                    self.direction = "shard-group"
                    t = base + 8 * a - 1   # (after the previous computation's visits)
                    for inst in graph.post_orders[comp.name]:
                        key = id(inst)
                        group = self.groups.group_of(inst)
                        if key in done_group or group is None:
                            continue
                        if key in self.provided:
                            if may_combine and key in self.unspecified and \
                                    sg.refine_open_dims_from_group(self, inst,
                                                                   self.unspecified[key], group):
                                clear_cache(inst, t)
                                done_group.add(key)
                                changed_last = True
                            continue
                        done_group.add(key)
                        if sg.infer_from_group(self, inst, group):
                            after_change(inst, t)
                            changed_last = True
                self.direction = "forward"
                t0 = base + 4 * a
                i = a - 1
                while True:   # (the flagged positions in [a, b), each flag read when the walk
                    # reaches it; the next position is tried before a find, which
                    # costs about ten such steps)
                    i += 1
                    if i >= b:
                        break
                    if not fw_bits[i]:
                        i = fw_bits.find(1, i, b)
                        if i < 0:
                            break
                    key, inst = fw_walk[i]
                    now = t0 + 4 * i
                    if key in provided:
                        fw_bits[i] = fw_keep[i]
                        if not may_combine or key not in unspecified:
                            continue
                        m = fw_mark[i]
                        if m >= 0 and m > fw_clear[i]:
                            continue
                        ok, conv = unspec.from_operand(self, inst, unspecified[key])
                        if ok:
                            clear_cache(inst, now + 1, conv)
                            fw_mark[i] = now + 2
                            changed_last = True
                        continue
                    last = now - sweep_time   # (its visit in the previous sweep)
                    m = fw_mark[i]
                    if m > last:
                        last = m
                    if last >= 0 and last > fw_clear[i]:
                        continue              # marked: the flag waits
                    fw_bits[i] = fw_keep[i]
                    if ask(inst, fw_entries.get(key) or fw_entry(inst), infer_fw, FW):
                        after_change(inst, now + 1)
                        changed_last = True
                if unchanged.check:
                    unchanged.check_unflagged(graph.post_orders[comp.name], FW, dirty)
                self.direction = "backward"
                t0 = base + 4 * b
                i = a - 1
                while True:   # (as forward)
                    i += 1
                    if i >= b:
                        break
                    if not bw_bits[i]:
                        i = bw_bits.find(1, i, b)
                        if i < 0:
                            break
                    key, inst = bw_walk[i]
                    now = t0 + 4 * i
                    is_provided = key in provided
                    m = bw_mark[i]
                    if is_provided:
                        last = m
                    else:
                        last = now - sweep_time
                        if m > last:
                            last = m
                    done = last >= 0 and last > bw_clear[i]
                    if key in boundaries and not done:
                        q = bw_pos.get(id(inst.operands[0]))
                        if q is not None:
                            bw_clear[q] = now + 1
                    if done:
                        continue
                    if is_provided:
                        bw_bits[i] = bw_keep[i]
                        if not may_combine or key not in unspecified:
                            continue
                        ok, conv = unspec.from_users(self, inst, unspecified[key], level)
                        if ok:
                            clear_cache(inst, now + 1, conv)
                            bw_mark[i] = now + 2
                            if conv is not None and id(conv) in bw_pos:
                                bw_mark[bw_pos[id(conv)]] = now + 2
                            changed_last = True
                        continue
                    bw_bits[i] = bw_keep[i]
                    if ask(inst, bw_entries.get(key) or bw_entry(inst), infer_bw, BW):
                        after_change(inst, now + 1)
                        changed_last = True
                if unchanged.check:
                    unchanged.check_unflagged(graph.post_orders[comp.name], BW, dirty)
            self.iterations += 1
            iterations += 1
        self.level_iterations.append(iterations)

    def run(self) -> None:
        self.setup()
        self.run_levels()
        self.finish()

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

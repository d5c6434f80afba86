"""Backward rules: the sharding a user implies for one of its operands
(XLA's ShardingPropagation::GetShardingFromUser).

``BACKWARD_RULES`` maps the *user's* opcode to a ``BackwardRule``: a function returning
the operand's candidate sharding (or None) and what that function reads, which the fix
point's skip memo and dirty set take as the inference's read set (``unchanged``,
``dirty``).  Users without a rule pass their sharding through when the shapes match
(``SAME_SHAPE``), which covers every elementwise op.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable, NamedTuple

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.opcodes import PASS_THROUGH
from hlo_spmd.passes.propagation import gather_scatter as gs
from hlo_spmd.passes.propagation import graph as g
from hlo_spmd.passes.propagation import sdy_manual
from hlo_spmd.passes.propagation import sharding_ops as ops
from hlo_spmd.passes.propagation.dims import DotDims
from hlo_spmd.ir.shape import Shape
from hlo_spmd.records import FrozenRecord
from hlo_spmd.sharding import (HloSharding, is_finer, is_spatially_partitioned, merge_if_compatible,
                               merge_sharding, partial_replicate, propagate_through_reshape,
                               replicate_all_data_dims, reverse_sharding, transpose_sharding,
                               with_tile_assignment)

if TYPE_CHECKING:
    from hlo_spmd.passes.propagation.interface import PropagatorInterface

BackRule = Callable[["PropagatorInterface", Instruction, Instruction], "HloSharding | None"]


class BackwardRule(NamedTuple):
    """A user's backward rule and its read set: besides the operand's own sharding and
    the user's, ``reads_operands``: the user's other operands' shardings too;
    ``from_nothing``: it gives its operand a sharding even when nothing around is
    sharded; ``level_classes``: where the rule reads the level as a number, the levels
    below it each answer differently and the levels from it on all alike."""
    operand_of: BackRule
    reads_operands: bool = False
    from_nothing: bool = False
    level_classes: int = 1


class UserRule(FrozenRecord):
    """What ``operand_from_user`` and the fix point need to know of a user that does not
    change while shardings move (``user_rule``): its rule, where it applies, and the
    rule's declared read set flattened in.  One object per distinct set of facts (a
    module's users share a few dozen), so asking costs a dict read."""
    __slots__ = __match_args__ = ("min_level", "operand_of", "name", "blocked",
                                  "reads_operands", "from_nothing", "level_classes",
                                  "manual_source")
    min_level: int          # the level it propagates from (``level_of``)
    operand_of: BackRule
    name: str               # provenance name of the rule
    blocked: bool           # a Shardy barrier blocks the backward direction
    reads_operands: bool    # (``BackwardRule``'s declaration)
    from_nothing: bool
    level_classes: int
    manual_source: bool     # a manual sharding of the user makes its operand manual
                            # (the user is not a manual region's entry)

    def __init__(self, min_level: int, operand_of: BackRule, name: str, blocked: bool,
                 reads_operands: bool, from_nothing: bool, level_classes: int,
                 manual_source: bool) -> None:
        self._set_fields(min_level, operand_of, name, blocked, reads_operands,
                         from_nothing, level_classes, manual_source)


def can_propagate_at_level(inst: Instruction, level: int) -> bool:
    """CanPropagateThroughAtAggressiveLevel: pass-through ops always, broadcast from
    level 2, everything else from level 1."""
    return level >= propagation_level(inst)


def propagation_level(inst: Instruction) -> int:
    """The lowest level at which ``can_propagate_at_level`` holds for ``inst``."""
    return level_of(g.opcode(inst), g.is_elementwise(inst))


def level_of(op: str, elementwise: bool) -> int:
    """``propagation_level`` given the instruction's opcode and elementwise-ness."""
    if elementwise or op in PASS_THROUGH:
        return 0
    if op == "broadcast":
        return 2
    return 1



def operand_from_user(p: "PropagatorInterface", inst: Instruction, user: Instruction,
                      level: int, facts: UserRule | None = None) -> HloSharding | None:
    """GetShardingFromUser (``facts``: ``p.user_rule(user)`` if the caller has it)."""
    facts = facts or p.user_rule(user)
    if facts.min_level and not p.at_least(facts.min_level, level):
        return None
    if not is_spatially_partitioned(user.sharding):
        return None
    if facts.blocked:
        return None
    return facts.operand_of(p, inst, user)


def user_rule(user: Instruction, op: str | None = None, elementwise: bool | None = None
              ) -> UserRule:
    """What ``operand_from_user`` needs to know of ``user`` (``UserRule``).  ``op`` /
    ``elementwise``: ``g.opcode`` / ``g.is_elementwise`` of ``user`` if the caller has
    them (the graph reads them once per instruction)."""
    blocked = g.is_custom_call(user, g.SDY_BARRIER) and not g.barrier_allows(user, "backward")
    if op is None:
        op = g.opcode(user)
    if elementwise is None:
        elementwise = g.is_elementwise(user)
    manual_source = not (g.is_custom_call(user, g.FULL_TO_SHARD)
                         or sdy_manual.is_sdy_entry(user))
    return _user_rule_of(op, elementwise, blocked, manual_source)


@functools.cache
def _user_rule_of(op: str, elementwise: bool, blocked: bool, manual_source: bool
                  ) -> UserRule:
    """The shared ``UserRule`` of these facts (they name a finite set: opcodes times
    three flags)."""
    declared = BACKWARD_RULES.get(op, SAME_SHAPE)
    return UserRule(level_of(op, elementwise), declared.operand_of,
                    _rule_name_of(op, elementwise), blocked, declared.reads_operands,
                    declared.from_nothing, declared.level_classes, manual_source)


def _rule_name_of(op: str, elementwise: bool) -> str:
    """Provenance name of the rule that maps a user's sharding to its operand."""
    if op in BACKWARD_RULES and BACKWARD_RULES[op].operand_of is not same_shape_rule:
        return f"{op}.backward"
    if elementwise:
        return "elementwise.backward"
    return f"{op}.backward(same shape)"


def same_shape_rule(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    if ops.shapes_compatible(inst.shape, user.shape):
        return user.sharding
    return None


def _index(p: "PropagatorInterface", user: Instruction, inst: Instruction) -> int:
    """The first position of ``inst`` among ``user``'s operands."""
    positions = p.graph.operand_positions(user, inst)
    if not positions:
        raise ValueError(f"{inst.name} is not an operand of {user.name}")
    return positions[0]


def broadcast(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    """InferBroadcastOperandSharding: replicate the new dims, then drop them."""
    s = user.sharding
    if s.is_replicated or s.is_manual:
        return s
    if not s.is_tiled:
        return s
    dims = list(user.attrs.dimensions)
    new_dims = [i for i in range(user.shape.rank) if i not in dims]
    return ops.remove_shape_dims(partial_replicate(s, new_dims), new_dims)


def concatenate(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    if not p.at_least(1):
        return None
    return user.sharding


def convolution(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    dnums = p.dot_dims(user)
    if dnums.conv_spatial:
        return None
    return dot_operand(p, user, _index(p, user, inst), dnums)


def dot(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    return dot_operand(p, user, _index(p, user, inst), p.dot_dims(user))


def dot_operand(p: "PropagatorInterface", dot_inst: Instruction, k: int,
                dnums: DotDims) -> HloSharding:
    """InferDotOperandSharding: from the output (other side's free dims replicated),
    merged with what the other operand implies through batch / contracting dims."""
    out_rep_dims = [d.output for d in (dnums.rhs_non_contracting if k == 0
                                       else dnums.lhs_non_contracting)]
    other_rep_dims = [(d.rhs if k == 0 else d.lhs) for d in (dnums.rhs_non_contracting if k == 0
                                                              else dnums.lhs_non_contracting)]
    out_rep_dims += [d.output for d in dnums.contracting if d.output >= 0]
    own_free = dnums.lhs_non_contracting if k == 0 else dnums.rhs_non_contracting
    other_rep_dims += [(d.rhs if k == 0 else d.lhs) for d in own_free
                       if (d.rhs if k == 0 else d.lhs) >= 0]
    op_rank = dnums.lhs_rank if k == 0 else dnums.rhs_rank
    other_rank = dnums.rhs_rank if k == 0 else dnums.lhs_rank

    def mine(d) -> int:
        return d.lhs if k == 0 else d.rhs

    def theirs(d) -> int:
        return d.rhs if k == 0 else d.lhs

    sharding = HloSharding.replicate()
    if dot_inst.sharding is not None:
        rep = partial_replicate(dot_inst.sharding, out_rep_dims)
        out_to_op = [-1] * dnums.output_rank
        op_to_out = [-1] * op_rank
        for d in list(dnums.batch) + list(own_free):
            out_to_op[d.output] = mine(d)
            op_to_out[mine(d)] = d.output
        t = ops.transpose_with_collapsed_dims(rep, out_to_op, op_to_out)
        if t is not None:
            sharding = t
    other = dot_inst.operands[1 - k]
    if is_spatially_partitioned(other.sharding):
        rep = partial_replicate(other.sharding, other_rep_dims)
        other_to_op = [-1] * other_rank
        op_to_other = [-1] * op_rank
        for d in list(dnums.batch) + list(dnums.contracting):
            other_to_op[theirs(d)] = mine(d)
            op_to_other[mine(d)] = theirs(d)
        from_other = ops.transpose_with_collapsed_dims(rep, other_to_op, op_to_other)
        if from_other is not None:
            ok, merged = merge_sharding(sharding, from_other, p.may_combine)
            if ok:
                sharding = merged
    return sharding


def dynamic_slicing(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    if not p.at_least(1):
        return None
    s = user.sharding
    if s.is_replicated:
        return s
    if g.opcode(user) == "dynamic-update-slice" and user.operands[0] is inst:
        return s
    operand = user.operands[0] if g.opcode(user) == "dynamic-slice" else user.operands[1]
    if inst is not operand:
        return None
    sliced = [i for i in range(user.shape.rank) if user.shape.dims[i] != operand.shape.dims[i]]
    return partial_replicate(s, sliced)


def reduce_window(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    n = len(user.operands) // 2
    if not any(o is inst for o in user.operands[:n]):
        return None
    if user.shape.is_tuple:
        return ops.sub_sharding(user.sharding, user.shape, _index(p, user, inst))
    return user.sharding


def reshape(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    return propagate_through_reshape(user.sharding, user.shape.dims, inst.shape.dims)


def pad(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    return user.sharding if user.operands[0] is inst else None


def slice_(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    return user.sharding


def transpose(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    dims = list(user.attrs.dimensions)
    inverse = [0] * len(dims)
    for i, d in enumerate(dims):
        inverse[d] = i
    return transpose_sharding(user.sharding, inverse)


def tuple_(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    s = user.sharding
    positions = p.graph.operand_positions(user, inst)
    best = ops.sub_sharding(s, user.shape, _index(p, user, inst))
    for i in positions:
        alt = ops.sub_sharding(s, user.shape, i)
        if is_finer(alt, best):
            best = alt
    return best


def get_tuple_element(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    shape = inst.shape
    start, _ = ops.leaf_range(shape, user.tuple_index)
    us = user.sharding

    def base(like: HloSharding) -> HloSharding:
        if inst.sharding is not None:
            return inst.sharding
        leaves = [replicate_all_data_dims(like, leaf.rank) for _, leaf in shape.leaves()]
        return HloSharding.tuple(leaves)

    if not user.shape.is_tuple:
        new = list(base(us).tuple_elements)
        new[start] = us
        return HloSharding.tuple(new)
    if not us.tuple_elements:
        return None
    new = list(base(us.tuple_elements[0]).tuple_elements)
    for i, e in enumerate(us.tuple_elements):
        new[start + i] = e
    return HloSharding.tuple(new)


def reduce(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    if inst.shape.rank == 0:
        return None
    us = ops.sub_sharding(user.sharding, user.shape, _index(p, user, inst)) \
        if user.shape.is_tuple else user.sharding
    if us.is_tiled:
        dims = list(user.attrs.dimensions)
        ta = us.tile_assignment
        n = inst.shape.rank + (1 if us.replicate_on_last_tile_dim else 0) + len(us.subgroup_types)
        target, nxt = [], 0
        for i in range(n):
            if i in dims:
                target.append(1)
            else:
                target.append(ta.dims[nxt])
                nxt += 1
        us = with_tile_assignment(us, ta.reshape(target))
    n_in = len(user.operands) // 2
    for op in user.operands[:n_in]:
        if op is not inst and op.sharding is not None:
            merged = merge_if_compatible(op.sharding, us)
            if merged is not None:
                us = merged
    return us


def sort(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    if user.sharding.is_tuple:
        return ops.sub_sharding(user.sharding, user.shape, _index(p, user, inst))
    return user.sharding


def reverse(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    return reverse_sharding(user.sharding, list(user.attrs.dimensions))


def outfeed(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    if user.operands[0] is not inst:
        return None
    operands_shape = Shape.tuple_of([o.shape for o in user.operands])
    return ops.sub_sharding(ops.normalize_tuple(user.sharding, operands_shape), operands_shape, 0)


def gather(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    if user.operands[1] is inst:
        return gs.gather_index_from_output(user.sharding, user)
    return gs.gather_operand_from_output(user.sharding, user, p.graph.callers)


def scatter(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    operands = gs.scatter_operands(user)
    for i, op in enumerate(operands):
        if op is inst:
            return ops.sub_sharding(user.sharding, user.shape, i) if user.sharding.is_tuple \
                else user.sharding
    idx = gs.scatter_indices(user)
    updates = gs.scatter_updates(user)
    if inst is idx:
        parted = [u for u in updates if is_spatially_partitioned(u.sharding)]
        if not parted:
            return None
        return ops.find_common_sharding([gs.scatter_index_from_update(u.sharding, user)
                                         for u in parted])
    k = next(i for i, u in enumerate(updates) if u is inst)
    from_indices = gs.scatter_update_from_index(idx.sharding, user) \
        if is_spatially_partitioned(idx.sharding) else HloSharding.replicate()
    out = ops.sub_sharding(user.sharding, user.shape, k) if user.sharding.is_tuple \
        else user.sharding
    from_output = gs.scatter_update_from_output(out, user, p.graph.callers)
    if from_output is not None:
        if not from_output.is_manual and not from_indices.is_manual:
            merged = merge_if_compatible(from_indices, from_output)
            if merged is not None:
                from_output = merged
        if not from_output.is_tile_maximal:
            return from_output
    if not from_indices.is_tile_maximal:
        return from_indices
    return None


def custom_call(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    return same_shape_rule(p, inst, user)


def batch_norm(p: "PropagatorInterface", inst: Instruction, user: Instruction) -> HloSharding | None:
    """The operand (and a grad's output gradient) from the normalized result; the
    per-feature operands get nothing (small: resharded by the partitioner)."""
    k = _index(p, user, inst)
    if k != 0 and not (k == 4 and user.opcode == "batch-norm-grad"):
        return None
    s = user.sharding
    if user.shape.is_tuple:
        s = ops.sub_sharding(s, user.shape, 0)
    return s


SAME_SHAPE = BackwardRule(same_shape_rule)

# (``reads_operands``: dot, convolution, reduce, scatter and batch norm read the user's
# other operands; ``level_classes``: broadcast's rules read the level as a number.)
BACKWARD_RULES: dict[str, BackwardRule] = {
    "broadcast": BackwardRule(broadcast, level_classes=2),
    "concatenate": BackwardRule(concatenate),
    "convolution": BackwardRule(convolution, reads_operands=True),
    "dynamic-slice": BackwardRule(dynamic_slicing),
    "dynamic-update-slice": BackwardRule(dynamic_slicing),
    "reduce-window": BackwardRule(reduce_window),
    "reshape": BackwardRule(reshape),
    "pad": BackwardRule(pad),
    "slice": BackwardRule(slice_),
    "transpose": BackwardRule(transpose),
    "tuple": BackwardRule(tuple_),
    "get-tuple-element": BackwardRule(get_tuple_element),
    "dot": BackwardRule(dot, reads_operands=True),
    "reduce": BackwardRule(reduce, reads_operands=True),
    "sort": BackwardRule(sort),
    "reverse": BackwardRule(reverse),
    "outfeed": BackwardRule(outfeed),
    "gather": BackwardRule(gather),
    "scatter": BackwardRule(scatter, reads_operands=True),
    "custom-call": BackwardRule(custom_call),
    "batch-norm-training": BackwardRule(batch_norm, reads_operands=True),
    "batch-norm-inference": BackwardRule(batch_norm, reads_operands=True),
    "batch-norm-grad": BackwardRule(batch_norm, reads_operands=True),
    # The rng state is replicated whatever the user's sharding (the fix point's
    # ``infer_from_users`` answers it before asking any rule).
    "rng-bit-generator": BackwardRule(same_shape_rule, from_nothing=True),
}

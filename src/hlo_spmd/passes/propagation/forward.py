"""Forward rules: an instruction's sharding from its operands (InferShardingFromOperands).

``FORWARD_RULES`` maps an opcode to a ``ForwardRule``: its rule and what the rule reads,
which the fix point's skip memo and dirty set take as the inference's read set
(``unchanged``, ``dirty``); every elementwise opcode shares ``ELEMENTWISE``, anything
else without a rule of its own ``DEFAULT``.  A rule offers candidates through
``p.improve(...)`` (which applies XLA's "strictly finer, compatible" test and records
provenance) and returns True if the instruction's sharding changed.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NamedTuple

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.opcodes import FED_IN, FOLLOWS_FINEST_OPERAND, FOLLOWS_FIRST_OPERAND
from hlo_spmd.ir.primitive_types import bit_width
from hlo_spmd.passes.propagation import gather_scatter as gs
from hlo_spmd.passes.propagation import graph as g
from hlo_spmd.passes.propagation import sharding_ops as ops
from hlo_spmd.passes.propagation.dims import DotDims, conv_kernel_is_small, window_has
from hlo_spmd.passes.propagation import provenance as prov
from hlo_spmd.sharding import (HloSharding, is_finer, is_spatially_partitioned, is_subtiling,
                               merge_sharding, partial_replicate, partial_replicate_all_except,
                               propagate_through_reshape, replicate_all_data_dims, reverse_sharding,
                               transpose_sharding, with_tile_assignment)

if TYPE_CHECKING:
    from hlo_spmd.passes.propagation.interface import PropagatorInterface

Rule = Callable[["PropagatorInterface", Instruction], bool]


class ForwardRule(NamedTuple):
    """A forward rule and its read set: besides the instruction's own sharding and its
    operands', ``lookahead``: the single-user chain ``lookahead_user_sharding`` follows
    (read per visit: the chain moves with the shardings); ``caller_operands``: for a
    parameter of a called computation, its caller's operands; ``level_classes``: where
    the rule reads the level as a number, the levels below it each answer differently
    and the levels from it on all alike."""
    infer: Rule
    lookahead: bool = False
    caller_operands: bool = False
    level_classes: int = 1

def pick_representative(p: "PropagatorInterface", inst: Instruction) -> Instruction | None:
    """PickRepresentativeOperand."""
    op = p.graph.op[inst]
    if op in FOLLOWS_FIRST_OPERAND:
        first = inst.operands[0]
        return first if first.sharding is not None else None
    if inst.opcode == "custom-call" and op != "copy":
        if g.is_custom_call(inst, g.SDY_BARRIER) and not g.barrier_allows(inst, "forward"):
            return None
        return inst.operands[0] if g.is_passthrough_custom_call(inst) else None
    if p.graph.elementwise[inst] or op in FOLLOWS_FINEST_OPERAND:
        best = None
        for operand in inst.operands:
            s = operand.sharding
            if s is not None and (best is None or is_finer(s, best.sharding)):
                best = operand
        return best
    return None


def _one_non_root_user(p: "PropagatorInterface", inst: Instruction) -> bool:
    return p.graph.non_root_users(inst) == 1


def _maybe_tuple(inst: Instruction, s: HloSharding) -> HloSharding:
    return ops.single_tuple(inst.shape, s)


# -- generic -------------------------------------------------------------------------------

def default_rule(p: "PropagatorInterface", inst: Instruction) -> bool:
    """Elementwise ops take every sharded operand in turn (from level 1); everything
    else follows its representative operand."""
    if p.graph.elementwise[inst]:
        return elementwise_rule(p, inst)
    return _follow_representative(p, inst, f"{p.graph.op[inst]}.forward")


def elementwise_rule(p: "PropagatorInterface", inst: Instruction) -> bool:
    """``default_rule`` of an elementwise instruction (the engine picks it once per
    instruction: elementwise-ness does not change while shardings move)."""
    if not p.at_least(1):   # (may_combine)
        return _follow_representative(p, inst, "elementwise.forward")
    changed = False
    operands = inst.operands
    single = len(operands) == 1 and _one_non_root_user(p, inst)
    rng = inst.opcode == "rng"
    for op in operands:
        s = op.sharding
        if not is_spatially_partitioned(s):
            continue
        if rng:
            cand = replicate_all_data_dims(s, inst.shape.rank)
            changed |= p.improve(inst, cand, "rng.forward", (op,), _one_non_root_user(p, inst))
            continue
        changed |= p.improve(inst, s, "elementwise.forward", (op,), single)
    return changed


def _follow_representative(p: "PropagatorInterface", inst: Instruction, rule: str) -> bool:
    op = pick_representative(p, inst)
    if op is None or not is_spatially_partitioned(op.sharding):
        return False
    return p.improve(inst, op.sharding, rule, (op,), _one_non_root_user(p, inst))


def unsupported_rule(p: "PropagatorInterface", inst: Instruction) -> bool:
    """An op the partitioner cannot split follows a replicated operand (array results only)."""
    if (inst.shape.is_tuple or not inst.operands or p.graph.is_root(inst)
            or g.has_side_effect(inst)):
        return False
    for op in inst.operands:
        s = op.sharding
        if s is not None and not s.is_tuple and s.is_tile_maximal and s.unique_device is None:
            return p.improve(inst, s, "unsupported.follow_replicated_operand", (op,))
    return False


# -- tuples and control flow ------------------------------------------------------------------

def get_tuple_element(p: "PropagatorInterface", inst: Instruction) -> bool:
    op = inst.operands[0]
    if not is_spatially_partitioned(op.sharding):
        return False
    new = ops.sub_sharding(op.sharding, op.shape, inst.tuple_index)
    if new.is_manual:
        p.set(inst, new, "get-tuple-element.forward(manual)", (op,))
        return True
    return p.improve(inst, new, "get-tuple-element.forward", (op,), _one_non_root_user(p, inst))


def tuple_rule(p: "PropagatorInterface", inst: Instruction) -> bool:
    if not any(is_spatially_partitioned(op.sharding) for op in inst.operands):
        return False
    had = inst.sharding is not None
    subs = list(inst.sharding.tuple_elements) if had else \
        [HloSharding.replicate()] * ops.required_leaves(inst.shape)
    sources: list[Instruction] = []
    idx = 0
    for op in inst.operands:
        n = ops.leaf_count(op.shape)
        s = op.sharding
        if s is not None:
            leaves = list(s.tuple_elements) if op.shape.is_tuple else [_output_sharding(op)]
            for j in range(min(n, len(leaves))):
                if not had or is_finer(leaves[j], subs[idx + j]):
                    if subs[idx + j] != leaves[j] and op not in sources:
                        sources.append(op)
                    subs[idx + j] = leaves[j]
        idx += n
    new = HloSharding.tuple(subs)
    if inst.sharding is None or new != inst.sharding:
        p.set(inst, new, "tuple.forward", tuple(sources))
        return True
    return False


def _output_sharding(op: Instruction) -> HloSharding:
    s = op.sharding
    assert s is not None
    if g.opcode(op) == "outfeed" and s.is_tuple:
        return s.tuple_elements[-1]
    return s


def while_rule(p: "PropagatorInterface", inst: Instruction) -> bool:
    op = inst.operands[0]
    if op.sharding is None:
        return False
    s = op.sharding
    if inst.sharding is not None:
        _, s = merge_sharding(inst.sharding, s, p.may_combine)
    return p.improve(inst, s, "while.forward(init)", (op,))


def parameter(p: "PropagatorInterface", inst: Instruction) -> bool:
    owner = p.graph.owner(inst)
    if owner is None:
        return False
    if owner.opcode == "conditional":
        for i, comp in enumerate(owner.called_computations):
            if comp is inst.parent:
                arg = owner.operands[i + 1]
                if arg.sharding is not None:
                    return p.improve(inst, arg.sharding, "conditional.branch_parameter", (arg,))
                return False
        return False
    if owner.opcode == "call":
        arg = owner.operands[inst.parameter_number]
        if arg.sharding is not None:
            return p.improve(inst, arg.sharding, "call.parameter", (arg,))
    return False


# -- shape-changing ops -------------------------------------------------------------------

def broadcast(p: "PropagatorInterface", inst: Instruction) -> bool:
    if not p.at_least(3):
        return False
    op = inst.operands[0]
    s = op.sharding
    if not is_spatially_partitioned(s) or s.is_replicated or not s.is_tiled:
        return False
    dims = list(inst.attrs.dimensions)
    ta = s.tile_assignment
    target = [ta.dims[dims.index(i)] if i in dims else 1 for i in range(inst.shape.rank)]
    target += list(ta.dims[ops.data_rank(s):])
    cand = with_tile_assignment(s, ta.reshape(target))
    return p.improve(inst, cand, "broadcast.forward", (op,), _one_non_root_user(p, inst))


def reduce(p: "PropagatorInterface", inst: Instruction) -> bool:
    """InferReduceShardingFromOperand: drop the reduced dims (replicating them first)."""
    n = len(inst.operands) // 2
    dims = list(inst.attrs.dimensions)
    changed = False
    aggressive = _one_non_root_user(p, inst)
    for i, op in enumerate(inst.operands[:n]):
        s = op.sharding
        if not is_spatially_partitioned(s):
            continue
        if s.is_manual:
            changed |= p.improve_sub(inst, s, i, "reduce.forward(manual)", (op,), aggressive)
            continue
        if s.is_replicated:
            cand = _maybe_tuple(inst, replicate_all_data_dims(s))
            changed |= p.improve(inst, cand, "reduce.forward", (op,), aggressive)
            continue
        after = partial_replicate(s, dims)
        if after.is_replicated:
            changed |= p.improve(inst, _maybe_tuple(inst, after), "reduce.forward", (op,),
                                 aggressive)
            continue
        cand = _maybe_tuple(inst, ops.remove_shape_dims(after, dims))
        changed |= p.improve(inst, cand, "reduce.forward", (op,), aggressive)
    return changed


def concatenate(p: "PropagatorInterface", inst: Instruction) -> bool:
    op = pick_representative(p, inst)
    if op is None or not is_spatially_partitioned(op.sharding):
        return False
    if not p.at_least(1):
        cdim = int(inst.attrs.dimensions[0])
        for o in inst.operands:
            s = o.sharding
            if not (is_spatially_partitioned(s) and s.num_tiles > 1 and o.opcode == "reshape"
                    and o.operands[0].opcode in FED_IN):
                return False
            if s.is_tiled and ops.tile_dims(s)[cdim] > 1:
                return False
    return p.improve(inst, op.sharding, "concatenate.forward", (op,), _one_non_root_user(p, inst))


def transpose(p: "PropagatorInterface", inst: Instruction) -> bool:
    op = inst.operands[0]
    if not is_spatially_partitioned(op.sharding):
        return False
    cand = transpose_sharding(op.sharding, list(inst.attrs.dimensions))
    return p.improve(inst, cand, "transpose.forward", (op,), _one_non_root_user(p, inst))


def reshape(p: "PropagatorInterface", inst: Instruction) -> bool:
    op = inst.operands[0]
    if not is_spatially_partitioned(op.sharding):
        return False
    cand = propagate_through_reshape(op.sharding, op.shape.dims, inst.shape.dims)
    return p.improve(inst, cand, "reshape.forward", (op,), _one_non_root_user(p, inst))


def reverse(p: "PropagatorInterface", inst: Instruction) -> bool:
    op = inst.operands[0]
    if not is_spatially_partitioned(op.sharding):
        return False
    cand = reverse_sharding(op.sharding, list(inst.attrs.dimensions))
    return p.improve(inst, cand, "reverse.forward", (op,), _one_non_root_user(p, inst))


def reduce_window(p: "PropagatorInterface", inst: Instruction) -> bool:
    if window_has(inst, "any"):
        return False
    n = len(inst.operands) // 2
    changed = False
    for op in inst.operands[:n]:
        if not is_spatially_partitioned(op.sharding):
            continue
        changed |= p.improve(inst, _maybe_tuple(inst, op.sharding), "reduce-window.forward",
                             (op,), _one_non_root_user(p, inst))
    return changed


def select_and_scatter(p: "PropagatorInterface", inst: Instruction) -> bool:
    op = inst.operands[0]
    if not is_spatially_partitioned(op.sharding) or window_has(inst, "base"):
        return False
    return p.improve(inst, op.sharding, "select-and-scatter.forward", (op,),
                     _one_non_root_user(p, inst))


def sort(p: "PropagatorInterface", inst: Instruction) -> bool:
    op = pick_representative(p, inst)
    if op is None or not is_spatially_partitioned(op.sharding):
        return False
    s = op.sharding
    sort_dim = int(inst.attrs.dimensions[0]) if inst.attrs.dimensions else 0
    if s.is_tiled and ops.tile_dims(s)[sort_dim] != 1 and \
            _first_target_dim_to_move(op.shape.dims, s, sort_dim) is None:
        return False
    return p.improve(inst, _maybe_tuple(inst, s), "sort.forward", (op,),
                     _one_non_root_user(p, inst))


def _first_target_dim_to_move(dims: tuple[int, ...], s: HloSharding, source: int) -> int | None:
    """GetFirstTargetDimToMoveShardingTiles: a dim that can absorb ``source``'s tiles."""
    if len(dims) < 2 or dims[source] == 1 or not s.is_tiled:
        return None
    t = ops.tile_dims(s)
    if t[source] == 1:
        return None
    for d in range(len(dims)):
        if d != source and dims[d] % (t[source] * t[d]) == 0:
            return d
    return None


def _slice_operand_rule(p: "PropagatorInterface", inst: Instruction, op: Instruction, rule: str) -> bool:
    """InferDynamicUpdateSliceShardingFromOperand1: replicate the sliced dims."""
    if not is_spatially_partitioned(op.sharding) or op.sharding.is_manual:
        return False
    sliced = [i for i in range(inst.shape.rank) if inst.shape.dims[i] != op.shape.dims[i]]
    cand = partial_replicate(op.sharding, sliced)
    return p.improve(inst, cand, rule, (op,), _one_non_root_user(p, inst))


def dynamic_slice(p: "PropagatorInterface", inst: Instruction) -> bool:
    return _slice_operand_rule(p, inst, inst.operands[0], "dynamic-slice.forward")


def dynamic_update_slice(p: "PropagatorInterface", inst: Instruction) -> bool:
    changed = _slice_operand_rule(p, inst, inst.operands[1], "dynamic-update-slice.from_update")
    base = inst.operands[0]
    if is_spatially_partitioned(base.sharding):
        changed |= p.improve(inst, base.sharding, "dynamic-update-slice.from_base", (base,))
    return changed


# -- dot / convolution ----------------------------------------------------------------------

def _dot_from_operand(inst: Instruction, dnums: DotDims, k: int) -> HloSharding | None:
    """The output sharding operand ``k`` implies: its batch / free dims carry over."""
    op = inst.operands[k]
    s = op.sharding
    assert s is not None
    if s.is_tile_maximal:
        return s
    contracting = [d.lhs if k == 0 else d.rhs for d in dnums.contracting]
    other_free = dnums.rhs_non_contracting if k == 0 else dnums.lhs_non_contracting
    contracting += [d.lhs if k == 0 else d.rhs for d in other_free
                    if (d.lhs if k == 0 else d.rhs) >= 0]
    rep = partial_replicate(s, contracting)
    out_to_op = [-1] * dnums.output_rank
    op_to_out = [-1] * op.shape.rank
    own_free = dnums.lhs_non_contracting if k == 0 else dnums.rhs_non_contracting
    for d in list(dnums.batch) + list(own_free):
        od = d.lhs if k == 0 else d.rhs
        out_to_op[d.output] = od
        op_to_out[od] = d.output
    return ops.transpose_with_collapsed_dims(rep, op_to_out, out_to_op)


def infer_dot(p: "PropagatorInterface", inst: Instruction, dnums: DotDims, name: str) -> bool:
    """InferDotShardingFromOperands: both operands' shardings, the larger (or the one
    the next user agrees with) first, the other merged in when compatible."""
    cands: list[HloSharding | None] = [None, None]
    for k in (0, 1):
        op = inst.operands[k]
        if not is_spatially_partitioned(op.sharding):
            continue
        c = _dot_from_operand(inst, dnums, k)
        if c is None:
            continue
        v = p.verdict(inst, c)
        if v.sharding is None and c != inst.sharding:
            p.reject(inst, c, f"{name}.from_{'lhs' if k == 0 else 'rhs'}", (op,), v.reason)
        cands[k] = v.sharding
    lhs, rhs = inst.operands
    labels = ("lhs", "rhs")
    if cands[0] is None and cands[1] is None:
        return False
    if cands[1] is None or cands[0] is None:
        k = 0 if cands[1] is None else 1
        p.set(inst, cands[k], f"{name}.from_{labels[k]}", (inst.operands[k],))
        return True
    order = [0, 1]
    decided = False
    look = p.lookahead_user_sharding(inst)
    if look is not None:
        sub0 = is_subtiling(look, cands[0], inst.shape.dims)
        sub1 = is_subtiling(look, cands[1], inst.shape.dims)
        if sub0 and not sub1:
            decided = True
        elif sub1 and not sub0:
            order = [1, 0]
            decided = True
    if not decided and _byte_size(lhs) < _byte_size(rhs):
        order = [1, 0]
    first, second = order
    p.set(inst, cands[first], f"{name}.from_{labels[first]}", (inst.operands[first],))
    primary = cands[first]
    v = p.verdict(inst, cands[second])
    if v.sharding is not None:
        rule = f"{name}.merge({labels[first]}, {labels[second]})"
        p.set(inst, v.sharding, rule, (inst.operands[first], inst.operands[second]))
    elif cands[second] != primary:
        p.reject(inst, cands[second], f"{name}.from_{labels[second]}",
                 (inst.operands[second],), prov.LOWER_PRIORITY + f" ({v.reason})")
    return True


def _byte_size(inst: Instruction) -> int:
    """ShapeUtil::ByteSizeOf of an array: sub-byte types take a whole byte each."""
    return inst.shape.num_elements * max(1, (bit_width(inst.shape.element_type) + 7) // 8)


def dot(p: "PropagatorInterface", inst: Instruction) -> bool:
    return infer_dot(p, inst, p.dot_dims(inst), "dot")


def convolution(p: "PropagatorInterface", inst: Instruction) -> bool:
    dnums = p.dot_dims(inst)

    def spatial_parts(op: Instruction, k: int) -> int:
        s = op.sharding
        if s is None or s.is_tile_maximal or not s.is_tiled:
            return 1
        t = ops.tile_dims(s)
        out = 1
        for d in dnums.conv_spatial:
            out *= t[d.lhs if k == 0 else d.rhs]
        return out

    lhs, _ = inst.operands
    if not dnums.conv_spatial or (
            spatial_parts(inst.operands[0], 0) == 1 and spatial_parts(inst.operands[1], 1) == 1
            and (inst.attrs.batch_group_count or 1) == 1
            and (inst.attrs.feature_group_count or 1) == 1):
        return infer_dot(p, inst, dnums, "convolution(dot)")
    s = lhs.sharding
    if not is_spatially_partitioned(s):
        return False
    if s.is_tile_maximal:
        return p.improve(inst, s, "convolution.from_lhs", (lhs,))
    if not s.is_tiled:
        return False
    cd = inst.attrs.convolution_dimension_numbers
    if conv_kernel_is_small(inst):
        if ops.tile_dims(s)[cd.input_feature_dimension] > 1:
            return False
        out_to_lhs = [0] * inst.shape.rank
        out_to_lhs[cd.output_batch_dimension] = cd.input_batch_dimension
        out_to_lhs[cd.output_feature_dimension] = cd.input_feature_dimension
        for i, o in zip(cd.input_spatial_dimensions, cd.output_spatial_dimensions):
            out_to_lhs[o] = i
        cand = transpose_sharding(s, out_to_lhs)
        return p.improve(inst, cand, "convolution.from_lhs(small kernel)", (lhs,))
    cand = partial_replicate_all_except(s, [cd.input_batch_dimension])
    return p.improve(inst, cand, "convolution.from_lhs(large kernel: batch only)", (lhs,))


# -- gather / scatter -------------------------------------------------------------------------

def _gather_parallel(p: "PropagatorInterface", inst: Instruction, dims, label: str) -> bool:
    changed = False
    op, idx = inst.operands[0], inst.operands[1]
    if is_spatially_partitioned(op.sharding):
        cand = ops.propagate_along(op.sharding, dims.operand, dims.output, inst.shape.rank)
        changed |= p.improve(inst, cand, f"gather.{label}(operand)", (op,))
    if is_spatially_partitioned(idx.sharding):
        cand = ops.propagate_along(idx.sharding, dims.indices, dims.output, inst.shape.rank)
        changed |= p.improve(inst, cand, f"gather.{label}(indices)", (idx,))
    return changed


def gather(p: "PropagatorInterface", inst: Instruction) -> bool:
    changed = False
    explicit = gs.gather_explicit_batch_dims(inst)
    if explicit is not None:
        changed |= _gather_parallel(p, inst, explicit, "batch_dims")
    op, idx = inst.operands[0], inst.operands[1]
    if is_spatially_partitioned(idx.sharding):
        cand = gs.gather_output_from_index(idx.sharding, inst)
        changed |= p.improve(inst, cand, "gather.from_indices", (idx,))
    parallel = gs.gather_parallel_dims(inst, p.graph.callers)
    if parallel is not None:
        changed |= _gather_parallel(p, inst, parallel, "parallel_dims")
    if is_spatially_partitioned(op.sharding):
        filtered = partial_replicate(op.sharding, parallel.operand if parallel else [])
        cand = gs.gather_output_from_operand_passthrough(filtered, inst)
        if cand is not None:
            changed |= p.improve(inst, cand, "gather.from_operand(passthrough)", (op,))
    return changed


def _scatter_parallel(p: "PropagatorInterface", inst: Instruction, dims, label: str) -> bool:
    n = gs.scatter_count(inst)
    shape = inst.shape.tuple_shapes[0] if inst.shape.is_tuple else inst.shape
    rank = shape.rank
    changed = False
    for i, op in enumerate(gs.scatter_operands(inst)):
        if is_spatially_partitioned(op.sharding):
            cand = ops.propagate_along(op.sharding, dims.operand, dims.operand, rank)
            changed |= p.improve_sub(inst, cand, i, f"scatter.{label}(operand)", (op,))
    idx = gs.scatter_indices(inst)
    if is_spatially_partitioned(idx.sharding):
        cand = ops.propagate_along(idx.sharding, dims.indices, dims.operand, rank)
        for i in range(n):
            changed |= p.improve_sub(inst, cand, i, f"scatter.{label}(indices)", (idx,))
    for i, upd in enumerate(gs.scatter_updates(inst)):
        if is_spatially_partitioned(upd.sharding):
            cand = ops.propagate_along(upd.sharding, dims.output, dims.operand, rank)
            changed |= p.improve_sub(inst, cand, i, f"scatter.{label}(updates)", (upd,))
    return changed


def scatter(p: "PropagatorInterface", inst: Instruction) -> bool:
    changed = False
    explicit = gs.scatter_explicit_batch_dims(inst)
    if explicit is not None:
        changed |= _scatter_parallel(p, inst, explicit, "batch_dims")
    for i, op in enumerate(gs.scatter_operands(inst)):
        if is_spatially_partitioned(op.sharding):
            changed |= p.improve_sub(inst, op.sharding, i, "scatter.from_operand", (op,))
    idx = gs.scatter_indices(inst)
    updates = gs.scatter_updates(inst)
    if not is_spatially_partitioned(idx.sharding) and \
            not any(is_spatially_partitioned(u.sharding) for u in updates):
        return changed
    parallel = gs.scatter_parallel_dims(inst, p.graph.callers)
    if parallel is not None:
        changed |= _scatter_parallel(p, inst, parallel, "parallel_dims")
    for i, upd in enumerate(updates):
        if is_spatially_partitioned(upd.sharding):
            cand = gs.scatter_output_from_update(upd.sharding, inst)
            if cand is not None:
                changed |= p.improve_sub(inst, cand, i, "scatter.from_updates(passthrough)",
                                         (upd,))
    return changed


def custom_call(p: "PropagatorInterface", inst: Instruction) -> bool:
    op = pick_representative(p, inst)
    if op is None or not is_spatially_partitioned(op.sharding):
        return False
    return p.improve(inst, op.sharding, f"custom-call[{inst.custom_call_target}].passthrough",
                     (op,), _one_non_root_user(p, inst))


def topk(p: "PropagatorInterface", inst: Instruction) -> bool:
    """Not in XLA's rules (it leaves top-k results replicated): both results (values and
    indices) follow the operand on every dim but the last, where k of the whole dim are
    chosen. Nothing when only the last dim is sharded."""
    op = inst.operands[0]
    s = op.sharding
    if not is_spatially_partitioned(s) or s.is_manual or s.is_tuple or not s.is_tiled \
            or not inst.shape.is_tuple or len(inst.shape.tuple_shapes) != 2:
        return False
    leaf = partial_replicate(s, [op.shape.rank - 1])
    if leaf.is_replicated:
        return False
    return p.improve(inst, HloSharding.tuple([leaf, leaf]), "topk.forward", (op,),
                     _one_non_root_user(p, inst))


# -- batch norm (not in XLA's rules: its partitioner replicates these ops) ------------------

def batch_norm(p: "PropagatorInterface", inst: Instruction) -> bool:
    """The normalized result follows the operand (or, for the grad, the output gradient);
    the per-feature results take the operand's sharding of the feature dim."""
    sources = [inst.operands[0]] + ([inst.operands[4]] if inst.opcode == "batch-norm-grad"
                                    else [])
    changed = False
    for op in sources:
        s = op.sharding
        if not is_spatially_partitioned(s) or s.is_manual or s.is_tuple:
            continue
        if not inst.shape.is_tuple:
            changed |= p.improve(inst, s, "batch_norm.forward", (op,),
                                 _one_non_root_user(p, inst))
            continue
        red = [d for d in range(op.shape.rank) if d != int(inst.attrs.feature_index)]
        after = partial_replicate(s, red)
        feat = after if after.is_replicated else ops.remove_shape_dims(after, red)
        cand = HloSharding.tuple([s, feat, feat])
        changed |= p.improve(inst, cand, "batch_norm.forward", (op,),
                             _one_non_root_user(p, inst))
    return changed


ELEMENTWISE = ForwardRule(elementwise_rule)
DEFAULT = ForwardRule(default_rule)

FORWARD_RULES: dict[str, ForwardRule] = {
    "get-tuple-element": ForwardRule(get_tuple_element),
    "tuple": ForwardRule(tuple_rule),
    "reduce": ForwardRule(reduce),
    "broadcast": ForwardRule(broadcast, level_classes=3),
    "concatenate": ForwardRule(concatenate),
    "convolution": ForwardRule(convolution, lookahead=True),
    "transpose": ForwardRule(transpose),
    "reduce-window": ForwardRule(reduce_window),
    "select-and-scatter": ForwardRule(select_and_scatter),
    "reshape": ForwardRule(reshape),
    "reverse": ForwardRule(reverse),
    "dot": ForwardRule(dot, lookahead=True),
    "parameter": ForwardRule(parameter, caller_operands=True),
    "sort": ForwardRule(sort),
    "dynamic-slice": ForwardRule(dynamic_slice),
    "dynamic-update-slice": ForwardRule(dynamic_update_slice),
    "gather": ForwardRule(gather),
    "scatter": ForwardRule(scatter),
    "while": ForwardRule(while_rule),
    "custom-call": ForwardRule(custom_call),
    "topk": ForwardRule(topk),
    "batch-norm-training": ForwardRule(batch_norm),
    "batch-norm-inference": ForwardRule(batch_norm),
    "batch-norm-grad": ForwardRule(batch_norm),
}
# The opcodes whose rule reads a lookahead chain (from the declarations above).
LOOKAHEAD_OPCODES = frozenset(op for op, rule in FORWARD_RULES.items() if rule.lookahead)


def forward_rule_of(graph: g.Graph, inst: Instruction) -> ForwardRule:
    """The declared forward rule of ``inst``."""
    rule = FORWARD_RULES.get(graph.op[inst])
    if rule is None:
        rule = ELEMENTWISE if graph.elementwise[inst] else DEFAULT
    return rule

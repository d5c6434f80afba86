"""Post-partition tidy: rewrites of the per-device program that move fewer bytes.

Handlers emit what each op needs locally; some collectives are only visible as wasteful
once their users are known. Each rewrite keeps the program's numbers (up to float
reassociation) and never adds bytes on the wire:

* **all-reduce + own-part dynamic-slice -> reduce-scatter** (XLA's ReduceScatterCreator /
  the paper's weight-update sharding, section 3.2): when every user of an all-reduce cuts
  this device's part of one dim -- part ``i`` for the ``i``-th member of its replica
  group -- the reduction only has to deliver that part. A transpose between the two is
  looked through (the slice moves before it), as gradients are often transposed before
  being cut to the weight's sharding.
* **all-reduce reassociation** (XLA's AllReduceReassociate): ``op(all-reduce(a),
  all-reduce(b))`` with ``op`` the reducer, the same groups and no other users is
  ``all-reduce(op(a, b))``: one collective instead of two, half the bytes.
* **all-gather + own-part dynamic-slice -> the operand** (a gather whose result is cut
  back to the device's own tile of the gathered dim is the local shard).

Then independent collectives of one kind and grouping are combined into one
(``combine.py``, XLA's AllReduceCombiner & co.; bytes unchanged, fewer collectives), and
last ``schedule.sink_to_first_use`` moves cheap values (constants, iotas, broadcasts of
scalars) next to their first user, so they are not live across unrelated big values.

Per-device offsets are read off the factory's table lookups
(``reshape(dynamic-slice(constant table, partition-id))``) or constants; nothing is
matched by name. Runs on every computation (loop bodies and branches included).
"""
from __future__ import annotations

from operator import attrgetter

import numpy as np

from hlo_spmd.ir.builder import next_channel_id
from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction, iter_operand_users
from hlo_spmd.ir.literal import literal_to_numpy
from hlo_spmd.ir.module import Module
from hlo_spmd.ir.opcodes import REDUCERS, TIDY_TRIGGERS, reducer_opcode
from hlo_spmd.ir.shape_inference import infer_shape, replica_groups
from hlo_spmd.passes.partition.combine import combine_collectives, may_combine
from hlo_spmd.passes.partition.schedule import sink_to_first_use
from hlo_spmd.proto import hlo_pb2
from hlo_spmd.sharding.device_ids import all_distinct
from hlo_spmd.stats import computation_peak_bytes

_CONTROL_PREDECESSORS = attrgetter("control_predecessors")
# Reducers whose all-reduces may be merged through an op of the same kind.
_ASSOCIATIVE = REDUCERS


def tidy_module(module: Module, num_devices: int, causes=None,
                combine_threshold_bytes: int = 0) -> None:
    """Apply every rewrite to every computation of ``module`` (in place). ``causes``
    (the partitioner's CauseLog) learns that a new collective serves what it replaces;
    ``combine_threshold_bytes`` > 0 combines collectives up to that size (combine.py)."""
    inherit = causes.inherit if causes is not None else (lambda new, old: None)
    # Each rewrite with the opcodes it starts from: a computation holding none of them
    # (most are reducers) is skipped without building its use map.
    # Each rewrite lists in ``touched`` the instructions whose operands it changed.
    # (The opcodes are the table's ``tidy-*`` traits.)
    rewrites = ((TIDY_TRIGGERS["reassociate"],
                 lambda c, t: _reassociate_all_reduces(c, t, inherit)),
                (TIDY_TRIGGERS["sink-slices"],
                 lambda c, t: _sink_slices_through_transposes(c, t)),
                (TIDY_TRIGGERS["reduce-scatter"],
                 lambda c, t: _all_reduce_slice_to_reduce_scatter(c, num_devices, t, inherit)),
                (TIDY_TRIGGERS["fold-slice"],
                 lambda c, t: _fold_all_gather_own_slice(c, num_devices, t)))
    for comp in list(module.computations):
        # No rewrite creates an opcode another one starts from unless it was there.
        present = {i.opcode for i in comp.instructions}
        for needs, rewrite in rewrites:
            touched: list[Instruction] = []
            if all(op in present for op in needs) and rewrite(comp, touched):
                # Replaced instructions go now, so the next rewrite counts real users.
                comp.sort_topologically(settled=_first_touched(comp, touched))
                _remove_dead(comp, touched)
    combine = {id(c) for c in module.computations if may_combine(c)} \
        if combine_threshold_bytes > 0 and causes is not None else set()
    largest = _largest_array_bytes(module) if combine else 0
    for comp in list(module.computations):
        if id(comp) in combine:
            # (it removes what it leaves dead itself; the driver left no dead code)
            combine_collectives(comp, combine_threshold_bytes, causes,
                                lambda c: computation_peak_bytes(c, c is module.entry),
                                largest)
        sink_to_first_use(comp)  # last: the order the rewrites leave is final


class _Dead(list):
    """What a rewrite left dead, when it knows exactly (a marker in ``touched``)."""

    __slots__ = ()


def _remove_dead(comp: Computation, touched: list) -> None:
    """Drop what the rewrite left dead. A rewrite that knows exactly what it left dead
    says so (a ``_Dead`` at the end of ``touched``): the computation had no dead code
    before (the driver removes it, each rewrite after itself), so that is all of it,
    unless a control edge keeps one of them alive (then, as otherwise, the liveness walk
    decides)."""
    dead = touched[-1] if touched and type(touched[-1]) is _Dead else None
    if dead is None or any(map(_CONTROL_PREDECESSORS, comp.instructions)):
        comp.remove_dead()
        return
    gone = set(dead)
    comp.instructions = [i for i in comp.instructions if i not in gone]


def _first_touched(comp: Computation, touched: list[Instruction]) -> int:
    """The position of the first instruction a rewrite rewired. The partitioner's
    computations are in program order (built by appending, and every rewrite ends with
    a sort) and a rewrite only appends new instructions after their operands, so all
    before that position still read only what precedes them: the sort keeps them."""
    if touched and type(touched[-1]) is _Dead:
        touched = touched[:-1]
    wanted = set(touched)
    for k, inst in enumerate(comp.instructions):  # (stops at the first: no table)
        if inst in wanted:
            return k
    return len(comp.instructions)


def _largest_array_bytes(module: Module) -> int:
    """The module's largest array: combining is one buffer per group, never larger than
    the biggest array already there. Sized once per shape object (shapes are shared)."""
    sizes: dict[int, int] = {}
    largest = 0
    for comp in module.computations:
        for inst in comp.instructions:
            shape = inst.shape
            n = sizes.get(id(shape))
            if n is None:
                n = sizes[id(shape)] = shape.byte_size() if shape.is_array else 0
            if n > largest:
                largest = n
    return largest


# -- reading the program ------------------------------------------------------------------------
def _groups(inst: Instruction, num_devices: int) -> np.ndarray | None:
    """``[num_groups, group_size]`` partition ids; None when ragged, unreadable, or not a
    cross-partition collective (no channel id: the groups would name replicas)."""
    if not inst.attrs.channel_id:
        return None
    try:
        g = replica_groups(inst.attrs)
    except (ValueError, IndexError):
        return None
    if g is None:
        return np.arange(num_devices, dtype=np.int64).reshape(1, num_devices)
    if g.dtype == object or g.ndim != 2:
        return None
    return g


def _position_in_group(groups: np.ndarray, num_devices: int) -> np.ndarray | None:
    """For every device, its index within its replica group (None unless every device is
    in exactly one group)."""
    flat = groups.reshape(-1)
    if flat.size != num_devices or not all_distinct(flat) or \
            flat.min() < 0 or flat.max() >= num_devices:
        return None
    pos = np.empty(num_devices, np.int64)
    pos[flat] = np.tile(np.arange(groups.shape[1]), groups.shape[0])
    return pos


def _per_device(inst: Instruction, num_devices: int) -> np.ndarray | None:
    """The value of scalar ``inst`` on every device, when it is a constant or the
    collective factory's table lookup; None otherwise."""
    if inst.opcode == "constant" and inst.shape.rank == 0:
        return np.full(num_devices, int(literal_to_numpy(inst.attrs.literal)), np.int64)
    if inst.opcode == "reshape" and inst.shape.rank == 0:
        ds = inst.operands[0]
        if ds.opcode == "dynamic-slice" and len(ds.operands) == 2:
            table, index = ds.operands
            if table.opcode == "constant" and index.opcode == "partition-id" and \
                    table.shape.rank == 1 and table.shape.dims[0] == num_devices:
                return np.asarray(literal_to_numpy(table.attrs.literal), np.int64).reshape(-1)
    return None


def _reducer_opcode(inst: Instruction) -> str | None:
    """The opcode of ``inst``'s reducer of the form ``op(param0, param1)``."""
    if len(inst.called_computations) != 1:
        return None
    return reducer_opcode(inst.called_computations[0])


class _DeviceFacts:
    """One rewrite's per-device readings, each made once: a collective's slices share
    its groups, and the slices of many collectives share one offset table lookup."""

    __slots__ = ("num_devices", "_positions", "_values")

    def __init__(self, num_devices: int) -> None:
        self.num_devices = num_devices
        # Keyed by id, the object held beside its answer (ids stay theirs meanwhile).
        self._positions: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        self._values: dict[int, tuple[Instruction, np.ndarray | None]] = {}

    def position_in_group(self, groups: np.ndarray) -> np.ndarray | None:
        got = self._positions.get(id(groups))
        if got is None:
            got = self._positions[id(groups)] = (
                groups, _position_in_group(groups, self.num_devices))
        return got[1]

    def per_device(self, inst: Instruction) -> np.ndarray | None:
        got = self._values.get(id(inst))
        if got is None:
            got = self._values[id(inst)] = (inst, _per_device(inst, self.num_devices))
        return got[1]


def _own_part_dim(ds: Instruction, full: Instruction, groups: np.ndarray,
                  facts: _DeviceFacts) -> int | None:
    """The dim along which ``ds`` (a dynamic-slice of ``full``) cuts exactly part ``i`` of
    ``g`` equal parts for the ``i``-th member of every replica group, all other dims
    whole; None otherwise."""
    if ds.opcode != "dynamic-slice" or ds.operands[0] is not full:
        return None
    dims = list(full.shape.dims)
    sizes = list(ds.attrs.dynamic_slice_sizes)
    cut = [k for k in range(len(dims)) if sizes[k] != dims[k]]
    if len(cut) != 1:
        return None
    d = cut[0]
    g = int(groups.shape[1])
    if g < 2 or dims[d] % g or sizes[d] != dims[d] // g:
        return None
    pos = facts.position_in_group(groups)
    starts = facts.per_device(ds.operands[1 + d])
    if pos is None or starts is None or not np.array_equal(starts, pos * sizes[d]):
        return None
    return d


def _collective_attrs(like: Instruction, module: Module) -> hlo_pb2.HloInstructionProto:
    """``like``'s attributes (replica groups, global ids) with a fresh channel id."""
    attrs = hlo_pb2.HloInstructionProto()
    attrs.CopyFrom(like.attrs)
    attrs.ClearField("dimensions")
    attrs.channel_id = next_channel_id(module)
    return attrs


def _new(comp: Computation, opcode: str, operands: list[Instruction],
         attrs: hlo_pb2.HloInstructionProto, called=(), like: Instruction | None = None) -> Instruction:
    shape = infer_shape(opcode, [o.shape for o in operands], attrs, list(called), None,
                        where=f"computation {comp.name}")
    inst = Instruction(opcode, shape, operands, attrs=attrs, called_computations=list(called))
    return comp.add(inst, like.name if like is not None else opcode)


def _replace(comp: Computation, old: Instruction, new: Instruction,
             users: dict[int, list[Instruction]], touched: list[Instruction]) -> None:
    """Every use of ``old`` reads ``new``; a new root keeps the root's (manual) sharding.
    ``users`` is the rewrite's use map (``iter_operand_users``): only ``old``'s users are
    visited, not the whole computation (a rewrite makes hundreds of replacements in a
    10k-instruction body), and ``new`` takes them over in the map. The rewired users
    are added to ``touched``."""
    if comp.root is old:
        new.sharding = old.sharding
        comp.root = new
    moved = [u for u in users.pop(id(old), ()) if u is not new]
    for u in moved:
        u.replace_operand(old, new)
    if moved:
        touched.extend(moved)
        mine = users.setdefault(id(new), [])
        seen = {id(u) for u in mine}
        mine.extend(u for u in moved if id(u) not in seen)


# -- rewrites ------------------------------------------------------------------------------------
def _reassociate_all_reduces(comp: Computation, touched: list[Instruction],
                             inherit=lambda new, old: None) -> bool:
    changed = False
    # Users are asked of all-reduces and of the binary ops that may merge two (also ones
    # that read an all-reduce this pass makes): only theirs are listed.
    users = iter_operand_users(comp.instructions, only={
        i for i in comp.instructions
        if i.opcode == "all-reduce" or (i.opcode in _ASSOCIATIVE and len(i.operands) == 2)})
    # Exactly these die: the op (its users move) and its two all-reduces (it was their
    # only user); what they read is read by the new op.
    dead = _Dead()
    for inst in list(comp.instructions):
        if inst.opcode not in _ASSOCIATIVE or len(inst.operands) != 2:
            continue
        a, b = inst.operands
        if a is b or a.opcode != "all-reduce" or b.opcode != "all-reduce":
            continue
        if len(a.operands) != 1 or len(b.operands) != 1 or not a.shape.is_array:
            continue
        if _reducer_opcode(a) != inst.opcode or _reducer_opcode(b) != inst.opcode:
            continue
        if a.shape != b.shape or a.shape != inst.shape or comp.root in (a, b):
            continue
        if not a.attrs.channel_id or _group_fields(a) != _group_fields(b):
            continue
        if len(users.get(id(a), [])) != 1 or len(users.get(id(b), [])) != 1:
            continue
        local = _new(comp, inst.opcode, [a.operands[0], b.operands[0]],
                     _plain_attrs(inst), like=inst)
        merged = _new(comp, "all-reduce", [local], _collective_attrs(a, comp.module),
                      a.called_computations, like=a)
        inherit(merged, a)
        _replace(comp, inst, merged, users, touched)
        users[id(local)] = [merged]
        dead.extend((inst, a, b))
        changed = True
    touched.append(dead)
    return changed


def _group_fields(inst: Instruction) -> bytes:
    """The collective's attributes minus its identity (channel id, name, ids, metadata):
    replica groups in any encoding (iota lists included), global-ids mode."""
    q = hlo_pb2.HloInstructionProto()
    q.CopyFrom(inst.attrs)
    for f in ("channel_id", "name", "id", "metadata", "operand_ids", "called_computation_ids"):
        q.ClearField(f)
    return q.SerializeToString(deterministic=True)


def _plain_attrs(inst: Instruction) -> hlo_pb2.HloInstructionProto:
    attrs = hlo_pb2.HloInstructionProto()
    if inst.attrs.HasField("metadata"):
        attrs.metadata.CopyFrom(inst.attrs.metadata)
    return attrs


def _sink_slices_through_transposes(comp: Computation, touched: list[Instruction]) -> bool:
    """``dynamic-slice(transpose(all-reduce))`` -> ``transpose(dynamic-slice(all-reduce))``
    when the transpose feeds only dynamic-slices, so the next rewrite sees the cut."""
    changed = False
    # Users are asked of transposes of all-reduces and of dynamic-slices (replaced): only
    # theirs are listed.
    users = iter_operand_users(comp.instructions, only={
        i for i in comp.instructions
        if i.opcode == "dynamic-slice" or (i.opcode == "transpose"
                                           and i.operands[0].opcode == "all-reduce")})
    dead = _Dead()
    for t in list(comp.instructions):
        if t.opcode != "transpose" or t.operands[0].opcode != "all-reduce":
            continue
        ds_users = users.get(id(t), [])
        if not ds_users or comp.root is t or \
                any(u.opcode != "dynamic-slice" or u.operands[0] is not t for u in ds_users):
            continue
        perm = list(t.attrs.dimensions)
        x = t.operands[0]
        for ds in ds_users:
            starts = [None] * len(perm)
            sizes = [0] * len(perm)
            for i, p in enumerate(perm):
                starts[p] = ds.operands[1 + i]
                sizes[p] = int(ds.attrs.dynamic_slice_sizes[i])
            attrs = _plain_attrs(ds)
            attrs.dynamic_slice_sizes.extend(sizes)
            inner = _new(comp, "dynamic-slice", [x] + starts, attrs, like=ds)
            tattrs = _plain_attrs(t)
            tattrs.dimensions.extend(perm)
            moved = _new(comp, "transpose", [inner], tattrs, like=t)
            _replace(comp, ds, moved, users, touched)
            changed = True
        # Exactly these die: the transpose (every user was one of these slices) and the
        # slices; what they read is read by the new slices.
        dead.append(t)
        dead.extend(ds_users)
    touched.append(dead)
    return changed


def _all_reduce_slice_to_reduce_scatter(comp: Computation, num_devices: int,
                                        touched: list[Instruction],
                                        inherit=lambda new, old: None) -> bool:
    changed = False
    # Users are asked of all-reduces and of dynamic-slices (replaced): only theirs.
    starts = TIDY_TRIGGERS["reduce-scatter"]
    users = iter_operand_users(comp.instructions, only={
        i for i in comp.instructions if i.opcode in starts})
    facts = _DeviceFacts(num_devices)
    for ar in list(comp.instructions):
        if ar.opcode != "all-reduce" or len(ar.operands) != 1 or not ar.shape.is_array \
                or comp.root is ar:
            continue
        cuts = users.get(id(ar), [])
        # Every user must be a dynamic-slice of the all-reduce (``_own_part_dim``): the
        # groups (read from the attributes into an array) are asked only then.
        if not cuts or not all(ds.opcode == "dynamic-slice" and ds.operands[0] is ar
                               for ds in cuts):
            continue
        groups = _groups(ar, num_devices)
        if groups is None:
            continue
        dims = {_own_part_dim(ds, ar, groups, facts) for ds in cuts}
        if len(dims) != 1 or None in dims:
            continue
        d = dims.pop()
        attrs = _collective_attrs(ar, comp.module)
        attrs.dimensions.append(d)
        rs = _new(comp, "reduce-scatter", [ar.operands[0]], attrs, ar.called_computations)
        inherit(rs, ar)
        for ds in cuts:
            _replace(comp, ds, rs, users, touched)
        changed = True
    return changed


def _fold_all_gather_own_slice(comp: Computation, num_devices: int,
                               touched: list[Instruction]) -> bool:
    # Only a dynamic-slice of an all-gather is folded: without one, no use map is built.
    if not any(i.opcode == "dynamic-slice" and i.operands and
               i.operands[0].opcode == "all-gather" for i in comp.instructions):
        return False
    changed = False
    users = iter_operand_users(comp.instructions)
    facts = _DeviceFacts(num_devices)
    for ag in list(comp.instructions):
        if ag.opcode != "all-gather" or len(ag.operands) != 1 or not ag.shape.is_array:
            continue
        cuts = users.get(id(ag), [])
        if not any(ds.opcode == "dynamic-slice" for ds in cuts):
            continue  # (the groups array is read only for a gather that is cut)
        groups = _groups(ag, num_devices)
        if groups is None:
            continue
        d = int(ag.attrs.dimensions[0])
        x = ag.operands[0]
        for ds in cuts:
            if _own_part_dim(ds, ag, groups, facts) == d and ds.shape == x.shape:
                _replace(comp, ds, x, users, touched)
                changed = True
    return changed

"""Combine independent collectives of one kind and one device grouping into one
collective (XLA's AllReduceCombiner, AllGatherCombiner and ReduceScatterCombiner).

Each collective has a fixed cost (a rendezvous, a launch) on top of its bytes; the
partitioner emits one per value, e.g. one all-reduce per weight gradient. Collectives
that agree on everything but their operand -- the same opcode, replica groups and id
mode, gather / scatter dimension, reduction computation and element type -- and that
do not depend on each other become one collective on one buffer: every member's operand
is laid out as a column block of a rank-2 buffer (concatenate), the collective runs on
the buffer, and each member's result is sliced back out. The bytes each device sends are
the sum of the parts (the cost model of ``collectives/cost.py`` is linear in the
operands), so the count drops and the bytes stay exactly the same.

Why one buffer and not XLA's variadic (tuple-shaped) form: jaxlib 0.10.2 compiles our
programs through its SPMD partitioner in manual mode, which rejects an all-reduce with
more than one operand (RET_CHECK "supports only single-operand allreduce in manual
partitioning mode"), and its StableHLO reduce-scatter takes a single operand. Only
all-gather runs variadic there; one form serves all three kinds instead. A buffer needs
one element type, so that is part of the key.

Which ones (greedy in program order, as XLA's combiners): a collective joins the open
group of its kind when it depends on none of the group's members (a bitset of the
candidate collectives each instruction depends on; XLA uses a reachability map), the
group's buffer stays under the threshold (XLA's ``combine_threshold_in_bytes``; 30 MiB
by default, ``PartitionOptions``, and never more than the program's largest array) and
it has fewer than 256 members (XLA's count threshold); otherwise the group is closed and
a new one opened. The combined collective takes the place of its group's last member;
users of earlier members move after it, everything else keeps its order (a topological
sort that follows the old positions). Independent members can still wait on each other
through another combined group, and combining makes the members' results live at the
same time, so the groups are put in together and kept only when the program stays
acyclic and the computation's peak-live estimate (``hlo_spmd.stats``, the figure
compared with XLA's) does not grow; otherwise one by one (up to ``MAX_TRIALS``), each
kept under the same two conditions.

Only collectives the partitioner made are combined, and only with collectives of the
same cause (``causes.CauseLog``), which the combined one inherits: the report's figures
per cause stay exact. Collectives of the input (user code) are kept as written.
"""
from __future__ import annotations

import heapq
from typing import Callable

from hlo_spmd.ir.builder import Builder
from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction, iter_operand_users
from hlo_spmd.ir.opcodes import COMBINABLE_COLLECTIVES
from hlo_spmd.ir.shape_inference import infer_shape
from hlo_spmd.proto import hlo_pb2

KINDS = COMBINABLE_COLLECTIVES
MAX_MEMBERS = 256  # XLA's combine_threshold_count
# Groups tried one by one when combining all of them would raise the peak (each try is
# one topological sort and one peak estimate of the computation).
MAX_TRIALS = 64


def _reducer_key(inst: Instruction) -> tuple:
    """What a reduction computation computes: ``op(p0, p1)`` by opcode and type, anything
    else by identity (the same called computation)."""
    if not inst.called_computations:
        return ()
    comp = inst.called_computations[0]
    root = comp.root
    if root is not None and len(root.operands) == 2 and \
            all(o.opcode == "parameter" for o in root.operands) and root.shape.is_array:
        return (root.opcode, int(root.shape.element_type))
    return ("computation", id(comp))


def _key(inst: Instruction, cause: str | None) -> tuple:
    q = hlo_pb2.HloInstructionProto()
    q.CopyFrom(inst.attrs)
    for f in ("channel_id", "name", "id", "metadata", "operand_ids", "called_computation_ids",
              "shape", "opcode", "sharding", "frontend_attributes"):
        q.ClearField(f)
    # The members share one buffer: one element type.
    etype = int(inst.shape.element_type)
    return (inst.opcode, q.SerializeToString(deterministic=True), _reducer_key(inst), etype,
            cause)


def combine_collectives(comp: Computation, threshold_bytes: int, causes,
                        peak: Callable[[Computation], int] | None = None,
                        largest_bytes: int | None = None) -> bool:
    """Combine in ``comp`` (see the module docstring); True when anything changed.
    What combining leaves dead is removed (a computation without dead code stays so).
    ``causes``: the partitioner's CauseLog (collectives it has no note of are user code);
    ``peak``: the peak-live estimate of a computation, which combining may not raise;
    ``largest_bytes``: the program's largest array, which no combined buffer may pass."""
    if largest_bytes is not None:
        threshold_bytes = min(threshold_bytes, largest_bytes)
    if threshold_bytes <= 0 or causes is None:
        return False
    order = comp.instructions
    if not may_combine(comp):
        return False
    # ancestors: a bit per candidate collective an instruction depends on (itself
    # included). A collective joins the open group of its kind only when it depends on
    # none of the members: the members are independent.
    # Keyed by the instructions themselves (they hash by identity; cheaper than id()).
    ancestors: dict[Instruction, int] = {}
    open_groups: dict[tuple, tuple[list[Instruction], list[int]]] = {}
    groups: list[list[Instruction]] = []
    bits = 0
    for inst in order:
        anc = 0
        for o in inst.operands:
            anc |= ancestors[o]
        for o in inst.control_predecessors:
            anc |= ancestors[o]
        if inst.opcode in KINDS and _candidate(comp, inst, causes):  # (the call: rarely)
            key = _key(inst, causes.lookup(inst).cause)
            size = max(inst.shape.byte_size(), inst.operands[0].shape.byte_size())  # buffer
            group = open_groups.get(key)
            if group is None or anc & group[1][0] or group[1][1] + size > threshold_bytes \
                    or len(group[0]) >= MAX_MEMBERS:
                if group is not None:
                    groups.append(group[0])
                group = open_groups[key] = ([], [0, 0])
            group[0].append(inst)
            group[1][0] |= 1 << bits
            group[1][1] += size
            anc |= 1 << bits
            bits += 1
        ancestors[inst] = anc
    groups.extend(g for g, _ in open_groups.values())
    groups = [g for g in groups if len(g) > 1]
    if not groups:
        return False
    base = list(order)
    position = {i: k for k, i in enumerate(base)}
    built = []
    for group in groups:
        new, reads = _emit(comp, group, causes)
        last = max(position[m] for m in group)  # users come after the last operand
        for inst in new:
            position[inst] = last
        built.append((new, reads))
    comp.instructions = base
    # Who reads each member, built once: a trial rewires only those (of the base program
    # and of the groups it puts in), not a scan of the computation per trial.
    users = iter_operand_users(base + [i for new, _ in built for i in new],
                               only={m for group in groups for m in group})
    built_set = {i for new, _ in built for i in new}  # small: the groups' new code

    def apply(chosen: list) -> tuple[list, bool]:
        """Put the groups of ``chosen`` in; False (undo it) when that makes a cycle or
        raises the peak."""
        reads: dict[Instruction, Instruction] = {}
        added: list[Instruction] = []
        for new, r in chosen:
            reads.update(r)
            added.extend(new)
        # A reader is rewired when it is in the program: the base, or a chosen group.
        in_chosen = set(added)
        saved = []
        rewired: set[Instruction] = set()
        for member in reads:
            for inst in users.get(id(member), ()):
                if (inst not in built_set or inst in in_chosen) and inst not in rewired:
                    rewired.add(inst)
                    saved.append((inst, inst.operands))
                    inst.operands = [reads.get(o, o) for o in inst.operands]
        kept = [i for i in base if i not in reads] + added
        # Everything before the first rewired reader and the first group's place reads
        # only what precedes it, unchanged: the walk would leave those where they are.
        first = min(min(map(position.__getitem__, rewired), default=len(base)),
                    min(position[new[0]] for new, _ in chosen))
        settled = first - sum(1 for m in reads if position[m] < first)
        new_order = _in_order(kept, position, settled)
        if new_order is None:
            return saved, False
        comp.instructions = new_order
        return saved, peak is None or peak(comp) <= limit

    def undo(saved: list) -> None:
        for inst, operands in saved:
            inst.operands = operands
        comp.instructions = base

    # Groups of independent collectives can still wait on each other through other
    # groups, and combining makes the members' results live together: keep the groups
    # that leave the program acyclic and do not raise the peak-live estimate (all of
    # them at once first, then one by one).
    def done(chosen: list) -> bool:
        """Dead code left by the chosen groups goes. Members have left the program and
        their readers read the groups' results; when every member had a reader, every
        new instruction is read (and so all of a computation that had no dead code),
        so the liveness walk runs only when a member had none."""
        if not all(users.get(id(m)) for _, r in chosen for m in r):
            comp.remove_dead()
        return True

    limit = peak(comp) if peak is not None else 0
    saved, ok = apply(built)
    if ok:
        return done(built)
    undo(saved)
    accepted: list = []
    for item in built[:MAX_TRIALS]:
        saved, ok = apply(accepted + [item])
        if ok:
            accepted.append(item)
        undo(saved)
    if not accepted:
        return False
    apply(accepted)
    return done(accepted)


def may_combine(comp: Computation) -> bool:
    """False when ``comp`` has fewer than two collectives of the combined kinds (most
    computations are reducers): nothing to do, checked before any other work."""
    return sum(1 for i in comp.instructions if i.opcode in KINDS) >= 2


def _candidate(comp: Computation, inst: Instruction, causes) -> bool:
    return (inst.opcode in KINDS and len(inst.operands) == 1 and inst.shape.is_array
            and bool(inst.attrs.channel_id) and not inst.control_predecessors
            and inst is not comp.root and causes.lookup(inst) is not None)


def _in_order(insts: list[Instruction], position: dict[Instruction, int],
              settled: int = 0) -> list[Instruction] | None:
    """A topological order of ``insts`` that follows ``position`` wherever the edges allow
    (Kahn's algorithm, the ready instruction of lowest (position, index) first); None
    when the edges make a cycle.

    Walked in rank order instead of through a heap of every instruction: most are ready
    when their turn comes (the base program is in order). One that is not waits on an
    operand it lacks and enters a heap once ready; at each step the next in rank order
    and the heap's top compete, so the pick is Kahn's. ``settled``: the caller knows the
    first ``settled`` of ``insts`` come first in rank order and read only each other
    (the walk would place them as they are): they are placed without being looked at."""
    members = set(insts)  # identity sets, as in combine_collectives
    # The rank (position, index) as one int, position * n + index (index < n): the same
    # order, compared and heaped as plain ints.
    n = len(insts)
    ranks = [position[i] * n + k for k, i in enumerate(insts)]
    walk = sorted(range(n), key=ranks.__getitem__)
    out: list[Instruction] = insts[:settled]
    done: set[Instruction] = set(out)

    def missing(inst: Instruction) -> Instruction | None:
        """An operand (or control predecessor) of ``inst`` not placed yet."""
        for dep in inst.operands:
            if dep not in done and dep in members:
                return dep
        for dep in inst.control_predecessors:
            if dep not in done and dep in members:
                return dep
        return None

    waiting: dict[Instruction, list[int]] = {}  # dep -> indices of instructions waiting on it
    ready: list[tuple[int, int]] = []  # (rank, index), became ready late
    nxt = settled  # (walk[:settled] is range(settled): the lowest ranks)
    while True:
        if ready and (nxt == len(walk) or ready[0][0] < ranks[walk[nxt]]):
            k = heapq.heappop(ready)[1]
        elif nxt < len(walk):
            k = walk[nxt]
            nxt += 1
            inst = insts[k]
            # (most are ready: their operands checked here, the call only otherwise)
            for dep in inst.operands:
                if dep not in done and dep in members:
                    break
            else:
                if not inst.control_predecessors:
                    out.append(inst)
                    done.add(inst)
                    if inst in waiting:
                        _release(inst, waiting, missing, ready, ranks, insts)
                    continue
            dep = missing(inst)
            if dep is not None:
                waiting.setdefault(dep, []).append(k)
                continue
        else:
            break
        inst = insts[k]
        out.append(inst)
        done.add(inst)
        if inst in waiting:
            _release(inst, waiting, missing, ready, ranks, insts)
    return out if len(out) == len(insts) else None


def _release(inst: Instruction, waiting: dict, missing, ready: list, ranks: list[int],
             insts: list[Instruction]) -> None:
    """``inst`` is placed: who waited on it is ready (into the heap) or waits on the next
    operand it lacks."""
    for j in waiting.pop(inst):
        dep = missing(insts[j])
        if dep is None:
            heapq.heappush(ready, (ranks[j], j))
        else:
            waiting.setdefault(dep, []).append(j)


def _emit(comp: Computation, members: list[Instruction],
          causes) -> tuple[list[Instruction], dict[Instruction, Instruction]]:
    """One collective over one buffer holding every member's operand, and per member the
    value that takes over its uses (member -> it); returns (new instructions, map).

    The buffer is rank 2, ``[g, n]`` with the group axis first (1 for all-reduce and
    all-gather operands), so each member is one column block: an all-gather of rows
    delivers member k's columns from every device in group order, a reduce-scatter of
    rows leaves each device its row, i.e. exactly the member's own result."""
    b = Builder(comp)
    start = len(comp.instructions)
    first = members[0]
    if first.attrs.HasField("metadata"):
        b.metadata = first.attrs.metadata
    kind = first.opcode
    d = int(first.attrs.dimensions[0]) if kind != "all-reduce" else 0
    blocks, widths = [], []
    for m in members:
        x = m.operands[0]
        dims = list(x.shape.dims)
        if kind == "reduce-scatter":
            g = dims[d] // m.shape.dims[d]
            # Split the scattered dim into (group position, part), group position first.
            split = dims[:d] + [g, dims[d] // g] + dims[d + 1:]
            x = _reshape(b, x, split)
            perm = [d] + [k for k in range(len(split)) if k != d]
            if perm != list(range(len(split))):
                x = b.transpose(x, perm)
            rows = g
        else:
            rows = 1
        width = x.shape.num_elements // rows
        blocks.append(_reshape(b, x, [rows, width]))
        widths.append(width)
    buffer = b.concatenate(blocks, 1) if len(blocks) > 1 else blocks[0]
    attrs = hlo_pb2.HloInstructionProto()
    attrs.CopyFrom(first.attrs)
    attrs.ClearField("metadata")
    if kind != "all-reduce":
        del attrs.dimensions[:]
        attrs.dimensions.append(0)
    shape = infer_shape(kind, [buffer.shape], attrs, list(first.called_computations), None,
                        where=f"computation {comp.name}")
    combined = comp.add(Instruction(kind, shape, [buffer], attrs=attrs,
                                    called_computations=list(first.called_computations)),
                        first.name)
    if first.attrs.HasField("metadata"):
        combined.attrs.metadata.CopyFrom(first.attrs.metadata)
    causes.inherit(combined, first)
    out_rows = combined.shape.dims[0]
    reads: dict[Instruction, Instruction] = {}
    offset = 0
    for m, width in zip(members, widths):
        part = combined
        if len(members) > 1:
            part = b.slice(combined, [0, offset], [out_rows, offset + width])
        offset += width
        if kind == "all-gather":
            # [g, operand...] -> the gathered dim d holds the group axis as its major part.
            src = list(m.operands[0].shape.dims)
            part = _reshape(b, part, [out_rows] + src)
            if d:
                perm = list(range(1, d + 1)) + [0] + list(range(d + 1, len(src) + 1))
                part = b.transpose(part, perm)
        reads[m] = _reshape(b, part, list(m.shape.dims))
    return comp.instructions[start:], reads


def _reshape(b: Builder, x: Instruction, dims: list[int]) -> Instruction:
    return x if list(x.shape.dims) == dims else b.reshape(x, dims)

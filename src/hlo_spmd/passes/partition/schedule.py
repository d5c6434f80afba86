"""Program order of the per-device program: make cheap values just before their first use.

Handlers emit a value's helpers where they are convenient (a mask's iota and constants
before the halo exchange they mask, a fill value before the window it fills), so some
of them sit live across big intermediates that do not need them. XLA's own schedulers
(the list / DFS memory schedulers of hlo_memory_scheduler) place such values next to their
users; our program order is what the peak-live estimate of ``hlo_spmd.stats`` walks and
what a runtime without a scheduler would follow, so it should not hold them early either.

``sink_to_first_use`` moves an instruction to just before its first user when it only
reads scalars (or nothing: constants, iotas, partition-id) and is at least as big as the
scalars whose life the move extends -- so no point of the program has more bytes live
than before. Side-effecting ops, collectives, parameters, control-flow and ops tied by
control edges keep their place; the relative order of everything else is unchanged.
"""
from __future__ import annotations

from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.opcodes import COLLECTIVES, NO_OWN_BUFFER, SIDE_EFFECTING


def _movable(inst: Instruction) -> bool:
    # Cheapest test first, as a plain loop: most instructions read a non-scalar.
    for o in inst.operands:
        if o.shape.dims or not o.shape.is_array:
            return False
    # Ops with no buffer of their own (they alias their operands): moving them saves
    # nothing and would only stretch what they alias.
    return (inst.opcode != "parameter" and inst.opcode not in SIDE_EFFECTING
            and inst.opcode not in COLLECTIVES and inst.opcode not in NO_OWN_BUFFER
            and not inst.called_computations and inst.shape.is_array)


def sink_to_first_use(comp: Computation) -> bool:
    """Reorder ``comp`` (see the module docstring); True when the order changed."""
    order = comp.instructions
    root = comp.root
    # Sets and dicts of the instructions themselves (they hash by identity).
    tied: set[Instruction] = set()
    for inst in order:
        if inst.control_predecessors:
            tied.add(inst)
            tied.update(inst.control_predecessors)
    movable: dict[Instruction, int] = {}  # -> position, in program order
    for pos, inst in enumerate(order):
        ops = inst.operands
        if ops and ops[0].shape.dims:
            continue  # reads a non-scalar (most do): not movable, without the call
        if inst is not root and inst not in tied and _movable(inst):
            movable[inst] = pos
    if not movable:
        return False  # e.g. a reducer: its only non-parameter is the root
    # (position, user) of the movable values only, and the last reader of every value.
    users: dict[Instruction, list[tuple[int, Instruction]]] = {}
    last_user: dict[Instruction, Instruction] = {}
    for pos, inst in enumerate(order):
        for o in inst.operands:
            last_user[o] = inst
            if o in movable:
                mine = users.get(o)
                if mine is None:
                    users[o] = [(pos, inst)]
                elif mine[-1][1] is not inst:
                    mine.append((pos, inst))
    # Sort keys: an instruction that stays has (position, 1); one placed before user U
    # has U's key with its last entry replaced by (0, own position, 1), so it comes
    # right before U, after anything else placed before U earlier in the program, and
    # after whatever is placed before it in turn. Only the placed ones get a key: the
    # order is then each staying instruction preceded by what is placed before it
    # (recursively, by position), without sorting the whole computation.
    key: dict[Instruction, tuple[int, ...]] = {}
    before: dict[Instruction, list[Instruction]] = {}  # U -> placed before U, latest first
    for pos in reversed(movable.values()):
        inst = order[pos]
        mine = users.get(inst)
        if not mine:
            continue
        distinct = dict.fromkeys(inst.operands)
        stretched = sum(o.shape.byte_size() for o in distinct if last_user.get(o) is inst)
        if inst.shape.byte_size() < stretched:
            continue
        first_pos, first = min(mine, key=lambda u: key.get(u[1]) or (u[0], 1))
        key[inst] = (key.get(first) or (first_pos, 1))[:-1] + (0, pos, 1)
        before.setdefault(first, []).append(inst)
    if not key:
        return False
    new: list[Instruction] = []

    def emit(inst: Instruction) -> None:
        for placed in reversed(before.get(inst, ())):
            emit(placed)
        new.append(inst)

    for inst in order:
        if inst not in key:
            if inst in before:
                emit(inst)
            else:
                new.append(inst)
    if new == order:  # instructions compare by identity
        return False
    comp.instructions = new
    return True

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
from hlo_spmd.ir.instruction import Instruction, iter_operand_users
from hlo_spmd.ir.opcodes import COLLECTIVES, SIDE_EFFECTING

# Ops that create no buffer of their own (they alias their operands): moving them saves
# nothing and would only stretch what they alias.
_NO_BUFFER = frozenset({"tuple", "get-tuple-element", "bitcast", "opt-barrier",
                        "add-dependency"})


def _movable(inst: Instruction, tied: set[int]) -> bool:
    return (inst.opcode != "parameter" and inst.opcode not in SIDE_EFFECTING
            and inst.opcode not in COLLECTIVES and inst.opcode not in _NO_BUFFER
            and not inst.called_computations and id(inst) not in tied
            and inst.shape.is_array
            and all(o.shape.is_array and o.shape.rank == 0 for o in inst.operands))


def sink_to_first_use(comp: Computation) -> bool:
    """Reorder ``comp`` (see the module docstring); True when the order changed."""
    order = comp.instructions
    users = iter_operand_users(order)
    tied: set[int] = set()
    for inst in order:
        if inst.control_predecessors:
            tied.add(id(inst))
            tied.update(id(p) for p in inst.control_predecessors)
    last_user: dict[int, Instruction] = {}
    for inst in order:
        for o in inst.operands:
            last_user[id(o)] = inst
    # Sort keys: an instruction that stays has (position, 1); one placed before user U
    # has U's key with its last entry replaced by (0, own position, 1), so it comes
    # right before U, after anything else placed before U earlier in the program, and
    # after whatever is placed before it in turn.
    key: dict[int, tuple[int, ...]] = {}
    for pos in range(len(order) - 1, -1, -1):
        inst = order[pos]
        mine = users.get(id(inst), [])
        key[id(inst)] = (pos, 1)
        if not mine or inst is comp.root or not _movable(inst, tied):
            continue
        distinct = {id(o): o for o in inst.operands}.values()
        stretched = sum(o.shape.byte_size() for o in distinct if last_user.get(id(o)) is inst)
        if inst.shape.byte_size() < stretched:
            continue
        first = min(key[id(u)] for u in mine)
        key[id(inst)] = first[:-1] + (0, pos, 1)
    new = sorted(order, key=lambda i: key[id(i)])
    if all(a is b for a, b in zip(new, order)):
        return False
    comp.instructions = new
    return True

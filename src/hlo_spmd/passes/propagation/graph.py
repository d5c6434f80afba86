"""The module as propagation sees it: XLA's post order, users, callers, opcode classes.

Everything here is computed once per ``propagate`` call (the graph does not change
while shardings move), in deterministic orders: instructions in XLA's
MakeInstructionPostOrder order, users in program order, computations in module order.
"""
from __future__ import annotations

import operator
from typing import Sequence

from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.module import Module
from hlo_spmd.ir.opcodes import ELEMENTWISE, ELEMENTWISE_PER_INSTRUCTION, SIDE_EFFECTING
from hlo_spmd.ir.primitive_types import bit_width

# Spellings other parts of the IR have used for the same opcodes.
ALIASES = {"top-k": "topk", "optimization-barrier": "opt-barrier", "cos": "cosine",
           "sin": "sine", "clz": "count-leading-zeros"}

SHARDING = "Sharding"
TOPK = "TopK"
FULL_TO_SHARD = "SPMDFullToShardShape"
SHARD_TO_FULL = "SPMDShardToFullShape"
# IsPassthroughCustomOps: custom-calls whose result is sharded like their operand.
PASSTHROUGH_ALWAYS = frozenset({"Sharding", "X64Combine", "LayoutConstraint"})
PASSTHROUGH_SAME_RANK = frozenset({
    "ResizeNearest", "ResizeBilinear", "ResizeNearestGrad", "ResizeBilinearGrad", "Cholesky",
    "MoveToHost", "MoveToDevice", "PinToDevice", "PinToDeviceSram",
    "annotate_device_placement"})


def opcode(inst: Instruction) -> str:
    """The opcode propagation reasons about.

    A ``Sharding`` custom-call is a ``copy`` (XLA replaces it by one before
    propagating), a ``TopK`` custom-call a ``topk`` (same meaning, same partitioner
    handler); old spellings map to XLA's.
    """
    op = inst.opcode
    if op == "custom-call":
        target = inst.custom_call_target
        return "copy" if target == SHARDING else "topk" if target == TOPK else op
    return ALIASES.get(op, op) if op in ALIASES else op


def is_custom_call(inst: Instruction, target: str) -> bool:
    return inst.opcode == "custom-call" and inst.custom_call_target == target


# Raw opcode spellings that are elementwise whatever the instruction (asked ~10^4-10^5
# times per module: tested before ``opcode``'s custom-call and alias mapping).
_ELEMENTWISE_SPELLINGS = frozenset(
    op for op in ELEMENTWISE | {"rng"} | set(ALIASES)
    if ALIASES.get(op, op) in ELEMENTWISE | {"rng"}
    and op not in ELEMENTWISE_PER_INSTRUCTION)


def is_elementwise(inst: Instruction) -> bool:
    """HloInstruction::IsElementwise (rng included; bitcast-convert only same width)."""
    if inst.opcode in _ELEMENTWISE_SPELLINGS:
        return True
    op = opcode(inst)
    if op == "bitcast-convert":
        src = inst.operands[0].shape
        return bit_width(src.element_type) == bit_width(inst.shape.element_type)
    return op in ELEMENTWISE or op == "rng"


def has_side_effect(inst: Instruction) -> bool:
    if inst.opcode == "custom-call":
        return bool(inst.attrs.custom_call_has_side_effect)
    return opcode(inst) in SIDE_EFFECTING


SDY_BARRIER = "xla.sdy.PropagationBarrier"
SDY_SHARDING_GROUP = "xla.sdy.ShardingGroup"


def barrier_allows(inst: Instruction, direction: str) -> bool:
    """Whether an ``xla.sdy.PropagationBarrier`` lets shardings through ``direction``
    ('forward': operand -> result, 'backward': result -> operand); its
    ``xla.sdy.allowed_direction`` is NONE, FORWARD, BACKWARD or BOTH (default NONE)."""
    allowed = inst.attrs.frontend_attributes.map.get("xla.sdy.allowed_direction", "NONE")
    allowed = allowed.strip().strip('"').upper()
    return allowed == "BOTH" or allowed == direction.upper()


def sharding_group_id(inst: Instruction) -> int | None:
    """The group of an ``xla.sdy.ShardingGroup`` custom-call (``"0 : i64"``)."""
    if not is_custom_call(inst, SDY_SHARDING_GROUP):
        return None
    text = inst.attrs.frontend_attributes.map.get("xla.sdy.sharding_group_id", "")
    try:
        return int(text.split(":")[0].strip())
    except ValueError:
        return None


def is_passthrough_custom_call(inst: Instruction) -> bool:
    """IsPassthroughCustomOps (plus Shardy's barrier, a passthrough in the directions
    it allows: see ``barrier_allows``)."""
    if inst.opcode != "custom-call":
        return False
    target = inst.custom_call_target
    if target == SDY_BARRIER:
        return len(inst.operands) == 1
    if target in PASSTHROUGH_ALWAYS:
        return True
    if (len(inst.operands) != 1 or inst.shape.is_tuple or inst.operands[0].shape.is_tuple
            or inst.operands[0].shape.rank != inst.shape.rank):
        return False
    return target in PASSTHROUGH_SAME_RANK


def post_order(comp: Computation) -> list[Instruction]:
    """XLA's MakeInstructionPostOrder: DFS from each user-less instruction in list order,
    first operand first, control predecessors before operands."""
    return _post_order(_list_order(comp))


def _post_order(insts: list[Instruction]) -> list[Instruction]:
    """``post_order`` of a computation's instructions in list order (keyed by the
    instructions themselves, which hash by identity: no ``id()`` call per step)."""
    has_users: set[Instruction] = set()
    for inst in insts:
        has_users.update(inst.operands)
    state: dict[Instruction, int] = {}
    order: list[Instruction] = []
    for start in insts:
        if start in has_users:
            continue
        _dfs(start, state, order)
    for inst in insts:  # unreachable cycles / stragglers (never in valid HLO)
        if inst not in state:
            _dfs(inst, state, order)
    return order


def _dfs(root: Instruction, state: dict[Instruction, int], order: list[Instruction]) -> None:
    stack = [root] if state.get(root) != 2 else []
    get = state.get
    while stack:
        cur = stack[-1]
        st = get(cur, 0)
        if st == 0:
            state[cur] = 1
        else:
            stack.pop()
            if st == 1:
                state[cur] = 2
                order.append(cur)
            continue
        for op in reversed(cur.operands):
            if get(op) != 2:
                stack.append(op)
        for op in cur.control_predecessors:
            if get(op) != 2:
                stack.append(op)


_by_id = operator.attrgetter("id")
_NO_USERS: tuple[Instruction, ...] = ()


def _list_order(comp: Computation) -> list[Instruction]:
    insts = list(comp.instructions)
    if insts and all(i.id >= 0 for i in insts):
        return sorted(insts, key=_by_id)
    return insts


class Graph:
    """Precomputed structure of a module for one propagation run."""

    def __init__(self, module: Module) -> None:
        self.module = module
        self.computations: list[Computation] = list(module.computations)
        self.post_orders: dict[str, list[Instruction]] = {}
        # (keyed by the instructions themselves, which hash by identity: no id() call
        # per question; likewise the tables below)
        self.users: dict[Instruction, list[Instruction]] = {}
        self.callers_of: dict[int, list[Instruction]] = {}
        # The fix point's walk as positions: per direction (0 forward, 1 backward) every
        # (id, instruction) of the module in walk order (computations in module order,
        # each in post order forward, reversed backward) and id -> position; per
        # computation its range of positions, [start, end) in both directions.
        fwalk: list[tuple[int, Instruction]] = []
        bwalk: list[tuple[int, Instruction]] = []
        self.walk = (fwalk, bwalk)
        self.walk_ranges: list[tuple[Computation, int, int]] = []
        users = self.users
        # Every instruction's ``opcode`` and ``is_elementwise``, read once here: the
        # per-instruction facts of the fix point and the representative-operand rule
        # ask them several times each.
        self.op: dict[Instruction, str] = {}
        self.elementwise: dict[Instruction, bool] = {}
        op_of, ew_of = self.op, self.elementwise
        for comp in self.computations:
            insts = _list_order(comp)
            order = _post_order(insts)
            self.post_orders[comp.name] = order
            start = len(fwalk)
            pairs = [(id(i), i) for i in order]
            fwalk.extend(pairs)
            bwalk.extend(reversed(pairs))
            self.walk_ranges.append((comp, start, len(fwalk)))
            for inst in insts:
                if inst not in users:
                    users[inst] = []
                raw = inst.opcode
                if raw in _ELEMENTWISE_SPELLINGS:   # (``is_elementwise``'s first test)
                    op_of[inst] = ALIASES.get(raw, raw)
                    ew_of[inst] = True
                else:
                    op_of[inst] = opcode(inst)
                    ew_of[inst] = is_elementwise(inst)
                ops = inst.operands
                if len(ops) == 1:
                    users.setdefault(ops[0], []).append(inst)
                elif ops:
                    # (each operand once, in order: instructions hash by identity)
                    for op in dict.fromkeys(ops):
                        users.setdefault(op, []).append(inst)
                for callee in inst.called_computations:
                    self.callers_of.setdefault(id(callee), []).append(inst)
        self._instructions: list[Instruction] = [inst for _key, inst in fwalk]
        self.walk_pos: tuple[dict[int, int], dict[int, int]] = (
            {key: k for k, (key, _inst) in enumerate(fwalk)},
            {key: k for k, (key, _inst) in enumerate(bwalk)})
        entry = module.entry
        self.entry_root = entry.root if entry is not None else None
        # computation -> the while / conditional / call instruction that owns it
        # (the last one in module order wins, as in XLA's map).
        self.computation_map: dict[int, Instruction] = {}
        # id(user) -> {id(operand): its operand positions}, built on first use.
        self._positions: dict[Instruction, dict[Instruction, tuple[int, ...]]] = {}
        self._non_root_users: dict[Instruction, int] = {}
        self._clear_targets: dict[Instruction, tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def clear_targets(self, inst: Instruction) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Walk positions whose ``already inferred`` mark a change of ``inst`` clears:
        forward, its users and the parameters of the computations they call; backward,
        its operands (XLA's ``clear_cache``; computed once per instruction)."""
        r = self._clear_targets.get(inst)
        if r is None:
            fpos, bpos = self.walk_pos
            fw: list[int] = []
            for user in self.users_of(inst):
                fw.append(fpos[id(user)])
                for c in user.called_computations:
                    fw.extend(fpos[id(prm)] for prm in c.parameters if id(prm) in fpos)
            bw = [bpos[id(o)] for o in inst.operands if id(o) in bpos]
            r = self._clear_targets[inst] = (tuple(fw), tuple(bw))
        return r

    def instructions(self) -> Sequence[Instruction]:
        """Every instruction, computations in module order, each in post order (read
        only: one list for the run, not a generator per question)."""
        return self._instructions

    def users_of(self, inst: Instruction) -> Sequence[Instruction]:
        """Users in program order (read only; asked ~10^5 times per module: no new
        empty list per question)."""
        return self.users.get(inst, _NO_USERS)

    def operand_positions(self, user: Instruction, inst: Instruction) -> tuple[int, ...]:
        """Where ``inst`` is an operand of ``user`` (in order), without scanning the
        operands per question: a wide tuple asks once per operand."""
        table = self._positions.get(user)
        if table is None:
            built: dict[Instruction, list[int]] = {}
            for i, op in enumerate(user.operands):
                built.setdefault(op, []).append(i)
            table = {k: tuple(v) for k, v in built.items()}
            self._positions[user] = table
        return table.get(inst, ())

    def callers(self, comp: object) -> list[Instruction]:
        return self.callers_of.get(id(comp), [])

    def non_root_users(self, inst: Instruction) -> int:
        """ComputeNonRootUsers: users other than the computation's root (counted once
        per instruction)."""
        n = self._non_root_users.get(inst)
        if n is None:
            users = self.users_of(inst)
            root = inst.parent.root if inst.parent is not None else None
            # (users are distinct and compare by identity: the root is among them once)
            n = self._non_root_users[inst] = len(users) - (root is not None
                                                                and root in users)
        return n

    def is_root(self, inst: Instruction) -> bool:
        return inst.parent is not None and inst.parent.root is inst

    def owner(self, inst: Instruction) -> Instruction | None:
        """The while/conditional/call whose computation ``inst`` lives in."""
        if inst.parent is None:
            return None
        return self.computation_map.get(id(inst.parent))

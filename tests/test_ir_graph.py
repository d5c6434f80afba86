"""Graph utilities of the IR (ir/computation.py, ir/instruction.py): topological order,
use lists, replace_all_uses."""
from __future__ import annotations

import random

from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction, iter_operand_users
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.ir.shape import Shape

SCALAR = Shape.array(PrimitiveType.F32, [])


def _dag(seed: int, n: int) -> list[Instruction]:
    rng = random.Random(seed)
    insts = [Instruction("add", SCALAR, [], f"i{k}") for k in range(n)]
    for k, inst in enumerate(insts):
        if k:
            inst.operands = [rng.choice(insts[:k]) for _ in range(rng.randint(0, 3))]
            if rng.random() < 0.2:
                inst.control_predecessors = [rng.choice(insts[:k])]
    return insts


def _is_topological(order: list[Instruction]) -> bool:
    pos = {id(i): n for n, i in enumerate(order)}
    return all(pos[id(d)] < pos[id(i)] for i in order
               for d in i.operands + i.control_predecessors)


def test_sort_topologically_orders_shuffled_graphs_and_keeps_sorted_ones():
    for seed in range(200):
        insts = _dag(seed, 1 + seed % 25)
        c = Computation("c")
        c.instructions = list(insts)
        c.sort_topologically()
        assert c.instructions == insts  # already in order: unchanged
        shuffled = list(insts)
        random.Random(seed).shuffle(shuffled)
        c.instructions = shuffled
        c.sort_topologically()
        assert _is_topological(c.instructions)
        assert sorted(map(id, c.instructions)) == sorted(map(id, insts))


def test_sort_topologically_is_a_stable_depth_first_post_order():
    a, b = (Instruction("parameter", SCALAR, [], n) for n in "ab")
    x = Instruction("add", SCALAR, [b, a], "x")
    y = Instruction("negate", SCALAR, [x], "y")
    c = Computation("c")
    c.instructions = [y, a, x, b]
    c.sort_topologically()
    # From y: its operand x first, x's operands in operand order (b, a).
    assert [i.name for i in c.instructions] == ["b", "a", "x", "y"]


def test_sort_topologically_handles_wide_instructions():
    params = [Instruction("parameter", SCALAR, [], f"p{k}") for k in range(5000)]
    t = Instruction("tuple", SCALAR, list(reversed(params)), "t")
    c = Computation("c")
    c.instructions = [t] + params
    c.sort_topologically()
    assert c.instructions[-1] is t and c.instructions[0] is params[-1]


def test_users_are_listed_once_in_program_order():
    a = Instruction("parameter", SCALAR, [], "a")
    x = Instruction("add", SCALAR, [a, a], "x")
    y = Instruction("multiply", SCALAR, [x, a, x], "y")
    users = iter_operand_users([a, x, y])
    assert users[id(a)] == [x, y] and users[id(x)] == [y] and id(y) not in users


def test_replace_all_uses_rewires_every_user_and_the_root():
    a, b = (Instruction("parameter", SCALAR, [], n) for n in "ab")
    x = Instruction("add", SCALAR, [a, a], "x")
    y = Instruction("multiply", SCALAR, [x, a], "y")
    c = Computation("c")
    c.instructions = [a, b, x, y]
    c.root = a
    c.replace_all_uses(a, b)
    assert x.operands == [b, b] and y.operands == [x, b] and c.root is b

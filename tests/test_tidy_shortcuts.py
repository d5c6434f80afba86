"""The tidy pass's shortcuts decide exactly what the full walks decide: the sort after a
rewrite starts after the prefix no edit reached (``sort_topologically(settled=)``), a
rewrite that knows what it left dead drops just that (instead of the liveness walk), and
the combiner's order walk starts after its settled prefix (``combine._in_order``).
Each shortcut is checked against its full walk while real programs are partitioned."""
from __future__ import annotations

import random

import pytest

from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.ir.shape import Shape
from hlo_spmd.ir.text_parser import parse_module
from hlo_spmd.passes.partition import partition_in_place
from hlo_spmd.passes.partition import combine, tidy

SCALAR = Shape.array(PrimitiveType.F32, [])


def test_sort_from_a_settled_prefix_is_the_full_sort():
    for seed in range(100):
        rng = random.Random(seed)
        n = 5 + seed % 20
        insts = [Instruction("add", SCALAR, [], f"i{k}") for k in range(n)]
        for k, inst in enumerate(insts):
            inst.operands = [rng.choice(insts[:k]) for _ in range(rng.randint(0, 2) if k else 0)]
        # A rewrite: new instructions appended, some users from position p on rewired.
        new = [Instruction("negate", SCALAR, [rng.choice(insts)], f"n{k}") for k in range(3)]
        p = rng.randrange(n)
        for u in insts[p:]:
            if u.operands and rng.random() < 0.3:
                u.operands = [new[rng.randrange(3)]] + u.operands[1:]
        c = Computation("c")
        c.instructions = insts + new
        c.sort_topologically()
        full = c.instructions
        c.instructions = insts + new
        c.sort_topologically(settled=p)
        assert c.instructions == full


SUMS = """HloModule m

ENTRY main {{
{params}
  ROOT s = f32[8,8] {op}, sharding={{replicated}}
}}
"""


def _dots(m: int) -> str:
    """``m`` dots d0..d(m-1) of parameters sharded on the contracted dim (each a partial
    sum: an all-reduce after partitioning)."""
    return "\n".join(
        f"  x{i} = f32[8,16] parameter({2 * i}), sharding={{devices=[1,4]<=[4]}}\n"
        f"  w{i} = f32[16,8] parameter({2 * i + 1}), sharding={{devices=[4,1]<=[4]}}\n"
        f"  d{i} = f32[8,8] dot(x{i}, w{i}), lhs_contracting_dims={{1}}, "
        f"rhs_contracting_dims={{0}}, sharding={{replicated}}" for i in range(m))


def _sum_of_dots(m: int) -> str:
    params = _dots(m)
    adds = [f"  a1 = f32[8,8] add(d0, d1), sharding={{replicated}}"]
    for i in range(2, m):
        adds.append(f"  a{i} = f32[8,8] add(a{i - 1}, d{i}), sharding={{replicated}}")
    body = params + "\n" + "\n".join(adds[:-1])
    last = adds[-1].split("add(", 1)[1].split(")", 1)[0]
    return SUMS.format(params=body, op=f"add({last})")


TRANSPOSED = """HloModule m

ENTRY main {
  x = f32[16,8] parameter(0), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  dy = f32[16,12] parameter(1), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  g = f32[12,8] dot(dy, x), lhs_contracting_dims={0}, rhs_contracting_dims={0}, sharding={replicated}
  ROOT t = f32[8,12] transpose(g), dimensions={1,0}, sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
}
"""


def _partial_sums(m: int) -> str:
    params = _dots(m)
    # A big value elsewhere holds the peak (combining may not raise it).
    big = (f"  big = f32[128,128] parameter({2 * m}), sharding={{replicated}}\n"
           f"  e = f32[128,128] exponential(big), sharding={{replicated}}")
    outs = ", ".join(f"d{i}" for i in range(m))
    shapes = ", ".join(["f32[8,8]"] * m + ["f32[128,128]"])
    return (f"HloModule m\n\nENTRY main {{\n{params}\n{big}\n"
            f"  ROOT t = ({shapes}) tuple({outs}, e)\n}}\n")


@pytest.fixture
def checked(monkeypatch):
    """Every shortcut taken while partitioning, compared with its full walk."""
    used = {"dead": 0, "in_order": 0, "sort": 0}
    real_dead, real_order = tidy._remove_dead, combine._in_order
    real_sort = Computation.sort_topologically

    def remove_dead(comp, touched):
        exact = bool(touched) and type(touched[-1]) is tidy._Dead
        before = list(comp.instructions)
        comp.remove_dead()
        walked = comp.instructions
        comp.instructions = before
        real_dead(comp, touched)
        assert comp.instructions == walked
        used["dead"] += exact

    def in_order(insts, position, settled=0):
        got = real_order(insts, position, settled)
        assert got == real_order(insts, position)
        used["in_order"] += settled > 0
        return got

    def sort(self, settled=0):
        before = list(self.instructions)
        real_sort(self)
        full = self.instructions
        self.instructions = before
        real_sort(self, settled)
        assert self.instructions == full
        used["sort"] += settled > 0

    monkeypatch.setattr(tidy, "_remove_dead", remove_dead)
    monkeypatch.setattr(combine, "_in_order", in_order)
    monkeypatch.setattr(Computation, "sort_topologically", sort)
    return used


@pytest.mark.parametrize("text", [_sum_of_dots(2), _sum_of_dots(4)])
def test_rewrites_drop_exactly_what_the_liveness_walk_drops(checked, text):
    partition_in_place(parse_module(text), 4, complete=True)
    assert checked["dead"] >= 1 and checked["sort"] >= 1


def test_reduce_scatter_rewrite_sorts_and_drops_as_the_full_walks(checked):
    result = partition_in_place(parse_module(TRANSPOSED), 4, complete=True)
    assert any(i.opcode == "reduce-scatter" for i in result.module.instructions())


def test_combined_order_from_a_settled_prefix_is_the_full_walk(checked):
    result = partition_in_place(parse_module(_partial_sums(4)), 4, complete=True)
    assert sum(1 for i in result.module.instructions() if i.opcode == "all-reduce") == 1
    assert checked["in_order"] >= 1  # (the walk from its settled prefix was compared)
